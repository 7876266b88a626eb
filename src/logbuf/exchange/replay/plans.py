"""Cutting a block of day-file frames into MoldUDP64 packets (pure).

A run of consecutive day-file frames *is* a MoldUDP64 packet body, so a packet is the 20-byte header plus one
slice of the file. A packet is flushed when the next message would exceed the payload budget, when the next
message is more than ``flush_gap_ns`` later (feed time), at a forced cut (a drop-range boundary) and at the end
of a read block."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from logbuf.exchange.dayfile import MessageBlock
from logbuf.marketdata.moldudp64 import HEADER_LENGTH, MAX_MESSAGE_COUNT


class PacketPlan(NamedTuple):
    """Messages ``[sequence, sequence + count)`` at file bytes ``[start, end)``; ``timestamp`` of the first."""

    sequence: int
    count: int  # type: ignore[assignment]  # MoldUDP64's name for the field; shadows tuple.count
    start: int
    end: int
    timestamp: int
    frames: np.ndarray  # frame offsets of the messages (for the retransmission ring)


class PlanColumns(NamedTuple):
    """A run of packet plans as columns (int64): plan i carries messages ``[sequence[i], +count[i])`` at file
    bytes ``[start[i], end[i])``, the block's messages ``first[i]..``, undisturbed send time ``base[i]``."""

    sequence: np.ndarray
    count: np.ndarray  # type: ignore[assignment]  # as PacketPlan.count, one per plan
    start: np.ndarray
    end: np.ndarray
    first: np.ndarray
    base: np.ndarray

    def plan(self, i: int, frames: np.ndarray) -> PacketPlan:
        """Plan ``i`` as a PacketPlan (``frames``: the block's frame offsets); timestamps are not kept."""
        first = int(self.first[i])
        return PacketPlan(int(self.sequence[i]), int(self.count[i]), int(self.start[i]), int(self.end[i]), 0,
                          frames[first : first + int(self.count[i])])

    def slice(self, lo: int, hi: int) -> PlanColumns:
        return PlanColumns(*(column[lo:hi] for column in self))


class Packetiser:
    """Cuts blocks of frames into packet plans (pure)."""

    def __init__(self, budget: int, flush_gap_ns: int, cuts: list[int] | None = None) -> None:
        self.budget = budget
        self.flush_gap_ns = flush_gap_ns
        self.cuts = sorted(set(cuts or ()))  # sequences that must start a packet

    def plans(self, block: MessageBlock, timestamps: np.ndarray, first_sequence: int,
              begin: int = 0) -> Iterator[PacketPlan]:
        """Plans for messages ``begin..`` of ``block``; message i of the block has ``first_sequence + i``."""
        frames = block.frames
        ends_arr = block.frame_ends
        ends = ends_arr.tolist()
        starts = frames.tolist()
        n = len(starts)
        gaps = np.flatnonzero(np.diff(timestamps.astype(np.int64)) > self.flush_gap_ns) + 1
        forced = set(gaps.tolist())
        lo = bisect.bisect_left(self.cuts, first_sequence)
        hi = bisect.bisect_left(self.cuts, first_sequence + n)
        forced.update(c - first_sequence for c in self.cuts[lo:hi])
        breaks = sorted(forced)
        room = self.budget - HEADER_LENGTH
        i = begin
        while i < n:
            j = bisect.bisect_right(ends, starts[i] + room, i)
            j = max(j, i + 1)  # a message larger than the budget still travels, alone
            b = bisect.bisect_right(breaks, i)
            if b < len(breaks) and breaks[b] < j:
                j = breaks[b]
            j = min(j, i + MAX_MESSAGE_COUNT)
            yield PacketPlan(first_sequence + i, j - i, starts[i], ends[j - 1], int(timestamps[i]), frames[i:j])
            i = j

    def columns(self, block: MessageBlock, first_sequence: int, begin: int = 0,
                timestamps: np.ndarray | None = None) -> PlanColumns:
        """The plans of :meth:`plans` as columns (``base`` left zero), cut without a per-message loop.

        ``timestamps`` are needed only when this packetiser flushes on time gaps."""
        starts = block.frames
        ends = block.frame_ends
        n = starts.size
        index = np.arange(n, dtype=np.int64)
        # where a packet starting at message i must end at the latest: the budget, then the forced breaks
        stop = np.searchsorted(ends, starts + (self.budget - HEADER_LENGTH), side="right")
        np.maximum(stop, index + 1, out=stop)  # a message larger than the budget still travels, alone
        np.minimum(stop, index + MAX_MESSAGE_COUNT, out=stop)
        breaks = np.empty(0, dtype=np.int64)
        if timestamps is not None and self.flush_gap_ns < np.iinfo(np.int64).max:
            breaks = np.flatnonzero(np.diff(timestamps.astype(np.int64)) > self.flush_gap_ns) + 1
        lo = bisect.bisect_left(self.cuts, first_sequence)
        hi = bisect.bisect_left(self.cuts, first_sequence + n)
        if hi > lo:
            cuts = np.asarray(self.cuts[lo:hi], dtype=np.int64) - first_sequence
            breaks = np.union1d(breaks, cuts[cuts > 0])
        if breaks.size:
            after = np.searchsorted(breaks, index, side="right")
            next_break = np.append(breaks, n)[after]
            np.minimum(stop, next_break, out=stop)
        # the packets themselves: a walk from ``begin`` along ``stop`` (one step per packet, not per message)
        step = stop.item  # a block has ~40x more messages than packets: no list of them all
        firsts: list[int] = []
        i = begin
        while i < n:
            firsts.append(i)
            i = step(i)
        first = np.asarray(firsts, dtype=np.int64)
        last = stop[first] - 1
        return PlanColumns(first + first_sequence, last - first + 1, starts[first], ends[last], first,
                           np.zeros(first.size, dtype=np.int64))
