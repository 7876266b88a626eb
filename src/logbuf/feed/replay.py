"""Replay an ITCH day file as a MoldUDP64 downstream feed (A and B), sans-IO core plus a socket loop.

Pipeline (everything left of the socket loop is pure and driven by the file and the configuration only)::

    DayFileReader --blocks--> Packetiser --PacketPlan--> FeedScheduler (A) --+
                                                     \\-> FeedScheduler (B) --+--> ReplayCore.events()
                                                                                    (time-ordered SendEvents)
                                                                                 ReplayCore.batches()
                                                                                    (the same, as SendBatches)
                                                                                           |
                                                        ReplayServer: sleep until due, publish to the
                                                        retransmission ring, send each feed's due packets

- Packets: a run of consecutive day-file frames *is* a MoldUDP64 packet body, so a packet is the 20-byte header
  plus one slice of the file. A packet is flushed when the next message would exceed the payload budget, when
  the next message is more than ``flush_gap_ns`` later (feed time), at a forced cut (a drop-range boundary) and
  at the end of a read block.
- Time: a packet is due at ``(ts(first message) - ts(first replayed message)) / speed`` after the start; with
  ``speed=None`` ("max") every packet is due at once and only faults add time. With ``packet_rate`` (a load
  profile: packets per second per feed) packet k is due at ``k / packet_rate`` and every packet is filled to
  the budget (no time-gap flush): the timestamps then only order the messages.
- Start phase: ``pre-open`` replays everything; ``open`` starts at the first message at or after 09:30:00 and
  ``close`` at or after 16:00:00. Skipped messages keep their sequence numbers: the first packet carries the
  sequence of the first replayed message, and skipped messages are still published to the retransmission ring
  (as SKIPPED events), so a late joiner can re-request the recent past.
- Heartbeats: per feed, every ``heartbeat_ns`` of silence, carrying the next sequence. End of session: repeated
  ``end_of_session_count`` times, ``end_of_session_interval_ns`` apart, after the last packet.
- Faults, per feed, from a seeded generator (same seed and configuration -> same faults): loss, duplication,
  reordering (a packet swapped with the next one), a head-end freeze (silence for 100-200 ms, then everything
  held is re-packed into large packets and sent back to back), and drop ranges (inclusive message sequence
  ranges never sent on that feed; packets are cut at their boundaries so exactly those messages go missing).
  A freeze starts at random (``freeze``, per packet) or on a schedule (``freeze_every_ms``: the first packet due
  at or after each multiple of the period starts one), as a load profile scripts it.
- Two ways to the same sends: :meth:`ReplayCore.events` walks packet by packet (the specification, every
  configuration); :meth:`ReplayCore.batches` decides a chunk of packets at a time with numpy for load profiles
  (``packet_rate`` with loss, delay and scheduled freezes; no jitter, duplication, reordering, random freezes
  or drop ranges) and groups :meth:`~ReplayCore.events` otherwise. Tests hold the two equal.
- The socket loop wakes when a packet is due (then at least ``batch_ns`` later: never early, at most that much
  late plus the wake-up latency) and sends every due packet of a feed at once, from a wire buffer where each
  packet was built once for A and B: runs of equal-sized packets as one segmented send (UDP GSO; the kernel
  cuts the datagrams), the rest with ``sendmmsg`` (the native ``lbn_send_from``), or ``send()`` per packet
  without the native module.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import errno
import heapq
import itertools
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from logbuf.errors import LogbufError
from logbuf.feed import moldudp64
from logbuf.feed.dayfile import DayFileReader, MessageBlock
from logbuf.feed.moldudp64 import DEFAULT_PAYLOAD_BUDGET, HEADER_LENGTH, MAX_MESSAGE_COUNT
from logbuf.feed.synth import CLOSE_NS, OPEN_NS
from logbuf.units import NANOS_PER_MILLI, NANOS_PER_SECOND

START_PHASES: dict[str, int] = {"pre-open": 0, "open": OPEN_NS, "close": CLOSE_NS}
DEFAULT_FLUSH_GAP_NS = 50_000
DEFAULT_CATCH_UP_BUDGET = 2_800  # ~70 messages of ~36 framed bytes per catch-up packet
_HEADER = struct.Struct(">10sQH")
_UNIFORM_BATCH = 4096
_LATE_NS = NANOS_PER_MILLI  # a packet sent later than this after its due time counts as late
_PROGRESS_MESSAGES = 65_536  # report progress in steps this large (a call per packet costs more than a send)
_CHUNK_PLANS = 256  # plans decided and built at a time: building a chunk holds up due sends well under 1 ms
# A wake-up sends everything due, then sleeps at least this long: a packet goes at most this much (plus the
# kernel's wake-up latency) after its time, and sendmmsg calls carry several packets at high rates.
DEFAULT_BATCH_NS = 100_000
_PREFETCH_NS = 20 * NANOS_PER_MILLI
# UDP generic segmentation offload: one send of up to 64 equal segments within one maximal UDP payload
_UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)  # linux/udp.h
_MAX_SEGMENTS = 64
_MAX_SEGMENTED_BYTES = 65_507 - 40  # IPv4's largest UDP payload, less IPv6's longer header
_MIN_SEGMENTED_RUN = 4  # shorter runs go with sendmmsg (a segmented send costs about three packets)  # build packets this far ahead of their due time
_EVENT_BATCH = 512  # events per batch when batches group events() (configurations the bulk path does not take)
_WIRE_HEADER = np.dtype([("session", "S10"), ("sequence", ">u8"), ("count", ">u2")])  # MoldUDP64, 20 bytes


class ReplayError(LogbufError, ValueError):
    """A replay setting is out of range (speed, budget, fault probabilities, destinations, ...)."""


class EventKind:
    DATA = "data"
    CATCH_UP = "catch-up"
    HEARTBEAT = "heartbeat"
    END_OF_SESSION = "end-of-session"
    SKIPPED = "skipped"  # not sent: messages before the start phase, to publish to the retransmission ring
    SOURCE = "source"  # a block of the day as the exchange disseminates it (lost on both feeds or not): to the ring


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


class SendEvent(NamedTuple):
    time_ns: int  # relative to the start of the replay
    feed: int  # index into ReplayConfig.feeds
    kind: str
    data: bytes | None
    sequence: int
    count: int  # type: ignore[assignment]  # as PacketPlan.count
    frames: np.ndarray | None


@dataclass(frozen=True)
class FaultConfig:
    loss: float = 0.0  # probability a packet is lost
    duplicate: float = 0.0  # probability a packet is sent twice
    reorder: float = 0.0  # probability a packet is swapped with the next one
    freeze: float = 0.0  # probability, per packet, that a head-end freeze starts
    freeze_ms: tuple[float, float] = (100.0, 200.0)
    freeze_max_packets: int = 64  # at most this many packets held by one freeze (bounds it at max speed)
    catch_up_budget: int = DEFAULT_CATCH_UP_BUDGET
    drop_ranges: tuple[tuple[int, int], ...] = ()  # inclusive message sequence ranges
    freeze_every_ms: float = 0.0  # a scheduled freeze every this many ms of the feed's time (0: none)

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder", "freeze"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ReplayError(f"fault probability {name} must be within [0, 1]")
        if not self.freeze_every_ms >= 0:
            raise ReplayError("freeze_every_ms must be >= 0 (0: no scheduled freezes)")
        low, high = self.freeze_ms
        if not 0 <= low <= high:
            raise ReplayError("freeze_ms must be (low, high) with 0 <= low <= high")
        if self.freeze_max_packets < 1 or self.catch_up_budget < HEADER_LENGTH + 2:
            raise ReplayError("freeze_max_packets must be >= 1 and catch_up_budget must fit a message")
        for first, last in self.drop_ranges:
            if not 1 <= first <= last:
                raise ReplayError(f"drop range {first}-{last} must satisfy 1 <= first <= last")


@dataclass(frozen=True)
class FeedConfig:
    name: str
    delay_ns: int = 0
    jitter_ns: int = 0
    faults: FaultConfig = field(default_factory=FaultConfig)


@dataclass(frozen=True)
class ReplayConfig:
    session: str | bytes = "SYNTH0001"
    speed: float | None = 1.0  # None = as fast as possible
    packet_rate: float | None = None  # packets per second per feed, full packets; overrides speed
    start: str = "pre-open"
    budget: int = DEFAULT_PAYLOAD_BUDGET
    flush_gap_ns: int = DEFAULT_FLUSH_GAP_NS
    heartbeat_ns: int = NANOS_PER_SECOND
    end_of_session_count: int = 3
    end_of_session_interval_ns: int = NANOS_PER_SECOND
    seed: int = 1
    feeds: tuple[FeedConfig, ...] = (FeedConfig("A"),)
    block_messages: int = 65_536

    def __post_init__(self) -> None:
        if self.speed is not None and self.speed <= 0:
            raise ReplayError("speed must be positive (or None for max)")
        if self.packet_rate is not None and not self.packet_rate > 0:
            raise ReplayError("packet rate must be positive (or None to follow the timestamps)")
        if self.start not in START_PHASES:
            raise ReplayError(f"start must be one of {', '.join(START_PHASES)}")
        if self.budget < HEADER_LENGTH + 2:
            raise ReplayError(f"payload budget {self.budget} leaves no room for a message")
        if self.heartbeat_ns <= 0 or self.end_of_session_count < 0 or self.end_of_session_interval_ns < 0:
            raise ReplayError("heartbeat interval must be positive; end-of-session count/interval >= 0")
        moldudp64.encode_session(self.session)


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


_NO_EVENTS: list[SendEvent] = []  # shared, never appended to


class _Uniforms:
    """Uniform draws in batches (a per-packet call into numpy's generator costs more than the packet)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._array = np.empty(0)
        self._values: list[float] = []
        self._next = 0

    def _refill(self) -> None:
        self._array = self._rng.random(_UNIFORM_BATCH)
        self._values = self._array.tolist()
        self._next = 0

    def __call__(self) -> float:
        if self._next >= len(self._values):
            self._refill()
        value = self._values[self._next]
        self._next += 1
        return value

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` draws at once: the values ``n`` calls would have returned."""
        parts: list[np.ndarray] = []
        while n > 0:
            if self._next >= len(self._values):
                self._refill()
            k = min(n, len(self._values) - self._next)
            parts.append(self._array[self._next : self._next + k])
            self._next += k
            n -= k
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0)


@dataclass
class FeedStats:
    packets: int = 0
    messages: int = 0
    bytes: int = 0
    heartbeats: int = 0
    end_of_session: int = 0
    lost_packets: int = 0
    lost_messages: int = 0
    duplicated_packets: int = 0
    reordered_packets: int = 0
    freezes: int = 0
    catch_up_packets: int = 0
    dropped_messages: int = 0  # by drop ranges


class FeedScheduler:
    """One feed's send schedule: delay, jitter, heartbeats and faults applied to the packet plans (pure)."""

    def __init__(self, index: int, config: FeedConfig, replay: ReplayConfig, seed: int,
                 buffer_slice: Callable[[int, int], bytes]) -> None:
        self.index = index
        self.config = config
        self.faults = config.faults
        self.replay = replay
        self.stats = FeedStats()
        self._uniform = _Uniforms(np.random.default_rng(seed))
        self._slice = buffer_slice
        self._delay = config.delay_ns
        self._plain = not config.jitter_ns and config.faults == FaultConfig()
        faults = config.faults
        # loss alone (the load profile's case) has a short path too; it draws exactly as the general one
        self._loss_only = (not config.jitter_ns and not faults.drop_ranges and faults.loss > 0
                           and not (faults.duplicate or faults.reorder or faults.freeze or faults.freeze_every_ms))
        # what schedule() decides in bulk: no per-packet randomness but the loss draw, times that never go back
        self.bulk = (not config.jitter_ns and config.delay_ns >= 0 and not faults.drop_ranges
                     and not (faults.duplicate or faults.reorder or faults.freeze))
        self._freeze_period = int(faults.freeze_every_ms * NANOS_PER_MILLI)
        self._next_freeze: int | None = self._freeze_period or None
        self._session = moldudp64.encode_session(replay.session)
        self._last_time = 0
        self._last_scheduled: int | None = None
        self._next_sequence: int | None = None
        self._held: list[PacketPlan] = []
        self._freeze_until: int | None = None
        self._stash: tuple[PacketPlan, bytes] | None = None  # a packet waiting to be sent after the next one
        self._drops = sorted(self.faults.drop_ranges)

    def advance(self, now: int) -> list[SendEvent]:
        """Heartbeats due before ``now`` (relative ns) on this feed."""
        if self._last_scheduled is None or self._last_scheduled + self.replay.heartbeat_ns > now:
            return _NO_EVENTS
        out: list[SendEvent] = []
        if self._next_sequence is None or self._freeze_until is not None:
            return out
        interval = self.replay.heartbeat_ns
        while self._last_scheduled + interval <= now:
            self._last_scheduled += interval
            out.append(self._control(self._last_scheduled, EventKind.HEARTBEAT, moldudp64.HEARTBEAT_COUNT))
            self.stats.heartbeats += 1
        return out

    def _control(self, t: int, kind: str, count: int) -> SendEvent:
        data = _HEADER.pack(self._session, self._next_sequence or 1, count)
        self._last_time = max(self._last_time, t)
        self.stats.bytes += len(data)  # a feed's bytes are all its packets' (the summary's total is their sum)
        return SendEvent(t, self.index, kind, data, self._next_sequence or 1, 0, None)

    def _dropped(self, plan: PacketPlan) -> bool:
        i = bisect.bisect_right(self._drops, (plan.sequence, float("inf"))) - 1
        return i >= 0 and self._drops[i][0] <= plan.sequence <= self._drops[i][1]

    def process(self, plan: PacketPlan, base: int, data: bytes) -> list[SendEvent]:
        """Events for one packet plan (bytes ``data``) whose undisturbed send time is ``base`` (relative ns)."""
        if self._plain:  # the common case, kept short: no jitter, no faults
            t = base + self._delay
            if t < self._last_time:
                t = self._last_time
            self._last_time = self._last_scheduled = t
            self._next_sequence = plan.sequence + plan.count
            stats = self.stats
            stats.packets += 1
            stats.messages += plan.count
            stats.bytes += len(data)
            return [SendEvent(t, self.index, EventKind.DATA, data, plan.sequence, plan.count, plan.frames)]
        if self._loss_only:
            t = base + self._delay
            if t < self._last_time:
                t = self._last_time
            self._last_scheduled = t
            self._next_sequence = plan.sequence + plan.count
            stats = self.stats
            if self._uniform() < self.faults.loss:
                stats.lost_packets += 1
                stats.lost_messages += plan.count
                return _NO_EVENTS
            self._last_time = t
            stats.packets += 1
            stats.messages += plan.count
            stats.bytes += len(data)
            return [SendEvent(t, self.index, EventKind.DATA, data, plan.sequence, plan.count, plan.frames)]
        u = self._uniform
        faults = self.faults
        t = base + self.config.delay_ns
        if self.config.jitter_ns:
            t += int(u() * self.config.jitter_ns)
        t = max(t, self._last_time)  # a feed never overtakes itself
        self._last_scheduled = t
        self._next_sequence = plan.sequence + plan.count
        if self._drops and self._dropped(plan):
            self.stats.dropped_messages += plan.count
            return []
        out: list[SendEvent] = []
        if self._freeze_until is not None:
            if t < self._freeze_until and len(self._held) < faults.freeze_max_packets:
                self._held.append(plan)
                return out
            out.extend(self._release())
            t = max(t, self._last_time)
        elif (self._next_freeze is not None and t >= self._next_freeze) or (faults.freeze and u() < faults.freeze):
            self._start_freeze(t, plan)  # scheduled, or at random
            return out
        if faults.loss and u() < faults.loss:
            self.stats.lost_packets += 1
            self.stats.lost_messages += plan.count
            return out
        copies = 2 if faults.duplicate and u() < faults.duplicate else 1
        if copies == 2:
            self.stats.duplicated_packets += 1
        if self._stash is not None:
            stashed_plan, stashed_data = self._stash
            self._stash = None
            out.extend(self._send(t, plan, data, EventKind.DATA, copies))
            out.extend(self._send(t, stashed_plan, stashed_data, EventKind.DATA, 1))
            return out
        if faults.reorder and u() < faults.reorder:
            self.stats.reordered_packets += 1
            self._stash = (plan, data)
            out.extend(self._send(t, plan, data, EventKind.DATA, copies - 1))
            return out
        out.extend(self._send(t, plan, data, EventKind.DATA, copies))
        return out

    def _start_freeze(self, t: int, plan: PacketPlan) -> None:
        """A freeze starts at ``t`` with ``plan`` held; a scheduled one moves the schedule past ``t``."""
        if self._next_freeze is not None and t >= self._next_freeze:
            self._next_freeze += ((t - self._next_freeze) // self._freeze_period + 1) * self._freeze_period
        low, high = self.faults.freeze_ms
        self._freeze_until = t + int((low + self._uniform() * (high - low)) * NANOS_PER_MILLI)
        self._held.append(plan)
        self.stats.freezes += 1

    def schedule(self, plans: PlanColumns, frames: np.ndarray) -> list[tuple[np.ndarray, np.ndarray] | list[SendEvent]]:
        """What :meth:`process` does for each plan of ``plans`` in turn, decided in bulk (``self.bulk`` only;
        the plans' base times never go back and no heartbeat falls between two of them).

        Returns the feed's sends in order: runs ``(plan indexes, send times)`` of plain packets and lists of
        events (catch-up bursts). ``frames`` are the frame offsets of the block (plan i's messages are
        ``frames[plans.first[i] : plans.first[i] + plans.count[i]]``), needed only for packets a freeze holds.
        """
        out: list[tuple[np.ndarray, np.ndarray] | list[SendEvent]] = []
        n = len(plans.sequence)
        times = plans.base + self._delay
        loss = self.faults.loss
        stats = self.stats
        i = 0
        while i < n:
            last = self._last_time
            if self._freeze_until is not None:
                # held while due before the end of the freeze and there is room (nothing is sent meanwhile)
                j = i if last >= self._freeze_until else i + int(np.searchsorted(times[i:], self._freeze_until))
                j = min(j, i + self.faults.freeze_max_packets - len(self._held))
                if j > i:
                    self._held.extend(plans.plan(k, frames) for k in range(i, j))
                    self._last_scheduled = max(int(times[j - 1]), last)
                    self._next_sequence = int(plans.sequence[j - 1] + plans.count[j - 1])
                    i = j
                if i == n:
                    break
                # plan i ends the freeze: the held packets go first, then plan i as usual (no new freeze)
                t = max(int(times[i]), last)
                self._last_scheduled = t
                self._next_sequence = int(plans.sequence[i] + plans.count[i])
                out.append(self._release())
                t = max(t, self._last_time)
                if loss and self._uniform() < loss:
                    stats.lost_packets += 1
                    stats.lost_messages += int(plans.count[i])
                else:
                    self._last_time = t
                    stats.packets += 1
                    stats.messages += int(plans.count[i])
                    stats.bytes += int(plans.end[i] - plans.start[i]) + HEADER_LENGTH
                    out.append((np.array([i]), np.array([t], dtype=np.int64)))
                i += 1
                continue
            # a run of plain packets up to the next scheduled freeze (times: at least the last send's)
            k = n
            if self._next_freeze is not None:
                k = i if last >= self._next_freeze else i + int(np.searchsorted(times[i:], self._next_freeze))
            if k > i:
                run_times = np.maximum(times[i:k], last)
                index = np.arange(i, k)
                if loss:
                    lost = self._uniform.take(k - i) < loss
                    if lost.any():
                        stats.lost_packets += int(np.count_nonzero(lost))
                        stats.lost_messages += int(plans.count[i:k][lost].sum())
                        index, run_times = index[~lost], run_times[~lost]
                if index.size:
                    stats.packets += int(index.size)
                    stats.messages += int(plans.count[index].sum())
                    stats.bytes += int((plans.end[index] - plans.start[index]).sum()) + HEADER_LENGTH * int(index.size)
                    self._last_time = int(run_times[-1])
                    out.append((index, run_times))
                self._last_scheduled = max(int(times[k - 1]), last)
                self._next_sequence = int(plans.sequence[k - 1] + plans.count[k - 1])
            if k < n:  # plan k starts a scheduled freeze
                t = max(int(times[k]), last)
                self._last_scheduled = t
                self._next_sequence = int(plans.sequence[k] + plans.count[k])
                self._start_freeze(t, plans.plan(k, frames))
                k += 1
            i = k
        return out

    def _send(self, t: int, plan: PacketPlan, data: bytes, kind: str, copies: int) -> list[SendEvent]:
        self._last_time = max(self._last_time, t)
        stats = self.stats
        stats.packets += copies
        stats.messages += plan.count * copies
        stats.bytes += len(data) * copies
        return [SendEvent(self._last_time, self.index, kind, data, plan.sequence, plan.count, plan.frames)] * copies

    def _release(self) -> list[SendEvent]:
        """End of a freeze: everything held goes out at once, re-packed into large packets."""
        assert self._freeze_until is not None
        t = max(self._freeze_until, self._last_time)
        self._freeze_until = None
        held, self._held = self._held, []
        out: list[SendEvent] = []
        room = self.faults.catch_up_budget - HEADER_LENGTH
        run: list[PacketPlan] = []
        for plan in [*held, None]:
            if run and (plan is None or plan.sequence != run[-1].sequence + run[-1].count
                        or plan.end - run[0].start > room
                        or plan.sequence + plan.count - run[0].sequence > MAX_MESSAGE_COUNT):
                first, last = run[0], run[-1]
                frames = np.concatenate([p.frames for p in run])
                count = last.sequence + last.count - first.sequence
                data = _HEADER.pack(self._session, first.sequence, count) + self._slice(first.start, last.end)
                merged = PacketPlan(first.sequence, count, first.start, last.end, first.timestamp, frames)
                out.extend(self._send(t, merged, data, EventKind.CATCH_UP, 1))
                self.stats.catch_up_packets += 1
                run = []
            if plan is not None:
                run.append(plan)
        return out

    def finish(self) -> list[SendEvent]:
        """Flush a freeze or a stashed packet, then the end-of-session packets."""
        out: list[SendEvent] = []
        if self._freeze_until is not None:
            out.extend(self._release())
        if self._stash is not None:
            plan, data = self._stash
            self._stash = None
            out.extend(self._send(self._last_time, plan, data, EventKind.DATA, 1))
        t = self._last_time
        for _ in range(self.replay.end_of_session_count):
            out.append(self._control(t, EventKind.END_OF_SESSION, moldudp64.END_OF_SESSION_COUNT))
            self.stats.end_of_session += 1
            t += self.replay.end_of_session_interval_ns
        return out


class ReplayCore:
    """Turns a day file and a configuration into time-ordered send events; no sockets, no clock."""

    def __init__(self, reader: DayFileReader, config: ReplayConfig) -> None:
        self.reader = reader
        self.config = config
        self._session = moldudp64.encode_session(config.session)
        cuts = [c for feed in config.feeds for first, last in feed.faults.drop_ranges for c in (first, last + 1)]
        flush_gap = config.flush_gap_ns if config.packet_rate is None else np.iinfo(np.int64).max
        self.packetiser = Packetiser(config.budget, flush_gap, cuts)
        view = reader.buffer.data  # numpy declares the buffer protocol only from Python 3.12
        self._view = view
        self.feeds = [
            FeedScheduler(i, feed, config, config.seed * 1_000_003 + i, self._slice)
            for i, feed in enumerate(config.feeds)
        ]
        self.first_sequence: int | None = None  # sequence of the first replayed message
        self.next_sequence = 1
        self.skipped = 0

    def _slice(self, start: int, end: int) -> bytes:
        return self._view[start:end].tobytes()

    def _packet(self, plan: PacketPlan) -> bytes:
        return _HEADER.pack(self._session, plan.sequence, plan.count) + self._view[plan.start : plan.end]

    def _relative(self, timestamp: int, origin: int) -> int:
        speed = self.config.speed
        return 0 if speed is None else int((timestamp - origin) / speed)

    def events(self) -> Iterator[SendEvent]:
        start_ts = START_PHASES[self.config.start]
        origin: int | None = None
        heap: list[tuple[int, int, SendEvent]] = []
        counter = itertools.count()  # ties keep production order
        sequence = 1
        packet_rate = self.config.packet_rate
        packet_ns = 0.0 if packet_rate is None else NANOS_PER_SECOND / packet_rate
        packets = 0
        for block in self.reader.blocks(self.config.block_messages):
            timestamps = block.headers().timestamp
            begin = 0
            if origin is None:
                begin = int(np.searchsorted(timestamps, start_ts, side="left")) if start_ts else 0
                if begin:
                    self.skipped += begin
                    yield SendEvent(0, -1, EventKind.SKIPPED, None, sequence, begin, block.frames[:begin])
                if begin == block.count:
                    sequence += block.count
                    continue
                origin = int(timestamps[begin])
                self.first_sequence = sequence + begin
            # the retransmission server holds every message, whatever the network does to the feeds
            yield SendEvent(0, -1, EventKind.SOURCE, None, sequence + begin, block.count - begin, block.frames[begin:])
            for plan in self.packetiser.plans(block, timestamps, sequence, begin):
                if packet_rate is None:
                    base = self._relative(plan.timestamp, origin)
                else:
                    base = int(packets * packet_ns)
                    packets += 1
                data = self._packet(plan)
                for feed in self.feeds:
                    for event in feed.advance(base):
                        heapq.heappush(heap, (event.time_ns, next(counter), event))
                    for event in feed.process(plan, base, data):
                        heapq.heappush(heap, (event.time_ns, next(counter), event))
                # nothing produced later can be due before ``base``: emit what is due by then
                while heap and heap[0][0] <= base:
                    yield heapq.heappop(heap)[2]
            sequence += block.count
            self.next_sequence = sequence
        for feed in self.feeds:
            for event in feed.finish():
                heapq.heappush(heap, (event.time_ns, next(counter), event))
        while heap:
            yield heapq.heappop(heap)[2]

    def batches(self) -> Iterator[SendBatch]:
        """The sends of :meth:`events`, per feed in the same order at the same times with the same bytes, as
        batches (and the same ring publications, each before the first packet of its messages).

        A load profile whose feeds all take the bulk path (:attr:`FeedScheduler.bulk`) is decided a chunk of
        packets at a time with numpy; anything else groups :meth:`events` (the same result, per packet)."""
        packet_rate = self.config.packet_rate
        if (packet_rate is None or not all(feed.bulk for feed in self.feeds)
                or NANOS_PER_SECOND / packet_rate + 1 >= self.config.heartbeat_ns):
            yield from self._event_batches()
            return
        packet_ns = NANOS_PER_SECOND / packet_rate
        start_ts = START_PHASES[self.config.start]
        publish: list[tuple[int, np.ndarray]] = []
        sequence = 1
        packets = 0
        for block in self.reader.blocks(self.config.block_messages):
            begin = 0
            if self.first_sequence is None:
                if start_ts:
                    begin = int(np.searchsorted(block.headers().timestamp, start_ts, side="left"))
                    if begin:
                        self.skipped += begin
                        publish.append((sequence, block.frames[:begin]))
                    if begin == block.count:
                        sequence += block.count
                        continue
                self.first_sequence = sequence + begin
            publish.append((sequence + begin, block.frames[begin:]))
            plans = self.packetiser.columns(block, sequence, begin)
            count = len(plans.sequence)
            plans.base[:] = ((packets + np.arange(count, dtype=np.int64)) * packet_ns).astype(np.int64)
            packets += count
            for lo in range(0, count, _CHUNK_PLANS):
                chunk = plans.slice(lo, lo + _CHUNK_PLANS)
                sends = [feed.schedule(chunk, block.frames) for feed in self.feeds]
                yield self._batch(chunk, sends, publish, int(chunk.base[-1]))
                publish = []
            sequence += block.count
            self.next_sequence = sequence
        ends = [feed.finish() for feed in self.feeds]
        last = max((e.time_ns for events in ends for e in events), default=0)
        yield self._batch(None, [[events] for events in ends], publish, last)

    def _batch(self, plans: PlanColumns | None, sends: list[list[tuple[np.ndarray, np.ndarray] | list[SendEvent]]],
               publish: list[tuple[int, np.ndarray]], horizon: int) -> SendBatch:
        """Builds every packet of ``plans`` once (A and B share them) and the events' packets after them."""
        packet_count = 0 if plans is None else len(plans.sequence)
        sizes = np.zeros(packet_count, dtype=np.int64) if plans is None else plans.end - plans.start + HEADER_LENGTH
        extra = [e.data for feed in sends for part in feed if isinstance(part, list) for e in part]
        offsets = np.zeros(packet_count + len(extra), dtype=np.int64)
        all_sizes = np.concatenate([sizes, np.fromiter((len(d) for d in extra), np.int64, len(extra))])  # type: ignore[arg-type]
        if all_sizes.size > 1:
            np.cumsum(all_sizes[:-1], out=offsets[1:])
        wire = np.empty(int(all_sizes.sum()), dtype=np.uint8)
        if plans is not None and packet_count:
            headers = np.empty(packet_count, dtype=_WIRE_HEADER)
            headers["session"] = self._session
            headers["sequence"] = plans.sequence
            headers["count"] = plans.count
            at = offsets[:packet_count]
            wire[(at[:, None] + np.arange(HEADER_LENGTH)).ravel()] = headers.view(np.uint8)
            source, target = self._view, wire.data  # memoryview slices copy fastest here
            for o, start, end in zip((at + HEADER_LENGTH).tolist(), plans.start.tolist(), plans.end.tolist(),
                                     strict=True):
                target[o : o + end - start] = source[start:end]
        for o, data in zip(offsets[packet_count:].tolist(), extra, strict=True):
            wire[o : o + len(data)] = np.frombuffer(data, dtype=np.uint8)  # type: ignore[arg-type]
        feeds: list[FeedBatch] = []
        next_extra = packet_count
        for parts in sends:
            times: list[np.ndarray] = []
            index: list[np.ndarray] = []
            counts: list[np.ndarray] = []
            ends: list[np.ndarray] = []
            for part in parts:
                if isinstance(part, list):
                    times.append(np.fromiter((e.time_ns for e in part), np.int64, len(part)))
                    index.append(np.arange(next_extra, next_extra + len(part)))
                    counts.append(np.fromiter((e.count for e in part), np.int64, len(part)))
                    ends.append(np.fromiter((e.sequence + e.count for e in part), np.int64, len(part)))
                    next_extra += len(part)
                else:
                    assert plans is not None
                    index.append(part[0])
                    times.append(part[1])
                    counts.append(plans.count[part[0]])
                    ends.append(plans.sequence[part[0]] + plans.count[part[0]])
            at = np.concatenate(index) if index else np.empty(0, dtype=np.int64)
            empty = np.empty(0, dtype=np.int64)
            feeds.append(FeedBatch(
                np.concatenate(times) if times else empty, offsets[at].astype(np.int32),
                all_sizes[at].astype(np.int32), np.concatenate(counts) if counts else empty,
                np.concatenate(ends).astype(np.int64) if ends else empty))
        return SendBatch(wire, feeds, publish, horizon)

    def _event_batches(self) -> Iterator[SendBatch]:
        """:meth:`events` grouped into batches (any configuration; Python per packet)."""
        publish: list[tuple[int, np.ndarray]] = []
        pending: list[list[SendEvent]] = [[] for _ in self.feeds]
        count = 0
        horizon = 0
        for event in self.events():
            if event.kind in (EventKind.SKIPPED, EventKind.SOURCE):
                if count:  # the sends so far go before these messages are published
                    yield self._batch(None, [[feed] for feed in pending], publish, horizon)
                    publish, pending, count = [], [[] for _ in self.feeds], 0
                if event.frames is not None and event.count:
                    publish.append((event.sequence, event.frames))
                continue
            pending[event.feed].append(event)
            horizon = event.time_ns
            count += 1
            if count >= _EVENT_BATCH:
                yield self._batch(None, [[feed] for feed in pending], publish, horizon)
                publish, pending, count = [], [[] for _ in self.feeds], 0
        yield self._batch(None, [[feed] for feed in pending], publish, horizon)


class FeedBatch(NamedTuple):
    """One feed's packets of a :class:`SendBatch` in send order: packet i is ``offsets[i]``, ``lengths[i]`` into
    the batch's wire buffer, due ``times[i]`` ns after the start, carrying ``counts[i]`` messages, the next
    message after it being ``ends[i]`` (a heartbeat's: the sequence it announces)."""

    times: np.ndarray  # int64, non-decreasing
    offsets: np.ndarray  # int32
    lengths: np.ndarray  # int32
    counts: np.ndarray  # int64
    ends: np.ndarray  # int64


class SendBatch(NamedTuple):
    """Packets for every feed built into one buffer, and the ring publications that must precede them."""

    wire: np.ndarray  # uint8: every packet of the batch, back to back
    feeds: list[FeedBatch]  # index: ReplayConfig.feeds
    publish: list[tuple[int, np.ndarray]]  # (first sequence, frame offsets) for the retransmission ring
    horizon: int  # every packet due at or before this (ns after the start) is in this batch or an earlier one


# ---- the socket loop ------------------------------------------------------------------------------------


def parse_host_port(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); raises ReplayError (a ValueError) with a readable message."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ReplayError(f"{text!r} is not host:port (e.g. 127.0.0.1:31001)")
    return host.strip("[]"), int(port)


@dataclass
class ReplaySummary:
    seconds: float
    packets: int
    messages: int
    bytes: int
    skipped_messages: int
    first_sequence: int | None
    next_sequence: int
    feeds: dict[str, FeedStats]
    late_packets: int = 0  # sent more than 1 ms after their due time
    max_late_ms: float = 0.0
    refused: int = 0  # sends that met "port unreachable" (nobody listening) and were sent again
    cpu_seconds: float = 0.0  # this process's CPU time during run() (building packets too, unless prebuilt)

    def as_dict(self) -> dict:
        return {
            "seconds": self.seconds, "packets": self.packets, "messages": self.messages, "bytes": self.bytes,
            "packets_per_second": self.packets / self.seconds if self.seconds else 0.0,
            "messages_per_second": self.messages / self.seconds if self.seconds else 0.0,
            "skipped_messages": self.skipped_messages, "first_sequence": self.first_sequence,
            "next_sequence": self.next_sequence, "late_packets": self.late_packets,
            "max_late_ms": self.max_late_ms, "refused": self.refused, "cpu_seconds": self.cpu_seconds,
            "feeds": {name: vars(stats).copy() for name, stats in self.feeds.items()},
        }


class _Queued:
    """A feed's part of a batch while it is being sent: Python lists for the loop, native pointers for sendmmsg."""

    __slots__ = ("times", "wire", "view", "offsets", "lengths", "counts", "bytes", "data", "reached", "sent", "native",
                 "run_end")

    def __init__(self, wire: np.ndarray, feed: FeedBatch, native: Any, segmenting: bool) -> None:
        self.times: list[int] = feed.times.tolist()
        self.wire = wire
        self.view = wire.data
        self.offsets: list[int] = feed.offsets.tolist()
        self.lengths: list[int] = feed.lengths.tolist()
        # prefix sums: the messages and bytes of packets [lo, hi) without a loop
        self.counts: list[int] = [0, *np.cumsum(feed.counts).tolist()]
        self.bytes: list[int] = [0, *np.cumsum(feed.lengths, dtype=np.int64).tolist()]
        # and of the data packets (heartbeats and end-of-session packets carry no message); the highest
        # sequence reached by packets [0, hi): what an interrupted run reports
        self.data: list[int] = [0, *np.cumsum(feed.counts > 0).tolist()]
        self.reached: list[int] = [0, *np.maximum.accumulate(feed.ends).tolist()] if feed.ends.size else [0]
        self.sent = 0  # packets [0, sent) went
        # run_end[i]: where the run of equal-sized packets lying back to back in the wire from packet i ends
        self.run_end: list[int] | None = None
        if segmenting and feed.offsets.size:
            offsets, lengths = feed.offsets.astype(np.int64), feed.lengths.astype(np.int64)
            starts = np.flatnonzero((offsets[1:] != offsets[:-1] + lengths[:-1]) | (lengths[1:] != lengths[:-1])) + 1
            ends = np.append(starts, offsets.size)
            self.run_end = ends[np.searchsorted(ends, np.arange(offsets.size), side="right")].tolist()
        self.native = None
        if native is not None:
            ffi = native.ffi
            offsets = np.ascontiguousarray(feed.offsets, dtype=np.int32)
            lengths = np.ascontiguousarray(feed.lengths, dtype=np.int32)
            # the cdata keep their numpy arrays (and the wire) alive
            self.native = (ffi.from_buffer("uint8_t[]", wire), ffi.from_buffer("int32_t[]", offsets),
                           ffi.from_buffer("int32_t[]", lengths))


def _native_net() -> Any:
    """``logbuf.native`` when the native modules are built (sendmmsg), else None (one send() per packet)."""
    try:
        from logbuf import native
    except ImportError:
        return None
    return native


def _went(planned: FeedStats, data: int, other: int, messages: int, nbytes: int) -> FeedStats:
    """A stopped run's feed statistics: the packets, messages and bytes that went.  Heartbeats come before
    the end-of-session packets, so the first ``other`` packets without messages were heartbeats.  The fault
    counts stay those decided (a few ms of packets are decided ahead of their time)."""
    heartbeats = min(planned.heartbeats, other)
    return dataclasses.replace(planned, packets=data, messages=messages, bytes=nbytes, heartbeats=heartbeats,
                               end_of_session=other - heartbeats)


class ReplayServer:
    """Sends a ReplayCore's packets on UDP sockets at their due times, each feed's due packets in batches.

    ``batch_ns``: after a wake-up the loop sleeps at least this long, so a packet goes at most that much after its
    time (never before) and a system call carries several packets at high rates (0: wake for every due time).
    ``segment``: send runs of equal-sized packets as UDP GSO sends where the kernel takes them (Linux).
    ``publish(sequence, frames)`` receives the retransmission ring's messages before any packet carrying them.
    :meth:`prebuild` first, and the run only sends (for a load profile next to the system under test).
    """

    def __init__(self, core: ReplayCore, destinations: list[tuple[str, int]], *,
                 clock: Callable[[], int] = time.monotonic_ns, sleep: Callable[[float], None] = time.sleep,
                 publish: Callable[[int, np.ndarray], None] | None = None,
                 stop: threading.Event | None = None, progress: Callable[[int], None] | None = None,
                 batch_ns: int = DEFAULT_BATCH_NS, segment: bool = True) -> None:
        if len(destinations) != len(core.feeds):
            raise ReplayError("one destination per feed")
        if batch_ns < 0:
            raise ReplayError("batch_ns must be >= 0")
        self.batch_ns = batch_ns
        self._built: list[SendBatch] | None = None
        self.core = core
        self.destinations = destinations
        self.clock = clock
        self.sleep = sleep
        self.publish = publish
        self.stop = stop or threading.Event()
        self.progress = progress
        self.refused = 0  # sends that met an ICMP port unreachable (nobody listening) and were sent again
        self.late_packets = 0  # sent more than 1 ms after their due time (the sender could not keep up)
        self.max_late_ns = 0
        self.send_calls = 0  # system calls that sent packets (sendmmsg, or send() without the native module)
        self._native = _native_net()
        # UDP GSO (Linux): runs of equal-sized packets handed to the kernel in one send each, cut there
        self._segmenting = [segment and sys.platform == "linux"] * len(destinations)
        self._sockets: list[socket.socket] = []
        try:
            for destination in destinations:
                sock = socket.socket(socket.AF_INET6 if ":" in destination[0] else socket.AF_INET,
                                     socket.SOCK_DGRAM)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                sock.connect(destination)  # no address to pass (or parse) per packet
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()

    def _wait_until(self, due: int) -> bool:
        """Sleeps until ``due`` (clock ns); False when stopped meanwhile. Never spins: the 2 cores are shared
        with the feed handler, and the kernel's wake-up slack (~50 us) is what batches the sends."""
        while True:
            remaining = due - self.clock()
            if remaining <= 0:
                return True
            if self.stop.is_set():
                return False
            self.sleep(min(remaining, 100 * NANOS_PER_MILLI) / NANOS_PER_SECOND)  # notices a stop within 100 ms

    def _send_range(self, feed: int, queued: _Queued, lo: int, hi: int) -> None:
        """Sends packets ``[lo, hi)`` of ``queued`` on ``feed``, each whole, in order: runs of equal-sized
        packets lying back to back as segmented sends (UDP GSO) when the kernel takes them, the rest with
        sendmmsg."""
        run_end = queued.run_end
        if run_end is None or not self._segmenting[feed]:
            self._send_each(feed, queued, lo, hi)
            return
        i = each_from = lo
        while i < hi:
            j = min(run_end[i], hi)
            if j - i >= _MIN_SEGMENTED_RUN:
                if each_from < i:
                    self._send_each(feed, queued, each_from, i)
                self._send_segmented(feed, queued, i, j)
                each_from = j
            i = j
        if each_from < hi:
            self._send_each(feed, queued, each_from, hi)

    def _send_segmented(self, feed: int, queued: _Queued, lo: int, hi: int) -> None:
        """Packets ``[lo, hi)`` (equal sizes, back to back in the wire): the kernel cuts each send into them."""
        sock = self._sockets[feed]
        size = queued.lengths[lo]
        per_send = min(_MAX_SEGMENTS, _MAX_SEGMENTED_BYTES // size)
        if per_send < 2:
            self._send_each(feed, queued, lo, hi)
            return
        segment = [(socket.SOL_UDP, _UDP_SEGMENT, size.to_bytes(2, sys.byteorder))]
        while lo < hi:
            n = min(hi - lo, per_send)
            offset = queued.offsets[lo]
            data = queued.view[offset : offset + n * size]
            self.send_calls += 1
            try:
                sock.sendmsg((data,), segment)
            except ConnectionRefusedError:
                self.refused += 1  # as in _send_one: an earlier packet's ICMP error; this send did not go
                with contextlib.suppress(ConnectionRefusedError):
                    sock.sendmsg((data,), segment)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EIO):
                    raise
                self._segmenting[feed] = False  # this kernel or route does not segment: one datagram per packet
                self._send_each(feed, queued, lo, hi)
                return
            lo += n

    def _send_each(self, feed: int, queued: _Queued, lo: int, hi: int) -> None:
        """Packets ``[lo, hi)`` one datagram each: sendmmsg, or send() without the native module."""
        sock = self._sockets[feed]
        native = self._native
        if native is None:
            for i in range(lo, hi):
                offset = queued.offsets[i]
                self._send_one(sock, queued.view[offset : offset + queued.lengths[i]])
            return
        lib, null = native.lib, native.ffi.NULL
        assert queued.native is not None
        wire, offsets, lengths = queued.native
        fd = sock.fileno()
        while lo < hi:
            n = lib.lbn_send_from(fd, wire, offsets + lo, lengths + lo, min(hi - lo, lib.LBN_MAX_BATCH), null, 0)
            self.send_calls += 1
            if n > 0:
                lo += n
            elif n in (-errno.EAGAIN, -errno.ENOBUFS):  # the socket buffer is full: wait until it drains
                select.select((), (fd,), (), 0.01)
            elif n == -errno.ECONNREFUSED:
                # an ICMP "port unreachable" for an earlier packet (nobody listens yet) is reported on this send,
                # which then did not go: count it and send that packet again, once
                self.refused += 1
                offset = queued.offsets[lo]
                self._send_one(sock, queued.view[offset : offset + queued.lengths[lo]], refused=True)
                lo += 1
            else:
                raise OSError(-n, f"replay: sending on feed {self.core.feeds[feed].config.name}: {os.strerror(-n)}")

    def _send_one(self, sock: socket.socket, data: memoryview, refused: bool = False) -> None:
        self.send_calls += 1
        try:
            sock.send(data)
        except ConnectionRefusedError:
            if refused:
                return
            self.refused += 1
            with contextlib.suppress(ConnectionRefusedError):
                sock.send(data)

    def prebuild(self) -> None:
        """Builds every packet now (memory: about the size of the replayed part of the file), so that
        :meth:`run` only sends: its CPU time is then the system calls' and the wake-ups'."""
        self._built = list(self.core.batches())

    def run(self) -> ReplaySummary:
        """Sends everything (or until :attr:`stop` is set); what went, how late, per feed."""
        clock = self.clock
        start = clock()
        publish = self.publish
        progress = self.progress
        stop = self.stop
        native = self._native
        batches = self.core.batches() if self._built is None else iter(self._built)
        self._built = None
        cpu = time.process_time()
        queues: list[collections.deque[_Queued]] = [collections.deque() for _ in self.destinations]
        horizon = 0  # every packet due by then is queued
        more = True
        packets = messages = nbytes = 0
        unreported = 0
        # per feed what went: data packets, other packets (heartbeats, end of session), messages, bytes
        went = [[0, 0, 0, 0] for _ in self.destinations]
        reached = 0  # the highest "next sequence" a packet sent so far announced
        while True:
            now = clock() - start
            while more and now + _PREFETCH_NS >= horizon:  # keep a few ms of packets built ahead
                batch = next(batches, None)
                if batch is None:
                    more = False
                    break
                if publish is not None:
                    for sequence, frames in batch.publish:
                        publish(sequence, frames)
                for feed, part in enumerate(batch.feeds):
                    if part.times.size:
                        queues[feed].append(_Queued(batch.wire, part, native, self._segmenting[feed]))
                horizon = batch.horizon
            if stop.is_set():
                break
            wake = horizon - _PREFETCH_NS if more else None
            for feed, queue in enumerate(queues):
                while queue:
                    queued = queue[0]
                    times = queued.times
                    lo = queued.sent
                    hi = bisect.bisect_right(times, now, lo)
                    if hi > lo:
                        # lateness (a packet due at 0 -- max speed -- is never late)
                        first = bisect.bisect_right(times, 0, lo, hi)
                        if first < hi:
                            late = now - times[first]
                            if late > _LATE_NS:
                                self.late_packets += bisect.bisect_left(times, now - _LATE_NS, first, hi) - first
                                self.max_late_ns = max(self.max_late_ns, late)
                        self._send_range(feed, queued, lo, hi)
                        queued.sent = hi
                        packets += hi - lo
                        sent_messages = queued.counts[hi] - queued.counts[lo]
                        messages += sent_messages
                        unreported += sent_messages
                        sent_bytes = queued.bytes[hi] - queued.bytes[lo]
                        nbytes += sent_bytes
                        tally = went[feed]
                        data = queued.data[hi] - queued.data[lo]
                        tally[0] += data
                        tally[1] += hi - lo - data
                        tally[2] += sent_messages
                        tally[3] += sent_bytes
                        reached = max(reached, queued.reached[hi])
                    if hi < len(times):
                        wake = times[hi] if wake is None else min(wake, times[hi])
                        break
                    queue.popleft()
            if progress is not None and unreported >= _PROGRESS_MESSAGES:
                progress(unreported)
                unreported = 0
            if wake is None:
                break  # everything went
            # what falls due within batch_ns waits for the next wake-up: one sendmmsg per feed instead of a few
            if not self._wait_until(start + max(wake, now + self.batch_ns)):
                break
        if progress is not None and unreported:
            progress(unreported)
        seconds = (self.clock() - start) / NANOS_PER_SECOND
        feeds = {feed.config.name: feed.stats for feed in self.core.feeds}
        next_sequence = self.core.next_sequence
        if more or any(queues):  # stopped early: what went, not what was planned a few ms ahead
            feeds = {name: _went(stats, *tally) for (name, stats), tally in zip(feeds.items(), went, strict=True)}
            next_sequence = max(reached, self.core.first_sequence or 1)
        return ReplaySummary(
            seconds, packets, messages, nbytes, self.core.skipped, self.core.first_sequence,
            next_sequence, feeds, self.late_packets, self.max_late_ns / NANOS_PER_MILLI, self.refused,
            time.process_time() - cpu,
        )
