"""A synthetic recording with KNOWN faults, for the analytics' tests, the demo and the benchmarks.

The day's messages come from :mod:`logbuf.exchange.synth` (stateful ITCH 5.0). Instead of replaying them over UDP,
the generator computes, per feed, what a recorder on the receiving side would have written - packets, their
arrival times, the delivered messages and the handler's gap events - with these faults injected on purpose::

    feed A  packets: budget 1400 B, flushed after 50 us of feed-time quiet; arrival = send + latency + jitter
    feed B  packets: budget 1200 B, flushed after 80 us (batched differently, as real B feeds are);
            arrival = send + latency + b_delay + jitter
    jitter  uniform [0, jitter_ns) per packet; a feed never overtakes itself (FIFO: running max)
    freeze  feed A stops sending at ITCH time ``at_ns`` for ``duration_ns``, then sends everything it held
            (and whatever arrives meanwhile) in catch-up packets of up to 2800 B (~70 messages), one every
            ``catch_up_interval_ns``, until its queue is empty; then normal packets resume
    losses  each feed loses random whole packets (probability per packet); a B loss that would hit a sequence
            A also lacks is skipped, so the only ranges missing on both feeds are the configured ones
    both    ``both_lost`` is dropped on both feeds (packets are cut at its bounds) and recovered by re-request:
            detected ``gap_wait_ns`` after both feeds have shown a later packet, answered ``recover_after_ns``
            later as 'R' packets; ``unrecovered`` is dropped on both feeds and never recovered
    control heartbeats after each second of silence per feed, three end-of-session packets per feed at the end

Arrival clock: the UTC midnight of ``date`` plus the ITCH timestamp (the exchange clock is taken as UTC).
Message ``i`` of the day (0-based) has sequence ``i + 1``. The truth - what was injected and what it did - is
returned as :class:`ScenarioTruth` and saved as ``_scenario_truth.json`` next to the datasets (a ``_`` file,
which readers skip). Memory is bounded by ``segment_messages`` (the day is processed in segments; a segment
grows until a catch-up it contains has drained).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from logbuf.exchange.dayfile import LENGTH_PREFIX_SIZE, scan_frames
from logbuf.exchange.synth import OPEN_NS, SynthConfig, SyntheticDay
from logbuf.marketdata import itch
from logbuf.marketdata.moldudp64 import HEADER_LENGTH as MOLD_HEADER
from logbuf.pipeline.columns import feed_array, messages_table
from logbuf.pipeline.errors import PipelineConfigError, PipelineError
from logbuf.recording import schema
from logbuf.recording.writer import RecordingWriter
from logbuf.units import NANOS_PER_MILLI, NANOS_PER_SECOND

TRUTH_FILE = "_scenario_truth.json"
_MAX_FRAME = max(itch.LENGTHS.values()) + LENGTH_PREFIX_SIZE
_NEVER = np.iinfo(np.int64).max
_FEEDS = (schema.FEED_A, schema.FEED_B, schema.FEED_RETRANSMIT)  # dictionary order of the feed columns
_A, _B, _R = 0, 1, 2


@dataclass(frozen=True)
class FreezeSpec:
    """A head-end freeze on one feed: silent from ITCH time ``at_ns`` for ``duration_ns``, then a catch-up."""

    feed: str = schema.FEED_A
    at_ns: int = OPEN_NS + 200 * NANOS_PER_MILLI
    duration_ns: int = 150 * NANOS_PER_MILLI
    catch_up_budget: int = 2_800
    catch_up_interval_ns: int = 20_000
    # catch-up packets stamped alike in groups of this many (a receiver that timestamps a whole batch of
    # datagrams at once); stamps shared, the recording holds them in reverse sequence order, so an analysis
    # that does not break ties by sequence shows it
    shared_stamps: int = 1

    def __post_init__(self) -> None:
        if self.shared_stamps < 1:
            raise PipelineConfigError("shared_stamps must be >= 1")
        if self.feed not in schema.LIVE_FEEDS:
            raise PipelineConfigError(f"freeze feed must be one of {schema.LIVE_FEEDS}, not {self.feed!r}")
        if self.duration_ns <= 0 or self.catch_up_interval_ns <= 0:
            raise PipelineConfigError("freeze duration and catch-up interval must be positive")
        if self.catch_up_budget < MOLD_HEADER + _MAX_FRAME:
            raise PipelineConfigError(f"catch-up budget must hold the largest message ({MOLD_HEADER + _MAX_FRAME} bytes)")


@dataclass(frozen=True)
class ScenarioConfig:
    messages: int = 200_000
    seed: int = 7
    session: str = "SYNTH0001"
    date: str = "2026-01-05"
    symbols: int | None = None
    latency_ns: int = 40_000  # feed A's one-way latency
    b_delay_ns: int = 5 * NANOS_PER_MILLI  # feed B arrives this much after A
    jitter_ns: int = 300_000
    budget_a: int = 1_400
    budget_b: int = 1_200
    flush_gap_a_ns: int = 50_000
    flush_gap_b_ns: int = 80_000
    loss_a: float = 0.002
    loss_b: float = 0.002
    freezes: tuple[FreezeSpec, ...] = (FreezeSpec(),)
    both_lost: tuple[int, int] | None = None  # None: 25 messages at 60 % of the day; (0, 0): none
    unrecovered: tuple[int, int] | None = (0, 0)  # (0, 0): none
    more_both_lost: tuple[tuple[int, int], ...] = ()  # further ranges lost on both feeds, each recovered
    a_ends_after: int | None = None  # feed A goes off the air after the packet holding this sequence
    gap_wait_ns: int = NANOS_PER_MILLI
    recover_after_ns: int = 3 * NANOS_PER_MILLI
    heartbeat_ns: int = NANOS_PER_SECOND
    segment_messages: int = 2_000_000

    def __post_init__(self) -> None:
        schema.check_session(self.session)
        for name in ("loss_a", "loss_b"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise PipelineConfigError(f"{name} must be within [0, 1)")
        for name in ("latency_ns", "b_delay_ns", "jitter_ns", "gap_wait_ns", "recover_after_ns"):
            if getattr(self, name) < 0:
                raise PipelineConfigError(f"{name} must be >= 0")
        for name in ("budget_a", "budget_b"):
            if getattr(self, name) < MOLD_HEADER + _MAX_FRAME:
                raise PipelineConfigError(f"{name} must hold the largest message ({MOLD_HEADER + _MAX_FRAME} bytes)")
        for rng in self.lost_ranges():
            if not 1 <= rng[0] <= rng[1] <= self.messages:
                raise PipelineConfigError(f"lost range {rng} must lie within sequences 1..{self.messages}")
        ranges = sorted(self.lost_ranges())
        if any(a[1] + 1 >= b[0] for a, b in zip(ranges, ranges[1:], strict=False)):
            raise PipelineConfigError("both_lost and unrecovered must not overlap or touch")
        self.day_start_ns()

    def both_lost_range(self) -> tuple[int, int] | None:
        if self.both_lost is None:
            first = max(1, int(self.messages * 0.6))
            return first, min(self.messages, first + 24)
        if self.both_lost == (0, 0):
            return None
        first, last = self.both_lost
        return first, last

    def unrecovered_range(self) -> tuple[int, int] | None:
        if self.unrecovered is None or self.unrecovered == (0, 0):
            return None
        first, last = self.unrecovered
        return first, last

    def lost_ranges(self) -> list[tuple[int, int]]:
        ranges = [r for r in (self.both_lost_range(), self.unrecovered_range()) if r is not None]
        return ranges + [(int(a), int(b)) for a, b in self.more_both_lost]

    def day_start_ns(self) -> int:
        try:
            day = _dt.date.fromisoformat(self.date)
        except ValueError:
            raise PipelineConfigError(f"date {self.date!r} is not YYYY-MM-DD") from None
        return int(_dt.datetime(day.year, day.month, day.day, tzinfo=_dt.timezone.utc).timestamp()) * NANOS_PER_SECOND

    def feed_delay_ns(self, feed: int) -> int:
        return self.latency_ns + (self.b_delay_ns if feed == _B else 0)


@dataclass
class FreezeTruth:
    feed: str
    silence_start_ns: int  # arrival of the feed's last packet before the freeze
    resume_ns: int  # arrival of its first catch-up packet
    catch_up_end_ns: int  # arrival of its last catch-up packet
    held_first: int  # first sequence sent in catch-up
    held_last: int  # last sequence sent in catch-up
    catch_up_packets: int
    catch_up_messages: int


@dataclass
class GapTruth:
    first: int
    last: int
    detected_ns: int
    recovered_ns: int | None


@dataclass
class ScenarioTruth:
    config: dict
    sequences: int = 0  # messages of the day: sequences 1..sequences
    delivered: int = 0  # rows of the messages dataset
    type_counts: dict[str, int] = field(default_factory=dict)  # delivered messages per ITCH type
    feed_gaps: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: {"A": [], "B": []})
    both_gaps: list[GapTruth] = field(default_factory=list)
    freezes: list[FreezeTruth] = field(default_factory=list)
    data_packets: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0, "R": 0})
    lost_packets: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})
    wins: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0, "R": 0})
    a_last_sequence: int | None = None  # with a_ends_after: the last sequence feed A carried

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def load(cls, root: str | os.PathLike) -> ScenarioTruth:
        raw = json.loads((Path(root) / TRUTH_FILE).read_text())
        raw["feed_gaps"] = {k: [tuple(r) for r in v] for k, v in raw["feed_gaps"].items()}
        raw["both_gaps"] = [GapTruth(**g) for g in raw["both_gaps"]]
        raw["freezes"] = [FreezeTruth(**f) for f in raw["freezes"]]
        return cls(**raw)


# ---- pure helpers ---------------------------------------------------------------------------------------


def packet_starts(ts: np.ndarray, frame_len: np.ndarray, budget: int, flush_gap_ns: int,
                  cuts: np.ndarray) -> np.ndarray:
    """Indices where packets start: at every cut, after feed-time quiet > ``flush_gap_ns``, and when the frames
    would exceed ``budget`` (vectorised: frames are binned by their byte offset within a run, so a packet never
    exceeds the budget, though it may close a little earlier than a greedy packer would)."""
    n = ts.size
    if n == 0:
        return np.empty(0, np.int64)
    brk = np.zeros(n, dtype=bool)
    brk[0] = True
    brk[1:] = np.diff(ts) > flush_gap_ns
    brk[cuts[(cuts >= 0) & (cuts < n)]] = True
    run = np.cumsum(brk) - 1
    before = np.cumsum(frame_len) - frame_len
    within = before - before[np.flatnonzero(brk)][run]
    capacity = budget - MOLD_HEADER - _MAX_FRAME + 1
    slot = within // capacity
    brk[1:] |= slot[1:] != slot[:-1]
    return np.flatnonzero(brk)


def runs_of(mask: np.ndarray, offset: int = 0) -> list[tuple[int, int]]:
    """Inclusive ``(first, last)`` index runs where ``mask`` is true, shifted by ``offset``."""
    if not mask.any():
        return []
    edges = np.diff(np.concatenate(([0], mask.view(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1) - 1
    return [(int(a) + offset, int(b) + offset) for a, b in zip(starts, ends, strict=True)]


def _merge_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for first, last in sorted(runs):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


@dataclass
class _Segment:
    buf: np.ndarray  # framed bytes
    frames: np.ndarray  # frame offsets
    ts: np.ndarray  # ITCH timestamps (int64)
    frame_len: np.ndarray
    first_sequence: int

    @property
    def size(self) -> int:
        return int(self.frames.size)


@dataclass
class _Packets:
    """One feed's packets in a segment, in send order."""

    start: np.ndarray  # first message index (segment-local)
    count: np.ndarray
    send_ns: np.ndarray  # feed time the head-end sends it
    catch_up: np.ndarray  # bool


@dataclass
class _PendingGap:
    first: int
    last: int
    recover: bool
    seen_after: dict[int, int] = field(default_factory=dict)  # feed -> arrival of its first packet past `last`
    frames: list[bytes] = field(default_factory=list)  # the lost messages' framed bytes (to answer re-requests)


class _BackgroundWriter:
    """The recording's writes done by one thread of their own, in call order: Parquet encoding and compression
    (a quarter of the generator's time) release the GIL, so they overlap the next segment's generation. At most
    ``depth`` writes wait (memory stays bounded); a failed write is raised by the next call or by close()."""

    def __init__(self, writer: RecordingWriter, depth: int = 4) -> None:
        import queue
        import threading

        self._writer = writer
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="scenario-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is None:
                try:
                    self._writer.write(*item)
                except BaseException as exc:  # kept for the generating thread
                    self._error = exc

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, dataset: str, session: str, table: pa.Table) -> None:
        self._check()
        self._queue.put((dataset, session, table))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._check()


class ScenarioGenerator:
    """Writes the recording of :class:`ScenarioConfig` to a directory and returns its :class:`ScenarioTruth`."""

    def __init__(self, config: ScenarioConfig) -> None:
        self.config = config
        self.day_ns = config.day_start_ns()
        self._rng = np.random.default_rng(config.seed + 1_000_003)
        self._last_arrival = {_A: 0, _B: 0}
        self._last_send: dict[int, tuple[int, int] | None] = {_A: None, _B: None}  # (send ns, next sequence)
        self._freezes_done: set[int] = set()
        self._last_kept: dict[int, int] = {}
        self._pending = [_PendingGap(a, b, recover=(a, b) != config.unrecovered_range())
                         for a, b in config.lost_ranges()]
        self.truth = ScenarioTruth(config=asdict(config))
        self._feed_gap_runs: dict[str, list[tuple[int, int]]] = {"A": [], "B": []}
        self._type_counts = np.zeros(256, dtype=np.int64)

    # ---- segments ---------------------------------------------------------------------------------------

    def _segments(self) -> Iterator[_Segment]:
        cfg = self.config
        day = SyntheticDay(SynthConfig(messages=cfg.messages, seed=cfg.seed, symbols=cfg.symbols))
        chunks = day.chunks()
        sequence = 1
        pending: list[tuple[np.ndarray, int]] = []
        pending_count = 0
        exhausted = False
        while not exhausted or pending:
            while not exhausted and (pending_count < cfg.segment_messages or self._needs_more(pending)):
                try:
                    frames, count = next(chunks)
                except StopIteration:
                    exhausted = True
                    break
                pending.append((frames, count))
                pending_count += count
            if not pending:
                break
            segment = self._build(pending, sequence)
            sequence += segment.size
            pending, pending_count = [], 0
            yield segment

    @staticmethod
    def _build(chunks: list[tuple[np.ndarray, int]], first_sequence: int) -> _Segment:
        buf = np.concatenate([c[0] for c in chunks]) if len(chunks) > 1 else chunks[0][0]
        total = sum(c[1] for c in chunks)
        frames, end = scan_frames(buf.data, 0, total)
        if frames.size != total or end != buf.size:
            raise PipelineError("synthetic chunk does not frame cleanly")
        ts = itch.decode_headers(buf, frames + LENGTH_PREFIX_SIZE).timestamp.astype(np.int64)
        frame_len = np.diff(np.append(frames, end))
        return _Segment(buf, frames, ts, frame_len, first_sequence)

    def _needs_more(self, chunks: list[tuple[np.ndarray, int]]) -> bool:
        """True while a freeze begins in the chunks but its catch-up would not drain before their end."""
        if not chunks:
            return False
        last_ts = _last_timestamp(chunks[-1][0])
        for index, spec in enumerate(self.config.freezes):
            if index in self._freezes_done or last_ts < spec.at_ns:
                continue
            segment = self._build(chunks, 1)
            _, drained = _catch_up(segment, spec, np.empty(0, np.int64))
            return not drained
        return False

    # ---- per feed ---------------------------------------------------------------------------------------

    def _feed_packets(self, seg: _Segment, feed: int, cuts: np.ndarray) -> tuple[_Packets, FreezeSpec | None]:
        cfg = self.config
        budget, gap = (cfg.budget_a, cfg.flush_gap_a_ns) if feed == _A else (cfg.budget_b, cfg.flush_gap_b_ns)
        n = seg.size
        for index, spec in enumerate(cfg.freezes):
            if index in self._freezes_done or schema.LIVE_FEEDS.index(spec.feed) != feed:
                continue
            if seg.ts[-1] < spec.at_ns:
                continue
            (cu_start, cu_count, cu_send), drained = _catch_up(seg, spec, cuts)
            if not drained and cu_count.size and cu_start[-1] + cu_count[-1] < n:
                raise PipelineError("catch-up must drain inside its segment")
            self._freezes_done.add(index)
            q0 = int(cu_start[0]) if cu_start.size else n
            q_end = int(cu_start[-1] + cu_count[-1]) if cu_start.size else q0
            pre = packet_starts(seg.ts[:q0], seg.frame_len[:q0], budget, gap, cuts)
            post = packet_starts(seg.ts[q_end:], seg.frame_len[q_end:], budget, gap, cuts - q_end) + q_end
            starts = np.concatenate((pre, cu_start, post))
            counts = np.diff(np.append(starts, n))
            counts[pre.size:pre.size + cu_start.size] = cu_count
            send = seg.ts[starts + counts - 1]
            send[pre.size:pre.size + cu_start.size] = cu_send
            catch = np.zeros(starts.size, bool)
            catch[pre.size:pre.size + cu_start.size] = True
            return _Packets(starts, counts, send, catch), spec
        starts = packet_starts(seg.ts, seg.frame_len, budget, gap, cuts)
        counts = np.diff(np.append(starts, n))
        return _Packets(starts, counts, seg.ts[starts + counts - 1], np.zeros(starts.size, bool)), None

    def _arrivals(self, feed: int, send_ns: np.ndarray) -> np.ndarray:
        cfg = self.config
        jitter = (self._rng.integers(0, cfg.jitter_ns, send_ns.size) if cfg.jitter_ns
                  else np.zeros(send_ns.size, np.int64))
        arrival = self.day_ns + send_ns + cfg.feed_delay_ns(feed) + jitter
        arrival = np.maximum.accumulate(np.maximum(arrival, self._last_arrival[feed]))  # FIFO per feed
        if arrival.size:
            self._last_arrival[feed] = int(arrival[-1])
        return arrival

    # ---- the run ----------------------------------------------------------------------------------------

    def run(self, root: str | os.PathLike, *, progress: bool | None = None) -> ScenarioTruth:
        from tqdm import tqdm

        cfg = self.config
        show = sys.stderr.isatty() if progress is None else progress
        with RecordingWriter(root) as files, tqdm(total=cfg.messages, unit="msg", unit_scale=True,
                                                   file=sys.stderr, disable=not show, desc="scenario") as bar:
            writer = _BackgroundWriter(files)
            try:
                for segment in self._segments():
                    self._segment(segment, writer)
                    bar.update(segment.size)
                self._finish(writer)
            finally:
                writer.close()
        truth = self.truth
        truth.type_counts = {bytes([c]).decode(): int(n) for c, n in enumerate(self._type_counts) if n}
        for name, runs in self._feed_gap_runs.items():
            truth.feed_gaps[name] = _merge_runs(runs)
        truth.both_gaps.sort(key=lambda g: g.first)
        tmp = Path(root) / (TRUTH_FILE + ".tmp")
        tmp.write_text(truth.to_json())
        os.replace(tmp, Path(root) / TRUTH_FILE)
        return truth

    def _segment(self, seg: _Segment, writer: _BackgroundWriter) -> None:
        cfg = self.config
        n = seg.size
        seq0 = seg.first_sequence
        self.truth.sequences += n
        lost_mask = np.zeros(n, dtype=bool)
        cut_list = []
        for gap in self._pending:
            lo, hi = gap.first - seq0, gap.last - seq0
            if hi < 0 or lo >= n:
                continue
            lo_c, hi_c = max(lo, 0), min(hi, n - 1)
            lost_mask[lo_c:hi_c + 1] = True
            cut_list += [lo_c, hi_c + 1]
            gap.frames += [bytes(seg.buf[seg.frames[i]:seg.frames[i] + seg.frame_len[i]])
                           for i in range(lo_c, hi_c + 1)]
        cuts = np.array(sorted(set(cut_list)), dtype=np.int64)

        arrival_msg = np.full((2, n), _NEVER, dtype=np.int64)
        cumulative = np.concatenate(([0], np.cumsum(seg.frame_len)))
        tables = []
        for feed in (_A, _B):
            packets, spec = self._feed_packets(seg, feed, cuts)
            arrival = self._arrivals(feed, packets.send_ns)
            tie_order = None
            if spec is not None and spec.shared_stamps > 1:
                arrival, tie_order = _share_stamps(arrival, packets.catch_up, spec.shared_stamps)
            lost_both = lost_mask[packets.start]  # packets are cut at the ranges' bounds
            keep = ~lost_both
            loss = cfg.loss_a if feed == _A else cfg.loss_b
            if loss:
                random_loss = (self._rng.random(packets.start.size) < loss) & keep & ~packets.catch_up
                if feed == _B:  # never lose on B what A lacks: the only both-feed gaps are the configured ones
                    a_missing = np.concatenate(([0], np.cumsum(arrival_msg[_A] == _NEVER)))
                    overlaps = a_missing[packets.start + packets.count] - a_missing[packets.start] > 0
                    random_loss &= ~overlaps
                keep &= ~random_loss
                self.truth.lost_packets[schema.LIVE_FEEDS[feed]] += int(random_loss.sum())
            if feed == _A and cfg.a_ends_after is not None:  # off the air: no packet, heartbeat or end
                on_air = seq0 + packets.start <= cfg.a_ends_after
                keep &= on_air
                if on_air.any():
                    last = int(np.flatnonzero(on_air)[-1])
                    self.truth.a_last_sequence = seq0 + int(packets.start[last] + packets.count[last] - 1)
            starts, counts, arr = packets.start[keep], packets.count[keep], arrival[keep]
            index = _expand(starts, counts)
            arrival_msg[feed, index] = np.repeat(arr, counts)
            if spec is not None:
                self._freeze_truth(spec, packets, arrival, keep, seq0)
            if arr.size:
                self._last_kept[feed] = int(arr[-1])
            self._gap_detection(feed, starts, counts, arr, seq0)
            self.truth.data_packets[schema.LIVE_FEEDS[feed]] += int(starts.size)
            size = MOLD_HEADER + cumulative[starts + counts] - cumulative[starts]
            rows = self._packet_rows(feed, arr, seq0 + starts, counts, size)
            if tie_order is not None:  # equal stamps in reverse sequence order: see FreezeSpec.shared_stamps
                rows = rows.append_column("_tie", pa.array(tie_order[keep]))
            tables.append(rows)
            tables.append(self._heartbeats(feed, arr, seq0 + starts, counts))
        for name, feed in (("A", _A), ("B", _B)):
            self._feed_gap_runs[name] += runs_of(arrival_msg[feed] == _NEVER, seq0)
        tables = [t if "_tie" in t.column_names else t.append_column("_tie", pa.array(np.zeros(t.num_rows, np.int64)))
                  for t in tables if t.num_rows]
        packets_table = pa.concat_tables(tables)
        order = np.lexsort((packets_table.column("_tie").to_numpy(), packets_table.column("arrival_ns").to_numpy()))
        packets_table = packets_table.drop_columns(["_tie"])
        writer.write(schema.PACKETS, cfg.session, packets_table.take(pa.array(order)))

        delivered = arrival_msg.min(axis=0) != _NEVER
        winner = np.where(arrival_msg[_A] <= arrival_msg[_B], _A, _B)
        where = np.flatnonzero(delivered)
        first_arrival = arrival_msg.min(axis=0)
        self._deliver(writer, seg.buf, seg.frames[where] + LENGTH_PREFIX_SIZE, seq0 + where, winner[where],
                      first_arrival[where])
        self._resolve_gaps(writer)

    def _deliver(self, writer: _BackgroundWriter, buf: np.ndarray, offsets: np.ndarray, sequences: np.ndarray,
                 feeds: np.ndarray, arrivals: np.ndarray) -> None:
        if not offsets.size:
            return
        table = messages_table(buf, offsets, sequences, feed_array(feeds, _FEEDS), arrivals)
        order = np.argsort(arrivals, kind="stable")
        writer.write(schema.MESSAGES, self.config.session, table.take(pa.array(order)))
        self.truth.delivered += int(offsets.size)
        self._type_counts += np.bincount(np.asarray(buf)[offsets], minlength=256)
        for feed in (_A, _B, _R):
            self.truth.wins[_FEEDS[feed]] += int((feeds == feed).sum())

    @staticmethod
    def _packet_rows(feed: int, arrival: np.ndarray, sequence: np.ndarray, count: np.ndarray,
                     size: np.ndarray) -> pa.Table:
        return pa.Table.from_pydict({
            "feed": feed_array(np.full(arrival.size, feed), _FEEDS),
            "arrival_ns": pa.array(arrival.astype(np.int64)),
            "sequence": pa.array(sequence.astype(np.int64)),
            "count": pa.array(count.astype(np.int32)),
            "bytes": pa.array(size.astype(np.int32)),
        }, schema=schema.PACKETS_SCHEMA)

    def _heartbeats(self, feed: int, arrival: np.ndarray, sequence: np.ndarray, count: np.ndarray) -> pa.Table:
        """A heartbeat after every ``heartbeat_ns`` of silence on the feed, carrying the next sequence."""
        interval = self.config.heartbeat_ns
        previous = self._last_send[feed]
        times = arrival
        nexts = sequence + count
        if previous is not None:
            times = np.concatenate(([previous[0]], times))
            nexts = np.concatenate(([previous[1]], nexts))
        if arrival.size:
            self._last_send[feed] = (int(arrival[-1]), int(nexts[-1]))
        if times.size < 2:
            return self._packet_rows(feed, np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64),
                                     np.empty(0, np.int64))
        silence = np.diff(times)
        beats = np.maximum((silence - 1) // interval, 0)
        which = np.repeat(np.arange(silence.size), beats)
        k = _expand(np.ones(beats.size, np.int64), beats)  # 1..beats after each silent stretch's start
        at = times[which] + k * interval
        return self._packet_rows(feed, at, nexts[which], np.zeros(at.size, np.int64),
                                 np.full(at.size, MOLD_HEADER))

    def _freeze_truth(self, spec: FreezeSpec, packets: _Packets, arrival: np.ndarray, keep: np.ndarray,
                      seq0: int) -> None:
        catch = np.flatnonzero(packets.catch_up)
        if not catch.size:
            return
        before = np.flatnonzero(keep[:catch[0]])
        feed = schema.LIVE_FEEDS.index(spec.feed)
        last_before = int(arrival[before[-1]]) if before.size else self._last_kept.get(feed, int(arrival[catch[0]]))
        self.truth.freezes.append(FreezeTruth(
            feed=spec.feed,
            silence_start_ns=last_before,
            resume_ns=int(arrival[catch[0]]),
            catch_up_end_ns=int(arrival[catch[-1]]),
            held_first=seq0 + int(packets.start[catch[0]]),
            held_last=seq0 + int(packets.start[catch[-1]] + packets.count[catch[-1]] - 1),
            catch_up_packets=int(catch.size),
            catch_up_messages=int(packets.count[catch].sum()),
        ))

    def _gap_detection(self, feed: int, starts: np.ndarray, counts: np.ndarray, arrival: np.ndarray,
                       seq0: int) -> None:
        first_seq = seq0 + starts
        for gap in self._pending:
            if feed in gap.seen_after:
                continue
            past = np.flatnonzero(first_seq > gap.last)
            if past.size:
                gap.seen_after[feed] = int(arrival[past].min())

    def _resolve_gaps(self, writer: _BackgroundWriter, final: bool = False) -> None:
        cfg = self.config
        still = []
        for gap in self._pending:
            if len(gap.seen_after) < 2 and not final:
                still.append(gap)
                continue
            if not gap.frames and not final:
                still.append(gap)
                continue
            seen = list(gap.seen_after.values()) or [max(self._last_arrival.values())]
            detected = max(seen) + cfg.gap_wait_ns
            recovered = None
            if gap.recover and gap.frames:
                recovered = self._answer(writer, gap, detected + cfg.recover_after_ns)
            self.truth.both_gaps.append(GapTruth(gap.first, gap.last, detected, recovered))
            table = pa.Table.from_pydict({
                "feed": pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), pa.array([schema.GAP_BOTH])),
                "first": pa.array([gap.first], pa.int64()),
                "last": pa.array([gap.last], pa.int64()),
                "detected_ns": pa.array([detected], pa.int64()),
                "recovered_ns": pa.array([recovered], pa.int64()),
            }, schema=schema.GAPS_SCHEMA)
            writer.write(schema.GAPS, cfg.session, table)
        self._pending = still

    def _answer(self, writer: _BackgroundWriter, gap: _PendingGap, at_ns: int) -> int:
        """Re-request answers ('R' packets, one budget each, 1 us apart); returns the last one's arrival."""
        buf = np.frombuffer(b"".join(gap.frames), dtype=np.uint8)
        frame_len = np.array([len(f) for f in gap.frames], dtype=np.int64)
        frames = np.concatenate(([0], np.cumsum(frame_len)[:-1]))
        starts = packet_starts(np.zeros(frame_len.size, np.int64), frame_len, self.config.budget_a, 1,
                               np.empty(0, np.int64))
        counts = np.diff(np.append(starts, frame_len.size))
        arrival = at_ns + 1_000 * np.arange(starts.size, dtype=np.int64)
        before = np.concatenate(([0], np.cumsum(frame_len)))
        size = MOLD_HEADER + before[starts + counts] - before[starts]
        writer.write(schema.PACKETS, self.config.session,
                     self._packet_rows(_R, arrival, gap.first + starts, counts, size))
        self.truth.data_packets["R"] += int(starts.size)
        per_message = np.repeat(arrival, counts)
        self._deliver(writer, buf, frames + LENGTH_PREFIX_SIZE, gap.first + np.arange(frame_len.size),
                      np.full(frame_len.size, _R), per_message)
        return int(arrival[-1])

    def _finish(self, writer: _BackgroundWriter) -> None:
        self._resolve_gaps(writer, final=True)
        eos = []
        for feed in (_A, _B):
            last = self._last_send[feed]
            if last is None or (feed == _A and self.config.a_ends_after is not None):
                continue
            at = last[0] + NANOS_PER_SECOND * np.arange(1, 4, dtype=np.int64)
            eos.append(self._packet_rows(feed, at, np.full(3, last[1]), np.full(3, schema.END_OF_SESSION_COUNT),
                                         np.full(3, MOLD_HEADER)))
        if eos:
            writer.write(schema.PACKETS, self.config.session, pa.concat_tables(eos))


def _expand(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concat(arange(s, s + c) for s, c in zip(starts, counts))``, vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64)
    offsets = np.cumsum(counts) - counts
    return np.repeat(starts - offsets, counts) + np.arange(total, dtype=np.int64)


def _share_stamps(arrival: np.ndarray, catch_up: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Catch-up packets stamped alike in groups of ``group`` (the group's last stamp: arrivals stay FIFO), and
    a tie order per packet that lists each group in reverse sequence order."""
    arrival = arrival.copy()
    tie = np.zeros(arrival.size, np.int64)
    catch = np.flatnonzero(catch_up)
    for start in range(0, catch.size, group):
        members = catch[start:start + group]
        arrival[members] = arrival[members[-1]]
        tie[members] = np.arange(members.size)[::-1]
    return arrival, tie


def _last_timestamp(frames: np.ndarray) -> int:
    """ITCH timestamp of the last message of a chunk (the chunk is scanned from its start: frames chain)."""
    offsets, _ = scan_frames(frames.data, 0, 1 << 62)
    return itch.timestamp_of(frames.data, int(offsets[-1]) + LENGTH_PREFIX_SIZE)


def _catch_up(seg: _Segment, spec: FreezeSpec, cuts: np.ndarray) -> tuple[tuple[np.ndarray, ...], bool]:
    """Catch-up packets of a freeze: (starts, counts, send times) and whether the backlog drained in ``seg``.

    Messages with ITCH time >= ``at_ns`` are held; from ``at_ns + duration_ns`` a packet every interval takes
    what is queued (up to the catch-up budget, never across a cut) until nothing is waiting.
    """
    n = seg.size
    q = int(np.searchsorted(seg.ts, spec.at_ns, "left"))
    ends = np.cumsum(seg.frame_len)
    room = spec.catch_up_budget - MOLD_HEADER
    t = spec.at_ns + spec.duration_ns
    starts: list[int] = []
    counts: list[int] = []
    sends: list[int] = []
    cut_list = np.sort(cuts)
    while q < n:
        available = int(np.searchsorted(seg.ts, t, "right"))
        if available <= q:
            return (np.array(starts, np.int64), np.array(counts, np.int64), np.array(sends, np.int64)), True
        base = int(ends[q - 1]) if q else 0
        j = max(int(np.searchsorted(ends, base + room, "right")), q + 1)
        j = min(j, available)
        c = int(np.searchsorted(cut_list, q, "right"))
        if c < cut_list.size:
            j = min(j, int(cut_list[c]))
        starts.append(q)
        counts.append(j - q)
        sends.append(t)
        q = j
        t += spec.catch_up_interval_ns
    return (np.array(starts, np.int64), np.array(counts, np.int64), np.array(sends, np.int64)), False


def generate(config: ScenarioConfig, root: str | os.PathLike, *, progress: bool | None = None) -> ScenarioTruth:
    """Write the scenario's recording into ``root`` (created; must not already hold a recording)."""
    root = Path(root)
    if (root / schema.MARKER_FILE).exists():
        raise PipelineConfigError(f"{root} already holds a recording; choose an empty directory")
    return ScenarioGenerator(config).run(root, progress=progress)
