"""MoldUDP64 re-request server: a ring of sent messages, request validation, fair service, its own process.

The ring maps a sequence number to the file offset of its frame; a power-of-two size makes the slot
``seq & (size - 1)``. It lives in one flat int64 buffer (a numpy array, or a shared mapping that a replay
writes and a server process reads)::

    word 0            next_sequence (one past the highest published; written after the slots)
    words 1..7        reserved (the slots start on a cache line of their own)
    words 8..         seq[size]      slot.seq == seq  <=> the slot still holds seq
    then              offset[size]   frame offset in the day file

A sequence is served only when it is not in the future (``seq < next``), not overwritten
(``seq >= next - size`` and ``slot.seq == seq``, the lap check). Because the frames of consecutive sequences
are consecutive in the day file, an answer is the 20-byte header plus one slice of the file. A reader trusts
nothing it finds in the ring: every offset is checked against the day file before a byte is read.

Layers, pure first:

- :class:`RetransmitCore` validates one request and builds its answer (fed bytes, a client and a clock
  reading). Invalid requests — wrong size, wrong session, count 0 or 0xFFFF, a first sequence in the future
  (2**63 and beyond included) or no longer in the ring, a message larger than the answer cap — get no answer,
  only a counter. One answer per request, never longer than the payload budget; the client re-requests the rest.
- :class:`FairService` puts admitted requests in one bounded queue per client and answers them round-robin, one
  per client per turn, so a client that floods waits behind its own requests only. Its token bucket
  (:class:`RateLimiter`) limits how many it may have answered per second.
- :class:`RetransmitServer` is the socket loop: each cycle it drains the socket (up to a bound), then answers
  round-robin. A client that exceeds its rate gets a socket of its own, connected to it on the same port: the
  kernel then queues that client's datagrams apart (a flood overflows its own queue, not everybody's), and the
  loop reads a bounded number of them per cycle.
- :class:`RetransmitProcess` runs a server in a child process (no interpreter lock shared with a replay's send
  loop), reading a ring in an anonymous shared mapping (memfd) the parent writes. The parent binds the socket
  and passes it; the child stops when the parent closes its control pipe, or dies (end of file on the pipe).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

import numpy as np

from logbuf.errors import LogbufError, bind_error
from logbuf.feed import moldudp64
from logbuf.feed.dayfile import LENGTH_PREFIX_SIZE
from logbuf.feed.moldudp64 import DEFAULT_PAYLOAD_BUDGET, HEADER_LENGTH, MAX_MESSAGE_COUNT, REQUEST_LENGTH
from logbuf.units import NANOS_PER_SECOND

log = logging.getLogger(__name__)

DEFAULT_RING_BITS = 20
MIN_RING_BITS, MAX_RING_BITS = 1, 30
DEFAULT_RATE = 1_000.0  # answers per second per client
DEFAULT_BURST = 100.0
DEFAULT_QUEUE = 64  # admitted, unanswered requests per client
MAX_UDP_PAYLOAD = 65_507  # IPv4: 65535 - 20 (IP) - 8 (UDP)
RING_HEADER_WORDS = 8
_NEXT_WORD = 0
_HEADER = struct.Struct(">10sQH")
_RECV_SIZE = REQUEST_LENGTH + 1  # anything longer than a request reads as REQUEST_LENGTH + 1: wrong size
_SOCKET_RCVBUF = 4 << 20
_DRAIN_LIMIT = 4_096  # datagrams read from the shared socket per cycle (a flood cannot stall the answers)
_ANSWERS_PER_CYCLE = 512  # answers per cycle before the sockets are read again
_ISOLATE_MAX = 64  # clients with a connected socket of their own
_ISOLATE_IDLE_NS = 5 * NANOS_PER_SECOND  # a quiet isolated client goes back to the shared socket
_POLL_MS = 100  # how often an idle loop looks at its stop condition
_READY = b"ready"  # the child's first line: it serves from now on


#: who asked, as far as the sans-IO classes care: any hashable key (the server's is the socket address)
ClientT = TypeVar("ClientT", bound=Hashable)
#: a UDP peer as ``recvfrom`` gives it: (host, port) for IPv4, (host, port, flowinfo, scope_id) for IPv6
SocketAddress = tuple[str, int] | tuple[str, int, int, int]


class RetransmitError(LogbufError, ValueError):
    """A retransmission server setting is out of range, or its child process could not start."""


def ring_bytes(bits: int) -> int:
    """Bytes of a ring of ``2**bits`` slots (header included)."""
    return (RING_HEADER_WORDS + 2 * (1 << bits)) * 8


class MessageRing:
    """The last ``2**bits`` (sequence -> frame offset) entries; one writer, any number of readers.

    ``buffer`` (optional, writable, at least :func:`ring_bytes` long) holds the ring, e.g. a shared mapping;
    by default the ring owns a zeroed numpy array.
    """

    def __init__(
        self, bits: int = DEFAULT_RING_BITS, buffer: mmap.mmap | bytearray | memoryview | np.ndarray | None = None
    ) -> None:
        if not MIN_RING_BITS <= bits <= MAX_RING_BITS:
            raise RetransmitError(f"ring bits must be within {MIN_RING_BITS}..{MAX_RING_BITS}, not {bits}")
        self.bits = bits
        self.capacity = 1 << bits
        self.mask = self.capacity - 1
        words = RING_HEADER_WORDS + 2 * self.capacity
        if buffer is None:
            self._words = np.zeros(words, dtype=np.int64)
            self._words[_NEXT_WORD] = 1  # sequence numbers start at 1
        else:
            raw = np.frombuffer(buffer, dtype=np.uint8)
            if raw.size < words * 8:
                raise RetransmitError(f"a ring of 2**{bits} slots needs {words * 8} bytes, the buffer has {raw.size}")
            self._words = raw[: words * 8].view(np.int64)
        self._seq = self._words[RING_HEADER_WORDS : RING_HEADER_WORDS + self.capacity]
        self._offset = self._words[RING_HEADER_WORDS + self.capacity :]

    @property
    def next_sequence(self) -> int:
        """One past the highest published sequence (as read from the ring: a reader must not trust it)."""
        return int(self._words[_NEXT_WORD])

    def reset(self) -> None:
        """An empty ring whose next sequence is 1 (for a buffer that did not start zeroed)."""
        self._seq[:] = 0
        self._words[_NEXT_WORD] = 1

    def publish(self, first_sequence: int, frames: np.ndarray) -> None:
        """Messages ``first_sequence ..`` at frame offsets ``frames``; sequences must continue the ring's."""
        if first_sequence != self.next_sequence:
            raise RetransmitError(f"ring expects sequence {self.next_sequence}, got {first_sequence}")
        n = int(frames.size)
        keep = min(n, self.capacity)  # only the last ``capacity`` can survive anyway
        seqs = np.arange(first_sequence + n - keep, first_sequence + n, dtype=np.int64)
        slots = seqs & self.mask
        # seq before offset, next_sequence last: a reader that reads offset then seq never pairs a new offset
        # with the old sequence (x86 keeps stores, and loads, in program order)
        self._seq[slots] = seqs
        self._offset[slots] = frames[n - keep :]
        self._words[_NEXT_WORD] = first_sequence + n

    def lowest_sequence(self) -> int:
        return max(1, self.next_sequence - self.capacity)

    def offset(self, sequence: int, next_sequence: int | None = None) -> int | None:
        """Frame offset of ``sequence`` if the ring still holds it (lap check), else None."""
        upper = self.next_sequence if next_sequence is None else next_sequence
        if not max(1, upper - self.capacity) <= sequence < upper:
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

    def __init__(self, rate: float = DEFAULT_RATE, burst: float = DEFAULT_BURST, max_clients: int = 4_096) -> None:
        if not rate > 0 or not burst >= 1 or max_clients < 1:
            raise RetransmitError("rate must be > 0, burst >= 1 and max_clients >= 1")
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
    """What the server did with the requests it read; every request lands in exactly one outcome counter."""

    requests: int = 0  # datagrams read
    answers: int = 0
    messages: int = 0  # messages in the answers
    bad_size: int = 0  # not exactly 20 bytes
    bad_session: int = 0
    bad_count: int = 0  # 0 (heartbeat) or 0xFFFF (end of session)
    future: int = 0  # first sequence not sent yet (any sequence >= 2**63 among them)
    not_retained: int = 0  # overwritten in the ring, or never in it
    too_large: int = 0  # the first message alone exceeds the answer cap
    bad_offset: int = 0  # the ring names a frame outside the day file (a corrupted ring)
    rate_limited: int = 0  # over the client's token bucket
    queue_full: int = 0  # the client's queue of admitted requests was full
    send_failed: int = 0  # the answer could not be sent (socket buffer full, client gone)
    kernel_dropped: int = 0  # datagrams the kernel dropped on the server's sockets (queue overflow)
    isolated_clients: int = 0  # clients given a socket of their own for exceeding their rate

    def add(self, other: RetransmitStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class RetransmitCore:
    """Validates one request and builds its answer (pure: no sockets, the clock is an argument)."""

    def __init__(self, session: str | bytes, ring: MessageRing, buffer: bytes | memoryview | np.ndarray,
                 budget: int = DEFAULT_PAYLOAD_BUDGET, limiter: RateLimiter | None = None) -> None:
        if not HEADER_LENGTH + LENGTH_PREFIX_SIZE < budget <= MAX_UDP_PAYLOAD:
            raise RetransmitError(
                f"payload budget {budget} must be within {HEADER_LENGTH + LENGTH_PREFIX_SIZE + 1}..{MAX_UDP_PAYLOAD}"
            )
        self.session = moldudp64.encode_session(session)
        self.ring = ring
        self.view = memoryview(buffer).cast("B") if not isinstance(buffer, np.ndarray) else buffer.data
        self.budget = budget
        self.limiter = limiter
        self.stats = RetransmitStats()

    def check(self, request: bytes | memoryview) -> tuple[int, int] | None:
        """(first sequence, count) of a well-formed request for something already sent, else None (counted)."""
        stats = self.stats
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
        if first >= self.ring.next_sequence:  # unsigned 64-bit: 2**63 and above are simply in the future
            stats.future += 1
            return None
        return first, count

    def answer(self, first: int, count: int) -> bytes | None:
        """The answer to an already checked request: as many messages from ``first`` as fit the budget."""
        stats = self.stats
        ring = self.ring
        upper = ring.next_sequence  # read once: the writer may move it meanwhile
        start = ring.offset(first, upper)
        if start is None:
            stats.not_retained += 1
            return None
        view = self.view
        size = len(view)
        room_end = start + self.budget - HEADER_LENGTH
        last = min(first + count, upper)  # never past what has been sent
        end = start
        sent = 0
        sequence = first
        while sequence < last:
            offset = ring.offset(sequence, upper)
            if offset != end:  # overwritten meanwhile, or (defensively) not contiguous
                break
            frame_end = end + LENGTH_PREFIX_SIZE + ((view[end] << 8) | view[end + 1]) if (
                0 <= end <= size - LENGTH_PREFIX_SIZE) else -1
            if not 0 <= end < frame_end <= size:
                if not sent:
                    stats.bad_offset += 1
                    return None
                break
            if frame_end > room_end:  # the answer is full (a first message larger than the cap: never sent)
                if not sent:
                    stats.too_large += 1
                    return None
                break
            end = frame_end
            sent += 1
            sequence += 1
        if not sent:
            return None
        stats.answers += 1
        stats.messages += sent
        return _HEADER.pack(self.session, first, sent) + view[start:end]

    def handle(self, request: bytes | memoryview, client: object, now_ns: int) -> bytes | None:
        """Check, rate-limit and answer one request at once (no queue): the answer bytes or None."""
        checked = self.check(request)
        if checked is None:
            return None
        if self.limiter is not None and not self.limiter.allow(client, now_ns):
            self.stats.rate_limited += 1
            return None
        return self.answer(*checked)


class FairService(Generic[ClientT]):
    """Admitted requests in one bounded queue per client, answered round-robin (sans-IO).

    ``receive`` checks a request and takes a token from the client's bucket before queueing it; ``next_answer``
    answers the oldest request of the next client in turn. A client with many requests queued is served once
    per turn like every other, so a flood delays only the flooder.
    """

    def __init__(self, core: RetransmitCore, limiter: RateLimiter | None = None, queue: int = DEFAULT_QUEUE,
                 max_clients: int = 4_096) -> None:
        if queue < 1 or max_clients < 1:
            raise RetransmitError("the per-client queue and max_clients must be >= 1")
        self.core = core
        self.stats = core.stats
        self.limiter = limiter if limiter is not None else core.limiter
        self.queue = queue
        self.max_clients = max_clients
        self._queues: dict[ClientT, deque[tuple[int, int]]] = {}
        self._turns: deque[ClientT] = deque()  # clients with something queued, in serving order
        self.over_rate = False  # set by the last receive(): the client asks faster than it may

    @property
    def pending(self) -> int:
        """Clients waiting for an answer."""
        return len(self._turns)

    def receive(self, request: bytes | memoryview, client: ClientT, now_ns: int) -> bool:
        """Queue one request; False when it was dropped (the reason is counted). :attr:`over_rate` tells
        whether the client was over its rate or its queue (the server isolates such clients)."""
        self.over_rate = False
        self.stats.requests += 1
        checked = self.core.check(request)
        if checked is None:
            return False
        if self.limiter is not None and not self.limiter.allow(client, now_ns):
            self.stats.rate_limited += 1
            self.over_rate = True
            return False
        queue = self._queues.get(client)
        if queue is None:
            if len(self._queues) >= self.max_clients:
                self.stats.queue_full += 1
                return False
            queue = self._queues[client] = deque()
        if len(queue) >= self.queue:
            self.stats.queue_full += 1
            self.over_rate = True
            return False
        if not queue:
            self._turns.append(client)
        queue.append(checked)
        return True

    def next_answer(self) -> tuple[ClientT, bytes | None] | None:
        """(client, answer or None when the request turned out unanswerable) of the next client in turn."""
        if not self._turns:
            return None
        client = self._turns.popleft()
        queue = self._queues[client]
        first, count = queue.popleft()
        if queue:
            self._turns.append(client)
        else:
            del self._queues[client]
        return client, self.core.answer(first, count)


def _kernel_drops(sock: socket.socket) -> int:
    """Datagrams the kernel dropped on ``sock`` (``drops`` of /proc/net/udp{,6}); 0 when unknown."""
    try:
        inode = str(os.fstat(sock.fileno()).st_ino)
    except OSError:
        return 0
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    columns = line.split()
                    if len(columns) >= 13 and columns[9] == inode:
                        return int(columns[-1])
        except (OSError, ValueError):
            continue
    return 0


def bind_server_socket(host: str, port: int) -> socket.socket:
    """A non-blocking UDP socket on (host, port) with SO_REUSEPORT (isolated clients share the port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:  # past net.core.rmem_max when allowed (CAP_NET_ADMIN), else as much as it grants
            sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", socket.SO_RCVBUF), _SOCKET_RCVBUF)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_RCVBUF)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise bind_error(exc, (host, port)) from exc
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class RetransmitServer:
    """One socket loop answering re-requests fairly; ``run`` in the calling thread or ``start`` a thread."""

    def __init__(self, service: FairService[SocketAddress], sock: socket.socket | None = None, host: str = "127.0.0.1",
                 port: int = 0, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.service = service
        self.stats = service.stats
        self.clock = clock
        self.sock = sock if sock is not None else bind_server_socket(host, port)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]
        self._isolated: dict[SocketAddress, tuple[socket.socket, list[int]]] = {}  # client -> (socket, [last seen])
        self._by_fd: dict[int, socket.socket] = {self.sock.fileno(): self.sock}
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool] | None = None, wake_fd: int | None = None) -> RetransmitStats:
        """Serve until ``should_stop()`` (or :meth:`stop`), or until ``wake_fd`` is readable (end of file)."""
        if wake_fd is not None:
            self._poll.register(wake_fd, select.POLLIN)
        service = self.service
        clock = self.clock
        try:
            while not self._stop.is_set() and (should_stop is None or not should_stop()):
                busy = service.pending > 0
                ready = self._poll.poll(0 if busy else _POLL_MS)
                for fd, _ in ready:
                    if fd == wake_fd:
                        return self.stats
                    sock = self._by_fd.get(fd)
                    if sock is not None:
                        self._drain(sock, clock())
                for _ in range(_ANSWERS_PER_CYCLE):
                    turn = service.next_answer()
                    if turn is None:
                        break
                    client, answer = turn
                    if answer is not None:
                        self._send(client, answer)
                if self._isolated:
                    self._expire(clock())
        finally:
            if wake_fd is not None:
                self._poll.unregister(wake_fd)
        return self.stats

    def _drain(self, sock: socket.socket, now_ns: int) -> None:
        service = self.service
        shared = sock is self.sock
        limit = _DRAIN_LIMIT if shared else service.queue  # an isolated flooder is read at its queue's pace
        recvfrom = sock.recvfrom
        for _ in range(limit):
            try:
                request, client = recvfrom(_RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ECONNREFUSED etc. from an earlier answer to a vanished client: not a request
                continue
            service.receive(request, client, now_ns)
            if not shared:
                entry = self._isolated.get(client)
                if entry is not None:
                    entry[1][0] = now_ns
            elif service.over_rate and client not in self._isolated:
                self._isolate(client, now_ns)

    def _isolate(self, client: SocketAddress, now_ns: int) -> None:
        """Give a client that asks faster than it may a socket connected to it: its flood queues apart."""
        if len(self._isolated) >= _ISOLATE_MAX:
            return
        try:
            sock = socket.socket(self.sock.family, socket.SOCK_DGRAM)
        except OSError:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(self.sock.getsockname())
            sock.connect(client)
            sock.setblocking(False)
        except OSError as exc:
            log.debug("cannot isolate %s: %s", client, exc)
            sock.close()
            return
        self._isolated[client] = (sock, [now_ns])
        self._by_fd[sock.fileno()] = sock
        self._poll.register(sock, select.POLLIN)
        self.stats.isolated_clients += 1

    def _expire(self, now_ns: int) -> None:
        for client, (sock, seen) in list(self._isolated.items()):
            if now_ns - seen[0] > _ISOLATE_IDLE_NS:
                self._release(client, sock)

    def _release(self, client: SocketAddress, sock: socket.socket) -> None:
        self.stats.kernel_dropped += _kernel_drops(sock)
        self._poll.unregister(sock)
        self._by_fd.pop(sock.fileno(), None)
        self._isolated.pop(client, None)
        # datagrams still queued on it are lost with it; they are counted as kernel drops of a closed socket
        sock.close()

    def _send(self, client: SocketAddress, answer: bytes) -> None:
        try:
            self.sock.sendto(answer, client)
        except OSError:  # buffer full or the client went away: UDP has no one to tell
            self.stats.send_failed += 1

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> RetransmitServer:
        """Serve in a thread of this process (for tests and tools; a replay uses :class:`RetransmitProcess`)."""
        self._thread = threading.Thread(target=self.run, name="retransmit", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client, (sock, _) in list(self._isolated.items()):
            self._release(client, sock)
        self.stats.kernel_dropped += _kernel_drops(self.sock)
        self.sock.close()

    def __enter__(self) -> RetransmitServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_server(session: str | bytes, ring: MessageRing, buffer: bytes | memoryview | np.ndarray, *,
                budget: int = DEFAULT_PAYLOAD_BUDGET, rate: float = DEFAULT_RATE, burst: float = DEFAULT_BURST,
                queue: int = DEFAULT_QUEUE, sock: socket.socket | None = None, host: str = "127.0.0.1",
                port: int = 0) -> RetransmitServer:
    """A server answering from ``ring`` / ``buffer`` with a per-client rate and a fair queue."""
    limiter = RateLimiter(rate, burst)
    core = RetransmitCore(session, ring, buffer, budget)
    return RetransmitServer(FairService(core, limiter, queue), sock, host, port)


# ---- in a process of its own --------------------------------------------------------------------------------


class RetransmitProcess:
    """A retransmission server in a child process, answering from a ring this process writes.

    The socket is bound here (a busy port fails before anything starts) and passed to the child with the ring
    (an anonymous memfd: nothing in the file system to leave behind) and the read end of a control pipe.
    :meth:`stop` closes the pipe and waits for the child's statistics; a child that does not exit in time is
    terminated, then killed, by its PID. If this process dies, the child sees end of file on the pipe and exits.
    """

    def __init__(self, day_file: str | os.PathLike[str], host: str, port: int, *, session: str | bytes,
                 budget: int = DEFAULT_PAYLOAD_BUDGET, ring_bits: int = DEFAULT_RING_BITS,
                 rate: float = DEFAULT_RATE, burst: float = DEFAULT_BURST, queue: int = DEFAULT_QUEUE) -> None:
        RetransmitCore(session, MessageRing(MIN_RING_BITS), b"", budget)  # validate before anything is created
        RateLimiter(rate, burst)
        if not MIN_RING_BITS <= ring_bits <= MAX_RING_BITS:
            raise RetransmitError(f"ring bits must be within {MIN_RING_BITS}..{MAX_RING_BITS}, not {ring_bits}")
        if queue < 1:
            raise RetransmitError("the per-client queue must be >= 1")
        self.day_file = os.fspath(day_file)
        self._args = [f"--session={moldudp64.encode_session(session).decode('ascii')}", f"--budget={budget}",
                      f"--ring-bits={ring_bits}", f"--rate={rate}", f"--burst={burst}", f"--queue={queue}"]
        self.ring_bits = ring_bits
        self.process: subprocess.Popen[bytes] | None = None
        self.stats: RetransmitStats | None = None
        self._control_w: int | None = None
        self.sock = bind_server_socket(host, port)
        try:
            self.address = self.sock.getsockname()[:2]
            self._ring_fd = os.memfd_create("logbuf-retransmit-ring")
            os.ftruncate(self._ring_fd, ring_bytes(ring_bits))
            self._map: mmap.mmap | None = mmap.mmap(self._ring_fd, ring_bytes(ring_bits))
            self.ring = MessageRing(ring_bits, self._map)
            self.ring.reset()
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self, ready_timeout: float = 60.0) -> RetransmitProcess:
        """Start the child and wait until it serves (at most ``ready_timeout`` seconds)."""
        control_r, self._control_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "logbuf.feed.retransmit", self.day_file, f"--socket-fd={self.sock.fileno()}",
                 f"--ring-fd={self._ring_fd}", f"--control-fd={control_r}", *self._args],
                pass_fds=(self.sock.fileno(), self._ring_fd, control_r), stdout=subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C reaches the replay, which stops the child
            )
        except OSError as exc:
            os.close(self._control_w)
            self._control_w = None
            raise RetransmitError(f"cannot start the retransmission process: {exc}") from exc
        finally:
            os.close(control_r)
        # the child holds its own copies now
        self.sock.close()
        os.close(self._ring_fd)
        self._ring_fd = -1
        self._wait_ready(ready_timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Until the child says it serves (requests meanwhile wait in the socket the parent bound)."""
        process = self.process
        assert process is not None and process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        line = process.stdout.readline() if ready else b""
        if line.strip() != _READY:
            self.stop(timeout=1.0)
            why = "did not start in time" if not ready else f"ended with status {process.poll()}"
            raise RetransmitError(f"the retransmission process {process.pid} {why}")

    def stop(self, timeout: float = 5.0) -> RetransmitStats | None:
        """Stop the child (pipe closed, then SIGTERM, then SIGKILL by PID); its statistics, None if it had none."""
        if self._control_w is not None:
            os.close(self._control_w)
            self._control_w = None
        process = self.process
        if process is not None and self.stats is None:
            out = b""
            try:
                out, _ = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, sig)
                    try:
                        out, _ = process.communicate(timeout=timeout)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            self.stats = _parse_stats(out)
            if process.returncode:
                log.warning("retransmission process %d ended with status %s", process.pid, process.returncode)
        self.close()
        return self.stats

    def close(self) -> None:
        if self._control_w is not None:  # never started or not stopped: the child (if any) sees end of file
            os.close(self._control_w)
            self._control_w = None
        mapping: mmap.mmap | None = getattr(self, "_map", None)  # absent when __init__ failed before it
        if mapping is not None:
            # the ring's arrays are views of the mapping: let them go first (the ring is unusable after close)
            self.ring = None  # type: ignore[assignment]  # typed for its open life, when it is never None
            with contextlib.suppress(BufferError):
                mapping.close()
            self._map = None
        if getattr(self, "_ring_fd", -1) >= 0:
            os.close(self._ring_fd)
            self._ring_fd = -1
        self.sock.close()

    def __enter__(self) -> RetransmitProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _parse_stats(out: bytes) -> RetransmitStats | None:
    try:
        values = json.loads(out.decode("ascii").strip().splitlines()[-1])
        return RetransmitStats(**{f.name: int(values.get(f.name, 0)) for f in fields(RetransmitStats)})
    except (ValueError, IndexError, TypeError, AttributeError):
        return None


def _child_main(argv: list[str] | None = None) -> int:
    """The child of :class:`RetransmitProcess`: serve until the control pipe ends, print the statistics."""
    from logbuf.feed.dayfile import DayFileReader

    parser = argparse.ArgumentParser(prog="logbuf-retransmit-child")
    parser.add_argument("file")
    for name in ("--socket-fd", "--ring-fd", "--control-fd", "--budget", "--ring-bits", "--queue"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--burst", type=float, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    sock = socket.socket(fileno=args.socket_fd)
    ring_map = mmap.mmap(args.ring_fd, ring_bytes(args.ring_bits))
    os.close(args.ring_fd)
    ring = MessageRing(args.ring_bits, ring_map)
    with DayFileReader(args.file) as reader:
        server = make_server(args.session, ring, reader.buffer, budget=args.budget, rate=args.rate,
                             burst=args.burst, queue=args.queue, sock=sock)
        sys.stdout.buffer.write(_READY + b"\n")
        sys.stdout.flush()
        try:
            stats = server.run(stopping.is_set, wake_fd=args.control_fd)
        finally:
            server.close()
        del server
    with contextlib.suppress(OSError):
        sys.stdout.write(json.dumps({f.name: getattr(stats, f.name) for f in fields(stats)}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(_child_main())
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
