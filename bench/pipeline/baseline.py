"""The same feed-quality analytics as ``logbuf analyze``, in one process with pyarrow + numpy (the baseline).

Everything is held in memory at once: dense per-sequence arrival arrays per feed (8 bytes x sequences x 3), the
expanded per-message arrays, the messages columns. It computes the summary figures ``logbuf analyze`` writes
(delay count/min/max and exact nearest-rank percentiles, per-feed gaps and missing counts, gaps on both feeds,
freezes, type mix, top symbols, wins, per-window rates) so the benchmark can check both agree.

    PYTHONPATH=src .venv/bin/python bench/pipeline/baseline.py RECORDING [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from logbuf.pipeline.freezes import FeedPackets, FreezeParams, characterize  # noqa: E402
from logbuf.pipeline.options import DEFAULT_PERCENTILES  # noqa: E402
from logbuf.pipeline.quantiles import rank_of  # noqa: E402
from logbuf.recording import schema  # noqa: E402
from logbuf.recording.reader import complete_files  # noqa: E402

NEVER = np.iinfo(np.int64).max
FEEDS = ("A", "B", "R")


def _read(root: Path, dataset: str, columns: list[str]) -> pa.Table:
    files = complete_files(root, dataset)
    if not files:
        return schema.SCHEMAS[dataset].empty_table().select(columns)
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files]).combine_chunks()


def _codes(column: pa.ChunkedArray | pa.Array, names: tuple[str, ...]) -> np.ndarray:
    """Dictionary column -> small int codes in the order of ``names`` (-1: other)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    dictionary = arr.dictionary.to_pylist()
    lookup = np.array([names.index(v) if v in names else -1 for v in dictionary], dtype=np.int8)
    return lookup[arr.indices.to_numpy(zero_copy_only=False)]


def _runs(mask: np.ndarray, offset: int) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate(([0], mask.view(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1) - 1
    return [(int(a) + offset, int(b) + offset) for a, b in zip(starts, ends, strict=True)]


def _window(p: FeedPackets, span: tuple[int, int]) -> FeedPackets:
    k = slice(int(np.searchsorted(p.arrival, span[0])), int(np.searchsorted(p.arrival, span[1], "right")))
    return FeedPackets(p.arrival[k], p.first[k], p.count[k])


def analyze(root: Path, window_ns: int | None = None) -> dict:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    packets = _read(root, schema.PACKETS, ["feed", "arrival_ns", "sequence", "count", "bytes"])
    feed = _codes(packets.column("feed"), FEEDS)
    arrival = packets.column("arrival_ns").to_numpy()
    first = packets.column("sequence").to_numpy()
    count = packets.column("count").to_numpy().astype(np.int64)
    data = (count >= 1) & (count <= schema.MAX_DATA_COUNT) & (feed >= 0)
    control_last = first[~data] - 1
    feed, arrival, first, count = feed[data], arrival[data], first[data], count[data]
    lo = int(first.min())
    hi = int(max((first + count - 1).max(), control_last.max() if control_last.size else 0))
    n = hi - lo + 1
    timings["read"] = time.perf_counter() - t

    t = time.perf_counter()
    per_feed = {}
    for code, name in enumerate(FEEDS):
        sel = feed == code
        c = count[sel]
        total = int(c.sum())
        seqs = np.repeat(first[sel] - np.cumsum(c) + c, c) + np.arange(total, dtype=np.int64) - lo
        times = np.repeat(arrival[sel], c)
        dense = np.full(n, NEVER, dtype=np.int64)
        np.minimum.at(dense, seqs, times)
        per_feed[name] = dense
        del seqs, times
    a, b = per_feed["A"], per_feed["B"]
    both = (a != NEVER) & (b != NEVER)
    delays = b[both] - a[both]
    timings["sequence"] = time.perf_counter() - t

    t = time.perf_counter()
    ordered = np.sort(delays)
    percentiles = {f"p{q * 100:g}": int(ordered[rank_of(q, ordered.size) - 1]) for q in DEFAULT_PERCENTILES} \
        if ordered.size else {}
    timings["quantiles"] = time.perf_counter() - t

    t = time.perf_counter()
    gaps = {name: _runs(per_feed[name] == NEVER, lo) for name in ("A", "B")}
    both_missing = (a == NEVER) & (b == NEVER)
    both_gaps = _runs(both_missing, lo)
    r = per_feed["R"]
    both_rows = []
    for g_first, g_last in both_gaps:
        got = r[g_first - lo:g_last - lo + 1]
        both_rows.append({"first": g_first, "last": g_last,
                          "status": "recovered" if (got != NEVER).all() else
                          "partly recovered" if (got != NEVER).any() else "unrecovered"})
    gap_events = _read(root, schema.GAPS, ["first", "last", "detected_ns", "recovered_ns"]).to_pylist()
    timings["gaps"] = time.perf_counter() - t

    t = time.perf_counter()
    params = FreezeParams()
    t0 = (int(arrival.min()) // 1_000_000_000) * 1_000_000_000
    span = int(arrival.max()) - t0
    if window_ns is None:
        from logbuf.pipeline.job import choose_window

        window_ns = choose_window(span, params.bin_ns)
    windows = (arrival - t0) // window_ns
    rates = {}
    for code, name in enumerate(("A", "B")):
        sel = feed == code
        rates[name] = (np.bincount(windows[sel], minlength=int(windows.max()) + 1),
                       np.bincount(windows[sel], weights=count[sel], minlength=int(windows.max()) + 1))
    freezes = []
    streams = {}
    for code, name in enumerate(("A", "B")):
        sel = feed == code
        streams[name] = FeedPackets.of(arrival[sel], first[sel], count[sel])
    for x, y in (("A", "B"), ("B", "A")):
        xs, ys = streams[x], streams[y]
        gap = np.diff(xs.arrival)
        cand = np.flatnonzero((gap >= params.min_silence_ns) & (gap <= params.max_silence_ns))
        sent_before = np.maximum.accumulate(xs.last)
        y_max = np.maximum.accumulate(ys.last)
        for i in cand.tolist():
            s, e, nxt = int(xs.arrival[i]), int(xs.arrival[i + 1]), int(sent_before[i]) + 1
            if xs.first[i + 1] > nxt:
                continue
            j = int(np.searchsorted(ys.arrival, e - params.min_lead_ns, side="right")) - 1
            if j < 0 or y_max[j] < nxt:
                continue
            span = (s - params.pre_ns, e + params.post_ns)
            f = characterize(x, _window(xs, span), _window(ys, span), s, e, nxt, params)
            if f is not None:
                freezes.append(f.as_dict())
    timings["time+freezes"] = time.perf_counter() - t

    t = time.perf_counter()
    messages = _read(root, schema.MESSAGES, ["feed", "arrival_ns", "type", "stock_locate"])
    types = messages.column("type").combine_chunks()
    type_names = types.dictionary.to_pylist()
    type_counts = np.bincount(types.indices.to_numpy(zero_copy_only=False), minlength=len(type_names))
    type_mix = {type_names[i]: int(c) for i, c in enumerate(type_counts) if c}
    locate = messages.column("stock_locate").to_numpy()
    by_locate = np.bincount(locate)
    top = np.argsort(-by_locate, kind="stable")[:20]
    winner = _codes(messages.column("feed"), FEEDS)
    wins = {name: int((winner == code).sum()) for code, name in enumerate(FEEDS)}
    win_windows = (messages.column("arrival_ns").to_numpy() - t0) // window_ns
    _ = [np.bincount(win_windows[winner == code]) for code in range(3)]
    timings["messages"] = time.perf_counter() - t

    return {
        "sequences": n,
        "messages_delivered": int(messages.num_rows),
        "delay": {"messages_on_both": int(delays.size), "min_ns": int(delays.min()) if delays.size else None,
                  "max_ns": int(delays.max()) if delays.size else None, "percentiles_ns": percentiles},
        "feeds": {name: {"missing": int((per_feed[name] == NEVER).sum()), "gaps": len(gaps.get(name, []))}
                  for name in ("A", "B")},
        "gaps_both": len(both_rows),
        "gaps_both_unrecovered": sum(1 for row in both_rows if row["status"] != "recovered"),
        "handler_gap_events": len(gap_events),
        "freezes": len(freezes),
        "wins": wins,
        "message_types": type_mix,
        "top_symbols": top.tolist(),
        "window_ns": window_ns,
        "stage_seconds": {k: round(v, 3) for k, v in timings.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("recording")
    parser.add_argument("--json", default=None, help="write the summary here")
    args = parser.parse_args()
    started = time.perf_counter()
    summary = analyze(Path(args.recording))
    summary["seconds"] = round(time.perf_counter() - started, 3)
    text = json.dumps(summary, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(f"baseline: {summary['sequences']} sequences in {summary['seconds']:.1f} s "
          f"(stages: {summary['stage_seconds']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
