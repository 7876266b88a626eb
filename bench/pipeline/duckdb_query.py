"""The core figures of ``logbuf analyze``, computed by DuckDB over the same recording (the benchmark's reference).

Runs in the benchmark's own environment (``bench_duckdb.py`` creates it; DuckDB is no project dependency), and
imports nothing from logbuf: it reads the Parquet datasets directly.

    DUCKDB_PYTHON bench/pipeline/duckdb_query.py RECORDING --json OUT.json [--window-ns N]

Figures: A-B delay of every message seen on both feeds (exact nearest-rank p50 and p99, count, min, max),
gaps (runs of missing sequences) and missing sequences per live feed, messages per feed per window of the
arrival clock (the rate), and the ITCH type mix of the delivered messages.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import duckdb

MAX_DATA_COUNT = 0xFFFE


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("recording")
    parser.add_argument("--json", required=True)
    parser.add_argument("--window-ns", type=int, default=1_000_000_000)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    con = duckdb.connect()
    if args.threads:
        con.execute(f"SET threads = {args.threads}")
    packets = f"read_parquet('{args.recording}/packets/*/*/*.parquet', hive_partitioning = false)"
    messages = f"read_parquet('{args.recording}/messages/*/*/*.parquet', hive_partitioning = false)"
    con.execute(f"""CREATE TEMP TABLE p AS SELECT feed::VARCHAR AS feed, arrival_ns, sequence, count
                    FROM {packets}""")
    # every message copy's first arrival per live feed
    con.execute(f"""CREATE TEMP TABLE first_arrival AS
        SELECT feed, seq, min(arrival_ns) AS t FROM (
            SELECT feed, arrival_ns, unnest(range(sequence, sequence + count)) AS seq FROM p
            WHERE count BETWEEN 1 AND {MAX_DATA_COUNT} AND feed IN ('A', 'B'))
        GROUP BY feed, seq""")
    first, last = con.execute(f"""SELECT min(first), max(last) FROM (
        SELECT min(sequence) AS first, max(sequence + count - 1) AS last FROM p
        WHERE count BETWEEN 1 AND {MAX_DATA_COUNT} AND feed IN ('A', 'B')
        UNION ALL SELECT NULL, max(sequence - 1) FROM p WHERE count = 0 OR count > {MAX_DATA_COUNT})""").fetchone()
    con.execute("""CREATE TEMP TABLE delays AS SELECT b.t - a.t AS d FROM first_arrival a JOIN first_arrival b
                   ON a.seq = b.seq AND a.feed = 'A' AND b.feed = 'B'""")
    n, low, high = con.execute("SELECT count(*), min(d), max(d) FROM delays").fetchone()
    ranks = {q: max(1, math.ceil(q * n)) for q in (0.5, 0.99)}  # nearest rank, as logbuf analyze
    picked = dict(con.execute(f"""SELECT rn, d FROM (SELECT d, row_number() OVER (ORDER BY d) AS rn FROM delays)
                                  WHERE rn IN ({', '.join(str(r) for r in ranks.values())})""").fetchall())
    feeds = {}
    for feed in ("A", "B"):
        distinct, runs_inside, lo, hi = con.execute(f"""
            SELECT count(*), count(*) FILTER (WHERE step > 1), min(seq), max(seq) FROM (
                SELECT seq, seq - lag(seq) OVER (ORDER BY seq) AS step FROM first_arrival
                WHERE feed = '{feed}' AND seq BETWEEN {first} AND {last})""").fetchone()
        gaps = runs_inside + (lo > first) + (hi < last) if distinct else 1
        feeds[feed] = {"missing": (last - first + 1) - distinct, "gaps": int(gaps)}
    rates = con.execute(f"""SELECT feed, arrival_ns // {args.window_ns} AS w, sum(count) AS messages FROM p
                            WHERE count BETWEEN 1 AND {MAX_DATA_COUNT} AND feed IN ('A', 'B')
                            GROUP BY feed, w ORDER BY feed, w""").fetchall()
    types = dict(con.execute(f"SELECT type::VARCHAR, count(*) FROM {messages} GROUP BY 1").fetchall())
    result = {
        "seconds": round(time.perf_counter() - started, 3),
        "sequences": last - first + 1,
        "delay": {"messages_on_both": n, "min_ns": low, "max_ns": high,
                  "percentiles_ns": {f"p{q * 100:g}": picked[r] for q, r in ranks.items()}},
        "feeds": feeds,
        "rates": [[f, int(w) * args.window_ns, int(m)] for f, w, m in rates],
        "message_types": {k: int(v) for k, v in types.items()},
    }
    with open(args.json, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
