"""Feed handler throughput: ``logbuf replay --speed max`` (A+B) -> ``logbuf feed`` -> a subscriber process.

    PYTHONPATH=src .venv/bin/python bench/feed/bench_handler.py --messages 2e6 --runs 3

Reports, per run, messages delivered to the subscriber per second (first to last message received), the
handler's counters (gaps, duplicates: kernel drops at max speed show up as gaps recovered from the
retransmission server), whether the stream was complete and in order, and the handler's CPU per received
packet (its process CPU while the loop ran ÷ datagrams received) with its packets per round.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import logbuf
from logbuf.samples.ports import free_udp_ports

LOGBUF = [sys.executable, "-m", "logbuf.cli"]




def run_once(day: Path, messages: int, work: Path, speed: str = "max") -> dict:
    a, b, r = free_udp_ports(3)
    driver = logbuf.MediaDriver.launch(work / "drv", ipc_term_length=64 << 20)
    env = dict(os.environ, LOGBUF_DIR=str(driver.directory))
    procs = []
    try:
        with logbuf.connect(driver.directory) as client:
            sub = client.add_subscription("aeron:ipc", 1001)
            feed = subprocess.Popen([*LOGBUF, "feed", "--feed-a", f"127.0.0.1:{a}", "--feed-b", f"127.0.0.1:{b}",
                                     "--retransmit", f"127.0.0.1:{r}", "--until-end-of-session", "-q",
                                     "--summary-json", str(work / "feed.json")], env=env)
            procs.append(feed)
            while not sub.images:
                time.sleep(0.01)
            replay = subprocess.Popen([*LOGBUF, "replay", str(day), "--feed-a", f"127.0.0.1:{a}", "--feed-b",
                                       f"127.0.0.1:{b}", "--speed", speed, "--retransmit", f"127.0.0.1:{r}",
                                       "--linger-s", "10", "--eos-interval-s", "0.2", "-q",
                                       # at max speed: full packets (~35 msgs each); paced: the day's own
                                       *(["--flush-gap-us", "100000"] if speed == "max" else [])], env=env)
            procs.append(replay)
            state = {"n": 0, "next": 1, "bad": 0, "first": 0.0, "last": 0.0}

            def on_fragment(buf: memoryview, header: logbuf.Header) -> None:
                seq = header.reserved_value
                if seq != state["next"]:
                    state["bad"] += 1
                state["next"] = seq + 1
                state["n"] += 1

            deadline = time.monotonic() + 600
            while state["n"] < messages and time.monotonic() < deadline:
                got = sub.poll(on_fragment, 4096)
                if got:
                    now = time.monotonic()
                    if not state["first"]:
                        state["first"] = now
                    state["last"] = now
                else:
                    sub.wait(0.01)
            feed.wait(60)
        summary = json.loads((work / "feed.json").read_text())
        seconds = state["last"] - state["first"]
        return {"delivered": state["n"], "in_order": state["bad"] == 0, "seconds": seconds,
                "msgs_per_s": state["n"] / seconds if seconds else 0.0,
                "gaps_detected": summary["gaps_detected"], "gaps_recovered": summary["gaps_recovered"],
                "gaps_unrecoverable": summary["gaps_unrecoverable"],
                "cpu_ns_per_packet": summary["cpu_ns_per_packet"],
                "packets_per_round": round((summary["A.packets"] + summary["B.packets"]) / max(1, summary["rounds"]), 1),
                "wire_to_log_p50_us": summary.get("wire_to_log_p50_ns", 0) / 1e3,
                "wire_to_log_p99_us": summary.get("wire_to_log_p99_ns", 0) / 1e3}
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        driver.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=float, default=1e6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--speed", default="max", help="replay speed: max (throughput) or a factor (paced latency)")
    args = parser.parse_args()
    n = int(args.messages)
    with tempfile.TemporaryDirectory() as tmp:
        day = Path(tmp) / "day.itch"
        subprocess.run([*LOGBUF, "synth", str(day), "--messages", str(n), "-q"], check=True)
        results = []
        for i in range(args.runs):
            work = Path(tmp) / f"run{i}"
            work.mkdir()
            results.append(run_once(day, n, work, args.speed))
            print(json.dumps(results[-1]), flush=True)
    print(f"median delivered rate: {statistics.median(r['msgs_per_s'] for r in results):,.0f} msg/s; handler CPU "
          f"{statistics.median(r['cpu_ns_per_packet'] for r in results):,.0f} ns per packet; load "
          f"{os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
