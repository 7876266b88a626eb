"""``LossDetector``: finds the first gap between an image's rebuild position and its high-water mark and
runs the NAK timer for it (Aeron's LossDetector + TermGapScanner).

Scan: from the rebuild position, walk committed frames (the native term reader) to the first frame that is
not there - the gap begins; the gap ends at the next 32-byte slot that holds a frame, or at the high-water
mark.  The rebuild position (rcv-pos) is where the gap begins, or the high-water mark when there is none.

Timer, one gap at a time (the first; the next becomes active when it is filled):

- a new gap arms the timer with ``nak_delay.initial_delay_ns()``; when it expires a NAK goes out and the
  timer re-arms with ``nak_delay.retry_delay_ns()``;
- unicast (:class:`UnicastNakDelay`): 100 us, then retries every 100 x 100 us = 10 ms;
- multicast (:class:`MulticastNakDelay`): a randomised back-off in [0, 10 ms] drawn from a truncated
  exponential (few of many receivers NAK early, the rest see the retransmit and stay quiet), seeded RNG;
- give-up (``give_up_ns``, None = never, 0 = at once as Aeron's ``reliable=false``): a gap open that long is
  handed back to be filled with a PAD frame ("Loss gap fills"), so subscribers move on instead of hanging.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple, Protocol

import numpy as np

from logbuf.errors import LogCorruptedError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.frame import FRAME_ALIGNMENT
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.logbuffer.term_reader import TermReader

DEFAULT_UNICAST_NAK_DELAY_NS = 100_000
DEFAULT_UNICAST_RETRY_RATIO = 100
DEFAULT_MULTICAST_MAX_BACKOFF_NS = 10_000_000
DEFAULT_MULTICAST_GROUP_SIZE = 10

_READ_CAPACITY = 1024
_SLOT_WORDS = FRAME_ALIGNMENT // 4


class Gap(NamedTuple):
    term_id: int
    term_offset: int
    length: int


class LossScan(NamedTuple):
    rebuild_position: int  # end of the contiguous data
    nak: Gap | None  # send a NAK for this range now
    give_up: Gap | None  # fill this range with PAD now


class NakDelay(Protocol):
    def initial_delay_ns(self) -> int: ...

    def retry_delay_ns(self) -> int: ...


class UnicastNakDelay:
    def __init__(self, delay_ns: int = DEFAULT_UNICAST_NAK_DELAY_NS,
                 retry_ratio: int = DEFAULT_UNICAST_RETRY_RATIO) -> None:
        if delay_ns < 0 or retry_ratio < 1:
            raise ValueError("delay must be >= 0 and the retry ratio >= 1")
        self.delay_ns = delay_ns
        self.retry_ns = max(delay_ns * retry_ratio, 1)

    def initial_delay_ns(self) -> int:
        return self.delay_ns

    def retry_delay_ns(self) -> int:
        return self.retry_ns


class MulticastNakDelay:
    """Delays drawn from ``p(x) ~ exp(lambda x / T)`` on ``[0, T]``, ``lambda = ln(group size) + 1``
    (the truncated-exponential timer of scalable multicast feedback), by inversion of a uniform draw."""

    def __init__(
        self,
        max_backoff_ns: int = DEFAULT_MULTICAST_MAX_BACKOFF_NS,
        group_size: int = DEFAULT_MULTICAST_GROUP_SIZE,
        rng: random.Random | None = None,
    ) -> None:
        if max_backoff_ns <= 0 or group_size < 1:
            raise ValueError("max back-off must be > 0 and group size >= 1")
        self.max_backoff_ns = max_backoff_ns
        self.lam = math.log(group_size) + 1
        self.rng = rng or random.Random()

    def _draw(self) -> int:
        u = self.rng.random()
        return int(self.max_backoff_ns / self.lam * math.log1p(u * math.expm1(self.lam)))

    def initial_delay_ns(self) -> int:
        return self._draw()

    def retry_delay_ns(self) -> int:
        return max(self._draw(), 1)


class LossDetector:
    def __init__(self, log: LogBuffers, nak_delay: NakDelay | None = None, *, give_up_ns: int | None = None) -> None:
        if give_up_ns is not None and give_up_ns < 0:
            raise ValueError("give_up_ns must be None or >= 0")
        self.nak_delay: NakDelay = UnicastNakDelay() if nak_delay is None else nak_delay
        self.give_up_ns = give_up_ns
        self.term_length = log.term_length
        self.position_bits = log.position_bits
        self.initial_term_id = log.initial_term_id
        self._reader = TermReader(log.term_pointer(0), log.term_length, _READ_CAPACITY)
        self._words = np.frombuffer(log.terms.view, dtype=np.int32)
        self.active: Gap | None = None
        self._expiry_ns = 0
        self._since_ns = 0

    def scan(self, rebuild_position: int, hwm_position: int, now_ns: int) -> LossScan:
        position = rebuild_position
        T = self.term_length
        while position < hwm_position:
            term_offset = position & (T - 1)
            term_begin = position - term_offset
            limit = min(hwm_position - term_begin, T)
            index = d.index_by_position(position, self.position_bits)
            offset, gap_length = self._scan_term(index, term_offset, limit)
            position = term_begin + offset
            if gap_length:
                term_id = d.compute_term_id_from_position(position, self.position_bits, self.initial_term_id)
                return self._on_gap(position, Gap(term_id, offset, gap_length), now_ns)
            if offset < T:
                break  # reached the high-water mark inside this term
        self.active = None
        return LossScan(position, None, None)

    def _on_gap(self, position: int, gap: Gap, now_ns: int) -> LossScan:
        active = self.active
        if active is None or active.term_id != gap.term_id or active.term_offset != gap.term_offset:
            self._since_ns = now_ns
            self._expiry_ns = now_ns + self.nak_delay.initial_delay_ns()
        self.active = gap
        if self.give_up_ns is not None and now_ns - self._since_ns >= self.give_up_ns:
            self.active = None
            return LossScan(position, None, gap)
        if now_ns >= self._expiry_ns:
            self._expiry_ns = now_ns + self.nak_delay.retry_delay_ns()
            return LossScan(position, gap, None)
        return LossScan(position, None, None)

    def next_deadline_ns(self) -> int | None:
        """When the active gap's timer (NAK or give-up) fires next."""
        if self.active is None:
            return None
        if self.give_up_ns is None:
            return self._expiry_ns
        return min(self._expiry_ns, self._since_ns + self.give_up_ns)

    def _scan_term(self, index: int, offset: int, limit: int) -> tuple[int, int]:
        """``(gap begin, gap length)``; length 0 when the frames run to ``limit`` (or past it)."""
        reader = self._reader
        while offset < limit:
            result = reader.read(index, offset, _READ_CAPACITY)
            if result < 0:
                raise LogCorruptedError(f"corrupted frame in an image term at offset {offset}", offset)
            next_offset = result >> 32
            if next_offset == offset:
                break
            offset = next_offset
            if result & 0xFFFFFFFF < _READ_CAPACITY:
                break  # stopped at a missing frame or the end of the term, not at the read capacity
        if offset >= limit:
            return offset, 0
        base = (index * self.term_length) >> 2
        slots = self._words[base + (offset >> 2) + _SLOT_WORDS : base + (limit >> 2) : _SLOT_WORDS]
        present = np.flatnonzero(slots)
        end = offset + FRAME_ALIGNMENT * (int(present[0]) + 1) if present.size else limit
        return offset, end - offset
