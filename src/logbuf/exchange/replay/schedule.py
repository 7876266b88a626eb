"""One feed's send schedule (pure): delay, jitter, loss, duplication, reordering (a packet swapped with the next
one) and drop ranges (inclusive message sequence ranges never sent on that feed) applied to the packet plans,
from a seeded generator (same seed and configuration -> same faults); freezes are :mod:`.freeze`'s.

Heartbeats go every ``heartbeat_ns`` of silence, carrying the next sequence; after the last packet the
end-of-session packet is repeated ``end_of_session_count`` times, ``end_of_session_interval_ns`` apart."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from logbuf.exchange.replay.config import FaultConfig, FeedConfig, ReplayConfig
from logbuf.exchange.replay.freeze import HeadEndFreeze
from logbuf.exchange.replay.plans import PacketPlan, PlanColumns
from logbuf.marketdata import moldudp64
from logbuf.marketdata.moldudp64 import HEADER_LENGTH

_UNIFORM_BATCH = 4096


class EventKind:
    """What a :class:`SendEvent` is."""

    DATA = "data"
    CATCH_UP = "catch-up"
    HEARTBEAT = "heartbeat"
    END_OF_SESSION = "end-of-session"
    SKIPPED = "skipped"  # not sent: messages before the start phase, to publish to the retransmission ring
    SOURCE = "source"  # a block of the day as the exchange disseminates it (lost on both feeds or not): to the ring


class SendEvent(NamedTuple):
    """One packet to send on one feed (or, with ``feed`` -1, messages to publish to the retransmission ring)."""

    time_ns: int  # relative to the start of the replay
    feed: int  # index into ReplayConfig.feeds
    kind: str
    data: bytes | None
    sequence: int
    count: int  # type: ignore[assignment]  # as PacketPlan.count
    frames: np.ndarray | None


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
class FeedSendStats:
    """What one feed of the replay sent (and the faults it met); the feed handler counts what arrived."""

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
        self.stats = FeedSendStats()
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
        self._session = moldudp64.encode_session(replay.session)
        self._last_time = 0
        self._last_scheduled: int | None = None
        self._next_sequence: int | None = None
        self._freeze = HeadEndFreeze(faults, self._session, buffer_slice)
        self._stash: tuple[PacketPlan, bytes] | None = None  # a packet waiting to be sent after the next one
        self._drops = sorted(self.faults.drop_ranges)

    def advance(self, now: int) -> list[SendEvent]:
        """Heartbeats due before ``now`` (relative ns) on this feed."""
        if self._last_scheduled is None or self._last_scheduled + self.replay.heartbeat_ns > now:
            return _NO_EVENTS
        out: list[SendEvent] = []
        if self._next_sequence is None or self._freeze.until is not None:
            return out
        interval = self.replay.heartbeat_ns
        while self._last_scheduled + interval <= now:
            self._last_scheduled += interval
            out.append(self._control(self._last_scheduled, EventKind.HEARTBEAT, moldudp64.HEARTBEAT_COUNT))
            self.stats.heartbeats += 1
        return out

    def _control(self, t: int, kind: str, count: int) -> SendEvent:
        data = moldudp64.HEADER.pack(self._session, self._next_sequence or 1, count)
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
        if self._freeze.until is not None:
            if t < self._freeze.until and len(self._freeze.held) < faults.freeze_max_packets:
                self._freeze.held.append(plan)
                return out
            out.extend(self._release())
            t = max(t, self._last_time)
        elif (self._freeze.next_at is not None and t >= self._freeze.next_at) or (faults.freeze and u() < faults.freeze):
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
        """A freeze starts at ``t`` with ``plan`` held."""
        self._freeze.start(t, plan, self._uniform())
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
            if self._freeze.until is not None:
                # held while due before the end of the freeze and there is room (nothing is sent meanwhile)
                j = i if last >= self._freeze.until else i + int(np.searchsorted(times[i:], self._freeze.until))
                j = min(j, i + self.faults.freeze_max_packets - len(self._freeze.held))
                if j > i:
                    self._freeze.held.extend(plans.plan(k, frames) for k in range(i, j))
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
            if self._freeze.next_at is not None:
                k = i if last >= self._freeze.next_at else i + int(np.searchsorted(times[i:], self._freeze.next_at))
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
        t, packets = self._freeze.release(self._last_time)
        out: list[SendEvent] = []
        for plan, data in packets:
            out.extend(self._send(t, plan, data, EventKind.CATCH_UP, 1))
            self.stats.catch_up_packets += 1
        return out

    def finish(self) -> list[SendEvent]:
        """Flush a freeze or a stashed packet, then the end-of-session packets."""
        out: list[SendEvent] = []
        if self._freeze.until is not None:
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
