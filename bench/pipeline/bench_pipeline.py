"""Benchmark: ``logbuf analyze`` (PySpark, local) vs the single-process pyarrow/numpy baseline, same recordings.

    PYTHONPATH=src .venv/bin/python bench/pipeline/bench_pipeline.py --messages 10M 50M [--runs 1]

For each size a scenario recording is generated once into ``--data-dir`` (kept for later runs: tens of GB at
the largest sizes, so not in the repository), then the two analyses run as child processes, interleaved
(baseline, spark, baseline, spark, ...). Reported per run: wall time, the peak resident memory of the whole
process tree (driver, JVM and Python workers for Spark; sampled every 0.25 s from /proc), the JVM heap limit,
the 1-minute load average before the run, and whether both analyses agree on the summary figures.
Results go to ``bench/pipeline/results/pipeline.{json,md}``. The machine is shared and has 2 vCPUs whose
placement moves (see docs/benchmarks.md): treat single runs as +-30 %.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
PAGE = os.sysconf("SC_PAGE_SIZE")
_SUFFIXES = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def count(text: str) -> int:
    raw = text.strip().lower().replace("_", "")
    scale = _SUFFIXES.get(raw[-1:], 1)
    return int(float(raw[:-1] if scale != 1 else raw) * scale)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            tree.setdefault(int(fields[1]), []).append(int(entry))
        except OSError:
            continue
    return tree


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants."""
    tree = _children()
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except OSError:
            pass
        stack.extend(tree.get(p, []))
    return total


def run_measured(cmd: list[str], env: dict[str, str], log: Path) -> dict:
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        peak = 0
        loads: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            ticks = 0
            while not stop.wait(0.25):
                peak = max(peak, tree_rss(proc.pid))
                ticks += 1
                if ticks % 20 == 0:  # the 1-minute load every 5 s: how busy the machine was meanwhile
                    loads.append(os.getloadavg()[0])

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            code = proc.wait()
        finally:
            stop.set()
            sampler.join()
            if proc.poll() is None:
                proc.kill()
    return {"seconds": round(time.perf_counter() - started, 2), "peak_rss_gb": round(peak / 2**30, 2),
            "load_1m_before": round(load, 2),
            "load_1m_during": [round(sum(loads) / len(loads), 1), round(max(loads), 1)] if loads else None,
            "exit": code, "log": str(log)}


def ensure_recording(data_dir: Path, messages: int, py: str, env: dict[str, str]) -> tuple[Path, float | None]:
    path = data_dir / f"scenario-{messages}"
    if (path / "_scenario_truth.json").exists():
        marker = path / "_generation_seconds"
        return path, float(marker.read_text()) if marker.exists() else None
    shutil.rmtree(path, ignore_errors=True)
    started = time.perf_counter()
    unrecovered = f"{int(messages * 0.8)}-{int(messages * 0.8) + 9}"
    subprocess.run([py, "-m", "logbuf.cli", "scenario", str(path), "--messages", str(messages), "--unrecovered",
                    unrecovered, "--quiet"], check=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - started
    (path / "_generation_seconds").write_text(f"{seconds:.1f}")
    return path, seconds


def agreement(baseline: dict, spark: dict) -> dict:
    checks = {
        "sequences": baseline["sequences"] == spark["sequences"],
        "messages_delivered": baseline["messages_delivered"] == spark["messages_delivered"],
        "delay_percentiles": baseline["delay"]["percentiles_ns"] == spark["delay"]["percentiles_ns"],
        "missing_per_feed": all(baseline["feeds"][f]["missing"] == spark["feeds"][f]["missing"] for f in "AB"),
        "gaps_per_feed": all(baseline["feeds"][f]["gaps"] == spark["feeds"][f]["gaps"] for f in "AB"),
        "gaps_both": baseline["gaps_both"] == spark["gaps_both"],
        "freezes": baseline["freezes"] == spark["freezes"],
        "wins": baseline["wins"] == spark["wins"],
    }
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", nargs="+", type=count, default=[10_000_000, 50_000_000])
    parser.add_argument("--runs", type=int, default=1, help="interleaved runs per size")
    parser.add_argument("--data-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "logbuf-bench"))
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--skip-baseline-above", type=count, default=None,
                        help="do not run the baseline above this many messages (it holds everything in memory)")
    args = parser.parse_args()
    py = sys.executable
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    from logbuf.pipeline.spark import find_java_home, java_major

    java = find_java_home()
    report = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version(), "java_home": java,
                          "java": java_major(os.path.join(java, "bin", "java"))},
              "driver_memory": args.driver_memory, "sizes": []}
    for messages in args.messages:
        recording, generated = ensure_recording(data_dir, messages, py, env)
        size = {"messages": messages, "recording": str(recording), "generation_seconds": generated,
                "recording_gb": round(sum(f.stat().st_size for f in recording.rglob("*") if f.is_file()) / 2**30, 2),
                "runs": []}
        for run in range(args.runs):
            entry = {}
            if args.skip_baseline_above is None or messages <= args.skip_baseline_above:
                base_json = data_dir / f"baseline-{messages}-{run}.json"
                entry["baseline"] = run_measured(
                    [py, str(ROOT / "bench/pipeline/baseline.py"), str(recording), "--json", str(base_json)], env,
                    data_dir / f"baseline-{messages}-{run}.log")
                entry["baseline"]["summary"] = json.loads(base_json.read_text()) if base_json.exists() else None
            out = data_dir / f"analyze-{messages}-{run}"
            shutil.rmtree(out, ignore_errors=True)
            entry["spark"] = run_measured(
                [py, "-m", "logbuf.cli", "analyze", str(recording), str(out), "--no-plots",
                 "--driver-memory", args.driver_memory], env, data_dir / f"analyze-{messages}-{run}.log")
            summary_path = out / "summary.json"
            entry["spark"]["summary"] = json.loads(summary_path.read_text()) if summary_path.exists() else None
            if entry.get("baseline", {}).get("summary") and entry["spark"]["summary"]:
                entry["agree"] = agreement(entry["baseline"]["summary"], entry["spark"]["summary"])
            size["runs"].append(entry)
            print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "summary"} if isinstance(v, dict) else v
                              for k, v in entry.items()}), file=sys.stderr, flush=True)
        report["sizes"].append(size)
    report["command"] = " ".join(["PYTHONPATH=src", ".venv/bin/python", "bench/pipeline/bench_pipeline.py",
                                  *sys.argv[1:]])
    (RESULTS / "pipeline.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (RESULTS / "pipeline.md").write_text(markdown(report))
    print(f"wrote {RESULTS / 'pipeline.json'} and pipeline.md", file=sys.stderr)
    return 0


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


def markdown(report: dict) -> str:
    lines = ["# logbuf analyze (PySpark) vs single-process pyarrow/numpy baseline", "",
             f"Command: `{report['command']}`. Machine: {report['machine']['cores']} vCPUs, Python "
             f"{report['machine']['python']}, Java {report['machine']['java']}; Spark `local[*]`, driver heap "
             f"{report['driver_memory']}, no plots (both sides write tables only). Peak memory is the resident "
             "set of the whole process tree (Spark: driver, JVM, Python workers).", "",
             "| messages | recording | baseline s | baseline peak GB | spark s | spark peak GB | spark / baseline "
             "| load before | results agree |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    rows = []
    for size in report["sizes"]:
        base = _median([r["baseline"]["seconds"] for r in size["runs"] if "baseline" in r])
        base_mem = _median([r["baseline"]["peak_rss_gb"] for r in size["runs"] if "baseline" in r])
        spark = _median([r["spark"]["seconds"] for r in size["runs"]])
        spark_mem = _median([r["spark"]["peak_rss_gb"] for r in size["runs"]])
        loads = ", ".join(f"{r['spark']['load_1m_before']:.1f}" for r in size["runs"])
        agree = [all(r["agree"].values()) for r in size["runs"] if "agree" in r]
        ratio = f"{spark / base:.1f}x" if base and spark else "-"
        lines.append(f"| {size['messages']:,} | {size['recording_gb']} GB | {base if base is not None else '-'} | "
                     f"{base_mem if base_mem is not None else '-'} | {spark} | {spark_mem} | {ratio} | {loads} | "
                     f"{'yes' if agree and all(agree) else 'NO' if agree else '-'} |")
        rows.append((size["messages"], base, spark))
    stages = report["sizes"][-1]["runs"][-1]["spark"].get("summary") or {}
    if stages:
        lines += ["", f"Spark stage seconds at {report['sizes'][-1]['messages']:,}: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in stages.get("stage_seconds", {}).items())]
    if len(rows) >= 2 and rows[-1][2] and rows[0][2]:
        (n0, _, s0), (n1, _, s1) = rows[0], rows[-1]
        per_message = (s1 - s0) / (n1 - n0)
        estimate = s1 + per_message * (400_000_000 - n1)
        lines += ["", f"Marginal Spark cost between the two sizes: {per_message * 1e9:.0f} ns per message; linear "
                  f"extrapolation to 400 M messages: about {estimate / 60:.0f} minutes with the same "
                  f"{report['driver_memory']} heap (goal: <= 20 minutes with <= 4 GB)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
