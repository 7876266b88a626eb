"""One re-request checked and answered (pure): no sockets, the clock is an argument.

Invalid requests -- wrong size, wrong session, count 0 or 0xFFFF, a first sequence in the future (2**63 and
beyond included) or no longer in the ring, a message larger than the answer cap -- get no answer, only a counter.
One answer per request, never longer than the payload budget; the client re-requests the rest.

:meth:`RetransmitCore.answer_spec` is the specification of an answer's extent, one message at a time in Python;
:meth:`RetransmitCore.answer` walks the same extent in C (``native/rtx_serve.c``, a property test compares
them), so a 40-message answer costs about a microsecond instead of tens."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from logbuf.exchange.dayfile import LENGTH_PREFIX_SIZE
from logbuf.exchange.retransmit.rate import RateLimiter
from logbuf.exchange.retransmit.ring import MessageRing, RetransmitError
from logbuf.marketdata import moldudp64
from logbuf.marketdata.moldudp64 import (
    DEFAULT_PAYLOAD_BUDGET,
    HEADER_LENGTH,
    MAX_MESSAGE_COUNT,
    REQUEST_LENGTH,
)
from logbuf.native import ffi, lib

MAX_UDP_PAYLOAD = 65_507  # IPv4: 65535 - 20 (IP) - 8 (UDP)


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
        # C views of the ring and the file (each cdata keeps its buffer exported, so alive, while the core is)
        self._c_seq = ffi.cast("const int64_t *", ffi.from_buffer(ring.seq_array))
        self._c_offset = ffi.cast("const int64_t *", ffi.from_buffer(ring.offset_array))
        self._c_buffer = ffi.from_buffer("uint8_t[]", self.view) if len(self.view) else ffi.new("uint8_t[]", 1)
        self._c_next = ffi.cast("const int64_t *", ffi.from_buffer(ring.next_word))
        self._c_session = ffi.new("uint8_t[]", self.session)
        self._c_keep = (ring.seq_array, ring.offset_array, ring.next_word)
        self._c_extent = ffi.new("int64_t[2]")

    def extent(self, first: int, count: int) -> tuple[int, int, int]:
        """(messages, start, end) of the answer to an already checked request, walked in C: messages >= 1 and
        the file's slice ``[start, end)`` they span, or an ``RTX_*`` code (<= 0) and zeros."""
        ring = self.ring
        extent = self._c_extent
        sent = lib.rtx_answer_extent(self._c_seq, self._c_offset, ring.mask, ring.next_sequence, self._c_buffer,
                                     len(self.view), first, count, self.budget - HEADER_LENGTH, extent,
                                     extent + 1)
        return (sent, extent[0], extent[1]) if sent > 0 else (sent, 0, 0)

    def answer(self, first: int, count: int) -> bytes | None:
        """The answer to an already checked request: as many messages from ``first`` as fit the budget (the
        extent walked in C; :meth:`answer_spec` is its specification)."""
        sent, start, end = self.extent(first, count)
        if sent <= 0:
            self._count_refusal(sent)
            return None
        stats = self.stats
        stats.answers += 1
        stats.messages += sent
        return moldudp64.HEADER.pack(self.session, first, sent) + self.view[start:end]

    def answer_batch(self, fd: int, firsts: Any, counts: Any, addresses: Any, address_slot: int,
                     address_lengths: Any, count: int, results: Any, went: Any) -> int:
        """Answers ``count`` checked requests and sends them from socket ``fd`` with one sendmmsg (cffi arrays:
        see ``rtx_answer_batch`` in ``native/rtx.h``), counting every outcome; how many answers went."""
        sent = lib.rtx_answer_batch(fd, self._c_seq, self._c_offset, self.ring.mask, self._c_next, self._c_buffer,
                                    len(self.view), self.budget - HEADER_LENGTH, self._c_session, firsts, counts,
                                    addresses, address_slot, address_lengths, count, results, went)
        stats = self.stats
        for i in range(count):
            messages = results[i]
            if messages > 0:
                stats.answers += 1
                stats.messages += messages
                if not went[i]:
                    stats.send_failed += 1
            else:
                self._count_refusal(messages)
        return int(sent)

    def _count_refusal(self, code: int) -> None:
        stats = self.stats
        if code == lib.RTX_NOT_RETAINED:
            stats.not_retained += 1
        elif code == lib.RTX_BAD_OFFSET:
            stats.bad_offset += 1
        elif code == lib.RTX_TOO_LARGE:
            stats.too_large += 1

    def check(self, request: bytes | memoryview) -> tuple[int, int] | None:
        """(first sequence, count) of a well-formed request for something already sent, else None (counted)."""
        stats = self.stats
        if len(request) != REQUEST_LENGTH:
            stats.bad_size += 1
            return None
        session, first, count = moldudp64.HEADER.unpack(request)
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

    def answer_spec(self, first: int, count: int) -> bytes | None:
        """The specification of :meth:`answer`, one message at a time: as many messages from ``first`` as fit
        the budget, each still in the ring, starting where the previous one ended, inside the file."""
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
        return moldudp64.HEADER.pack(self.session, first, sent) + view[start:end]

    def handle(self, request: bytes | memoryview, client: object, now_ns: int) -> bytes | None:
        """Check, rate-limit and answer one request at once (no queue): the answer bytes or None."""
        checked = self.check(request)
        if checked is None:
            return None
        if self.limiter is not None and not self.limiter.allow(client, now_ns):
            self.stats.rate_limited += 1
            return None
        return self.answer(*checked)
