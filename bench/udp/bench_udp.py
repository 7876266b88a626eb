"""``python -m bench.udp``: UDP through the media driver on loopback - throughput and ping-pong RTT.

Set-up (what Aeron's numbers on this machine were taken with): one ``logbuf driver`` process in shared mode
(conductor, sender and receiver in one loop) with the yielding idle strategy; client processes with yielding
idle strategies.  Both ends of each stream are in the same driver: the sender's datagrams go through the
kernel's loopback to the same driver's receiver, which rebuilds them into an image the subscriber reads.

1. Throughput: a publisher process offers ``--messages`` messages one at a time (``offer``) on
   ``aeron:udp?endpoint=127.0.0.1:P``; a subscriber process polls them; msg/s from the first offer to the last
   message received.  Payloads 32 B and 256 B, ``--runs`` runs each, interleaved; medians.
2. Ping-pong: a pinger offers 32 B on one UDP channel, a ponger echoes it on another, the pinger measures the
   round trip (two trips through the driver's sender and receiver, four through loopback sockets).

For scale: Aeron's C media driver here does 0.15-0.40 M msg/s at 32 B and an RTT p50 of ~20 us with
yielding clients.  Results: ``bench/results/udp.json`` and ``udp.md`` (date, machine, load, command).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench import machine

RESULTS = Path(__file__).resolve().parents[1] / "results"
ROOT = Path(__file__).resolve().parents[2]
CTX = multiprocessing.get_context("spawn")
SIZES = (32, 256)
TERM = "16m"
AERON_C_32B_MSGS_PER_S = (0.15e6, 0.40e6)
AERON_C_RTT_P50_US = 20.0


def free_port() -> int:
    """A UDP port on loopback that nothing holds now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _channel(port: int) -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}|term-length={TERM}"


@contextlib.contextmanager
def driver_process(idle: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``logbuf driver`` process (shared mode) in a fresh directory; stopped by its PID."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    scratch = tempfile.mkdtemp(prefix="logbuf-udp-bench-", dir=base)
    directory = os.path.join(scratch, "driver")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "driver", "--dir", directory, "--idle", idle,
         "--threading-mode", "shared", "--pre-touch"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )
    try:
        wait_for_driver(directory, proc)
        yield directory, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()
        shutil.rmtree(scratch, ignore_errors=True)


def wait_for_driver(directory: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Returns once the driver ``proc`` serves ``directory`` (its cnc.dat names its pid and it has heartbeated)."""
    from logbuf.cnc.cnc_file import CncFile

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"driver exited ({proc.returncode})")
        with contextlib.suppress(Exception), CncFile.open(os.path.join(directory, "cnc.dat")) as cnc:
            if cnc.to_driver.consumer_heartbeat_time > 0 and cnc.layout.pid == proc.pid:
                return
        time.sleep(0.05)
    raise RuntimeError("the driver did not come up")


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- process roles ------------------------------------------------------------------------------------


def _publisher(directory: str, channel: str, size: int, count: int, results: Any) -> None:
    import logbuf
    from logbuf.idle import YieldingIdleStrategy

    with logbuf.connect(directory) as client:
        pub = client.add_exclusive_publication(channel, 1)
        deadline = time.monotonic() + 30
        while not pub.is_connected:
            if time.monotonic() > deadline:
                raise TimeoutError("the publication did not connect")
            time.sleep(0.001)
        results.put(("publisher-ready", 0.0, 0.0))
        message = bytes(size)
        offer = pub.offer
        idle = YieldingIdleStrategy()
        cpu0 = _cpu_seconds()
        start = time.perf_counter()
        sent = 0
        while sent < count:
            if offer(message) > 0:
                sent += 1
            else:
                idle.idle(0)
        results.put(("publisher", start, _cpu_seconds() - cpu0))
        time.sleep(2)  # keep the publication (and its log) until the subscriber has everything


def _subscriber(directory: str, channel: str, count: int, results: Any) -> None:
    import logbuf
    from logbuf.idle import YieldingIdleStrategy

    with logbuf.connect(directory) as client:
        sub = client.add_subscription(channel, 1)
        received = [0]

        def on_fragment(buffer: memoryview, header: Any) -> None:
            received[0] += 1

        results.put(("subscriber-ready", 0.0, 0.0))
        idle = YieldingIdleStrategy()
        poll = sub.poll
        cpu0 = _cpu_seconds()
        while received[0] < count:
            idle.idle(poll(on_fragment, 256))
        results.put(("subscriber", time.perf_counter(), _cpu_seconds() - cpu0))


def _pinger(directory: str, ping: str, pong: str, size: int, count: int, warmup: int, results: Any) -> None:
    import logbuf
    from logbuf.idle import YieldingIdleStrategy

    with logbuf.connect(directory) as client:
        sub = client.add_subscription(pong, 2)
        pub = client.add_exclusive_publication(ping, 1)
        deadline = time.monotonic() + 30
        while not (pub.is_connected and sub.images):
            if time.monotonic() > deadline:
                raise TimeoutError("ping-pong did not connect")
            time.sleep(0.001)
        image = sub.images[0]
        got = [0]

        def on_pong(buffer: memoryview, header: Any) -> None:
            got[0] += 1

        idle = YieldingIdleStrategy()
        message = bytes(size)
        rtts = np.empty(count, dtype=np.int64)
        clock = time.perf_counter_ns
        for i in range(warmup + count):
            t0 = clock()
            while pub.offer(message) < 0:
                idle.idle(0)
            while got[0] <= i:
                idle.idle(image.poll(on_pong, 1))
            if i >= warmup:
                rtts[i - warmup] = clock() - t0
        results.put(("pinger", rtts, 0.0))


def _ponger(directory: str, ping: str, pong: str, count: int, results: Any) -> None:
    import logbuf
    from logbuf.idle import YieldingIdleStrategy

    with logbuf.connect(directory) as client:
        sub = client.add_subscription(ping, 1)
        pub = client.add_exclusive_publication(pong, 2)
        deadline = time.monotonic() + 30
        while not (pub.is_connected and sub.images):
            if time.monotonic() > deadline:
                raise TimeoutError("ping-pong did not connect")
            time.sleep(0.001)
        image = sub.images[0]
        idle = YieldingIdleStrategy()
        echoed = [0]

        def on_ping(buffer: memoryview, header: Any) -> None:
            while pub.offer(buffer) < 0:
                idle.idle(0)
            echoed[0] += 1

        while echoed[0] < count:
            idle.idle(image.poll(on_ping, 1))
        results.put(("ponger", echoed[0], 0.0))
        time.sleep(1)


def _collect(processes: list[Any], results: Any, names: set[str], timeout: float) -> dict[str, tuple]:
    """Results from the role processes until every name in ``names`` arrived."""
    out: dict[str, tuple] = {}
    deadline = time.monotonic() + timeout
    while not names <= out.keys():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"benchmark roles {sorted(names - out.keys())} did not finish in {timeout:.0f} s")
        with contextlib.suppress(Exception):
            name, *rest = results.get(timeout=min(remaining, 0.5))
            out[name] = tuple(rest)
        failed = [p for p in processes if p.exitcode not in (None, 0)]
        if failed:
            raise RuntimeError(", ".join(f"{p.name} exited {p.exitcode}" for p in failed))
    return out


@contextlib.contextmanager
def _roles(*processes: Any) -> Iterator[None]:
    """Every role process is stopped by its PID on the way out."""
    try:
        yield
    finally:
        for proc in processes:
            if proc.pid is not None:
                proc.join(timeout=5)
                if proc.is_alive():
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.join(timeout=5)


# -- the rigs -----------------------------------------------------------------------------------------


def throughput(size: int, count: int, idle: str, timeout: float = 300.0) -> dict[str, float]:
    with driver_process(idle) as (directory, driver):
        channel = _channel(free_port())
        results = CTX.Queue()
        subscriber = CTX.Process(target=_subscriber, args=(directory, channel, count, results), name="subscriber")
        publisher = CTX.Process(target=_publisher, args=(directory, channel, size, count, results),
                                name="publisher")
        with _roles(subscriber, publisher):
            subscriber.start()
            _collect([subscriber], results, {"subscriber-ready"}, 60)
            driver_cpu0 = _proc_cpu_seconds(driver.pid)
            publisher.start()
            out = _collect([subscriber, publisher], results, {"publisher-ready", "publisher", "subscriber"}, timeout)
            driver_cpu = _proc_cpu_seconds(driver.pid) - driver_cpu0
    start, publisher_cpu = out["publisher"]
    end, subscriber_cpu = out["subscriber"]
    seconds = end - start
    return {
        "size": size,
        "messages": count,
        "seconds": seconds,
        "msgs_per_s": count / seconds,
        "mb_per_s": count * size / seconds / 1e6,
        "cpu_s_per_million": (publisher_cpu + subscriber_cpu + driver_cpu) / count * 1e6,
        "driver_cpu_share": driver_cpu / seconds,
    }


def ping_pong(size: int, count: int, warmup: int, idle: str, timeout: float = 300.0) -> dict[str, float]:
    with driver_process(idle) as (directory, _):
        ping, pong = _channel(free_port()), _channel(free_port())
        results = CTX.Queue()
        ponger = CTX.Process(target=_ponger, args=(directory, ping, pong, warmup + count, results), name="ponger")
        pinger = CTX.Process(target=_pinger, args=(directory, ping, pong, size, count, warmup, results),
                             name="pinger")
        with _roles(ponger, pinger):
            ponger.start()
            pinger.start()
            out = _collect([ponger, pinger], results, {"pinger", "ponger"}, timeout)
    us = out["pinger"][0] / 1000.0
    p50, p90, p99, p999 = np.percentile(us, [50, 90, 99, 99.9])
    return {"size": size, "samples": len(us), "p50_us": float(p50), "p90_us": float(p90), "p99_us": float(p99),
            "p999_us": float(p999), "max_us": float(us.max())}


# -- report -------------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# UDP through the media driver ({result['date']})",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {m.get('cpu')}, {m.get('cores')} cores"
        + (f" ({m['hypervisor']} guest)" if m.get("hypervisor") else "")
        + f", Python {m.get('python')}, kernel {m.get('kernel')}.  ",
        f"Load average (1 min): {result['load_before']:.2f} before, {result['load_after']:.2f} after (the "
        f"machine is shared; after includes the benchmark's own processes).  ",
        f"Set-up: one `logbuf driver` process in shared mode, idle strategy `{result['idle']}`; publisher and "
        f"subscriber processes with yielding idle strategies; loopback 127.0.0.1, term length {TERM}, MTU 1408.",
        "",
        "| payload | msg/s (median) | min..max | MB/s | CPU s / M msg (all processes) | driver CPU | Aeron C driver |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size in SIZES:
        row = result["throughput"][str(size)]
        rates = [r["msgs_per_s"] for r in row["runs"]]
        aeron = (f"{AERON_C_32B_MSGS_PER_S[0] / 1e6:.2f}-{AERON_C_32B_MSGS_PER_S[1] / 1e6:.2f} M"
                 if size == 32 else "")
        lines.append(
            f"| {size} B | {row['median_msgs_per_s'] / 1e6:.3f} M | {min(rates) / 1e6:.3f}..{max(rates) / 1e6:.3f} M "
            f"| {row['median_msgs_per_s'] * size / 1e6:.1f} | {row['median_cpu_s_per_million']:.2f} "
            f"| {row['median_driver_cpu_share'] * 100:.0f}% of a core | {aeron} |"
        )
    rtt = result["rtt"]
    lines += [
        "",
        f"Ping-pong RTT, {rtt['size']} B, {rtt['samples']:,} samples per run, median over {len(rtt['runs'])} runs: "
        f"p50 {rtt['p50_us']:.1f} µs, p90 {rtt['p90_us']:.1f} µs, p99 {rtt['p99_us']:.1f} µs, "
        f"p99.9 {rtt['p999_us']:.1f} µs (Aeron's C driver with yielding clients: p50 ≈ {AERON_C_RTT_P50_US:.0f} µs).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.udp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (medians are reported)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per throughput run")
    parser.add_argument("--rtt-samples", type=int, default=20_000)
    parser.add_argument("--rtt-warmup", type=int, default=2_000)
    parser.add_argument("--idle", default="yield", help="the driver's idle strategy (default yield)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    command = "python -m bench.udp " + " ".join(argv if argv is not None else sys.argv[1:])
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": command.strip(),
        "machine": machine.describe(),
        "load_before": machine.load_average(),
        "idle": args.idle,
        "term_length": TERM,
    }
    runs: dict[int, list[dict[str, float]]] = {size: [] for size in SIZES}
    rtts: list[dict[str, float]] = []
    for _ in range(args.runs):
        for size in SIZES:
            runs[size].append(throughput(size, args.messages, args.idle))
        rtts.append(ping_pong(32, args.rtt_samples, args.rtt_warmup, args.idle))
    result["throughput"] = {
        str(size): {
            "median_msgs_per_s": statistics.median(r["msgs_per_s"] for r in rows),
            "median_cpu_s_per_million": statistics.median(r["cpu_s_per_million"] for r in rows),
            "median_driver_cpu_share": statistics.median(r["driver_cpu_share"] for r in rows),
            "runs": rows,
        }
        for size, rows in runs.items()
    }
    result["rtt"] = {
        "size": 32,
        "samples": args.rtt_samples,
        **{key: statistics.median(r[key] for r in rtts) for key in ("p50_us", "p90_us", "p99_us", "p999_us")},
        "runs": rtts,
    }
    result["load_after"] = machine.load_average()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "udp.json").write_text(json.dumps(result, indent=2))
    (args.out / "udp.md").write_text(markdown(result))
    print(markdown(result))
    return 0
