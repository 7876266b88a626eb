"""The market-open profile through the real processes: ``logbuf replay``'s sender (A/B + retransmission process)
-> ``logbuf feed`` -> subscriber, with the media driver in this process.

    PYTHONPATH=src .venv/bin/python bench/feed/bench_profile.py --rate 20000 --duration 60 --term-mib 64
    PYTHONPATH=src .venv/bin/python bench/feed/bench_profile.py --sweep 20000,40000,60000,80000 --duration 20
    PYTHONPATH=src .venv/bin/python bench/feed/bench_profile.py --find-max --duration 20

A day file of ``rate x duration x 40`` Add Order messages (36 bytes, each carrying its sequence number) is written
first; the sender replays it with the replay library (``ReplayCore`` / ``ReplayServer``, as ``logbuf replay``
does; every packet built before the clock starts, then sent when due, at most ``--batch-us`` late, runs of
packets as segmented sends) as a load profile: ``--rate`` packets per second on each of A and B, 40 messages per
packet, B ``--b-lag`` packets behind A, each feed losing ``--loss`` of its packets independently, and every
``--freeze-every`` seconds A stops for ``--freeze-ms`` and then sends what it held as a catch-up burst. A
retransmission process answers the handler's re-requests. A subscriber process reads the messages stream in
batches and checks every sequence and message. Long runs at high rates need memory for the day file (38 bytes a
message) and, prebuilt, as much again for the packets: ``--no-prebuild`` builds them while sending.

Per run, one JSON line: delivered/expected, unrecoverable, the handler's CPU per received packet (its rusage ÷
packets received), the sender's CPU per packet sent and how late it was, the driver's CPU share, wire-to-log
latency (kernel arrival -> committed in the log), kernel drops. A run is *complete* when every message arrived
intact and none was unrecoverable. ``--sweep`` runs several rates, ``--find-max`` searches (up by x1.5, then
bisection) for the highest complete rate; both end with a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

SESSION = "PROFILE01"
MESSAGES_PER_PACKET = 40
MESSAGE_LENGTH = 36  # an Add Order
BLOCK = MESSAGE_LENGTH + 2
BUDGET = 20 + MESSAGES_PER_PACKET * BLOCK  # MoldUDP64 header + 40 message blocks: every packet carries 40
LOGBUF = [sys.executable, "-m", "logbuf.cli"]
HANDLER_COUNTER_TYPE = 1100  # the feed handler's counters are up: it is listening


def messages_block(first: int, count: int) -> bytes:
    """``count`` message blocks from ``first``: 2-byte length, 'A', the sequence (8 bytes), filler."""
    seqs = np.arange(first, first + count, dtype=">u8")
    blocks = np.zeros((count, BLOCK), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(struct.pack(">H", MESSAGE_LENGTH), np.uint8)
    blocks[:, 2] = ord("A")
    blocks[:, 3:11] = seqs.view(np.uint8).reshape(count, 8)
    blocks[:, 11:] = (np.arange(first, first + count) % 251).astype(np.uint8)[:, None]
    return blocks.tobytes()


def write_day(path: Path, messages: int) -> None:
    """A day file of ``messages`` Add Orders, each carrying its sequence number (vectorised: ~1 s per 4 M)."""
    with open(path, "wb") as out:
        for first in range(1, messages + 1, 1 << 20):
            out.write(messages_block(first, min(1 << 20, messages + 1 - first)))


def _machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs: how busy the whole machine was between two readings."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


# ---- the roles (processes of this script) ------------------------------------------------------------------


def sender(args: argparse.Namespace) -> int:
    """``logbuf replay`` as a library: A/B at ``--rate`` with the profile's faults, a retransmission process."""
    from logbuf.exchange.dayfile import DayFileReader
    from logbuf.exchange.replay.config import FaultConfig, FeedConfig, ReplayConfig
    from logbuf.exchange.replay.core import ReplayCore
    from logbuf.exchange.replay.sender import ReplayServer
    from logbuf.exchange.retransmit.process import RetransmitProcess

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    scheduled = args.freeze_ms > 0 and args.freeze_every > 0
    a_faults = FaultConfig(loss=args.loss, freeze_every_ms=args.freeze_every * 1e3 if scheduled else 0.0,
                           freeze_ms=(args.freeze_ms, args.freeze_ms), freeze_max_packets=1 << 40)
    config = ReplayConfig(
        session=SESSION, packet_rate=args.rate, budget=BUDGET, seed=args.seed,
        end_of_session_count=10, end_of_session_interval_ns=200_000_000,  # the end is seen despite any loss
        feeds=(FeedConfig("A", faults=a_faults),
               FeedConfig("B", delay_ns=round(args.b_lag * 1e9 / args.rate), faults=FaultConfig(loss=args.loss))),
    )
    with DayFileReader(args.day) as reader:
        reader.verify()  # the frame index: blocks are slices of it, nothing is scanned while sending
        retransmit = RetransmitProcess(args.day, "127.0.0.1", args.port_r, session=SESSION, budget=BUDGET,
                                       ring_bits=args.ring_bits, rate=args.retransmit_rate,
                                       burst=args.retransmit_rate / 10, queue=4096)
        retransmit_stats = None
        try:
            retransmit.start()
            destinations = [("127.0.0.1", args.port_a), ("127.0.0.1", args.port_b)]
            server = ReplayServer(ReplayCore(reader, config), destinations, publish=retransmit.ring.publish,
                                  stop=stop, segment=not args.no_segment, batch_ns=int(args.batch_us * 1e3))
            try:
                if not args.no_prebuild:
                    server.prebuild()  # every packet built before the clock starts: the run only sends
                print("sending", flush=True)  # the session starts now (a late start counts from here)
                busy = _machine_busy()
                summary = server.run()
                busy_now = _machine_busy()
            finally:
                server.close()
            send_calls = server.send_calls
            stop.wait(args.linger)  # keep answering re-requests until the bench says it is over
        finally:
            retransmit_stats = retransmit.stop()
    report = summary.as_dict()
    busy_cores = (busy_now[0] - busy[0]) / max(1, busy_now[1] - busy[1]) * (os.cpu_count() or 1)
    report.update(send_calls=send_calls, machine_busy_cores=busy_cores,
                  retransmit=vars(retransmit_stats) if retransmit_stats else {})
    print(json.dumps(report), flush=True)
    return 0


def subscriber(args: argparse.Namespace) -> int:
    import logbuf

    expected = args.messages
    got = bad = 0
    next_seq = 1
    started = time.monotonic()
    deadline = started + args.timeout
    stalled_at = deadline  # from the first message on: none for --stall seconds, whatever is missing stays missing
    cpu = _cpu_seconds()
    timeline: list[tuple[float, int]] = []  # (monotonic s, next sequence) every 0.1 s: when it caught up with live
    next_mark = started
    with logbuf.connect(args.dir) as client:
        sub = client.add_subscription("aeron:ipc", 1001)
        while got < expected and time.monotonic() < min(deadline, stalled_at):
            now = time.monotonic()
            if now >= next_mark:
                timeline.append((round(now, 3), next_seq))
                next_mark = now + 0.1
            work = 0
            for image in sub.images:
                with image.batch_poll(4096) as batch:
                    n = batch.count
                    if not n:
                        continue
                    work += n
                    seqs = batch.reserved_values.astype(np.int64)
                    bad += int(np.count_nonzero(seqs != np.arange(next_seq, next_seq + n)))
                    data, offsets = batch.gather()
                    body = data.reshape(n, MESSAGE_LENGTH) if n * MESSAGE_LENGTH == data.size else None
                    if body is None or not np.array_equal(body[:, 1:9].copy().view(">u8").ravel(), seqs):
                        bad += 1
                    next_seq = int(seqs[-1]) + 1
                    got += n
            if work:
                stalled_at = time.monotonic() + args.stall
            else:
                sub.wait(0.01)
    timeline.append((round(time.monotonic(), 3), next_seq))
    print(json.dumps({"received": got, "bad": bad, "cpu_seconds": _cpu_seconds() - cpu, "timeline": timeline}),
          flush=True)
    return 0


# ---- the bench ---------------------------------------------------------------------------------------------


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    """Stops one process we started, by its PID: SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _wait_for_handler(directory: object, feed: subprocess.Popen) -> None:
    import logbuf

    with logbuf.connect(directory) as client:  # the handler's publications are up
        deadline = time.monotonic() + 30
        while not any(c.type_id == HANDLER_COUNTER_TYPE for c in client.counters):
            if time.monotonic() > deadline or feed.poll() is not None:
                raise SystemExit("the feed handler did not start")
            time.sleep(0.05)


def _last_json(text: str | None) -> dict:
    lines = [line for line in (text or "").strip().splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def run_profile(args: argparse.Namespace, rate: float, work: Path, watch: Any = None) -> dict:
    """One run at ``rate`` packets/s per feed; the result line (also printed). ``watch(directory)``, if given,
    is called once the driver is up and returns something whose ``close()`` is called before the driver
    closes (bench_late_real.py samples the handler's counters with it)."""
    import logbuf
    from logbuf.samples.ports import free_udp_ports

    messages = int(rate * args.duration) * MESSAGES_PER_PACKET
    day = work / f"profile-{int(rate)}.itch"
    write_day(day, messages)
    a, b, r = free_udp_ports(3)
    received: dict = {}
    driver_cpu = 0.0
    started_at = late_started = caught_up_s = 0.0
    sent: dict = {}
    summary: dict = {}
    timeout = args.duration + 120 + args.linger  # the subscriber waits for what the handler may still fetch
    try:
        with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="bench-profile-") as tmp:
            driver = logbuf.MediaDriver.launch(Path(tmp) / "drv", ipc_term_length=args.term_mib << 20)
            watcher = watch(driver.directory) if watch is not None else None
            env = dict(os.environ, LOGBUF_DIR=str(driver.directory))
            me = [sys.executable, __file__, "--dir", str(driver.directory)]
            procs: list[subprocess.Popen] = []
            try:
                for _ in range(args.busy_cores):  # other work on the machine: a process keeping a core busy
                    procs.append(subprocess.Popen(["yes"], stdout=subprocess.DEVNULL))
                feed_cmd = [*LOGBUF, "feed", "--feed-a", f"127.0.0.1:{a}", "--feed-b", f"127.0.0.1:{b}",
                            "--retransmit", f"127.0.0.1:{r}", "--until-end-of-session", "-q",
                            "--summary-json", f"{tmp}/feed.json", *args.handler_arg]
                sub = subprocess.Popen([*me, "--role", "subscriber", "--messages", str(messages),
                                        "--timeout", str(timeout), "--stall", str(args.stall)],
                                       env=env, stdout=subprocess.PIPE, text=True)
                procs.append(sub)
                feed = None
                if not args.late_start:
                    feed = subprocess.Popen(feed_cmd, env=env)
                    procs.append(feed)
                    _wait_for_handler(driver.directory, feed)
                    time.sleep(1.0)
                send = subprocess.Popen([*me, "--role", "sender", "--day", str(day), "--rate", str(rate),
                                         "--port-a", str(a), "--port-b", str(b), "--port-r", str(r),
                                         "--loss", str(args.loss), "--freeze-every", str(args.freeze_every),
                                         "--freeze-ms", str(args.freeze_ms), "--b-lag", str(args.b_lag),
                                         "--linger", str(args.linger + timeout), "--seed", str(args.seed),
                                         "--ring-bits", str(args.ring_bits),
                                         "--retransmit-rate", str(args.retransmit_rate),
                                         "--batch-us", str(args.batch_us),
                                         *(["--no-segment"] if args.no_segment else []),
                                         *(["--no-prebuild"] if args.no_prebuild else [])],
                                        env=env, stdout=subprocess.PIPE, text=True)
                procs.append(send)
                if args.late_start and send.stdout is not None:
                    send.stdout.readline()  # "sending": the packets are built, the session starts
                started_at = time.monotonic()
                if args.late_start:  # the handler starts this long into the session: it recovers the past
                    time.sleep(args.late_start)
                    feed = subprocess.Popen(feed_cmd, env=env)
                    procs.append(feed)
                    late_started = time.monotonic() - started_at
                driver_cpu = _cpu_seconds()
                try:
                    out, _ = sub.communicate(timeout=timeout + 60)
                    received = _last_json(out)
                except subprocess.TimeoutExpired:
                    received = {}
                driver_cpu = _cpu_seconds() - driver_cpu
                caught_up_s = time.monotonic() - started_at
                assert feed is not None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    feed.wait(args.linger + 30)  # it ends at the end of session, once nothing is missing
                _stop(feed, 10)
                _stop(send, 30)  # it stops lingering, stops its retransmission process, reports
                sent = _last_json(send.stdout.read() if send.stdout else "")
                feed_json = Path(f"{tmp}/feed.json")
                summary = json.loads(feed_json.read_text()) if feed_json.exists() else {}
            finally:
                for proc in reversed(procs):
                    _stop(proc, 10)
                    for stream in (proc.stdout, proc.stderr):
                        if stream is not None:
                            stream.close()
                if watcher is not None:
                    watcher.close()
                driver.close()
    finally:
        day.unlink(missing_ok=True)
    sender_packets = max(1, sent.get("packets", 0))
    received_packets = sum(summary.get(f"{feed}.packets", 0) for feed in ("A", "B", "RETRANSMIT"))
    sending = max(1e-9, sent.get("seconds", 0.0))  # CPU shares: over the send phase (the rest is mostly idle)
    result = {
        "rate_per_feed": rate, "duration_s": args.duration, "expected": messages,
        "delivered": received.get("received", 0), "bad": received.get("bad", 0),
        "unrecoverable": summary.get("messages_unrecoverable", -1),
        "gaps_detected": summary.get("gaps_detected", 0), "gaps_recovered": summary.get("gaps_recovered", 0),
        "recovery_requests": summary.get("recovery_requests", 0),
        "handler_cpu_us_per_packet": round(summary.get("cpu_ns_per_packet", 0) / 1e3, 2),
        # the same CPU split into user space and the kernel (its rusage over the loop, per received packet)
        "handler_user_us_per_packet": round(summary.get("cpu_user_us", 0) / max(1, received_packets), 2),
        "handler_sys_us_per_packet": round(summary.get("cpu_sys_us", 0) / max(1, received_packets), 2),
        "packets_per_round": round(received_packets / max(1, summary.get("rounds", 0)), 1),
        "wire_to_log_p50_us": round(summary.get("wire_to_log_p50_ns", 0) / 1e3, 1),
        "wire_to_log_p99_us": round(summary.get("wire_to_log_p99_ns", 0) / 1e3, 1),
        "kernel_drops": summary.get("A.kernel_drops", 0) + summary.get("B.kernel_drops", 0),
        # why a run breaks: the log pushing back, the arbiter's queue full, ranges given up (by reason)
        "back_pressure_waits": summary.get("back_pressure_waits", 0),
        "queue_overflows": summary.get("queue_overflows", 0), "shed_packets": summary.get("shed_packets", 0),
        "lost": {k[5:]: v for k, v in summary.items() if k.startswith("lost.") and v},
        # jumps held back until confirmed (a loss on one feed), confirmed, and revealed as forged (none when honest)
        "jumps": {k[6:]: summary.get(k, 0) for k in ("jumps_held", "jumps_confirmed", "jumps_forged")},
        "replay_cpu_us_per_packet": round(sent.get("cpu_seconds", 0.0) * 1e6 / sender_packets, 2),
        "replay_packets_per_send_call": round(sender_packets / max(1, sent.get("send_calls", 0)), 1),
        "replay_late_share": round(sent.get("late_packets", 0) / sender_packets, 4),
        "replay_max_late_ms": round(sent.get("max_late_ms", 0.0), 1),
        "retransmit_answers": sent.get("retransmit", {}).get("answers", 0),
        "retransmit_server": {k: v for k, v in sent.get("retransmit", {}).items() if v},  # every outcome counter
        "handler_cpu_share": round(summary.get("cpu_us", 0) / 1e6 / sending, 2),
        "subscriber_cpu_share": round(received.get("cpu_seconds", 0.0) / sending, 2),
        "driver_cpu_share": round(driver_cpu / sending, 2),
        "sender_cpu_share": round(sent.get("cpu_seconds", 0.0) / sending, 2),
        # the whole machine while the sender was sending: our processes and any other work
        "machine_busy_cores": round(sent.get("machine_busy_cores", 0.0), 2),
        "load": round(os.getloadavg()[0], 2),
        "busy_cores": args.busy_cores,
    }
    if args.late_start:  # when the handler started, when it caught up with live, when the subscriber had it all
        result["started_at_monotonic"] = started_at  # the session's first packet (bench_late_real.py's live edge)
        result["late_start_s"] = round(late_started, 1)
        result["caught_up_after_start_s"] = _caught_up(received.get("timeline", []), started_at, late_started,
                                                       rate)
        result["complete_after_s"] = round(caught_up_s, 1)
        result["retransmit_delivered"] = summary.get("RETRANSMIT.delivered", 0)
    result["complete"] = (result["delivered"] == messages and not result["bad"] and result["unrecoverable"] == 0)
    print(json.dumps(result), flush=True)
    return result


def _caught_up(timeline: list, started_at: float, late_started: float, rate: float) -> float | None:
    """Seconds from the handler's (late) start until the subscriber was within 100 ms of the live stream: its
    next sequence at least where the sender's schedule stood 100 ms earlier (None: never during the run)."""
    for t, next_seq in timeline:
        live = (t - started_at - 0.1) * rate * MESSAGES_PER_PACKET
        if t - started_at >= late_started and next_seq > 1 and next_seq - 1 >= live:
            return round(t - started_at - late_started, 1)
    return None


def _table(results: list[dict]) -> str:
    rows = ["| packets/s per feed | delivered / expected | unrecoverable (gaps) | kernel drops | "
            "handler CPU / packet | replay CPU / packet (late > 1 ms) | wire→log p50 / p99 | machine busy |",
            "|---:|---|---|---:|---:|---:|---|---:|"]
    for r in sorted(results, key=lambda r: r["rate_per_feed"]):
        rows.append(
            f"| {r['rate_per_feed']:,.0f} | {r['delivered']:,} / {r['expected']:,}{'' if r['complete'] else ' ✗'} "
            f"| {r['unrecoverable']:,} ({r['gaps_detected']:,}) | {r['kernel_drops']:,} "
            f"| {r['handler_cpu_us_per_packet']:.2f} µs "
            f"| {r['replay_cpu_us_per_packet']:.2f} µs ({r['replay_late_share']:.1%}) "
            f"| {r['wire_to_log_p50_us'] / 1e3:.2f} / {r['wire_to_log_p99_us'] / 1e3:.1f} ms "
            f"| {r['machine_busy_cores']:.2f} cores |")
    return "\n".join(rows)


def find_max(args: argparse.Namespace, work: Path) -> list[dict]:
    """Up by x1.5 from ``--min-rate`` until a run is incomplete, then bisection to ``--resolution``."""
    results: list[dict] = []
    good, bad = 0.0, None
    rate = args.min_rate
    while rate <= args.max_rate:
        result = run_profile(args, rate, work)
        results.append(result)
        if not result["complete"]:
            bad = rate
            break
        good = rate
        rate = round(rate * 1.5 / args.resolution) * args.resolution
    if bad is None:
        return results
    while bad - good > args.resolution and good:
        rate = round((good + bad) / 2 / args.resolution) * args.resolution
        if rate in (good, bad):
            break
        result = run_profile(args, rate, work)
        results.append(result)
        good, bad = (rate, bad) if result["complete"] else (good, rate)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("bench", "sender", "subscriber"), default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=20_000, help="packets per second per feed (one run)")
    parser.add_argument("--sweep", default=None, metavar="R1,R2,...", help="run each of these rates")
    parser.add_argument("--find-max", action="store_true", help="search for the highest complete rate")
    parser.add_argument("--min-rate", type=float, default=20_000, help="--find-max: first rate (default 20000)")
    parser.add_argument("--max-rate", type=float, default=400_000, help="--find-max: highest rate tried")
    parser.add_argument("--resolution", type=float, default=5_000, help="--find-max: stop within this much")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic per run")
    parser.add_argument("--loss", type=float, default=0.005, help="share of packets each feed loses")
    parser.add_argument("--freeze-every", type=float, default=10.0, help="seconds between freezes of A")
    parser.add_argument("--freeze-ms", type=float, default=150.0, help="length of a freeze of A (0: none)")
    parser.add_argument("--b-lag", type=int, default=5, help="packets B runs behind A")
    parser.add_argument("--linger", type=float, default=15.0, help="seconds the handler may take after the end")
    parser.add_argument("--seed", type=int, default=1, help="seed of the losses")
    parser.add_argument("--term-mib", type=int, default=16, help="term length of the log (MiB)")
    parser.add_argument("--ring-bits", type=int, default=24, help="retransmission ring: the last 2**BITS messages")
    parser.add_argument("--retransmit-rate", type=float, default=50_000.0,
                        help="re-requests answered per second (the handler is the only client)")
    parser.add_argument("--no-segment", action="store_true",
                        help="the sender sends one datagram per packet (sendmmsg), not segmented runs (UDP GSO)")
    parser.add_argument("--no-prebuild", action="store_true",
                        help="the sender builds packets while sending (default: all built before the clock starts)")
    parser.add_argument("--batch-us", type=float, default=250.0,
                        help="the sender sends what fell due, then sleeps at least this long (default 250)")
    parser.add_argument("--work-dir", default=None, help="where the day files go (default: a temporary directory)")
    parser.add_argument("--port-a", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port-b", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port-r", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--day", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--messages", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    parser.add_argument("--busy-cores", type=int, default=0,
                        help="processes keeping a core busy each while the profile runs (other work on the machine)")
    parser.add_argument("--late-start", type=float, default=0.0, metavar="SECONDS",
                        help="start the handler this long into the session (it recovers the past from the server)")
    parser.add_argument("--handler-arg", action="append", default=[], metavar="ARG",
                        help="an extra argument for logbuf feed (repeat: --handler-arg=--request-rate "
                             "--handler-arg=20000)")
    parser.add_argument("--stall", type=float, default=30.0,
                        help="a run ends when no message arrived for this many seconds once they flow (default 30)")
    args = parser.parse_args()
    if args.role == "sender":
        return sender(args)
    if args.role == "subscriber":
        return subscriber(args)

    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="bench-profile-") as work:
        if args.find_max:
            results = find_max(args, Path(work))
        elif args.sweep:
            results = [run_profile(args, float(rate), Path(work)) for rate in args.sweep.split(",")]
        else:
            result = run_profile(args, args.rate, Path(work))
            return 0 if result["complete"] else 1
    print(_table(results))
    complete = [r["rate_per_feed"] for r in results if r["complete"]]
    print(f"highest complete rate: {max(complete):,.0f} packets/s per feed" if complete else "no rate was complete")
    return 0 if complete else 1


if __name__ == "__main__":
    raise SystemExit(main())
