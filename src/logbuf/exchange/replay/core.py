"""The replay's sans-IO core: a day file and a configuration in, time-ordered sends out (no sockets, no clock).

Time: a packet is due at ``(ts(first message) - ts(first replayed message)) / speed`` after the start; with
``speed=None`` ("max") every packet is due at once and only faults add time. With ``packet_rate`` (a load
profile: packets per second per feed) packet k is due at ``k / packet_rate`` and every packet is filled to the
budget (no time-gap flush): the timestamps then only order the messages.

Start phase: ``pre-open`` replays everything; ``open`` starts at the first message at or after 09:30:00 and
``close`` at or after 16:00:00. Skipped messages keep their sequence numbers: the first packet carries the
sequence of the first replayed message, and skipped messages are still published to the retransmission ring (as
SKIPPED events), so a late joiner can re-request the recent past.

Two ways to the same sends: :meth:`ReplayCore.events` walks packet by packet (the specification, every
configuration); :meth:`ReplayCore.batches` decides a chunk of packets at a time with numpy for load profiles
(``packet_rate`` with loss, delay and scheduled freezes; no jitter, duplication, reordering, random freezes or
drop ranges) and groups :meth:`~ReplayCore.events` otherwise. Tests hold the two equal."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

import numpy as np

from logbuf.exchange.dayfile import DayFileReader
from logbuf.exchange.replay.config import NANOS_PER_SECOND, START_PHASES, ReplayConfig
from logbuf.exchange.replay.plans import Packetiser, PacketPlan
from logbuf.exchange.replay.schedule import EventKind, FeedScheduler, SendEvent
from logbuf.exchange.replay.wire import SendBatch, build_batch
from logbuf.marketdata import moldudp64

_CHUNK_PLANS = 256  # plans decided and built at a time: building a chunk holds up due sends well under 1 ms
_EVENT_BATCH = 512  # events per batch when batches group events() (configurations the bulk path does not take)


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
        return moldudp64.HEADER.pack(self._session, plan.sequence, plan.count) + self._view[plan.start : plan.end]

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
                yield build_batch(self._session, self._view, chunk, sends, publish, int(chunk.base[-1]))
                publish = []
            sequence += block.count
            self.next_sequence = sequence
        ends = [feed.finish() for feed in self.feeds]
        last = max((e.time_ns for events in ends for e in events), default=0)
        yield build_batch(self._session, self._view, None, [[events] for events in ends], publish, last)

    def _event_batches(self) -> Iterator[SendBatch]:
        """:meth:`events` grouped into batches (any configuration; Python per packet)."""
        publish: list[tuple[int, np.ndarray]] = []
        pending: list[list[SendEvent]] = [[] for _ in self.feeds]
        count = 0
        horizon = 0
        for event in self.events():
            if event.kind in (EventKind.SKIPPED, EventKind.SOURCE):
                if count:  # the sends so far go before these messages are published
                    yield build_batch(self._session, self._view, None, [[feed] for feed in pending], publish, horizon)
                    publish, pending, count = [], [[] for _ in self.feeds], 0
                if event.frames is not None and event.count:
                    publish.append((event.sequence, event.frames))
                continue
            pending[event.feed].append(event)
            horizon = event.time_ns
            count += 1
            if count >= _EVENT_BATCH:
                yield build_batch(self._session, self._view, None, [[feed] for feed in pending], publish, horizon)
                publish, pending, count = [], [[] for _ in self.feeds], 0
        yield build_batch(self._session, self._view, None, [[feed] for feed in pending], publish, horizon)
