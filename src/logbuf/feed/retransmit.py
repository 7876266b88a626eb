"""MoldUDP64 re-request server: a ring of recent messages, request validation, rate limiting, socket workers.

The ring maps a sequence number to the file offset of its frame; a power-of-two size makes the slot
``seq & (size - 1)``::

    slot:    0         1         2               size-1
           +---------+---------+---------+-----+---------+
    seq    | 8 bytes | 8 bytes | 8 bytes | ... | 8 bytes |   slot.seq == seq  <=> the slot still holds seq
    offset | 8 bytes | 8 bytes | 8 bytes | ... | 8 bytes |   frame offset in the day file
           +---------+---------+---------+-----+---------+

A sequence is served only when it is not in the future (``seq < next``), not overwritten
(``seq >= next - size`` and ``slot.seq == seq``, the lap check). Because the frames of consecutive sequences
are consecutive in the day file, an answer is the 20-byte header plus one slice of the file.

:class:`RetransmitCore` is pure (fed with request bytes, a client address and a clock reading; returns the
answer bytes or None). Invalid requests — wrong size, wrong session, count 0 or 0xFFFF, a first sequence in the
future or out of the ring — get no answer at all. One answer per request, capped at the payload budget; the
client re-requests the rest. :class:`RetransmitServer` runs worker threads, each with its own socket bound to
the same port with SO_REUSEPORT; the kernel hashes a client's address to one worker, so the per-worker rate
limiter is a per-client limiter.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from logbuf.feed import moldudp64
from logbuf.feed.dayfile import LENGTH_PREFIX_SIZE
from logbuf.feed.moldudp64 import DEFAULT_PAYLOAD_BUDGET, HEADER_LENGTH, MAX_MESSAGE_COUNT, REQUEST_LENGTH

NANOS_PER_SECOND = 1_000_000_000
DEFAULT_RING_BITS = 20
_HEADER = struct.Struct(">10sQH")
_EMPTY_SLOT = 0  # sequence numbers start at 1
_RECV_BUFFER = 2048
_POLL_SECONDS = 0.1  # how often a worker looks at the stop flag


class MessageRing:
    """The last ``2**bits`` (sequence -> frame offset) entries; one writer, any number of readers."""

    def __init__(self, bits: int = DEFAULT_RING_BITS) -> None:
        if not 1 <= bits <= 30:
            raise ValueError("ring bits must be within 1..30")
        self.capacity = 1 << bits
        self.mask = self.capacity - 1
        self._seq = np.zeros(self.capacity, dtype=np.int64)
        self._offset = np.zeros(self.capacity, dtype=np.int64)
        self.next_sequence = 1  # one past the highest published; written last so readers never see a torn entry

    def publish(self, first_sequence: int, frames: np.ndarray) -> None:
        """Messages ``first_sequence ..`` at frame offsets ``frames``; sequences must continue the ring's."""
        if first_sequence != self.next_sequence:
            raise ValueError(f"ring expects sequence {self.next_sequence}, got {first_sequence}")
        n = int(frames.size)
        keep = min(n, self.capacity)  # only the last ``capacity`` can survive anyway
        seqs = np.arange(first_sequence + n - keep, first_sequence + n, dtype=np.int64)
        slots = seqs & self.mask
        self._seq[slots] = seqs
        self._offset[slots] = frames[n - keep :]
        self.next_sequence = first_sequence + n

    def lowest_sequence(self) -> int:
        return max(1, self.next_sequence - self.capacity)

    def offset(self, sequence: int) -> int | None:
        """Frame offset of ``sequence`` if the ring still holds it (lap check), else None."""
        if not self.lowest_sequence() <= sequence < self.next_sequence:
            return None
        slot = sequence & self.mask
        offset = int(self._offset[slot])
        # read the offset, then confirm the slot was not overwritten meanwhile (seqlock-style)
        return offset if int(self._seq[slot]) == sequence else None


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; a request costs one token."""

    __slots__ = ("rate", "burst", "tokens", "updated_ns")

    def __init__(self, rate: float, burst: float, now_ns: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated_ns = now_ns

    def take(self, now_ns: int) -> bool:
        elapsed = max(0, now_ns - self.updated_ns)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate / NANOS_PER_SECOND)
        self.updated_ns = now_ns
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class RateLimiter:
    """A token bucket per client address, at most ``max_clients`` remembered (least recently seen evicted)."""

    def __init__(self, rate: float = 1_000.0, burst: float = 100.0, max_clients: int = 4_096) -> None:
        if rate <= 0 or burst < 1 or max_clients < 1:
            raise ValueError("rate must be > 0, burst >= 1 and max_clients >= 1")
        self.rate = rate
        self.burst = burst
        self.max_clients = max_clients
        self._buckets: OrderedDict[object, TokenBucket] = OrderedDict()

    def allow(self, client: object, now_ns: int) -> bool:
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, now_ns)
            self._buckets[client] = bucket
            if len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(client)
        return bucket.take(now_ns)


@dataclass
class RetransmitStats:
    requests: int = 0
    answers: int = 0
    messages: int = 0
    bad_size: int = 0
    bad_session: int = 0
    bad_count: int = 0
    future: int = 0
    not_retained: int = 0
    rate_limited: int = 0


class RetransmitCore:
    """Validates one request and builds its answer (pure: no sockets, the clock is an argument)."""

    def __init__(self, session: str | bytes, ring: MessageRing, buffer: bytes | memoryview | np.ndarray,
                 budget: int = DEFAULT_PAYLOAD_BUDGET, limiter: RateLimiter | None = None) -> None:
        if budget < HEADER_LENGTH + LENGTH_PREFIX_SIZE:
            raise ValueError(f"payload budget {budget} leaves no room for a message")
        self.session = moldudp64.encode_session(session)
        self.ring = ring
        self.view = memoryview(buffer).cast("B") if not isinstance(buffer, np.ndarray) else memoryview(buffer)
        self.budget = budget
        self.limiter = limiter
        self.stats = RetransmitStats()

    def handle(self, request: bytes, client: object, now_ns: int) -> bytes | None:
        stats = self.stats
        stats.requests += 1
        if len(request) != REQUEST_LENGTH:
            stats.bad_size += 1
            return None
        session, first, count = _HEADER.unpack(request)
        if session != self.session:
            stats.bad_session += 1
            return None
        if not 1 <= count <= MAX_MESSAGE_COUNT:
            stats.bad_count += 1
            return None
        ring = self.ring
        if first >= ring.next_sequence:
            stats.future += 1
            return None
        start = ring.offset(first)
        if start is None:
            stats.not_retained += 1
            return None
        if self.limiter is not None and not self.limiter.allow(client, now_ns):
            stats.rate_limited += 1
            return None
        view = self.view
        room_end = start + self.budget - HEADER_LENGTH
        last = min(first + count, ring.next_sequence)  # never past what has been sent
        end = start
        sent = 0
        sequence = first
        while sequence < last:
            offset = ring.offset(sequence)
            if offset != end:  # overwritten meanwhile, or (defensively) not contiguous
                break
            frame_end = end + LENGTH_PREFIX_SIZE + ((view[end] << 8) | view[end + 1])
            if frame_end > room_end and sent:
                break
            end = frame_end
            sent += 1
            sequence += 1
            if frame_end > room_end:  # a single message larger than the budget travels alone
                break
        if not sent:
            stats.not_retained += 1
            return None
        stats.answers += 1
        stats.messages += sent
        return _HEADER.pack(self.session, first, sent) + view[start:end]


class RetransmitServer:
    """Worker threads answering re-requests on ``(host, port)``, each with its own SO_REUSEPORT socket."""

    def __init__(self, core_factory: Callable[[], RetransmitCore], host: str = "127.0.0.1", port: int = 0,
                 workers: int = 1, clock: Callable[[], int] = time.monotonic_ns) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.clock = clock
        self.stop_event = threading.Event()
        self.cores = [core_factory() for _ in range(workers)]
        self._sockets: list[socket.socket] = []
        try:
            for _ in range(workers):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((host, port))
                port = sock.getsockname()[1]  # port 0: the first bind picks it, the others share it
                sock.settimeout(_POLL_SECONDS)
                self._sockets.append(sock)
        except OSError:
            self.close()
            raise
        self.address = (host, port)
        self._threads = [
            threading.Thread(target=self._serve, args=(sock, core), name=f"retransmit-{i}", daemon=True)
            for i, (sock, core) in enumerate(zip(self._sockets, self.cores, strict=True))
        ]

    def start(self) -> RetransmitServer:
        for thread in self._threads:
            thread.start()
        return self

    def _serve(self, sock: socket.socket, core: RetransmitCore) -> None:
        clock = self.clock
        while not self.stop_event.is_set():
            try:
                request, client = sock.recvfrom(_RECV_BUFFER)
            except TimeoutError:
                continue
            except OSError:
                if self.stop_event.is_set():
                    return
                raise
            answer = core.handle(request, client, clock())
            if answer is not None:
                with contextlib.suppress(OSError):  # the client went away; UDP has no one to tell
                    sock.sendto(answer, client)

    def stop(self, timeout: float = 2.0) -> None:
        self.stop_event.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)
        self.close()

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()

    def stats(self) -> RetransmitStats:
        total = RetransmitStats()
        for core in self.cores:
            for name, value in vars(core.stats).items():
                setattr(total, name, getattr(total, name) + value)
        return total

    def __enter__(self) -> RetransmitServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
