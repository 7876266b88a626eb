"""Head-end freezes and catch-up bursts: a feed silent while the other carries on, then a burst.

Detection is two-stage:

1. **Spark bins, driver scan: exact silences** - per feed, packets are binned by arrival in Spark (``bin_ns`` =
   ``min_silence_ns``) keeping each bin's first/last arrival and highest sequence; the bins (bounded by the
   recording's duration, not its size) are scanned on the driver. Consecutive non-empty bins give every
   silence ``>= min_silence_ns`` exactly (a silence that long always crosses a bin edge), with
   ``next_expected`` = 1 + the highest sequence the feed had sent before it. A silence is a **candidate** when
   the feed resumed at or before ``next_expected`` and the *other* feed had sent a sequence ``>=
   next_expected`` in a bin up to the bin of ``resume - min_lead_ns`` (an as-of running maximum over the
   other feed's bins: a superset of the exact rule below).
2. **Driver, exact rule and characterisation** (:func:`characterize`, numpy on the packets around the
   candidate): the other feed must deliver a message ``>= next_expected`` during ``(silence_start, resume -
   min_lead]`` - new data, and early enough that it is not just the usual A/B offset. A quiet market (both
   feeds silent) or the lagging feed's ordinary delay never qualifies.

Characterisation of a freeze on feed X against the other feed Y::

    silence   (silence_start, resume): X's last packet before, X's first packet after
    resumed   X must resume at or before next_expected: a freeze holds data; a feed that skips ahead lost it
              (that is an outage, reported by the gap tables)
    lateness  per X packet: arrival on X - arrival on Y of the packet's first message; baseline = median of
              X's packets in the ``pre_ns`` before the silence
    catch-up  from resume to the first X packet whose lateness is back within ``settle_ns`` of the baseline
    burst     X's packets in the catch-up: count, messages, messages per packet (vs. the baseline's), rate,
              stale messages (already delivered by Y before X's copy arrived)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from logbuf.pipeline.errors import PipelineConfigError
from logbuf.units import NANOS_PER_MILLI

MIN_SILENCE_FLOOR_NS = 10 * NANOS_PER_MILLI


@dataclass(frozen=True)
class FreezeParams:
    min_silence_ns: int = 50 * NANOS_PER_MILLI
    max_silence_ns: int = 10_000 * NANOS_PER_MILLI
    min_lead_ns: int = 20 * NANOS_PER_MILLI
    pre_ns: int = 100 * NANOS_PER_MILLI
    post_ns: int = 1_000 * NANOS_PER_MILLI
    settle_ns: int = 2 * NANOS_PER_MILLI
    max_freezes: int = 50

    def __post_init__(self) -> None:
        if not MIN_SILENCE_FLOOR_NS <= self.min_silence_ns <= self.max_silence_ns:
            raise PipelineConfigError(f"need {MIN_SILENCE_FLOOR_NS // NANOS_PER_MILLI} ms <= min_silence <= max_silence "
                             "(the silence is also the width of the arrival bins the driver scans)")
        if self.min_lead_ns < 0 or self.pre_ns <= 0 or self.post_ns <= 0 or self.settle_ns < 0:
            raise PipelineConfigError("min_lead_ns/settle_ns must be >= 0, pre_ns/post_ns > 0")
        if self.max_freezes < 1:
            raise PipelineConfigError("max_freezes must be >= 1")

    @property
    def bin_ns(self) -> int:
        """Arrival bins as wide as the shortest silence: a silence that long always crosses a bin edge, so the
        consecutive non-empty bins' last/first arrivals give every such silence exactly."""
        return self.min_silence_ns


@dataclass
class FeedPackets:
    """Data packets of one feed, sorted by arrival and, among packets sharing an arrival stamp, by first
    sequence (a catch-up burst can stamp several packets alike; the order must not depend on the input's)."""

    arrival: np.ndarray
    first: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, arrival: np.ndarray, first: np.ndarray, count: np.ndarray) -> FeedPackets:
        order = np.lexsort((np.asarray(first), np.asarray(arrival)))
        return cls(np.asarray(arrival, np.int64)[order], np.asarray(first, np.int64)[order],
                   np.asarray(count, np.int64)[order])

    @property
    def last(self) -> np.ndarray:
        return self.first + self.count - 1

    def first_arrival_of(self, sequences: np.ndarray) -> np.ndarray:
        """Earliest arrival of each sequence on this feed (int64 max when never received)."""
        never = np.iinfo(np.int64).max
        seqs = np.asarray(sequences, np.int64)
        if not self.first.size or not seqs.size:
            return np.full(seqs.size, never, np.int64)
        lo = int(min(self.first.min(), seqs.min()))
        hi = int(max(self.last.max(), seqs.max()))
        table = np.full(hi - lo + 1, never, np.int64)
        total = int(self.count.sum())
        offsets = np.cumsum(self.count) - self.count
        expanded = np.repeat(self.first - offsets, self.count) + np.arange(total, dtype=np.int64)
        np.minimum.at(table, expanded - lo, np.repeat(self.arrival, self.count))
        return table[seqs - lo]


@dataclass
class Freeze:
    feed: str
    silence_start_ns: int
    resume_ns: int
    silence_ms: float
    next_expected: int
    resume_sequence: int
    other_new_messages: int  # messages >= next_expected the other feed delivered during the silence
    catch_up_end_ns: int
    catch_up_ms: float
    settled: bool  # False: lateness never returned to the baseline inside the examined window
    burst_packets: int
    burst_messages: int
    burst_messages_per_packet: float
    baseline_messages_per_packet: float
    burst_rate_msgs_per_s: float
    baseline_lateness_ms: float
    peak_lateness_ms: float
    held_first: int
    held_last: int
    stale_messages: int

    def as_dict(self) -> dict:
        return asdict(self)


def other_carried_on(y: FeedPackets, silence_start: int, resume: int, next_expected: int,
                     params: FreezeParams) -> int:
    """Messages >= next_expected that Y delivered in (silence_start, resume - min_lead]; 0: not a freeze."""
    sel = (y.arrival > silence_start) & (y.arrival <= resume - params.min_lead_ns) & (y.last >= next_expected)
    if not sel.any():
        return 0
    return int(np.sum(y.last[sel] - np.maximum(y.first[sel], next_expected) + 1))


def characterize(feed: str, x: FeedPackets, y: FeedPackets, silence_start: int, resume: int, next_expected: int,
                 params: FreezeParams) -> Freeze | None:
    """The freeze of feed ``feed`` (packets ``x``) against the other feed ``y``, or None if it is not one."""
    new_on_y = other_carried_on(y, silence_start, resume, next_expected, params)
    if new_on_y == 0:
        return None
    after = np.flatnonzero(x.arrival >= resume)
    if not after.size:
        return None
    first_after = int(after[0])
    resume_seq = int(x.first[first_after])
    if resume_seq > next_expected:
        return None  # it skipped data: an outage with a gap (see the gap tables), not a freeze
    y_arrival = y.first_arrival_of(x.first)
    never = np.iinfo(np.int64).max
    lateness = np.where(y_arrival == never, np.iinfo(np.int64).min, x.arrival - y_arrival)
    known = y_arrival != never
    before = np.flatnonzero((x.arrival <= silence_start) & (x.arrival >= silence_start - params.pre_ns))
    base_known = before[known[before]]
    baseline = float(np.median(lateness[base_known])) if base_known.size else 0.0
    baseline_mpp = float(x.count[before].mean()) if before.size else float("nan")
    # catch-up ends at the first packet (from the resume on) whose lateness is back near the baseline
    settled_at = np.flatnonzero(known[after] & (lateness[after] <= baseline + params.settle_ns))
    settled = bool(settled_at.size)
    end_index = int(after[settled_at[0]]) if settled else int(after[-1])
    burst = np.arange(first_after, end_index + 1)
    if settled and end_index > first_after:
        burst = np.arange(first_after, end_index)  # the settled packet is live again, not part of the burst
    end_ns = int(x.arrival[burst[-1]])
    messages = int(x.count[burst].sum())
    duration = end_ns - resume
    seqs = np.concatenate([np.arange(f, f + c) for f, c in zip(x.first[burst], x.count[burst], strict=True)])
    y_seq = y.first_arrival_of(seqs)
    x_seq = np.repeat(x.arrival[burst], x.count[burst])
    stale = int(np.sum(y_seq < x_seq))
    peak = lateness[after][known[after]]
    return Freeze(
        feed=feed,
        silence_start_ns=int(silence_start),
        resume_ns=int(resume),
        silence_ms=(resume - silence_start) / NANOS_PER_MILLI,
        next_expected=int(next_expected),
        resume_sequence=resume_seq,
        other_new_messages=new_on_y,
        catch_up_end_ns=end_ns,
        catch_up_ms=duration / NANOS_PER_MILLI,
        settled=settled,
        burst_packets=int(burst.size),
        burst_messages=messages,
        burst_messages_per_packet=messages / burst.size,
        baseline_messages_per_packet=baseline_mpp,
        burst_rate_msgs_per_s=messages / (duration / 1e9) if duration > 0 else float("inf"),
        baseline_lateness_ms=baseline / NANOS_PER_MILLI,
        peak_lateness_ms=float(peak.max()) / NANOS_PER_MILLI if peak.size else float("nan"),
        held_first=int(next_expected),
        held_last=int(x.last[burst].max()),
        stale_messages=stale,
    )


# ---- Spark: candidates ----------------------------------------------------------------------------------


_SEQUENCE_SCALE = 10**20
_SEQUENCE_SHIFT = 2**63  # makes every int64 sequence non-negative


def feed_bins(packets, t0: int, params: FreezeParams):
    """One pass over all packets: per (feed, bin of ``bin_ns``) the data packets' first/last arrival, highest
    sequence, first packet's sequence, lowest sequence, packets, messages, bytes; and the control packets'
    count and highest ``next expected - 1``. Feeds the freeze search, the rate series and the sequence domain."""
    from pyspark.sql import functions as F

    data = (F.col("count") >= 1) & (F.col("count") <= 0xFFFE)
    arrival = F.when(data, F.col("arrival_ns"))
    # (arrival within its bin, sequence) in one decimal: the offset is below bin_ns (<= 10 s), the shifted
    # sequence below 2^64 < _SEQUENCE_SCALE, so the key orders exactly as the pair and fits 38 digits
    dec = "decimal(38,0)"
    offset = F.expr(f"(arrival_ns - {int(t0)}) % {params.bin_ns}")
    scale, shift = F.expr(f"CAST('{_SEQUENCE_SCALE}' AS {dec})"), F.expr(f"CAST('{_SEQUENCE_SHIFT}' AS {dec})")
    first_key = offset.cast(dec) * scale + F.col("sequence").cast(dec) + shift
    return (packets
            .groupBy("feed", F.expr(f"(arrival_ns - {int(t0)}) div {params.bin_ns}").alias("bin"))
            .agg(F.min(arrival).alias("min_arrival"), F.max(arrival).alias("max_arrival"),
                 F.max(F.when(data, F.col("sequence") + F.col("count") - 1)).alias("max_last"),
                 # the bin's first packet: earliest arrival, ties broken by sequence (min_by breaks none), as
                 # the minimum of one fixed-width key (a struct minimum would force a sort-based aggregate)
                 ((F.min(F.when(data, first_key)) % scale) - shift).cast("long")
                 .alias("first_sequence"),
                 F.min(F.when(data, F.col("sequence"))).alias("min_first"),
                 F.sum(F.when(data, 1).otherwise(0)).alias("packets"),
                 F.sum(F.when(data, F.col("count")).otherwise(0)).alias("messages"),
                 F.sum(F.when(data, F.col("bytes")).otherwise(0)).alias("bytes"),
                 F.sum(F.when(~data, 1).otherwise(0)).alias("control_packets"),
                 F.max(F.when(~data, F.col("sequence") - 1)).alias("control_last")))


def candidates(bins, t0: int, params: FreezeParams):
    """Silences after which a live feed resumed where it stopped (a freeze holds data; a feed that skips ahead
    lost it) while the other feed was ahead (see module doc), from the collected bins of :func:`feed_bins`.

    Columns: feed, silence_start, resume, next_expected, other_ahead (how far the other feed was ahead, at bin
    resolution: real freezes rank first). The bins are few (one per ``bin_ns`` of arrival time per feed, so at
    most ~1.2 M per feed for a 16-hour day at 50 ms), which is why this runs on the driver. ``bins`` and the
    result are pandas DataFrames.
    """
    import pandas as pd

    out = []
    live = bins[bins["feed"].isin(["A", "B"]) & (bins["packets"] > 0)]
    per_feed = {feed: frame.sort_values("bin") for feed, frame in live.groupby("feed")}
    for x, y in (("A", "B"), ("B", "A")):
        if x not in per_feed or y not in per_feed:
            continue
        xs, ys = per_feed[x], per_feed[y]
        col = {name: xs[name].to_numpy(dtype=np.int64) for name in ("min_arrival", "max_arrival", "max_last",
                                                                    "first_sequence")}
        min_arrival, max_arrival = col["min_arrival"], col["max_arrival"]
        sent = np.maximum.accumulate(col["max_last"])
        silence = min_arrival[1:] - max_arrival[:-1]
        next_expected = sent[:-1] + 1
        resumed_in_place = col["first_sequence"][1:] <= next_expected
        keep = (silence >= params.min_silence_ns) & (silence <= params.max_silence_ns) & resumed_in_place
        if not keep.any():
            continue
        resume, start, nxt = min_arrival[1:][keep], max_arrival[:-1][keep], next_expected[keep]
        # as-of: the other feed's highest sequence in its bins up to the bin of (resume - min_lead)
        y_bins = ys["bin"].to_numpy(dtype=np.int64)
        y_sent = np.maximum.accumulate(ys["max_last"].to_numpy(dtype=np.int64))
        at = np.searchsorted(y_bins, (resume - params.min_lead_ns - t0) // params.bin_ns, side="right") - 1
        other = np.where(at >= 0, y_sent[np.maximum(at, 0)], np.iinfo(np.int64).min)
        ahead = other >= nxt
        out.append(pd.DataFrame({"feed": x, "silence_start": start[ahead], "resume": resume[ahead],
                                 "next_expected": nxt[ahead], "other_ahead": (other - nxt + 1)[ahead]}))
    columns = ["feed", "silence_start", "resume", "next_expected", "other_ahead"]
    if not out:
        return pd.DataFrame(columns=columns)
    found = pd.concat(out, ignore_index=True)
    return found.sort_values(["other_ahead", "resume"], ascending=[False, True]).reset_index(drop=True)
