"""Benchmark: ``logbuf analyze`` (PySpark, local) vs DuckDB computing the same core figures on the same recording.

    .venv/bin/python bench/pipeline/bench_duckdb.py --messages 5M [50M 200M 400M] [--runs 1]

DuckDB lives in the benchmark's own virtual environment (``--env-dir``, created with ``python -m venv`` and
``pip install duckdb`` on first use; it is no dependency of logbuf). For each size a scenario recording is
generated once into ``--data-dir`` and kept; then, back to back on the same recording, ``logbuf analyze
--no-plots --window 1s`` and ``duckdb_query.py`` run as child processes. Reported per run: wall time, peak
resident memory of the whole process tree (sampled every 0.25 s), the 1-minute load average before each
run, and whether both agree on: A-B delay p50/p99 (exact, nearest rank), gaps and missing sequences per feed,
messages per feed per second, the ITCH type mix. Spark's fixed start-up (a session and one trivial job) is
measured separately. Results: ``bench/pipeline/results/duckdb.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bench_pipeline import count, ensure_recording, run_measured  # noqa: E402

RESULTS = HERE / "results"
WINDOW_NS = 1_000_000_000


def ensure_duckdb(env_dir: Path) -> str:
    """The python of the benchmark's own environment with DuckDB installed (created on first use)."""
    py = env_dir / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import duckdb"], capture_output=True).returncode == 0:
        return str(py)
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "duckdb"], check=True)
    return str(py)


def spark_start_up(env: dict[str, str]) -> float:
    """Seconds from a fresh interpreter to a SparkSession that has run one trivial job."""
    code = ("import time; t = time.perf_counter(); from logbuf.pipeline.spark import get_spark; "
            "s = get_spark(); s.range(1).count(); print(time.perf_counter() - t); s.stop()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return round(float(done.stdout.strip().splitlines()[-1]), 2)


def spark_figures(out: Path) -> dict:
    import pyarrow.parquet as pq

    summary = json.loads((out / "summary.json").read_text())
    rates = pq.read_table(out / "tables" / "rates.parquet").to_pandas()
    types = pq.read_table(out / "tables" / "message_types.parquet").to_pandas()
    pct = summary["delay"]["percentiles_ns"]
    return {
        "sequences": summary["sequences"],
        "delay": {"messages_on_both": summary["delay"]["messages_on_both"], "min_ns": summary["delay"]["min_ns"],
                  "max_ns": summary["delay"]["max_ns"], "percentiles_ns": {"p50": pct["p50"], "p99": pct["p99"]}},
        "feeds": {f: {"missing": summary["feeds"][f]["missing"], "gaps": summary["feeds"][f]["gaps"]}
                  for f in ("A", "B")},
        "rates": sorted([str(r.feed), int(r.window_start_ns), int(r.messages)] for r in rates.itertuples()),
        "message_types": {str(t): int(m) for t, m in zip(types["type"], types["messages"], strict=True)},
        "stage_seconds": summary.get("stage_seconds", {}),
    }


def agreement(spark: dict, duck: dict) -> dict[str, bool]:
    return {
        "delay_p50_p99": spark["delay"]["percentiles_ns"] == duck["delay"]["percentiles_ns"],
        "delay_count_min_max": all(spark["delay"][k] == duck["delay"][k]
                                   for k in ("messages_on_both", "min_ns", "max_ns")),
        "gaps_and_missing_per_feed": spark["feeds"] == duck["feeds"],
        "messages_per_second": spark["rates"] == sorted(duck["rates"]),
        "type_mix": spark["message_types"] == duck["message_types"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", nargs="+", type=count, default=[5_000_000])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--data-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "logbuf-bench"))
    parser.add_argument("--env-dir", default=None, help="DuckDB's environment (default: DATA_DIR/duckdb-venv)")
    parser.add_argument("--driver-memory", default="2g")
    args = parser.parse_args()
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    duck_py = ensure_duckdb(Path(args.env_dir) if args.env_dir else data_dir / "duckdb-venv")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    report: dict = {"cores": os.cpu_count(), "driver_memory": args.driver_memory, "sizes": [],
                    "spark_start_up_s": spark_start_up(env),
                    "command": " ".join([".venv/bin/python", "bench/pipeline/bench_duckdb.py", *sys.argv[1:]])}
    for messages in args.messages:
        recording, _ = ensure_recording(data_dir, messages, sys.executable, env)
        size: dict = {"messages": messages, "runs": []}
        for run in range(args.runs):
            out = data_dir / f"analyze-duck-{messages}-{run}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            spark = run_measured([sys.executable, "-m", "logbuf.cli", "analyze", str(recording), str(out),
                                  "--no-plots", "--quiet", "--window", "1s", "--driver-memory", args.driver_memory],
                                 env, data_dir / f"analyze-duck-{messages}-{run}.log")
            duck_json = data_dir / f"duckdb-{messages}-{run}.json"
            duck = run_measured([duck_py, str(HERE / "duckdb_query.py"), str(recording), "--json", str(duck_json),
                                 "--window-ns", str(WINDOW_NS)], {**os.environ},
                                data_dir / f"duckdb-{messages}-{run}.log")
            entry = {"spark": spark, "duckdb": duck, "spark_start_up_s": spark_start_up(env)}
            if spark["exit"] == 0 and duck["exit"] == 0:
                figures = spark_figures(out)
                entry["spark"]["stage_seconds"] = figures.pop("stage_seconds")
                entry["agree"] = agreement(figures, json.loads(duck_json.read_text()))
                entry["figures"] = {k: v for k, v in figures.items() if k != "rates"}
            size["runs"].append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k != "figures"}), file=sys.stderr, flush=True)
        report["sizes"].append(size)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "duckdb.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (RESULTS / "duckdb.md").write_text(markdown(report))
    print(f"wrote {RESULTS / 'duckdb.md'}", file=sys.stderr)
    return 0


def _during(run: dict) -> str:
    during = run.get("load_1m_during")
    return f"{during[0]}/{during[1]}" if during else "-"


def markdown(report: dict) -> str:
    lines = ["# logbuf analyze (PySpark, local) vs DuckDB, same recording, back to back", "",
             f"Command: `{report['command']}`. {report['cores']} vCPUs; Spark driver heap {report['driver_memory']}, "
             f"no plots. Spark's fixed start-up (session + one trivial job): {report['spark_start_up_s']} s. "
             "Peak memory: resident set of the whole process tree.", "",
             "| messages | spark s | spark peak GB | duckdb s | duckdb peak GB | spark / duckdb | load before "
             "(spark, duckdb) | load during, mean/max (spark; duckdb) | spark start-up s (after) | figures agree |",
             "|---:|---:|---:|---:|---:|---:|---|---|---:|---|"]
    for size in report["sizes"]:
        for r in size["runs"]:
            s, d = r["spark"], r["duckdb"]
            agree = r.get("agree")
            verdict = ("yes" if agree and all(agree.values()) else
                       "NO: " + ", ".join(k for k, v in agree.items() if not v) if agree else "-")
            lines.append(f"| {size['messages']:,} | {s['seconds']} | {s['peak_rss_gb']} | {d['seconds']} | "
                         f"{d['peak_rss_gb']} | {s['seconds'] / d['seconds']:.2f}x | {s['load_1m_before']}, "
                         f"{d['load_1m_before']} | {_during(s)}; {_during(d)} | {r.get('spark_start_up_s', '-')} | {verdict} |")
    last = report["sizes"][-1]["runs"][-1]["spark"].get("stage_seconds") if report["sizes"] else None
    if last:
        lines += ["", "Spark stage seconds (last run): " + ", ".join(f"{k} {v:.1f}" for k, v in last.items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
