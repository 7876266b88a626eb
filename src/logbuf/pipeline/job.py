"""``logbuf analyze``: a recording -> feed-quality tables, plots and a one-page report (PySpark).

Runs embedded (``local[*]``) from ``logbuf analyze``, and unchanged on a cluster through spark-submit
(client mode: the driver writes OUT on the submitting machine)::

    spark-submit --master spark://HOST:7077 src/logbuf/pipeline/job.py RECORDING OUT [options]

Stages (each is one or a few Spark jobs; results small enough for the driver are collected as Arrow). With
the direct reader (``--reader arrow``, the default for a local recording: :mod:`logbuf.pipeline.direct`) the
tasks read their Parquet row groups with pyarrow and the pieces need no shuffle; with Spark's reader
(``--reader spark``) the stages work on Spark DataFrames as described here:

    read       one scan of the packets into per-(feed, arrival bin) aggregates (kept for the time series and the
               freeze search), the sequence domain and per-feed counts from them, the handler's gap events
    sequence   packet ranges cut at bucket edges, partitioned by bucket, summarised per partition in numpy
               (:mod:`logbuf.pipeline.arrivals`), ONE pass: A-B delay histogram and distinct delays (summed
               across partitions in Spark), per-feed gaps, copies, earliest feed, ranges lost on both
    quantiles  exact nearest-rank percentiles of the A-B delay from the distinct delays
               (:mod:`logbuf.pipeline.quantiles`; refined in Spark when too many to collect)
    time       message rate, messages per packet and highest sequence per window, from the bins
    freezes    silences with the other feed ahead -> characterised on the driver (:mod:`logbuf.pipeline.freezes`)
    messages   one scan (GROUPING SETS): ITCH type mix, most active symbols, delivered copy per feed per window
    gaps       gaps on both feeds: data-derived ranges joined with the handler's events and re-request answers
    output     Parquet + CSV tables, PNG plots, report.md, summary.json

Memory: the driver holds only small results (the distinct delays up to EXACT_COLLECT of them); the merged
output of the per-message pass is persisted MEMORY_AND_DISK, so a heap smaller than it spills to the local dir
instead of failing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from logbuf.pipeline import arrivals, direct
from logbuf.pipeline.freezes import FeedPackets, Freeze, candidates, characterize, feed_bins
from logbuf.pipeline.options import AnalyzeConfig, add_arguments, config_from_args
from logbuf.pipeline.quantiles import exact_quantiles, quantiles_of_counts
from logbuf.pipeline.storage import Location, Staging, check_output
from logbuf.recording import schema
from logbuf.units import NANOS_PER_MILLI, NANOS_PER_SECOND

# nice window lengths for the time series (multiples of the default freeze bin of 12.5 ms)
_WINDOWS_MS = (100, 250, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000)
STAGES = ("read", "sequence", "quantiles", "time", "freezes", "messages", "gaps", "output")
TARGET_MESSAGES_PER_PARTITION = 4_000_000
# distinct A-B delays collected to the driver for the exact percentiles (16 bytes each); more are refined in Spark
EXACT_COLLECT = 8_000_000


@dataclass
class Domain:
    first: int
    last: int
    start_ns: int
    end_ns: int
    feeds: dict[str, dict]


@dataclass
class AnalysisResult:
    out: Path  # where the job wrote (OUT itself when local; for a remote OUT, a temp dir already removed)
    session: str
    summary: dict
    tables: dict[str, object]  # name -> pandas DataFrame
    plots: dict[str, Path]
    report: Path
    timings: dict[str, float]
    delay_percentiles: dict[float, int]  # fraction -> exact nearest-rank delay (ns)
    delay_stats: dict


# ---- helpers --------------------------------------------------------------------------------------------


def _arrow(df) -> pa.Table:
    return df.toArrow()


def _utc(ns: int | None) -> str:
    if ns is None or ns < 0:
        return ""
    import datetime as dt

    moment = dt.datetime.fromtimestamp(ns // NANOS_PER_SECOND, tz=dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{ns % NANOS_PER_SECOND:09d}Z"


def choose_window(span_ns: int, bin_ns: int) -> int:
    """At most 1500 windows over the span (first to last arrival), the shortest of a list of round lengths
    that is a multiple of the freeze bin: a 61 s recording gets 100 ms windows, a 6.5 h day 30 s ones."""
    for ms in _WINDOWS_MS:
        window = ms * NANOS_PER_MILLI
        if window % bin_ns == 0 and span_ns / window <= 1_500:
            return window
    return _WINDOWS_MS[-1] * NANOS_PER_MILLI


# Time bins and windows count from the Unix epoch: every window length divides an hour, so they line up with
# the hour partitions without reading them, and the origin never depends on where the recording is stored.
TIME_ORIGIN_NS = 0


def ended_early(domain: Domain) -> dict[str, int]:
    """Live feeds that went off the air before the session's end: feed -> its last sequence.  A feed's tail
    is "ended early" (not lost) when it carried nothing past its last data packet, not even a heartbeat or an
    end-of-session packet announcing later sequences - the feed (or its recording) stopped there."""
    out = {}
    for feed in schema.LIVE_FEEDS:
        info = domain.feeds.get(feed) or {}
        last = info.get("last")
        if last is None or last >= domain.last:
            continue
        control = info.get("control_last")
        if control is None or control <= last:
            out[feed] = int(last)
    return out


def project_packets(packets):
    """The packet columns every stage needs, read once: persisted, then bins, pieces and freezes come from it."""
    return packets.select("feed", "arrival_ns", "sequence", "count", "bytes")


def _data_packets(packets):
    from pyspark.sql import functions as F

    return packets.where((F.col("count") >= 1) & (F.col("count") <= schema.MAX_DATA_COUNT))


# ---- stages ---------------------------------------------------------------------------------------------


def read_domain(bins: pd.DataFrame) -> Domain:
    """Sequence domain and per-feed counts, from the collected per-bin aggregates of :func:`freezes.feed_bins`."""
    feeds = {}
    live: list[tuple[int, int, int, int]] = []  # (first, last, start_ns, end_ns) of each feed with data packets
    control_lasts: list[int] = []
    for feed, g in bins.groupby("feed"):
        data = g[g["packets"] > 0]
        control = g["control_last"].dropna()
        span = None
        if len(data):
            span = (int(data["min_first"].min()), int(data["max_last"].max()), int(data["min_arrival"].min()),
                    int(data["max_arrival"].max()))
            live.append(span)
        control_last = int(control.max()) if len(control) else None
        if control_last:
            control_lasts.append(control_last)
        feeds[feed] = {
            "data_packets": int(g["packets"].sum()), "control_packets": int(g["control_packets"].sum()),
            "messages": int(g["messages"].sum()), "bytes": int(g["bytes"].sum()),
            "first": span[0] if span else None,
            "last": span[1] if span else None,
            "control_last": control_last,
            "start_ns": span[2] if span else None,
            "end_ns": span[3] if span else None,
        }
    if not live:
        raise schema.RecordingFormatError("the recording has no data packets for this session")
    return Domain(first=min(s[0] for s in live), last=max([s[1] for s in live] + control_lasts),
                  start_ns=min(s[2] for s in live), end_ns=max(s[3] for s in live), feeds=feeds)


def sequence_pieces(packets, bucket_size: int, partitions: int):
    """Data-packet ranges cut at bucket edges, hash-partitioned by bucket (feeds coded A=0, B=1, R=2)."""
    from pyspark.sql import functions as F

    w = bucket_size
    code = (F.when(F.col("feed") == "A", 0).when(F.col("feed") == "B", 1)
            .when(F.col("feed") == "R", 2)).cast("byte")
    ranges = (_data_packets(packets)
              .select(code.alias("feed"), "arrival_ns", F.col("sequence").alias("first"),
                      (F.col("sequence") + F.col("count") - 1).alias("last"))
              .where(F.col("feed").isNotNull()))
    split = ranges.select("*", F.explode(F.sequence(F.expr(f"first div {w}"), F.expr(f"last div {w}")))
                          .alias("bucket"))
    return (split.select("bucket", "feed", "arrival_ns",
                         F.greatest("first", F.col("bucket") * w).alias("lo"),
                         F.least("last", F.col("bucket") * w + (w - 1)).alias("hi"))
            .repartition(partitions, "bucket"))


def _pass_schema():
    from pyspark.sql.types import ByteType, LongType, StructField, StructType

    return StructType([StructField("kind", ByteType()), StructField("feed", ByteType())]
                      + [StructField(c, LongType()) for c in (*"abcde", arrivals.ROW_KEY)])


def _merge_pass_rows(rows):
    """Output rows of the per-message pass, rows alike across partitions merged in Spark (histogram bins and
    distinct delays summed: see :func:`arrivals.keyed`)."""
    from pyspark.sql import functions as F

    return (rows.groupBy("kind", "feed", arrivals.ROW_KEY, "a", "c", "d", "e")
            .agg(F.sum("b").alias("b")).select("kind", "feed", *"abcde"))


def _run_pieces(pieces, params: arrivals.Params):
    """The per-message pass over ``pieces`` (a Spark DataFrame of its output rows), merged across partitions."""
    return _merge_pass_rows(pieces.mapInArrow(partial(arrivals.map_partition, params=params), _pass_schema()))


def _direct_pass(spark, recording: Location, tasks: list, params: arrivals.Params):
    """The per-message pass with the direct reader: task i reads its row groups and summarises its buckets."""
    w = params.bucket_size

    def body(index: int):
        task = tasks[index]
        table = direct.pieces(direct.read(recording, task.groups, direct.PIECE_COLUMNS), task, w)
        if not table.num_rows:
            return []
        return arrivals.keyed(arrivals.summarize(table, params), index)

    return _merge_pass_rows(direct.run_tasks(spark, tasks, body, arrivals.ROW_KEY_SCHEMA))


def _kind(table: pa.Table, kind: int) -> dict[str, np.ndarray]:
    rows = table.filter(pc.equal(table.column("kind"), kind))
    return {name: rows.column(name).to_numpy() for name in ("feed", "a", "b", "c", "d", "e")}


def merge_feed_gaps(gap_rows: dict[str, np.ndarray], head_rows: dict[str, np.ndarray],
                    domain_last: int) -> list[dict]:
    """Gap pieces (cut at bucket edges) -> whole gaps per feed, dated by the packet after each gap."""
    heads = {(int(f), int(s)): int(t) for f, s, t in zip(head_rows["feed"], head_rows["a"], head_rows["b"],
                                                         strict=True)}
    order = np.lexsort((gap_rows["a"], gap_rows["feed"]))
    merged: list[dict] = []
    for i in order.tolist():
        feed, first, last = int(gap_rows["feed"][i]), int(gap_rows["a"][i]), int(gap_rows["b"][i])
        detected, filled, unfilled = int(gap_rows["c"][i]), int(gap_rows["d"][i]), int(gap_rows["e"][i])
        if merged and merged[-1]["_feed"] == feed and merged[-1]["last"] + 1 == first:
            g = merged[-1]
            g["last"] = last
            g["detected_ns"] = detected
            g["filled_ns"] = max(g["filled_ns"], filled)
            g["unfilled"] += unfilled
        else:
            merged.append({"_feed": feed, "feed": arrivals.FEED_NAMES[feed], "first": first, "last": last,
                           "detected_ns": detected, "filled_ns": filled, "unfilled": unfilled})
    for g in merged:
        if g["detected_ns"] == arrivals.NONE and g["last"] < domain_last:
            g["detected_ns"] = heads.get((g["_feed"], g["last"] + 1), arrivals.NONE)
        g["size"] = g["last"] - g["first"] + 1
        if g["unfilled"] == g["size"]:
            g["filled_ns"] = arrivals.NONE
        del g["_feed"]
    return merged


def refined_quantiles(exact, qs, lows: np.ndarray, highs: np.ndarray, counts: np.ndarray, *,
                      max_collect: int, split: int = 4096) -> dict[float, int]:
    """Exact nearest-rank quantiles of the distribution in ``exact`` (a Spark DataFrame of distinct ``value``
    and its ``messages``) given its histogram (``lows``/``highs``/``counts``): bins refined in Spark, values
    collected only for bins holding at most ``max_collect`` messages."""
    from pyspark.sql import functions as F

    def within(ranges):
        cond = F.lit(False)
        for lo, hi in ranges:
            cond = cond | F.col("value").between(int(lo), int(hi))
        return exact.where(cond)

    def fetch_values(ranges):
        table = _arrow(within(ranges).select("value", "messages"))
        return np.repeat(table.column("value").to_numpy(), table.column("messages").to_numpy())

    def fetch_histogram(ranges, split):
        # sub-bin j of [lo, hi] cut in `parts` (quantiles._sub_bounds): j = ((v - lo + 1) * parts - 1) div span,
        # in decimals so that no product overflows
        dec = "decimal(38,0)"
        index = F.lit(None).cast("int")
        sub = F.lit(None).cast("long")
        for i, (lo, hi) in enumerate(ranges):
            span = hi - lo + 1
            parts = min(split, span)
            inside = F.col("value").between(int(lo), int(hi))
            j = F.floor(((F.col("value").cast(dec) - F.expr(f"CAST('{lo}' AS {dec})") + 1) * parts - 1)
                        / F.expr(f"CAST('{span}' AS {dec})")).cast("long")
            index = F.when(inside, F.lit(i)).otherwise(index)
            sub = F.when(inside, j).otherwise(sub)
        grouped = _arrow(within(ranges).select(index.alias("range"), sub.alias("sub"), "messages")
                         .groupBy("range", "sub").agg(F.sum("messages").alias("messages")))
        ranges_of = grouped.column("range").to_numpy()
        out = []
        for i in range(len(ranges)):
            sel = ranges_of == i
            sub_counts = np.zeros(split, np.int64)
            np.add.at(sub_counts, grouped.column("sub").to_numpy()[sel], grouped.column("messages").to_numpy()[sel])
            out.append(sub_counts)
        return out

    return exact_quantiles(qs, lows, highs, counts, fetch_values, fetch_histogram, max_collect=max_collect,
                           split=split)


class Analysis:
    """One run of the analytics over one session of one recording."""

    def __init__(self, spark, recording: str | os.PathLike | Location, out: str | os.PathLike | Location,
                 config: AnalyzeConfig, progress=None) -> None:
        from logbuf.pipeline import sources
        from logbuf.pipeline.progress import StageProgress

        self.spark = spark
        self.recording = recording if isinstance(recording, Location) else Location.parse(recording)
        self.destination = out if isinstance(out, Location) else Location.parse(out)
        self.staging = Staging(self.destination)
        self.out = self.staging.dir  # written here (OUT itself when local), published to OUT at the end
        self.config = config
        self.session = sources.pick_session(self.recording, config.session)
        self.progress = progress or StageProgress(list(STAGES), spark, mode="off")
        self.src = sources.load(spark, self.recording, self.session)
        self.summary: dict = {"session": self.session, "recording": self.recording.spark_uri}
        self.tables: dict[str, pd.DataFrame] = {}
        self.detail: dict = {}
        # the direct reader (pipeline.direct): row groups read by pyarrow inside the Spark tasks
        self.direct = config.reader == "arrow" or (config.reader == "auto" and self.recording.is_local)
        self.summary["reader"] = "arrow" if self.direct else "spark"

    def _task_rows(self, groups: list) -> int:
        """Rows per task of the direct reader: two tasks per core at least, at most ~4 M rows each."""
        total = sum(g.rows for g in groups)
        cores = self.spark.sparkContext.defaultParallelism
        return max(1, min(4_000_000, math.ceil(total / (2 * cores))))

    def _direct_bins(self) -> pa.Table:
        self.packet_groups = direct.row_groups(self.recording, schema.PACKETS, self.session, "sequence")
        tasks = direct.batches(self.packet_groups, self._task_rows(self.packet_groups))
        recording, t0, bin_ns = self.recording, self.t0, self.config.freeze.bin_ns

        def body(index: int):
            return [direct.bins(direct.read(recording, tasks[index], direct.PACKET_COLUMNS), t0, bin_ns)]

        return direct.merge_bins(direct.collect_tasks(self.spark, tasks, body, direct.BIN_SCHEMA))

    # -- stages

    def run(self) -> AnalysisResult:
        started = time.perf_counter()
        stage = self.progress.stage
        with stage("read"):
            from pyspark import StorageLevel

            self.t0 = TIME_ORIGIN_NS
            # the packets projected once; every later product is derived from this one DataFrame. Persisted
            # when re-reading costs more than caching: remote storage (auto) or --cache-packets yes. On local
            # disk Spark re-reads the projected Parquet columns faster than it builds its row-based cache
            # (50 M messages, 2 cores: read stage 42 s without, 144 s with).
            self.packets = project_packets(self.src.packets)
            cache = self.config.cache_packets
            if not self.direct and (cache is True or (cache is None and not self.recording.is_local)):
                self.packets = self.packets.persist(StorageLevel.MEMORY_AND_DISK)
            # bounded by the recording's duration (one row per feed and bin_ns), not by its size
            bins = self._direct_bins() if self.direct else _arrow(feed_bins(self.packets, self.t0,
                                                                              self.config.freeze))
            self.bins = bins.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
            self.domain = read_domain(self.bins)
            self.ended = ended_early(self.domain)
            self.handler_gaps = _arrow(self.src.gaps.drop(*schema.PARTITION_COLUMNS)).to_pandas(
                types_mapper={pa.int64(): pd.Int64Dtype()}.get)  # nullable ints stay exact
            # sized from the first arrival, not the hour's start: a minute recorded at 14:59 is a minute long
            span = self.domain.end_ns - self.domain.start_ns
            self.window_ns = self.config.window_ns or choose_window(max(span, 1), self.config.freeze.bin_ns)
        with stage("sequence"):
            self._sequence_space()
        with stage("quantiles"):
            self._quantiles()
            self.merged.unpersist()
        with stage("time"):
            self._time_series()
        with stage("freezes"):
            self._freezes()
        with stage("messages"):
            self._messages()
        with stage("gaps"):
            self._both_gaps()
        with stage("output"):
            self.packets.unpersist()
            result = self._output(time.perf_counter() - started)
        return result

    def _sequence_space(self) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        d = self.domain
        size = d.last - d.first + 1
        cores = self.spark.sparkContext.defaultParallelism
        partitions = self.config.sequence_partitions or max(
            2 * cores, math.ceil(size / TARGET_MESSAGES_PER_PARTITION))
        partitions = min(partitions, max(1, math.ceil(size / self.config.bucket_size)))
        if not self.config.sequence_partitions and partitions > cores:  # whole waves: no core idles at the end
            partitions = math.ceil(partitions / cores) * cores
        live_end = tuple(self.ended.get(f, d.last) for f in schema.LIVE_FEEDS)
        self.params = arrivals.Params(self.config.bucket_size, d.first, d.last, live_end=live_end)
        # the per-message pass runs ONCE: its merged output (small rows plus one row per distinct delay) is
        # persisted, and the exact percentiles come from the distinct delays, not from another pass
        if self.direct:
            tasks = direct.plan_pieces(self.packet_groups, d.first, d.last, self.config.bucket_size, partitions)
            passed = _direct_pass(self.spark, self.recording, tasks, self.params)
        else:
            passed = _run_pieces(sequence_pieces(self.packets, self.config.bucket_size, partitions), self.params)
        self.merged = passed.persist(StorageLevel.MEMORY_AND_DISK)
        rows = _arrow(self.merged.where(F.col("kind") != arrivals.EXACT))
        self.distinct_delays = self.merged.where(F.col("kind") == arrivals.EXACT).count()
        hist = _kind(rows, arrivals.HIST)
        order = np.argsort(hist["a"], kind="stable")
        self.delay_bins, self.delay_counts = hist["a"][order], hist["b"][order]
        delay = _kind(rows, arrivals.DELAY)
        n = int(delay["a"].sum())
        self.delay_stats = {
            "messages_on_both": n,
            "mean_ns": float(delay["b"].sum()) / n if n else None,
            "min_ns": int(delay["c"].min()) if n else None,
            "max_ns": int(delay["d"].max()) if n else None,
        }
        stats = _kind(rows, arrivals.STATS)
        per_feed: dict[str, dict] = {}
        for code, name in enumerate(arrivals.FEED_NAMES):
            sel = stats["feed"] == code
            copies, distinct = int(stats["a"][sel].sum()), int(stats["b"][sel].sum())
            per_feed[name] = {"messages_received": copies, "distinct": distinct, "duplicates": copies - distinct}
            if name in schema.LIVE_FEEDS:
                per_feed[name].update(missing=size - distinct, earliest=int(stats["c"][sel].sum()))
        self.feed_stats = per_feed
        self.feed_gaps = merge_feed_gaps(_kind(rows, arrivals.GAP), _kind(rows, arrivals.HEAD), d.last)
        self.lost_on_both = arrivals.merge_lost_on_both(_kind(rows, arrivals.BOTH))

    def _quantiles(self) -> None:
        """Exact nearest-rank percentiles from the distinct delays of the per-message pass: collected when they
        are few enough (the usual case: delays spread over a bounded range), else refined in Spark over the
        persisted distinct delays (never another pass over the messages)."""
        from pyspark.sql import functions as F

        p = self.params.precision_bits
        if not self.delay_counts.size:
            self.delay_percentiles = {}
            return
        exact = self.merged.where(F.col("kind") == arrivals.EXACT).select(
            F.col("a").alias("value"), F.col("b").alias("messages"))
        if self.distinct_delays <= max(self.config.max_collect, EXACT_COLLECT):
            table = _arrow(exact)
            self.delay_percentiles = quantiles_of_counts(self.config.percentiles, table.column("value").to_numpy(),
                                                         table.column("messages").to_numpy())
            return
        lows, highs = arrivals.bin_bounds(self.delay_bins, p)
        self.delay_percentiles = refined_quantiles(exact, self.config.percentiles, lows, highs, self.delay_counts,
                                                   max_collect=self.config.max_collect)

    def _time_series(self) -> None:
        from pyspark.sql import functions as F

        params = self.config.freeze
        if self.window_ns % params.bin_ns == 0:
            live = self.bins[self.bins["feed"].isin(["A", "B"]) & (self.bins["packets"] > 0)]
            frame = (live.assign(window=live["bin"] // (self.window_ns // params.bin_ns))
                     .groupby(["feed", "window"], as_index=False)
                     .agg(packets=("packets", "sum"), messages=("messages", "sum"), bytes=("bytes", "sum"),
                          max_sequence=("max_last", "max")))
        else:  # a window that is not a whole number of bins: from the packets themselves
            rates = (_data_packets(self.packets).where(F.col("feed").isin("A", "B"))
                     .groupBy("feed", F.expr(f"(arrival_ns - {self.t0}) div {self.window_ns}").alias("window"))
                     .agg(F.count("*").alias("packets"), F.sum("count").alias("messages"),
                          F.sum("bytes").alias("bytes"),
                          F.max(F.col("sequence") + F.col("count") - 1).alias("max_sequence")))
            frame = _arrow(rates).to_pandas()
        frame = frame.astype({c: "int64" for c in ("window", "packets", "messages", "bytes", "max_sequence")})
        frame = frame.sort_values(["window", "feed"]).reset_index(drop=True)
        frame.insert(0, "window_start_ns", self.t0 + frame["window"].astype("int64") * self.window_ns)
        frame = frame.drop(columns="window")
        seconds = self.window_ns / NANOS_PER_SECOND
        frame["messages_per_s"] = frame["messages"] / seconds
        # a window without data packets has no messages per packet (not an infinite number of them)
        frame["messages_per_packet"] = frame["messages"] / frame["packets"].where(frame["packets"] > 0)
        self.tables["rates"] = frame

    def _freezes(self) -> None:
        from pyspark.sql import functions as F

        params = self.config.freeze
        found = candidates(self.bins, self.t0, params)
        self.freeze_candidates_truncated = len(found) > params.max_freezes
        # the feed letter stays a str, every other column becomes an exact int
        rows: list[dict[str, Any]] = [{k: v if k == "feed" else int(v) for k, v in r.items()}
                                      for r in found.head(params.max_freezes).to_dict("records")]
        self.freeze_candidates = len(rows)
        freezes: list[Freeze] = []
        windows: list[dict] = []
        if rows:
            spans = [(F.col("arrival_ns") >= r["silence_start"] - params.pre_ns)
                     & (F.col("arrival_ns") <= r["resume"] + params.post_ns) for r in rows]
            cond = spans[0]
            for span in spans[1:]:
                cond = cond | span
            # only the hour partitions the windows touch are read (a packet's hour is its arrival's UTC hour)
            hours = sorted({schema.hour_label(h * schema.NANOS_PER_HOUR) for r in rows
                            for h in range((r["silence_start"] - params.pre_ns) // schema.NANOS_PER_HOUR,
                                           (r["resume"] + params.post_ns) // schema.NANOS_PER_HOUR + 1)})
            if self.direct:
                near = self._direct_near(np.array([(r["silence_start"] - params.pre_ns, r["resume"] + params.post_ns)
                                                   for r in rows], np.int64))
            else:
                source = self.src.packets.where(F.col(schema.HOUR_COLUMN).isin(hours))
                near = (_arrow(_data_packets(project_packets(source)).where(cond)
                               .select("feed", "arrival_ns", "sequence", "count")).to_pandas())
            for r in sorted(rows, key=lambda r: r["silence_start"]):
                lo, hi = r["silence_start"] - params.pre_ns, r["resume"] + params.post_ns
                part = near[(near["arrival_ns"] >= lo) & (near["arrival_ns"] <= hi)]
                packets = {f: FeedPackets.of(g["arrival_ns"].to_numpy(), g["sequence"].to_numpy(),
                                             g["count"].to_numpy()) for f, g in part.groupby("feed")}
                x, y = r["feed"], "B" if r["feed"] == "A" else "A"
                if x not in packets or y not in packets:
                    continue
                freeze = characterize(x, packets[x], packets[y], r["silence_start"], r["resume"],
                                      r["next_expected"], params)
                if freeze is not None:
                    freezes.append(freeze)
                    windows.append({"freeze": freeze, "packets": packets})


        columns = list(Freeze.__dataclass_fields__)
        frame = pd.DataFrame([f.as_dict() for f in freezes], columns=columns)
        frame["silence_start_utc"] = [_utc(v) for v in frame["silence_start_ns"]]
        self.tables["freezes"] = frame
        self.detail["freeze_windows"] = windows

    def _direct_near(self, windows: np.ndarray) -> pd.DataFrame:
        """The data packets inside the arrival windows, from the row groups whose arrivals overlap them."""
        groups = [g for g in direct.row_groups(self.recording, schema.PACKETS, self.session, "arrival_ns")
                  if any(g.overlaps(lo, hi) for lo, hi in windows.tolist())]
        tasks = direct.batches(groups, self._task_rows(groups))
        recording = self.recording

        def body(index: int):
            return [direct.near(direct.read(recording, tasks[index], direct.PIECE_COLUMNS), windows)]

        return direct.collect_tasks(self.spark, tasks, body, direct.NEAR_SCHEMA).to_pandas()

    def _direct_message_rows(self) -> pd.DataFrame:
        groups = direct.row_groups(self.recording, schema.MESSAGES, self.session)
        tasks = direct.batches(groups, self._task_rows(groups))
        recording, t0, window_ns = self.recording, self.t0, self.window_ns

        def body(index: int):
            table = direct.read(recording, tasks[index], direct.MESSAGE_COLUMNS)
            return [direct.message_counts(table, t0, window_ns)]

        partials = direct.collect_tasks(self.spark, tasks, body, direct.MESSAGE_SCHEMA)
        return direct.merge_message_counts(partials).to_pandas()

    def _messages(self) -> None:
        """Type mix, symbols and wins per window from ONE scan of the messages (GROUPING SETS)."""

        if self.direct:
            self._message_tables(self._direct_message_rows())
            return
        view = f"logbuf_messages_{id(self)}"
        self.src.messages.createOrReplaceTempView(view)
        # every aggregate has a fixed-width buffer (a string max would force a slow sort-based aggregate):
        # the symbol name is a grouping key of the per-symbol set instead
        grouped = self.spark.sql(f"""
            SELECT grouping_id(type, stock_locate, stock, window, feed) AS gid,
                   type, stock_locate, stock, window, feed, count(*) AS messages,
                   sum(CASE WHEN type IN ('A', 'F') THEN 1 ELSE 0 END) AS adds,
                   sum(CASE WHEN type IN ('E', 'C', 'P') THEN 1 ELSE 0 END) AS executions,
                   sum(CASE WHEN type IN ('E', 'C', 'P') THEN shares ELSE 0 END) AS executed_shares
            FROM (SELECT *, (arrival_ns - {self.t0}) div {self.window_ns} AS window FROM {view})
            GROUP BY GROUPING SETS ((type), (stock_locate, stock), (window, feed))""")
        rows = _arrow(grouped).to_pandas()
        self.spark.catalog.dropTempView(view)
        self._message_tables(rows)

    def _message_tables(self, rows: pd.DataFrame) -> None:
        from logbuf.marketdata import itch

        # grouping_id: bit set = column aggregated away; (type, stock_locate, stock, window, feed) = bits 4..0
        by_type = rows[rows["gid"] == 0b01111]
        by_window = rows[rows["gid"] == 0b11100]
        per_name = rows[rows["gid"] == 0b10011]
        named = per_name.dropna(subset=["stock"]).sort_values("messages", ascending=False)
        by_symbol = (per_name.groupby("stock_locate", as_index=False)[["messages", "adds", "executions",
                                                                         "executed_shares"]].sum())
        by_symbol["stock"] = by_symbol["stock_locate"].map(named.drop_duplicates("stock_locate")
                                                           .set_index("stock_locate")["stock"])

        names = {code.decode(): cls.__name__ for code, (cls, _) in itch.BODY_FORMATS.items()}
        types = (by_type[["type", "messages"]].sort_values(["messages", "type"], ascending=[False, True])
                 .reset_index(drop=True))
        total = int(types["messages"].sum())
        types.insert(1, "name", [names.get(t, "?") for t in types["type"]])
        types["share"] = types["messages"] / total if total else 0.0
        self.tables["message_types"] = types
        self.summary["messages_delivered"] = total

        symbols = (by_symbol.sort_values(["messages", "stock_locate"], ascending=[False, True])
                   .head(self.config.top_symbols).reset_index(drop=True))
        symbols["share"] = symbols["messages"] / total if total else 0.0
        self.tables["symbols"] = symbols[["stock_locate", "stock", "messages", "share", "adds", "executions",
                                          "executed_shares"]].astype({"stock_locate": "int64"})

        frame = by_window.pivot_table(index="window", columns="feed", values="messages", fill_value=0,
                                      aggfunc="sum")
        for feed in (*schema.LIVE_FEEDS, schema.FEED_RETRANSMIT):
            if feed not in frame.columns:
                frame[feed] = 0
        frame = frame[[*schema.LIVE_FEEDS, schema.FEED_RETRANSMIT]].astype("int64").sort_index()
        window_total = frame.sum(axis=1)
        out = frame.add_prefix("wins_").reset_index()
        out.insert(0, "window_start_ns", self.t0 + out["window"].astype("int64") * self.window_ns)
        out = out.drop(columns="window")
        for feed in (*schema.LIVE_FEEDS, schema.FEED_RETRANSMIT):
            out[f"share_{feed}"] = (frame[feed] / window_total).to_numpy()
        self.tables["wins"] = out
        self.summary["wins"] = {feed: int(frame[feed].sum()) for feed in frame.columns}

    def _both_gaps(self) -> None:
        """Ranges lost on both feeds, with their recovery: from the per-message pass (the BOTH rows: the latest
        re-request arrival and the count recovered per range, computed next to the arrivals in Spark), matched
        to the handler's gap events by a sorted search."""
        events = self.handler_gaps
        ev_last_all = events["last"].to_numpy(dtype=np.int64)
        ev_order: np.ndarray = np.argsort(ev_last_all, kind="stable")
        ev_last = ev_last_all[ev_order]
        ev_first = events["first"].to_numpy(dtype=np.int64)[ev_order]
        used = set()
        rows = []
        for g in self.lost_on_both:
            first, last = g["first"], g["last"]
            size = last - first + 1
            recovered_messages = g["recovered_messages"]
            data_recovered = g["latest_recovery_ns"] if recovered_messages == size else None
            event = None
            # the first event (by its last sequence) ending at or after `first` that starts at or before `last`
            at = int(np.searchsorted(ev_last, first, side="left"))
            while at < ev_last.size and ev_first[at] > last:
                at += 1
            if at < ev_last.size:
                index = events.index[ev_order[at]]
                event = events.loc[index]
                used.add(index)
            detected = int(event["detected_ns"]) if event is not None else None
            recovered = None if event is None or pd.isna(event["recovered_ns"]) else int(event["recovered_ns"])
            if recovered is None:
                recovered = data_recovered
            status = ("recovered" if recovered_messages == size
                      else "partly recovered" if recovered_messages else "unrecovered")
            rows.append({
                "first": first, "last": last, "size": size, "status": status,
                "recovered_messages": recovered_messages,
                "detected_ns": detected, "recovered_ns": recovered,
                "time_to_recover_ns": (recovered - detected) if recovered is not None and detected is not None
                else None,
                "handler_event": event is not None,
                "handler_first": int(event["first"]) if event is not None else None,
                "handler_last": int(event["last"]) if event is not None else None,
                "detected_utc": _utc(detected),
            })
        columns = ["first", "last", "size", "status", "recovered_messages", "detected_ns", "recovered_ns",
                   "time_to_recover_ns", "handler_event", "handler_first", "handler_last", "detected_utc"]
        nullable = ("detected_ns", "recovered_ns", "time_to_recover_ns", "handler_first", "handler_last")
        frame = pd.DataFrame({c: pd.array([r[c] for r in rows], dtype="Int64") if c in nullable
                              else [r[c] for r in rows] for c in columns}, columns=columns)
        frame = frame.astype({"first": "int64", "last": "int64", "size": "int64", "recovered_messages": "int64",
                              "handler_event": "bool"})
        self.tables["gaps_both"] = frame
        self.tables["handler_gaps_unmatched"] = events.drop(index=[i for i in events.index if i in used])
        names = ["feed", "first", "last", "size", "detected_ns", "filled_ns", "unfilled"]
        feed_frame = pd.DataFrame({c: [g[c] for g in self.feed_gaps] for c in names}, columns=names)
        feed_frame = feed_frame.astype({c: "int64" for c in ("first", "last", "size", "unfilled")})
        for c in ("detected_ns", "filled_ns"):
            values = [None if g[c] == arrivals.NONE else g[c] for g in self.feed_gaps]
            feed_frame[c] = pd.array(values, dtype="Int64")
        feed_frame["fill_delay_ns"] = feed_frame["filled_ns"] - feed_frame["detected_ns"]
        # sorted search: a gap is on both feeds when it overlaps a range lost on both
        both_first = np.array([g["first"] for g in self.lost_on_both], np.int64)
        both_last = np.array([g["last"] for g in self.lost_on_both], np.int64)
        firsts, lasts = feed_frame["first"].to_numpy(np.int64), feed_frame["last"].to_numpy(np.int64)
        at = np.searchsorted(both_last, firsts, side="left")
        inside = at < both_last.size
        feed_frame["on_both"] = inside & (both_first[np.minimum(at, max(both_last.size - 1, 0))] <= lasts
                                          if both_last.size else False)
        # the tail of a feed that went off the air early: not a loss (see ended_early)
        feed_frame["ended_early"] = [bool(f in self.ended and first == self.ended[f] + 1 and last == self.domain.last)
                                     for f, first, last in zip(feed_frame["feed"], firsts, lasts, strict=True)]
        self.tables["gaps_feed"] = feed_frame

    # -- output

    def _output(self, seconds: float) -> AnalysisResult:


        from logbuf.pipeline import plots, report

        tables_dir = self.out / "tables"
        tables_dir.mkdir(parents=True, exist_ok=True)
        d = self.domain
        lows, highs = arrivals.bin_bounds(self.delay_bins, self.params.precision_bits)
        self.tables["delay_histogram"] = pd.DataFrame({"low_ns": lows, "high_ns": highs,
                                                       "messages": self.delay_counts})
        pct = pd.DataFrame({"percentile": [q * 100 for q in self.delay_percentiles],
                            "delay_ns": list(self.delay_percentiles.values())})
        self.tables["delay_percentiles"] = pct
        feeds = {}
        for name in (*schema.LIVE_FEEDS, schema.FEED_RETRANSMIT):
            info = dict(self.domain.feeds.get(name, {}))
            info.pop("feed", None)
            info.update(self.feed_stats.get(name, {}))
            if name in schema.LIVE_FEEDS:
                info["gaps"] = sum(1 for g in self.feed_gaps if g["feed"] == name)
            feeds[name] = info
        freezes = self.tables["freezes"]
        both = self.tables["gaps_both"]
        self.summary.update({
            "sequence_first": d.first, "sequence_last": d.last, "sequences": d.last - d.first + 1,
            "start_ns": d.start_ns, "end_ns": d.end_ns, "start_utc": _utc(d.start_ns), "end_utc": _utc(d.end_ns),
            "window_ns": self.window_ns,
            "feeds": feeds,
            "delay": {**self.delay_stats,
                      "percentiles_ns": {f"p{q * 100:g}": v for q, v in self.delay_percentiles.items()}},
            "freezes": len(freezes), "freeze_candidates": self.freeze_candidates,
            "freeze_candidates_truncated": self.freeze_candidates_truncated,
            "gaps_both": len(both), "gaps_both_unrecovered": int((both["status"] != "recovered").sum()),
            "handler_gap_events": len(self.handler_gaps),
            "ended_early": {feed: {"last_sequence": last, "not_on_air": d.last - last,
                                   "end_ns": self.domain.feeds[feed]["end_ns"],
                                   "end_utc": _utc(self.domain.feeds[feed]["end_ns"])}
                            for feed, last in self.ended.items()},
            "host_warnings": list(self.config.host_warnings),
        })
        for name, frame in self.tables.items():
            table = pa.Table.from_pandas(frame, preserve_index=False)
            import pyarrow.csv as pacsv
            import pyarrow.parquet as pq

            pq.write_table(table, tables_dir / f"{name}.parquet")
            pacsv.write_csv(table, tables_dir / f"{name}.csv")
        plot_paths: dict[str, Path] = {}
        if self.config.plots:
            plot_paths = plots.draw_all(self, self.out / "plots")
        self.summary["seconds"] = round(seconds, 3)
        self.summary["stage_seconds"] = {k: round(v, 3) for k, v in self.progress.timings.items()}
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str) + "\n")
        report_path = report.write(self, plot_paths)
        self.staging.publish()  # a remote OUT gets the finished directory through the filesystem layer
        return AnalysisResult(self.out, self.session, self.summary, self.tables, plot_paths, report_path,
                              dict(self.progress.timings), dict(self.delay_percentiles), dict(self.delay_stats))


def analyze(spark, recording: str | os.PathLike | Location, out: str | os.PathLike | Location,
            config: AnalyzeConfig | None = None,
            *, progress: str | None = None) -> AnalysisResult:
    """Run the whole analysis. ``progress``: "bar", "lines", "off", or None (bar on a terminal, else lines)."""
    from logbuf.pipeline.progress import StageProgress

    bar = StageProgress(list(STAGES), spark, mode=progress)
    try:
        return Analysis(spark, recording, out, config or AnalyzeConfig(), bar).run()
    finally:
        bar.close()


# ---- command line (shared by `logbuf analyze` and spark-submit) -----------------------------------------


_CANCEL_INTERVAL_S = 0.2


@contextlib.contextmanager
def cancel_on_interrupt(spark) -> Iterator[None]:
    """Ctrl-C (SIGINT) stops the analysis cleanly: every Spark job is cancelled (also one started after the
    signal), and the interrupt is raised where Python is running - but not inside a py4j call: an interrupt
    raised there leaves py4j's connection half-used and py4j logs that with a traceback; the waiting call
    fails with the cancelled job's error instead.  Either way the caller sees KeyboardInterrupt.  PySpark's
    own handler (cancel, then raise anywhere) is restored on exit."""
    interrupted = threading.Event()
    done = threading.Event()

    def cancel_until_done() -> None:
        while not done.is_set():
            with contextlib.suppress(Exception):
                spark.sparkContext.cancelAllJobs()
            done.wait(_CANCEL_INTERVAL_S)

    def on_sigint(signum: int, frame) -> None:
        first = not interrupted.is_set()
        interrupted.set()
        inside_py4j = False
        while frame is not None and not inside_py4j:
            inside_py4j = frame.f_globals.get("__name__", "").startswith("py4j")
            frame = frame.f_back
        if first:  # a running job would make even the clean-up of an interrupted call wait for it
            threading.Thread(target=cancel_until_done, name="logbuf-analyze-cancel", daemon=True).start()
            if inside_py4j:
                return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except BaseException:
        if interrupted.is_set():  # whatever the cancellation made the waiting call raise
            raise KeyboardInterrupt from None
        raise
    else:
        if interrupted.is_set():  # the last job finished before its cancellation: still an interrupted run
            raise KeyboardInterrupt
    finally:
        done.set()
        signal.signal(signal.SIGINT, previous)


def run_from_args(args: argparse.Namespace) -> int:
    from logbuf.pipeline.sources import check_files, pick_session
    from logbuf.pipeline.spark import SparkSettings, get_spark

    config = config_from_args(args)
    recording, out = Location.parse(args.recording), Location.parse(args.out)
    # a bad path, session, file or output directory fails here, in one line, before Spark starts
    check_files(recording, pick_session(recording, config.session))
    check_output(out)
    settings = SparkSettings(master=args.master, driver_memory=args.driver_memory,
                             shuffle_partitions=args.shuffle_partitions, extra=dict(args.conf or ()))
    if not args.quiet:
        print(f"analyze: starting Spark ({args.master or 'local[*]'})", file=sys.stderr, flush=True)
    spark = get_spark(settings)
    with cancel_on_interrupt(spark):
        result = analyze(spark, recording, out, config, progress="off" if args.quiet else None)
    if not args.quiet:
        from logbuf.pipeline.report import headline_text

        s = result.summary
        print(f"analyze: session {s['session']}: {headline_text(result)}; analysed in {s['seconds']:.1f} s",
              file=sys.stderr)
        where = str(out.local_path) if out.is_local else str(out)
        print(f"analyze: report {where}/report.md", file=sys.stderr)
        print(f"analyze: plots  {where}/plots", file=sys.stderr)
        print(f"analyze: tables {where}/tables", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="logbuf-analyze", description=__doc__.split("\n", 1)[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_from_args(args)
    except (schema.RecordingFormatError, ValueError, OSError) as exc:
        print(f"analyze: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
