"""``python -m bench peers``: logbuf against the peers a Python engineer would pick, in one interleaved run.

For each payload size, one producer process -> one consumer process, every peer's throughput (msg/s, MB/s,
CPU seconds per million messages); the same for 1, 2 and 4 producers -> one consumer; and ping-pong round
trips (p50/p99/p99.9) for every peer and wait mode.  Noise handling (see docs/benchmarks.md
and bench/README.md: the vCPUs move between near and far placements every few seconds):

* a calibration round first (discarded): it warms the machine and sizes each case so a run lasts about
  ``--seconds`` (unless ``--messages`` fixes the count);
* then ``--runs`` rounds, each running every case once (the order reversed on every other round), so a
  placement change hits all peers alike; figures are medians over rounds, ratios are medians of per-round
  ratios;
* each run warms up in-process (``--warmup`` messages) before its clock starts;
* the load average before and after, and per run the share of CPU other processes used and the hypervisor
  stole, are recorded; the report says when the machine was busy.

Results: ``peers.json`` (everything, including each run), ``peers.md`` and ``peers_*.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import machine, runner
from bench.peers import PEERS

RESULTS = Path(__file__).resolve().parent / "results"

SIZES = (32, 256, 4096)
PRODUCERS = (1, 2, 4)
CALIBRATION_MESSAGES = 20_000  # per-message peers; batch peers x10
CALIBRATION_RTT = 2_000
CALIBRATION_TIMEOUT_S = 60.0
MIN_MESSAGES, MAX_MESSAGES = 5_000, 50_000_000
MIN_RTT, MAX_RTT = 5_000, 200_000
RTT_PEER_ORDER = tuple(k for k, p in PEERS.items() if p.rtt_waits)

# the targets
TARGET_PER_MESSAGE = 5_000_000  # msg/s at 32 B
TARGET_VS_ZMQ = 4.0  # per-message vs pyzmq ipc at 32 B
TARGET_VS_NAIVE = 2.0  # per-message vs the naive pure-Python SPSC ring at 32 B (the floor)
TARGET_RTT_VS_NAIVE = 0.5  # ping-pong p50 vs the naive ring's at 32 B
TARGET_BATCH = 30_000_000  # msg/s at 32 B
TARGET_RTT_P50_US = 1.5


@dataclass(frozen=True)
class Case:
    kind: str  # "throughput" (1 -> 1, per size), "multi" (N -> 1), "rtt"
    peer: str
    size: int
    producers: int = 1
    wait: str = ""

    @property
    def name(self) -> str:
        if self.kind == "rtt":
            return f"rtt {self.peer} {self.wait} {self.size} B"
        if self.kind == "multi":
            return f"multi {self.peer} {self.producers}->1 {self.size} B"
        return f"throughput {self.peer} {self.size} B"


def plan(peers: list[str], sizes: list[int], producers: list[int], multi_size: int, rtt_sizes: list[int],
         rtt_waits: list[str] | None) -> tuple[list[Case], list[dict[str, Any]]]:
    """Every case to run, and every case skipped with its reason."""
    cases, skipped = [], []

    def add(case: Case) -> None:
        reason = PEERS[case.peer].skip_reason(case.size, case.producers)
        if reason:
            skipped.append({**asdict(case), "name": case.name, "reason": reason})
        else:
            cases.append(case)

    for size in sizes:
        for key in peers:
            add(Case("throughput", key, size))
    for n in producers:
        for key in peers:
            add(Case("multi", key, multi_size, n))
    for size in rtt_sizes:
        for key in peers:
            for wait in PEERS[key].rtt_waits:
                if rtt_waits is None or wait in rtt_waits:
                    add(Case("rtt", key, size, wait=wait))
    return cases, skipped


def _run(case: Case, count: int, warmup: int, timeout: float) -> dict[str, Any]:
    if case.kind == "rtt":
        return runner.ping_pong(case.peer, case.size, wait=case.wait, count=count, warmup=warmup,
                                timeout=timeout).as_dict()
    return runner.throughput(case.peer, case.size, producers=case.producers, count=count, warmup=warmup,
                             multi=case.kind == "multi", timeout=timeout).as_dict()


def _size_from(case: Case, run: dict[str, Any], seconds: float) -> int:
    """How many messages (per producer) or round trips make a run of about ``seconds``."""
    if case.kind == "rtt":
        per_s = 1e6 / max(run["p50_us"], 1e-3)
        return int(min(MAX_RTT, max(MIN_RTT, per_s * seconds)))
    per_producer = run["msgs_per_s"] / case.producers
    return int(min(MAX_MESSAGES, max(MIN_MESSAGES, per_producer * seconds)))


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _describe(case: Case, run: dict[str, Any]) -> str:
    if case.kind == "rtt":
        return f"p50 {run['p50_us']:.2f} µs  p99 {run['p99_us']:.2f} µs"
    return f"{run['msgs_per_s'] / 1e6:8.3f} M msg/s  {run['cpu_s_per_million']:.2f} CPU s/M"


def execute(cases: list[Case], *, runs: int, seconds: float, messages: int | None, rtt_samples: int | None,
            warmup: int) -> dict[Case, list[dict[str, Any]]]:
    """Calibration round (unless counts are fixed), then ``runs`` interleaved rounds; failures are kept."""
    counts: dict[Case, int] = {}
    for case in cases:
        fixed = rtt_samples if case.kind == "rtt" else messages
        if fixed is not None:
            counts[case] = fixed
    todo = [c for c in cases if c not in counts]
    for i, case in enumerate(todo):
        batch = PEERS[case.peer].batch
        count = CALIBRATION_RTT if case.kind == "rtt" else CALIBRATION_MESSAGES * (10 if batch else 1)
        try:
            run = _run(case, count, warmup, CALIBRATION_TIMEOUT_S)
            counts[case] = _size_from(case, run, seconds)
            _log(f"[calibrate {i + 1}/{len(todo)}] {case.name}: {_describe(case, run)} -> {counts[case]:,}")
        except runner.RunFailed as exc:
            counts[case] = count
            _log(f"[calibrate {i + 1}/{len(todo)}] {case.name}: FAILED {str(exc).splitlines()[0]}")
    raw: dict[Case, list[dict[str, Any]]] = {c: [] for c in cases}
    for round_no in range(runs):
        order = cases if round_no % 2 == 0 else list(reversed(cases))
        for i, case in enumerate(order):
            t0 = time.monotonic()
            try:
                # a lost message shows as a consumer that never finishes: give up well before 5 minutes
                run = _run(case, counts[case], warmup, max(60.0, 30 * seconds))
                run["round"] = round_no
                raw[case].append(run)
                _log(f"[round {round_no + 1}/{runs} {i + 1}/{len(order)}] {case.name}: {_describe(case, run)} "
                     f"({time.monotonic() - t0:.1f} s)")
            except runner.RunFailed as exc:
                raw[case].append({"round": round_no, "error": str(exc)})
                _log(f"[round {round_no + 1}/{runs} {i + 1}/{len(order)}] {case.name}: FAILED {exc}")
    return raw


# -- aggregation --------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else None


def _paired_ratio(num: list[dict[str, Any]], den: list[dict[str, Any]], key: str) -> float | None:
    """Median over rounds of num/den measured in the same round."""
    by_round = {r["round"]: r[key] for r in den if "error" not in r}
    ratios = [r[key] / by_round[r["round"]] for r in num if "error" not in r and by_round.get(r["round"])]
    return _median(ratios)


def _errors(runs: list[dict[str, Any]]) -> list[str]:
    return [r["error"].splitlines()[0] for r in runs if "error" in r]


def summarize(raw: dict[Case, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"throughput": [], "multi": [], "rtt": []}
    zmq = {c.size: runs for c, runs in raw.items() if c.kind == "throughput" and c.peer == "zmq"}
    naive = {c.size: runs for c, runs in raw.items() if c.kind == "throughput" and c.peer == "naive-ring"}
    naive_rtt = {(c.size, c.wait): runs for c, runs in raw.items() if c.kind == "rtt" and c.peer == "naive-ring"}
    for case, runs in raw.items():
        ok = [r for r in runs if "error" not in r]
        row: dict[str, Any] = {"peer": case.peer, "label": PEERS[case.peer].label, "size": case.size,
                               "runs": len(ok), "failed": _errors(runs)}
        if case.kind == "rtt":
            row.update(wait=case.wait, samples=ok[0]["samples"] if ok else 0,
                       **{k: _median([r[k] for r in ok]) for k in ("p50_us", "p99_us", "p999_us", "max_us")})
            if (case.size, case.wait) in naive_rtt:
                row["p50_vs_naive"] = _paired_ratio(runs, naive_rtt[(case.size, case.wait)], "p50_us")
        else:
            rates = [r["msgs_per_s"] for r in ok]
            row.update(
                producers=case.producers,
                messages=ok[0]["messages"] if ok else 0,
                msgs_per_s=_median(rates),
                min_msgs_per_s=min(rates) if rates else None,
                max_msgs_per_s=max(rates) if rates else None,
                mb_per_s=_median([r["mb_per_s"] for r in ok]),
                cpu_s_per_million=_median([r["cpu_s_per_million"] for r in ok]),
                cpu_helper_share=_median([r["cpu_helper"] / max(1e-12, r["cpu_s_per_million"] * r["messages"] / 1e6)
                                          for r in ok]),
            )
            if case.kind == "throughput" and case.size in zmq:
                row["vs_zmq"] = _paired_ratio(runs, zmq[case.size], "msgs_per_s")
            if case.kind == "throughput" and case.size in naive:
                row["vs_naive"] = _paired_ratio(runs, naive[case.size], "msgs_per_s")
        row["others_cpu"] = _median([r.get("others_cpu") for r in ok])
        row["steal"] = _median([r.get("steal") for r in ok])
        out[case.kind].append(row)
    return out


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def targets(summary: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The issue's targets against the measured medians (None when a row is missing)."""
    tput, rtt = summary["throughput"], summary["rtt"]
    out = []

    def add(name: str, value: float | None, goal: float, unit: str, higher_is_better: bool = True) -> None:
        met = None if value is None else (value >= goal if higher_is_better else value <= goal)
        out.append({"target": name, "measured": value, "goal": goal, "unit": unit, "met": met})

    for key, label in (("logbuf", "per-message"), ("logbuf-driver", "per-message via driver")):
        row = _find(tput, peer=key, size=32)
        if row is None and key == "logbuf-driver":
            continue
        add(f"logbuf {label} at 32 B ≥ 5 M msg/s", row and row["msgs_per_s"], TARGET_PER_MESSAGE, "msg/s")
        add(f"logbuf {label} at 32 B ≥ 4× pyzmq ipc", row and row.get("vs_zmq"), TARGET_VS_ZMQ, "×")
        if key == "logbuf":
            add("logbuf per-message at 32 B ≥ 2× the naive SPSC ring", row and row.get("vs_naive"),
                TARGET_VS_NAIVE, "×")
    row = _find(tput, peer="logbuf-batch", size=32)
    add("logbuf batch at 32 B ≥ 30 M msg/s", row and row["msgs_per_s"], TARGET_BATCH, "msg/s")
    for key, label in (("logbuf", "per-message"), ("logbuf-driver", "via driver")):
        row = _find(rtt, peer=key, size=32, wait="backoff")
        if row is None and key == "logbuf-driver":
            continue
        add(f"logbuf {label} ping-pong RTT p50 at 32 B ≤ 1.5 µs", row and row["p50_us"], TARGET_RTT_P50_US, "µs",
            higher_is_better=False)
        if key == "logbuf":
            add("logbuf per-message ping-pong RTT p50 at 32 B ≤ 0.5× the naive ring's", row and row.get("p50_vs_naive"),
                TARGET_RTT_VS_NAIVE, "×", higher_is_better=False)
    return out


def busy_verdict(info: dict[str, Any], summary: dict[str, list[dict[str, Any]]],
                 raw: dict[Case, list[dict[str, Any]]]) -> dict[str, Any]:
    others = [r["others_cpu"] for runs in raw.values() for r in runs
              if "error" not in r and r.get("others_cpu") is not None and not math.isnan(r["others_cpu"])]
    steal = [r["steal"] for runs in raw.values() for r in runs if "error" not in r and r.get("steal") is not None]
    median_others = _median(others)
    max_others = max(others) if others else None
    busy = (info["load_1m_at_start"] > 0.5 or (median_others or 0) > 0.05 or (max_others or 0) > 0.25)
    return {"busy": busy, "others_cpu_median": median_others, "others_cpu_max": max_others,
            "steal_median": _median(steal), "runs_with_others_over_10pct": sum(o > 0.10 for o in others),
            "runs_measured": len(others)}


# -- the command --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=0.5, help="target length of each run (default 0.5)")
    parser.add_argument("--messages", type=int, help="fixed messages per producer per run (skips calibration)")
    parser.add_argument("--rtt-samples", type=int, help="fixed round trips per run (skips calibration)")
    parser.add_argument("--warmup", type=int, default=1000, help="in-process warm-up messages per run")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS), metavar="PEER",
                        help=f"subset of: {' '.join(PEERS)}")
    parser.add_argument("--producers", type=int, nargs="*", default=list(PRODUCERS),
                        help="multi-producer series (empty: none)")
    parser.add_argument("--multi-size", type=int, default=32, help="payload of the multi-producer series")
    parser.add_argument("--rtt-sizes", type=int, nargs="*", default=list(SIZES), help="(empty: no ping-pong)")
    parser.add_argument("--rtt-waits", nargs="+", choices=("backoff", "blocking"), help="default: all")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for peers.json/.md/.png")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    parser.add_argument("--from-json", type=Path, metavar="PEERS_JSON",
                        help="measure nothing: render peers.md and the charts again from a results file")
    args = parser.parse_args(argv)
    if args.from_json is not None:
        return render(json.loads(args.from_json.read_text()), args.out, charts=not args.no_charts)
    if args.runs < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--runs and --seconds must be positive, --warmup >= 0")
    for name in ("messages", "rtt_samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if any(s < 8 for s in args.sizes + args.rtt_sizes + [args.multi_size]):
        parser.error("payload sizes must be >= 8 bytes (each message carries an 8-byte stamp)")
    if any(p < 1 for p in args.producers):
        parser.error("--producers must be positive")

    command = "python -m bench peers " + shlex.join(sys.argv[2:] if argv is None else argv)
    info = machine.describe()
    started = time.time()
    cases, skipped = plan(args.peers, args.sizes, args.producers, args.multi_size, args.rtt_sizes, args.rtt_waits)
    for s in skipped:
        _log(f"[skip] {s['name']}: {s['reason']}")
    raw = execute(cases, runs=args.runs, seconds=args.seconds, messages=args.messages,
                  rtt_samples=args.rtt_samples, warmup=args.warmup)
    info["load_1m_at_end"] = machine.load_average()
    summary = summarize(raw)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "command": command.strip(),
        "machine": info,
        "settings": {"runs": args.runs, "seconds": args.seconds, "messages": args.messages,
                     "rtt_samples": args.rtt_samples, "warmup": args.warmup},
        "usage": {k: PEERS[k].usage for k in args.peers},
        "labels": {k: PEERS[k].label for k in args.peers},
        **summary,
        "targets": targets(summary),
        "noise": busy_verdict(info, summary, raw),
        "skipped": skipped,
        "raw": {c.name: runs for c, runs in raw.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    result = _finite(result)
    (args.out / "peers.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    render(result, args.out, charts=not args.no_charts)
    failed = sum(bool(row["failed"]) for rows in summary.values() for row in rows)
    return 1 if failed else 0


def render(result: dict[str, Any], out: Path, *, charts: bool = True) -> int:
    """peers.md (and the PNG charts) from a result, into ``out``."""
    from bench import report

    out.mkdir(parents=True, exist_ok=True)
    written = report.charts(result, out) if charts else []
    text = report.markdown(result, [p.name for p in written])
    (out / "peers.md").write_text(text)
    print(text)
    return 0


def _finite(value: Any) -> Any:
    """JSON has no NaN: unknown figures (too short a window for /proc/stat) become null."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
