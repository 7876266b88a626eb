"""``logbuf demo``: the whole story on one machine, embedded defaults, a few minutes on 2 cores.

1. an embedded media driver;
2. a synthetic ITCH 5.0 day (``logbuf synth``);
3. the feed handler (``logbuf feed``: A/B arbitration, gap detection, recovery, publishing + capture);
4. an example subscriber building top of book (``logbuf book``) and the recorder (``logbuf record``);
5. the replay of the day as MoldUDP64 feeds A and B with faults — a head-end freeze with a catch-up burst
   on A, random loss on both, one range lost on both and recovered from the retransmission server;
6. ``logbuf analyze`` (PySpark, ``local[*]``) on the recording: tables, plots and a report.

Every process it starts is stopped by its PID; ``--transport`` runs the older transport-only demo
(publisher process → subscriber process throughput and RTT).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from logbuf.cli_args import DefaultsHelpFormatter, count
from logbuf.cnc.counters import (
    FEED_HANDLER_COUNTER_TYPE_ID,
    PUBLISHER_LIMIT_TYPE_ID,
    SUBSCRIBER_POSITION_TYPE_ID,
)
from logbuf.errors import USAGE_EXIT_STATUS, LogbufError
from logbuf.samples.ipc import ping_pong, throughput
from logbuf.samples.ports import free_udp_ports
from logbuf.units import NANOS_PER_MICRO


class DemoError(LogbufError):
    """A step of the demo failed (a child process ended early or with an error): one line, status 1."""


if TYPE_CHECKING:  # the demo imports the client only when it runs
    from logbuf.client.client import Client

DROP_BOTH = (20_000, 20_049)  # a range lost on A and on B: only the retransmission server has it
STATUS_INTERVAL_S = 0.5
MIN_MESSAGES = 60_000
DEMO_SUBSCRIPTIONS = 5  # the book: messages + events; the recorder: messages + events + capture
DEFAULT_SPEED = 1000.0


def _speed(text: str) -> float:
    """A positive replay speed factor (the feed handler's demo needs paced A/B interleaving: no 'max')."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"speed {text!r} must be a positive number (e.g. 500)") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"speed {text!r} must be a positive number (e.g. 500)")
    return value


def run_transport_demo(messages: int, sizes: list[int], rtt_samples: int, out=sys.stdout) -> int:
    print("logbuf transport demo: 1 publisher process -> 1 subscriber process, shared-memory log buffer", file=out)
    print(f"{'API':<14}{'size':>6}{'messages':>12}{'msg/s':>14}{'MB/s':>10}{'CPU s/M msg':>13}", file=out)
    for batch in (False, True):
        for size in sizes:
            count = messages * (5 if batch else 1)
            r = throughput(size, count, batch=batch)
            print(f"{r.mode:<14}{size:>6}{count:>12,}{r.msgs_per_s:>14,.0f}{r.mb_per_s:>10,.0f}"
                  f"{r.cpu_s_per_million:>13.2f}", file=out, flush=True)
    rtt = ping_pong(sizes[0], rtt_samples, warmup=min(10_000, rtt_samples))
    print(f"ping-pong RTT ({rtt.size} B, {rtt.samples:,} samples): p50 {rtt.p50_us:.1f} us, "
          f"p99 {rtt.p99_us:.1f} us, p99.9 {rtt.p999_us:.1f} us", file=out)
    return 0




class _Step:
    def __init__(self, total: int) -> None:
        self.total = total
        self.n = 0
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        self.n += 1
        print(f"[{self.n}/{self.total} +{time.monotonic() - self.started:5.1f}s] {text}", file=sys.stderr, flush=True)


def _wait_for_counters(client: Client, type_id: int, at_least: int, procs: list[subprocess.Popen], failure: str,
                       timeout_s: float = 60.0) -> None:
    """Until ``at_least`` counters of ``type_id`` are in cnc.dat; ``failure`` if one of ``procs`` exits first or
    the time runs out."""
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while sum(1 for i in client.counters if i.type_id == type_id) < at_least:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise DemoError(failure)
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def _feed_counters(client: Client) -> dict[str, int]:
    """The feed handler's counters (cnc.dat type 1100) by name."""
    return {info.key.rstrip(b"\0").decode(errors="replace"): info.value
            for info in client.counters if info.type_id == FEED_HANDLER_COUNTER_TYPE_ID}


class _StatusLine:
    """One line, rewritten in place on a terminal (nothing when stderr is not a terminal)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self.shown = False

    def update(self, values: dict[str, int]) -> None:
        if not self.tty or not values:
            return
        text = (f"    {values.get('published', 0):>10,} / {self.total:,} messages published   gaps "
                f"{values.get('gaps_detected', 0)} detected, {values.get('gaps_recovered', 0)} recovered, "
                f"{values.get('gaps_unrecoverable', 0)} lost   retransmitted "
                f"{values.get('RETRANSMIT.delivered', 0):,}")
        print("\r" + text, end="", file=sys.stderr, flush=True)
        self.shown = True

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr, flush=True)


def _summary(summary: dict, total: int) -> tuple[str, bool]:
    """The closing summary and whether anything was lost (every fault the demo scripts is recoverable)."""
    published = int(summary.get("published", 0))
    lost = int(summary.get("messages_unrecoverable", 0))
    why = ", ".join(f"{n:,} {k.split('.', 1)[1].replace('_', ' ')}" for k, n in sorted(summary.items())
                    if k.startswith("lost.") and n)
    drops = int(summary.get("A.kernel_drops", 0)) + int(summary.get("B.kernel_drops", 0))
    lines = [
        f"delivered:        {published:,} of {total:,} messages, in sequence order",
        f"from A / B:       {summary.get('A.delivered', 0):,} / {summary.get('B.delivered', 0):,} (first copy wins)",
        f"recovered:        {summary.get('RETRANSMIT.delivered', 0):,} messages by retransmission, in "
        f"{summary.get('gaps_recovered', 0)} gaps ({summary.get('recovery_requests', 0)} requests)",
        f"lost:             {lost:,} messages" + (f" ({why})" if why else ""),
        f"kernel drops:     {drops:,} datagrams (socket buffers full)",
        f"wire to log:      p50 {summary.get('wire_to_log_p50_ns', 0) / NANOS_PER_MICRO:,.0f} us, "
        f"p99 {summary.get('wire_to_log_p99_ns', 0) / NANOS_PER_MICRO:,.0f} us",
    ]
    return "\n".join(lines), lost > 0 or published != total


HOST_SUMMARIES = ("replay-summary.json", "feed-summary.json")


def _late_warnings(workdir: Path) -> list[str]:
    """The replay or the handler ran late beyond the threshold: what the recording shows is then the host."""
    from logbuf.pipeline.host import late_warnings

    summaries = []
    for name in HOST_SUMMARIES:
        with contextlib.suppress(OSError, ValueError):
            summaries.append(json.loads((workdir / name).read_text()))
    return late_warnings([s for s in summaries if isinstance(s, dict)])


def _stop(proc: subprocess.Popen, timeout: float = 15.0) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


def run_market_data_demo(args: argparse.Namespace) -> int:
    import logbuf

    step = _Step(7)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="logbuf-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    day = workdir / "day.itch"
    recording = workdir / "recording"
    report_dir = workdir / "report"
    for path in (recording, report_dir):
        shutil.rmtree(path, ignore_errors=True)
    logbuf_cmd = [sys.executable, "-m", "logbuf.cli"]
    a, b, r = free_udp_ports(3)
    procs: list[subprocess.Popen] = []

    step(f"synthesising an ITCH 5.0 day of {args.messages:,} messages -> {day}")
    subprocess.run([*logbuf_cmd, "synth", str(day), "--messages", str(args.messages), "--seed", str(args.seed), "-q"],
                   check=True, timeout=600)

    step("starting an embedded media driver")
    driver_dir = Path(tempfile.mkdtemp(prefix="logbuf-demo-driver-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    driver = logbuf.MediaDriver.launch(driver_dir / "driver", ipc_term_length=16 << 20)
    env = dict(os.environ, LOGBUF_DIR=str(driver.directory), PYTHONUNBUFFERED="1")
    try:
        step("starting the feed handler (A+B, recovery on, capture on), the top-of-book subscriber and the recorder")
        feed = subprocess.Popen(
            [*logbuf_cmd, "feed", "--feed-a", f"127.0.0.1:{a}", "--feed-b", f"127.0.0.1:{b}",
             "--retransmit", f"127.0.0.1:{r}", "--capture", "--until-end-of-session", "--seed", str(args.seed),
             "--summary-json", str(workdir / "feed-summary.json"), "-q"], env=env)
        procs.append(feed)
        with logbuf.connect(driver.directory) as client:  # wait for the handler's publications
            _wait_for_counters(client, PUBLISHER_LIMIT_TYPE_ID, 1, [feed], "the feed handler did not start")
        book = subprocess.Popen([*logbuf_cmd, "book", "--interval", "2", "-q"], env=env,
                                stdout=subprocess.PIPE, text=True)
        procs.append(book)
        recorder = subprocess.Popen([*logbuf_cmd, "record", str(recording), "--until-end-of-session", "--quiet"],
                                    env=env)
        procs.append(recorder)
        with logbuf.connect(driver.directory) as client:  # every subscription joined before the first packet
            _wait_for_counters(client, SUBSCRIBER_POSITION_TYPE_ID, DEMO_SUBSCRIPTIONS, [book, recorder],
                               "the book and the recorder did not subscribe")

        step(f"replaying the day as feeds A and B at {args.speed:g}x, with faults on A (freeze + catch-up, loss) and "
             f"B (loss, 5 ms delay), and {DROP_BOTH[0]}-{DROP_BOTH[1]} lost on both")
        replay = subprocess.Popen(
            [*logbuf_cmd, "replay", str(day), "--feed-a", f"127.0.0.1:{a}", "--feed-b", f"127.0.0.1:{b}",
             "--speed", f"{args.speed:g}", "--b-delay-ms", "5", "--b-jitter-ms", "1", "--seed", str(args.seed),
             "--faults-a", "loss=0.005,freeze=0.0002", "--faults-b", "loss=0.005",
             "--drop-both", f"{DROP_BOTH[0]}-{DROP_BOTH[1]}", "--retransmit", f"127.0.0.1:{r}", "--linger-s", "10",
             "--eos-interval-s", "0.5", "--summary-json", str(workdir / "replay-summary.json"), "-q"], env=env)
        procs.append(replay)
        status = _StatusLine(args.messages)
        deadline = time.monotonic() + args.timeout
        with logbuf.connect(driver.directory) as client:
            while feed.poll() is None and time.monotonic() < deadline:
                status.update(_feed_counters(client))
                time.sleep(STATUS_INTERVAL_S)
        status.close()
        if feed.poll() is None:
            raise DemoError(f"the feed handler did not reach the end of the session within {args.timeout:g} s")
        if feed.returncode != 0:
            raise DemoError(f"the feed handler failed (exit {feed.returncode})")
        if recorder.wait(120) != 0:
            raise DemoError(f"the recorder failed (exit {recorder.returncode})")
        _stop(replay)
        _stop(book)
        tob = book.stdout.read() if book.stdout else ""
        summary = json.loads((workdir / "feed-summary.json").read_text())
        closing, lost_any = _summary(summary, args.messages)
        step("feed handler done")
        print(closing, file=sys.stderr, flush=True)
        for warning in _late_warnings(workdir):
            print(f"logbuf demo: warning: {warning}", file=sys.stderr, flush=True)
        if "seq " in tob:
            print("top of book, last snapshot of `logbuf book`:\n" + tob[tob.rfind("seq ") :].rstrip(), file=sys.stderr)
    finally:
        for proc in procs:
            _stop(proc)
        driver.close()
        shutil.rmtree(driver_dir, ignore_errors=True)

    step(f"analysing the recording with PySpark (local[*]) -> {report_dir}")
    host = [a for name in HOST_SUMMARIES if (workdir / name).is_file()
            for a in ("--host-summary", str(workdir / name))]  # the report warns too when the host ran late
    result = subprocess.run([*logbuf_cmd, "analyze", str(recording), str(report_dir), *host], timeout=1200)
    if result.returncode != 0:
        print(f"logbuf demo: error: analyze failed (exit status {result.returncode})", file=sys.stderr)
        return result.returncode
    step("done")
    if lost_any:
        print("logbuf demo: messages were lost beyond the scripted faults (all of them are recoverable)",
              file=sys.stderr)
    print(f"report:    {report_dir / 'report.md'}")
    print(f"plots:     {report_dir / 'plots'}")
    print(f"tables:    {report_dir / 'tables'}")
    print(f"recording: {recording}")
    return 1 if lost_any else 0


def _demo(args: argparse.Namespace) -> int:
    if args.transport:
        if args.transport_messages <= 0 or args.rtt_samples <= 0 or any(s < 0 for s in args.sizes):
            print("logbuf demo: error: --transport-messages and --rtt-samples must be positive, --sizes >= 0",
                  file=sys.stderr)
            return USAGE_EXIT_STATUS
        return run_transport_demo(args.transport_messages, args.sizes, args.rtt_samples)
    if args.messages < MIN_MESSAGES:
        print(f"logbuf demo: error: --messages must be at least {MIN_MESSAGES} (the scripted faults need room)",
              file=sys.stderr)
        return USAGE_EXIT_STATUS
    if args.timeout <= 0:
        print("logbuf demo: error: --timeout must be > 0", file=sys.stderr)
        return USAGE_EXIT_STATUS
    with contextlib.suppress(KeyboardInterrupt):
        return run_market_data_demo(args)
    print("logbuf demo: interrupted", file=sys.stderr)  # after its processes were stopped
    return 130


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="the end-to-end story: driver, replay with faults, feed handler, recorder, Spark report",
        description=__doc__.split("\n\n")[0], formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--messages", type=count, default=300_000, help="messages in the synthetic day (e.g. 300k)")
    parser.add_argument("--speed", type=_speed, default=DEFAULT_SPEED,
                        help="replay speed factor: 1000 = the synthetic day in about a minute")
    parser.add_argument("--seed", type=int, default=7, help="seed of the day and of the faults")
    parser.add_argument("--workdir", default=None, help="where the day, recording and report go (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the replay to finish")
    parser.add_argument("--transport", action="store_true", help="the transport-only demo instead")
    parser.add_argument("--transport-messages", type=count, default=1_000_000, help="--transport messages")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 256], help="--transport payload sizes (default: 32 256)")
    parser.add_argument("--rtt-samples", type=count, default=100_000, help="--transport ping-pong round trips")
    parser.set_defaults(func=_demo)
