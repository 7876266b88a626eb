"""Replay an ITCH day file as a MoldUDP64 downstream feed (A and B), sans-IO core plus a socket loop.

Pipeline (everything left of the socket loop is pure and driven by the file and the configuration only)::

    DayFileReader --blocks--> Packetiser --PacketPlan--> FeedScheduler (A) --+
                                                     \\-> FeedScheduler (B) --+--> ReplayCore.events()
                                                                                    (time-ordered SendEvents)
                                                                                           |
                                                        ReplayServer: wait until due (sleep / idle strategy),
                                                        publish to the retransmission ring, send()

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
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import itertools
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from logbuf.errors import LogbufError
from logbuf.feed import moldudp64
from logbuf.feed.dayfile import DayFileReader, MessageBlock
from logbuf.feed.moldudp64 import DEFAULT_PAYLOAD_BUDGET, HEADER_LENGTH, MAX_MESSAGE_COUNT
from logbuf.feed.synth import CLOSE_NS, OPEN_NS
from logbuf.idle import BackoffIdleStrategy, IdleStrategy

START_PHASES: dict[str, int] = {"pre-open": 0, "open": OPEN_NS, "close": CLOSE_NS}
NANOS_PER_SECOND = 1_000_000_000
NANOS_PER_MILLI = 1_000_000
DEFAULT_FLUSH_GAP_NS = 50_000
DEFAULT_CATCH_UP_BUDGET = 2_800  # ~70 messages of ~36 framed bytes per catch-up packet
_HEADER = struct.Struct(">10sQH")
_UNIFORM_BATCH = 4096
# Sleep instead of idling when the next send is further away than this; wake this much early.
_SLEEP_THRESHOLD_NS = 2 * NANOS_PER_MILLI
_SLEEP_MARGIN_NS = NANOS_PER_MILLI
_LATE_NS = NANOS_PER_MILLI  # a packet sent later than this after its due time counts as late
_PROGRESS_MESSAGES = 65_536  # report progress in steps this large (a call per packet costs more than a send)


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
    count: int
    start: int
    end: int
    timestamp: int
    frames: np.ndarray  # frame offsets of the messages (for the retransmission ring)


class SendEvent(NamedTuple):
    time_ns: int  # relative to the start of the replay
    feed: int  # index into ReplayConfig.feeds
    kind: str
    data: bytes | None
    sequence: int
    count: int
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

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder", "freeze"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ReplayError(f"fault probability {name} must be within [0, 1]")
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


_NO_EVENTS: list[SendEvent] = []  # shared, never appended to


class _Uniforms:
    """Uniform draws in batches (a per-packet call into numpy's generator costs more than the packet)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._values: list[float] = []
        self._next = 0

    def __call__(self) -> float:
        if self._next >= len(self._values):
            self._values = self._rng.random(_UNIFORM_BATCH).tolist()
            self._next = 0
        value = self._values[self._next]
        self._next += 1
        return value


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
                           and not (faults.duplicate or faults.reorder or faults.freeze))
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
        elif faults.freeze and u() < faults.freeze:
            low, high = faults.freeze_ms
            self._freeze_until = t + int((low + u() * (high - low)) * NANOS_PER_MILLI)
            self._held.append(plan)
            self.stats.freezes += 1
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
        for plan in held + [None]:  # type: ignore[list-item]
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
        view = memoryview(reader.buffer)
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

    def as_dict(self) -> dict:
        return {
            "seconds": self.seconds, "packets": self.packets, "messages": self.messages, "bytes": self.bytes,
            "packets_per_second": self.packets / self.seconds if self.seconds else 0.0,
            "messages_per_second": self.messages / self.seconds if self.seconds else 0.0,
            "skipped_messages": self.skipped_messages, "first_sequence": self.first_sequence,
            "next_sequence": self.next_sequence, "late_packets": self.late_packets,
            "max_late_ms": self.max_late_ms, "refused": self.refused,
            "feeds": {name: vars(stats).copy() for name, stats in self.feeds.items()},
        }


class ReplayServer:
    """Sends a ReplayCore's events on UDP sockets at their due times."""

    def __init__(self, core: ReplayCore, destinations: list[tuple[str, int]], *,
                 clock: Callable[[], int] = time.monotonic_ns, sleep: Callable[[float], None] = time.sleep,
                 idle: IdleStrategy | None = None,
                 publish: Callable[[int, np.ndarray], None] | None = None,
                 stop: threading.Event | None = None, progress: Callable[[int], None] | None = None) -> None:
        if len(destinations) != len(core.feeds):
            raise ReplayError("one destination per feed")
        self.core = core
        self.destinations = destinations
        self.clock = clock
        self.sleep = sleep
        self.idle = idle or BackoffIdleStrategy()
        self.publish = publish
        self.stop = stop or threading.Event()
        self.progress = progress
        self.refused = 0  # sends that met an ICMP port unreachable (nobody listening) and were sent again
        self.late_packets = 0  # sent more than 1 ms after their due time (the sender could not keep up)
        self.max_late_ns = 0
        self._sockets: list[socket.socket] = []
        try:
            for destination in destinations:
                sock = socket.socket(socket.AF_INET6 if ":" in destination[0] else socket.AF_INET,
                                     socket.SOCK_DGRAM)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                sock.connect(destination)  # send() skips parsing the address per packet
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()

    def _wait_until(self, due: int) -> bool:
        """False when stopped while waiting."""
        while True:
            remaining = due - self.clock()
            if remaining <= 0:
                self.idle.reset()
                return True
            if self.stop.is_set():
                return False
            if remaining > _SLEEP_THRESHOLD_NS:
                # far away: sleep (at most 100 ms at a time, to notice a stop request)
                self.sleep(min(remaining - _SLEEP_MARGIN_NS, 100 * NANOS_PER_MILLI) / NANOS_PER_SECOND)
            else:
                self.idle.idle(0)

    def _send(self, feed: int, data: bytes) -> None:
        sock = self._sockets[feed]
        try:
            sock.send(data)
        except ConnectionRefusedError:
            # an ICMP "port unreachable" for an earlier datagram (nobody listens yet) is reported on this send,
            # which then did not go: count it and send again
            self.refused += 1
            with contextlib.suppress(ConnectionRefusedError):
                sock.send(data)

    def run(self) -> ReplaySummary:
        start = self.clock()
        clock = self.clock
        send = self._send
        publish = self.publish
        progress = self.progress
        stop = self.stop
        packets = messages = nbytes = 0
        unreported = 0
        for event in self.core.events():
            if event.kind in (EventKind.SKIPPED, EventKind.SOURCE):
                if publish is not None and event.frames is not None and event.count:
                    publish(event.sequence, event.frames)
                continue
            if event.time_ns:
                due = start + event.time_ns
                late = clock() - due
                if late < 0:
                    if not self._wait_until(due):
                        break
                elif late > _LATE_NS:
                    self.late_packets += 1
                    if late > self.max_late_ns:
                        self.max_late_ns = late
            if stop.is_set():
                break
            send(event.feed, event.data)  # type: ignore[arg-type]
            packets += 1
            messages += event.count
            nbytes += len(event.data)  # type: ignore[arg-type]
            unreported += event.count
            if progress is not None and unreported >= _PROGRESS_MESSAGES:
                progress(unreported)
                unreported = 0
        if progress is not None and unreported:
            progress(unreported)
        seconds = (self.clock() - start) / NANOS_PER_SECOND
        return ReplaySummary(
            seconds, packets, messages, nbytes, self.core.skipped, self.core.first_sequence,
            self.core.next_sequence, {feed.config.name: feed.stats for feed in self.core.feeds},
            self.late_packets, self.max_late_ns / NANOS_PER_MILLI, self.refused,
        )
