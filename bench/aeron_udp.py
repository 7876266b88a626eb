"""``python -m bench aeron-udp``: UDP on loopback through two ``logbuf driver`` processes and two ``aeronmd``,
with Aeron's C samples as the clients, interleaved in the same run - throughput, ping-pong RTT and the ratios.

For each round, each threading mode (``--modes``, default ``shared,dedicated``) and each driver kind (logbuf,
and Aeron's C driver when its binaries are found), two fresh drivers are started (driver A publishes, driver B
subscribes), then:

1. throughput: ``rate_subscriber`` on B, ``streaming_publisher -m N -L 32`` on A, one UDP stream A -> B; the
   figure is the publisher's ``Total`` rate (every message offered, under the driver's flow control; the
   window keeps it within one window of what B received);
2. RTT: ``cpong`` on B, ``cping`` on A (ping A -> B, pong B -> A, each on its own UDP channel), 32 B; p50 and
   p99 from cping's HdrHistogram table.

Rounds alternate the order of modes and kinds.  Figures are medians over rounds; ratios are logbuf / aeronmd
(throughput: >= 1 is as fast; RTT: <= 1 is as fast).  With ``--busy-core`` (default on) a last throughput run
per logbuf mode shares the machine with one busy-looping process, and the drivers' duty-cycle counters (max
cycle time, cycles over the threshold, per agent) are read from their cnc.dat before they stop.

The binaries: ``$AERON_BIN`` (a directory holding ``bin/``), else ``aeron-bin`` beside the repository's parent
directory's ``shared/`` folder; without ``aeronmd`` only logbuf's drivers run.
The Python client's own UDP figures (``python -m bench.udp``, ``results/udp.json``) are shown beside.
Results: ``bench/results/aeron_udp.json`` and ``aeron_udp.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import machine
from bench.udp.bench_udp import free_port, wait_for_driver

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
MODES = ("shared", "shared-network", "dedicated")
AERON_MODE = {"shared": "SHARED", "shared-network": "SHARED_NETWORK", "dedicated": "DEDICATED"}
SIZE = 32
# system counter ids (Aeron's): max cycle time and cycles over the threshold, per agent
CYCLE_COUNTERS = {"conductor": (26, 27), "sender": (28, 29), "receiver": (30, 31)}


def find_aeron_bin() -> Path | None:
    """The directory holding Aeron's ``bin/`` (see the module docstring), or None."""
    candidates = []
    if os.environ.get("AERON_BIN"):
        candidates.append(Path(os.environ["AERON_BIN"]))
    candidates += [ROOT.parent / "shared" / "aeron-bin"]
    for candidate in candidates:
        for base in (candidate, candidate.parent):
            if (base / "bin" / "streaming_publisher").is_file():
                return base
    return None


def _channel(port: int) -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}"


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def read_cycle_counters(directory: str) -> dict[str, dict[str, int]]:
    """Each agent's max cycle time (ns) and cycles over the threshold, from the driver's cnc.dat."""
    from logbuf.cnc.cnc_file import CncFile

    with CncFile.open(os.path.join(directory, "cnc.dat")) as cnc:
        reader = cnc.counters_reader()
        return {agent: {"max_cycle_ns": reader.counter_value(max_id), "over_threshold": reader.counter_value(over)}
                for agent, (max_id, over) in CYCLE_COUNTERS.items()}


@contextlib.contextmanager
def drivers(kind: str, mode: str, aeron: Path | None, logbuf_args: list[str]) -> Iterator[tuple[str, str]]:
    """Two drivers of ``kind`` (``logbuf`` or ``aeronmd``) in ``mode``, each in a fresh directory; both stopped
    by their PIDs, their directories removed."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    scratch = tempfile.mkdtemp(prefix="logbuf-aeron-udp-", dir=base)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        directories = []
        for name in ("a", "b"):
            directory = os.path.join(scratch, name)
            env = dict(os.environ)
            if kind == "logbuf":
                env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
                command = [sys.executable, "-m", "logbuf.cli", "driver", "--dir", directory,
                           "--threading-mode", mode, *logbuf_args]
            else:
                assert aeron is not None
                env.update(AERON_DIR=directory, AERON_THREADING_MODE=AERON_MODE[mode], AERON_DIR_DELETE_ON_START="1",
                           AERON_DIR_DELETE_ON_SHUTDOWN="1")
                command = [str(aeron / "bin" / "aeronmd")]
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            procs.append(proc)
            wait_for_driver(directory, proc)
            directories.append(directory)
        yield directories[0], directories[1]
    finally:
        for proc in procs:
            _stop(proc, signal.SIGINT if kind == "aeronmd" else signal.SIGTERM)
        shutil.rmtree(scratch, ignore_errors=True)


def _run(command: list[str], timeout: float) -> str:
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    return done.stdout.decode(errors="replace")


def throughput(aeron: Path, a: str, b: str, messages: int, timeout: float) -> dict[str, Any]:
    channel = _channel(free_port())
    subscriber = subprocess.Popen([str(aeron / "bin" / "rate_subscriber"), "-p", b, "-c", channel, "-s", "1001"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = _run([str(aeron / "bin" / "streaming_publisher"), "-p", a, "-c", channel, "-s", "1001",
                    "-m", str(messages), "-L", str(SIZE)], timeout)
    finally:
        _stop(subscriber, signal.SIGINT)
    match = re.search(r"Total: (\d+)ms, ([0-9.e+]+) msgs/sec", out)
    if match is None:
        raise RuntimeError(f"streaming_publisher printed no total: {out[-400:]!r}")
    return {"messages": messages, "ms": int(match.group(1)), "msgs_per_s": float(match.group(2))}


def parse_percentiles(out: str) -> dict[str, float]:
    """p50 and p99 (µs) from cping's HdrHistogram percentile table."""
    rows = [(float(v), float(p)) for v, p in re.findall(r"^\s+([0-9.]+)\s+([01]\.\d+)\s+\d+\s", out, re.M)]
    if not rows:
        raise RuntimeError(f"cping printed no percentile table: {out[-400:]!r}")

    def at(q: float) -> float:
        return next(value for value, percentile in rows if percentile >= q)

    return {"p50_us": at(0.5), "p99_us": at(0.99)}


def rtt(aeron: Path, a: str, b: str, samples: int, warmup: int, timeout: float) -> dict[str, Any]:
    ping, pong = _channel(free_port()), _channel(free_port())
    ponger = subprocess.Popen([str(aeron / "bin" / "cpong"), "-p", b, "-c", ping, "-C", pong],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = _run([str(aeron / "bin" / "cping"), "-p", a, "-c", ping, "-C", pong, "-m", str(samples),
                    "-w", str(warmup), "-L", str(SIZE)], timeout)
    finally:
        _stop(ponger, signal.SIGINT)
    return {"samples": samples, **parse_percentiles(out)}


def _busy_loop() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_case(kind: str, mode: str, aeron: Path, args: argparse.Namespace, busy: bool = False) -> dict[str, Any]:
    case: dict[str, Any] = {"kind": kind, "mode": mode, "busy_core": busy}
    hog = _busy_loop() if busy else None
    try:
        with drivers(kind, mode, aeron, args.logbuf_args) as (a, b):
            try:
                case["throughput"] = throughput(aeron, a, b, args.messages, args.timeout)
                if not busy:
                    case["rtt"] = rtt(aeron, a, b, args.pings, args.warmup, args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                case["error"] = str(exc)
            if kind == "logbuf":
                case["cycle_counters"] = {"a": read_cycle_counters(a), "b": read_cycle_counters(b)}
    except RuntimeError as exc:
        case["error"] = str(exc)
    finally:
        if hog is not None:
            _stop(hog, signal.SIGKILL)
    return case


def _median(cases: list[dict[str, Any]], kind: str, mode: str, section: str, key: str) -> float | None:
    values = [c[section][key] for c in cases
              if c["kind"] == kind and c["mode"] == mode and not c["busy_core"] and section in c]
    return statistics.median(values) if values else None


def summarize(cases: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for mode in modes:
        row: dict[str, Any] = {}
        for kind in ("logbuf", "aeronmd"):
            row[kind] = {"msgs_per_s": _median(cases, kind, mode, "throughput", "msgs_per_s"),
                         "p50_us": _median(cases, kind, mode, "rtt", "p50_us"),
                         "p99_us": _median(cases, kind, mode, "rtt", "p99_us")}
        ours, theirs = row["logbuf"], row["aeronmd"]
        row["ratio"] = {key: (ours[key] / theirs[key] if ours[key] and theirs[key] else None)
                        for key in ("msgs_per_s", "p50_us", "p99_us")}
        summary[mode] = row
    return summary


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}{unit}"


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# UDP through two drivers, Aeron's C samples as clients ({result['date']})",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {m.get('cpu')}, {m.get('cores')} cores" + (f" ({m['hypervisor']} guest)" if m.get("hypervisor")
                                                               else "")
        + f", kernel {m.get('kernel')}; load average {result['load_before']:.2f} before, "
        f"{result['load_after']:.2f} after.  ",
        f"{SIZE} B messages, loopback; logbuf drivers: `logbuf driver --threading-mode MODE "
        f"{' '.join(result['logbuf_args'])}`; aeronmd: defaults with `AERON_THREADING_MODE`"
        + ("" if result["aeron_driver"] else " (aeronmd not found: logbuf only)") + ".",
        "",
        "| mode | driver | msg/s | RTT p50 | RTT p99 |",
        "|---|---|---:|---:|---:|",
    ]
    for mode, row in result["summary"].items():
        for kind in ("logbuf", "aeronmd"):
            r = row[kind]
            lines.append(f"| {mode} | {kind} | {_fmt(r['msgs_per_s'], 1e6, 3, ' M')} | {_fmt(r['p50_us'], unit=' µs')} "
                         f"| {_fmt(r['p99_us'], unit=' µs')} |")
        ratio = row["ratio"]
        lines.append(f"| {mode} | **logbuf / aeronmd** | {_fmt(ratio['msgs_per_s'], digits=2, unit='×')} "
                     f"| {_fmt(ratio['p50_us'], digits=2, unit='×')} | {_fmt(ratio['p99_us'], digits=2, unit='×')} |")
    busy = [c for c in result["cases"] if c["busy_core"]]
    if busy:
        lines += ["", "Duty cycles with one more busy-looping process (logbuf drivers, throughput run; max cycle "
                  "time in µs / cycles over the 1 ms threshold, publisher's driver A and subscriber's driver B):", "",
                  "| mode | msg/s | A conductor | A sender | A receiver | B conductor | B sender | B receiver |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for case in busy:
            counters = case.get("cycle_counters", {})
            cells = [f"{counters[d][agent]['max_cycle_ns'] / 1e3:.0f} / {counters[d][agent]['over_threshold']}"
                     if d in counters else "-" for d in ("a", "b") for agent in ("conductor", "sender", "receiver")]
            lines.append(f"| {case['mode']} | {_fmt(case.get('throughput', {}).get('msgs_per_s'), 1e6, 3, ' M')} | "
                         + " | ".join(cells) + " |")
        lines += ["", "(A role that runs in the driver's Python loop rather than on a native agent writes no counters "
                  "of its own: its time is in the conductor's figure.)"]
    errors = [c for c in result["cases"] if "error" in c]
    if errors:
        lines += ["", "Failed runs:", ""] + [f"* {c['kind']} {c['mode']}: {c['error']}" for c in errors]
    python_udp = result.get("python_client_udp")
    if python_udp:
        lines += ["", f"The Python client over UDP (`{python_udp['command']}`, {python_udp['date']}, one driver): "
                  f"{python_udp['msgs_per_s'] / 1e6:.3f} M msg/s at 32 B, RTT p50 {python_udp['p50_us']:.1f} µs, "
                  f"p99 {python_udp['p99_us']:.1f} µs."]
    return "\n".join(lines) + "\n"


def _python_client_udp() -> dict[str, Any] | None:
    path = RESULTS / "udp.json"
    try:
        data = json.loads(path.read_text())
        return {"command": data["command"], "date": data["date"],
                "msgs_per_s": data["throughput"]["32"]["median_msgs_per_s"],
                "p50_us": data["rtt"]["p50_us"], "p99_us": data["rtt"]["p99_us"]}
    except (OSError, ValueError, KeyError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench aeron-udp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="shared,dedicated",
                        help=f"comma-separated threading modes ({', '.join(MODES)}; default shared,dedicated)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (medians reported; default 1)")
    parser.add_argument("--messages", type=int, default=2_000_000, help="messages per throughput run (2000000)")
    parser.add_argument("--pings", type=int, default=20_000, help="RTT samples per run (20000)")
    parser.add_argument("--warmup", type=int, default=2_000, help="RTT warm-up messages (2000)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one sample may run (60)")
    parser.add_argument("--no-busy-core", dest="busy_core", action="store_false",
                        help="skip the duty-cycle run beside a busy-looping process")
    parser.add_argument("--no-aeronmd", dest="aeronmd", action="store_false", help="run logbuf's drivers only")
    parser.add_argument("--logbuf-args", default="--idle yield --pre-touch",
                        help="extra `logbuf driver` options (default: --idle yield --pre-touch)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(MODES)}")
    args.logbuf_args = args.logbuf_args.split()
    aeron = find_aeron_bin()
    if aeron is None:
        print("Aeron's C samples (streaming_publisher, rate_subscriber, cping, cpong) were not found: set "
              "AERON_BIN to the directory holding their bin/", file=sys.stderr)
        return 2
    kinds = ["logbuf"] + (["aeronmd"] if args.aeronmd and (aeron / "bin" / "aeronmd").is_file() else [])
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": ("python -m bench aeron-udp " + " ".join(argv if argv is not None else sys.argv[1:])).strip(),
        "machine": machine.describe(),
        "load_before": machine.load_average(),
        "modes": modes,
        "logbuf_args": args.logbuf_args,
        "aeron_driver": "aeronmd" in kinds,
    }
    cases = []
    for round_index in range(args.rounds):
        order = [(mode, kind) for mode in modes for kind in kinds]
        for mode, kind in order[::-1] if round_index % 2 else order:
            case = run_case(kind, mode, aeron, args)
            print(json.dumps(case), file=sys.stderr, flush=True)
            cases.append(case)
    if args.busy_core:
        for mode in modes:
            case = run_case("logbuf", mode, aeron, args, busy=True)
            print(json.dumps(case), file=sys.stderr, flush=True)
            cases.append(case)
    result["cases"] = cases
    result["summary"] = summarize(cases, modes)
    result["python_client_udp"] = _python_client_udp()
    result["load_after"] = machine.load_average()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "aeron_udp.json").write_text(json.dumps(result, indent=2))
    (args.out / "aeron_udp.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
