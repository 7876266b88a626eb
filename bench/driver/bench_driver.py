"""``python -m bench.driver``: what the media driver costs.

1. Transport through the driver (``connect()`` + ``add_exclusive_publication`` / ``add_subscription``) vs the
   same rigs driver-less, interleaved round by round, medians: goal within 10%.
2. The wake-up semaphore: the cost it adds to ``offer`` when nobody waits (same process, same log, wake
   configured vs not, interleaved), and the wake-up latency of a subscriber process blocked in ``wait``.
3. The driver's CPU with no traffic (a ``logbuf driver`` process, default idle strategy): goal < 2% of a core.
4. A ``logbuf stat --json`` snapshot of the driver after a run.

Results: ``bench/results/driver.json`` and ``driver.md``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import machine
from logbuf.samples.ipc import ping_pong, throughput

RESULTS = Path(__file__).resolve().parents[1] / "results"
CTX = multiprocessing.get_context("spawn")


def transport(runs: int, messages: int, rtt_samples: int) -> dict[str, Any]:
    rows: dict[str, list[float]] = {}
    for _ in range(runs):
        for via in (False, True):
            tag = "via driver" if via else "driver-less"
            rows.setdefault(f"per-message 32 B {tag}", []).append(throughput(32, messages, via_driver=via).msgs_per_s)
            rows.setdefault(f"batch 32 B {tag}", []).append(
                throughput(32, messages * 4, batch=True, via_driver=via).msgs_per_s
            )
            rtt = ping_pong(32, rtt_samples, warmup=rtt_samples // 5, via_driver=via)
            rows.setdefault(f"RTT p50 us {tag}", []).append(rtt.p50_us)
            rows.setdefault(f"RTT p99 us {tag}", []).append(rtt.p99_us)
    return {name: {"median": statistics.median(v), "runs": v} for name, v in rows.items()}


def offer_cost(rounds: int, offers: int) -> dict[str, Any]:
    """ns per 32-byte offer with and without a wake-up semaphore configured (nobody waiting)."""
    import posix_ipc

    from logbuf.client.publication import ExclusivePublication
    from logbuf.logbuffer.log_buffers import LogBuffers
    from logbuf.position import Position

    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(prefix="logbuf-wake-", dir=base)
    name = f"/logbuf-bench-{os.getpid()}"
    semaphore = posix_ipc.Semaphore(name, posix_ipc.O_CREAT, initial_value=0)
    try:
        results: dict[str, list[float]] = {"no wake-up": [], "wake-up configured": []}
        message = bytes(32)
        for r in range(rounds):
            for label, wake in (("no wake-up", None), ("wake-up configured", name)):
                log = LogBuffers.create(os.path.join(directory, f"{r}-{wake is not None}.log"), term_length=64 << 20)
                pub = ExclusivePublication(log, Position.standalone(1 << 62), wake_semaphore=wake)
                offer = pub.offer
                start = time.perf_counter_ns()
                for _ in range(offers):
                    offer(message)
                results[label].append((time.perf_counter_ns() - start) / offers)
                pub.close()
                log.close()
                os.unlink(os.path.join(directory, f"{r}-{wake is not None}.log"))
        return {k: {"median_ns": statistics.median(v), "runs_ns": v} for k, v in results.items()}
    finally:
        semaphore.unlink()
        semaphore.close()
        shutil.rmtree(directory, ignore_errors=True)


def _waiter(directory: str, count: int, results: Any) -> None:
    import logbuf

    with logbuf.connect(directory) as client:
        sub = client.add_subscription("aeron:ipc", 77)
        while not sub.images:
            time.sleep(0.001)
        latencies = []
        got: list[int] = []

        def on_fragment(buffer: memoryview, header: Any) -> None:
            got.append(int.from_bytes(buffer[:8], "little"))

        results.put(("ready", 0))
        while len(latencies) < count:
            if sub.poll(on_fragment, 10) == 0:
                sub.wait(1.0)
                continue
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            latencies.extend(now - stamp for stamp in got)  # one sample per message, however many one poll took
            got.clear()
        results.put(("latencies", latencies))


def wake_latency(samples: int) -> dict[str, Any]:
    """Publisher offers a monotonic timestamp every ~2 ms; a subscriber process asleep in wait() measures
    the time from the offer to its poll returning the message."""
    import logbuf

    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(prefix="logbuf-wakelat-", dir=base)
    driver = logbuf.MediaDriver.launch(os.path.join(directory, "drv"))
    results = CTX.Queue()
    proc = CTX.Process(target=_waiter, args=(str(driver.directory), samples, results))
    try:
        with logbuf.connect(driver.directory) as client:
            pub = client.add_exclusive_publication("aeron:ipc?term-length=1m", 77)
            proc.start()
            assert results.get(timeout=30)[0] == "ready"
            for _ in range(samples):
                time.sleep(0.002)  # let the subscriber fall asleep
                while pub.offer(time.clock_gettime_ns(time.CLOCK_MONOTONIC).to_bytes(8, "little")) < 0:
                    time.sleep(0.0001)
            kind, latencies = results.get(timeout=60)
        us = np.array(latencies) / 1000
        return {
            "samples": len(us),
            "p50_us": float(np.percentile(us, 50)),
            "p99_us": float(np.percentile(us, 99)),
            "max_us": float(us.max()),
        }
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        driver.close()
        shutil.rmtree(directory, ignore_errors=True)


def driver_idle_cpu(seconds: float) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="logbuf-idle-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "driver", "--dir", os.path.join(directory, "drv")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tck = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tck

    try:
        time.sleep(2)  # start-up (imports) is not idle time
        c0, t0 = cpu(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu(), time.monotonic()
        return {"seconds": t1 - t0, "percent_of_a_core": 100 * (c1 - c0) / (t1 - t0), "idle_strategy": "default"}
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def stat_snapshot() -> dict[str, Any]:
    """``logbuf stat --json`` of a driver with one publication and one subscription that moved data."""
    import logbuf
    from logbuf.directory import cnc_path
    from logbuf.tools import read_stat

    directory = tempfile.mkdtemp(prefix="logbuf-stat-")
    try:
        with logbuf.MediaDriver.launch(os.path.join(directory, "drv")) as driver, logbuf.connect(driver.directory) as c:
            sub = c.add_subscription("aeron:ipc", 1001)
            pub = c.add_publication("aeron:ipc?term-length=1m", 1001)
            while not pub.is_connected:
                time.sleep(0.001)
            for _ in range(10_000):
                while pub.offer(bytes(32)) < 0:
                    sub.poll(lambda b, h: None, 1000)
            while sub.poll(lambda b, h: None, 1000):
                pass
            time.sleep(0.05)
            return read_stat(cnc_path(driver.directory)).to_dict()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def markdown(result: dict[str, Any]) -> str:
    t = result["transport"]
    lines = [
        f"# Media driver benchmarks ({result['date']})",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {result['machine'].get('cpu')}, {result['machine'].get('cores')} cores; "
        f"load before {result['load_before']:.2f}, after {result['load_after']:.2f}",
        "",
        "| measure | driver-less | via driver | ratio |",
        "|---|---|---|---|",
    ]
    for name in ("per-message 32 B", "batch 32 B"):
        a, b = t[f"{name} driver-less"]["median"], t[f"{name} via driver"]["median"]
        lines.append(f"| {name} msg/s | {a / 1e6:.2f} M | {b / 1e6:.2f} M | {b / a:.2f} |")
    for name in ("RTT p50 us", "RTT p99 us"):
        a, b = t[f"{name} driver-less"]["median"], t[f"{name} via driver"]["median"]
        lines.append(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f} |")
    oc = result["offer_cost"]
    lines += [
        "",
        f"Offer 32 B, nobody waiting: {oc['no wake-up']['median_ns']:.0f} ns without a wake-up semaphore, "
        f"{oc['wake-up configured']['median_ns']:.0f} ns with one (median of interleaved rounds).  ",
        f"Wake-up latency (offer → poll in a process asleep in `wait()`): p50 {result['wake_latency']['p50_us']:.0f} µs, "
        f"p99 {result['wake_latency']['p99_us']:.0f} µs over {result['wake_latency']['samples']} samples.  ",
        f"Driver idle CPU (no traffic, default idle strategy): {result['idle_cpu']['percent_of_a_core']:.2f}% of a core "
        f"over {result['idle_cpu']['seconds']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.driver")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rtt-samples", type=int, default=50_000)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    command = "python -m bench.driver " + " ".join(argv if argv is not None else sys.argv[1:])
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": command.strip(),
        "machine": machine.describe(),
        "load_before": machine.load_average(),
    }
    result["transport"] = transport(args.runs, args.messages, args.rtt_samples)
    result["offer_cost"] = offer_cost(args.runs, 1_000_000)
    result["wake_latency"] = wake_latency(500)
    result["idle_cpu"] = driver_idle_cpu(args.idle_seconds)
    result["stat_snapshot"] = stat_snapshot()
    result["load_after"] = machine.load_average()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "driver.json").write_text(json.dumps(result, indent=2))
    (args.out / "driver.md").write_text(markdown(result))
    print(markdown(result))
    return 0
