"""``logbuf feed``: argument parsing and wiring only.

User errors (bad host:port, bad numbers) end in one line on stderr and exit status 2, runtime errors (a busy
port, no driver) in one line and 1, both printed by ``logbuf.cli``; SIGINT and SIGTERM stop the feed handler
cleanly: a stopped run still prints its summary, then Ctrl-C (SIGINT) ends with ``logbuf feed: interrupted``
and status 130, SIGTERM with 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading

from logbuf.channel import parse_endpoint
from logbuf.cli_args import (
    DefaultsHelpFormatter,
    StopSignal,
    add_driver_dir,
    off_or,
    stop_on_signals,
    stopped_status,
    traceback_wanted,
    value_errors_as_usage,
)
from logbuf.errors import LogbufError, UsageError
from logbuf.units import NANOS_PER_MILLI as _NANOS_PER_MILLI
from logbuf.units import NANOS_PER_SECOND as _NANOS_PER_SECOND


def _ipv4_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` for the handler's sockets, which are IPv4 (an IPv6 address is refused by name, not left
    to fail at bind time)."""
    host, port = parse_endpoint(text)
    if ":" in host:
        raise ValueError(f"{text}: the feed handler speaks IPv4 only")
    return host, port


_host_port = off_or(_ipv4_endpoint)  # HOST:PORT or off


def _stop_on_signals() -> contextlib.AbstractContextManager[StopSignal]:
    """An event set by SIGINT or SIGTERM while the block runs (previous handlers restored afterwards)."""
    return stop_on_signals()


# ---- feed handler -------------------------------------------------------------------------------------------


def _cmd_feed(args: argparse.Namespace) -> int:
    from logbuf.feed.config import ArbiterConfig, RecoveryConfig
    from logbuf.feed.events import FeedMode
    from logbuf.feed.handler import FeedHandler, FeedHandlerConfig

    mode = {"ab": FeedMode.A_AND_B, "a": FeedMode.A_ONLY, "b": FeedMode.B_ONLY}[args.mode]
    for name in ("lost_packet_wait_ms", "initial_backoff_ms", "retry_interval_ms", "give_up", "request_rate"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0")
    if args.wait_for_subscriber < 0:
        raise UsageError("--wait-for-subscriber must be >= 0")
    if not 0 <= args.batch_wait_us <= _MAX_BATCH_WAIT_US:
        raise UsageError(f"--batch-wait-us must be within 0..{_MAX_BATCH_WAIT_US}")
    if args.queue_bytes < 3000 or args.queue_packets < 2:
        raise UsageError("--queue-bytes must be >= 3000 and --queue-packets >= 2")
    checkpoint = args.checkpoint
    if checkpoint is None:  # beside the driver's files: a restart on the same driver resumes
        from logbuf.directory import resolve_directory

        checkpoint = os.path.join(str(resolve_directory(args.dir)), f"feed-{args.stream}.checkpoint")
    config = FeedHandlerConfig(
        feed_a=args.feed_a,
        feed_b=args.feed_b,
        interface=args.interface,
        retransmit=None if args.no_recovery else args.retransmit,
        driver_directory=args.dir,
        channel=args.channel,
        messages_stream=args.stream,
        events_stream=args.events_stream,
        capture_stream=args.capture_stream if args.capture else None,
        arbiter=ArbiterConfig(
            mode=mode,
            out_of_order_max_interval=args.out_of_order_max_interval,
            lost_packet_wait_time_ns=int(args.lost_packet_wait_ms * _NANOS_PER_MILLI),
            max_queue_packets=args.queue_packets,
            max_queue_bytes=args.queue_bytes,
            max_jump=args.max_jump,
        ),
        recovery=RecoveryConfig(
            initial_backoff_ns=int(args.initial_backoff_ms * _NANOS_PER_MILLI),
            retry_interval_ns=int(args.retry_interval_ms * _NANOS_PER_MILLI),
            give_up_ns=int(args.give_up * _NANOS_PER_SECOND),
            request_rate=args.request_rate,
            max_outstanding=args.max_outstanding,
        ),
        seed=args.seed,
        rcvbuf=args.rcvbuf,
        udp_gro=args.udp_gro == "on",
        batch_wait_s=args.batch_wait_us / 1e6,
        stop_at_end_of_session=args.until_end_of_session,
        wait_for_subscriber_s=args.wait_for_subscriber,
        join=args.join,
        checkpoint=checkpoint,
    )
    try:
        handler = FeedHandler(config)
    except LogbufError as exc:
        if traceback_wanted():
            raise
        print(f"logbuf feed: error: {exc}", file=sys.stderr)
        return 1
    with handler, _stop_on_signals() as stop:

        def stop_when_signalled() -> None:
            stop.wait()
            handler.stop()

        threading.Thread(target=stop_when_signalled, daemon=True).start()
        if not args.quiet:
            print(f"logbuf feed: A={args.feed_a} B={args.feed_b} mode={args.mode} "
                  f"recovery={'off' if config.retransmit is None else config.retransmit} -> {args.channel} "
                  f"stream {args.stream}", file=sys.stderr, flush=True)
            if handler.resumed is not None:
                session, next_sequence = handler.resumed
                print(f"logbuf feed: resuming session {session.decode('ascii', 'replace').rstrip()} at sequence "
                      f"{next_sequence} (checkpoint {checkpoint})", file=sys.stderr, flush=True)
        try:
            handler.run(duration_s=args.duration)
        except LogbufError as exc:
            if traceback_wanted():
                raise
            print(f"logbuf feed: error: {exc}", file=sys.stderr)
            return 1
        values = handler.counter_values()
        latency = handler.latency_percentiles_ns()
        stop.set()  # ends the watcher thread (signum stays None unless a signal came)
    summary: dict[str, float] = {k: v for k, v in values.items() if not k.startswith("RETRANSMIT.") or v}
    summary.update({f"wire_to_log_{k}_ns": v for k, v in latency.items()})
    received = sum(values.get(f"{feed}.packets", 0) for feed in ("A", "B", "RETRANSMIT"))
    summary["cpu_ns_per_packet"] = round(values["cpu_us"] * 1_000 / received, 1) if received else 0.0
    if args.summary_json:
        _write_json_atomically(args.summary_json, summary)
    if not args.quiet:
        keys = ("published", "gaps_detected", "gaps_recovered", "gaps_unrecoverable", "recovery_requests",
                "A.packets", "B.packets", "A.delivered", "B.delivered", "A.duplicates", "B.duplicates",
                "A.kernel_drops", "B.kernel_drops")
        print("logbuf feed: " + ", ".join(f"{k}={summary.get(k, 0)}" for k in keys), file=sys.stderr)
    status = stopped_status("feed", stop)
    if values["unpublished"]:
        print(f"logbuf feed: warning: {values['unpublished']} messages were not published (no subscriber was "
              "connected)", file=sys.stderr)
        return status or 1
    return status


_MAX_BATCH_WAIT_US = 100_000


def _write_json_atomically(path: str, value: object) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(value, fh, indent=2)
    os.replace(tmp, path)

def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from logbuf.feed.config import add_feed_options

    d = DefaultsHelpFormatter
    p = subparsers.add_parser(
        "feed", help="feed handler: arbitrate MoldUDP64 A/B, recover gaps, publish ITCH into logbuf",
        formatter_class=d,
        description="Receives the A and B MoldUDP64 feeds, arbitrates them per message, detects gaps, recovers "
        "them from a retransmission server, and publishes every ITCH message in sequence order into a logbuf "
        "publication (reserved value = sequence); gap and session events go on the events stream.")
    p.add_argument("--feed-a", type=_host_port, default=("127.0.0.1", 30001), metavar="HOST:PORT|off",
                   help="feed A address to bind (a multicast group joins it on --interface) (default: 127.0.0.1:30001)")
    p.add_argument("--feed-b", type=_host_port, default=("127.0.0.1", 30002), metavar="HOST:PORT|off",
                   help="feed B address to bind (default: 127.0.0.1:30002)")
    p.add_argument("--interface", default="0.0.0.0", help="interface address for multicast joins")
    p.add_argument("--mode", choices=("ab", "a", "b"), default="ab", help="arbitrate A+B, A only or B only")
    p.add_argument("--retransmit", type=_host_port, default=None, metavar="HOST:PORT",
                   help="retransmission server (recovery is off without one)")
    p.add_argument("--no-recovery", action="store_true", help="declare gaps lost at once")
    add_driver_dir(p)
    p.add_argument("--channel", default="aeron:ipc", help="channel of the publications")
    p.add_argument("--stream", type=int, default=1001, help="messages stream id")
    p.add_argument("--events-stream", type=int, default=1002, help="gap/session events stream id")
    p.add_argument("--capture", action="store_true", help="publish packet/delivery capture rows for the recorder")
    p.add_argument("--capture-stream", type=int, default=1003, help="capture stream id")
    add_feed_options(p)  # every tuning setting, its default and help: logbuf.feed.config
    p.add_argument("--seed", type=int, default=None, help="seed of the re-request back-off jitter")
    p.add_argument("--until-end-of-session", action="store_true",
                   help="exit after the session's end, once every hole of it is recovered or given up")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--summary-json", default=None, metavar="PATH", help="write the final counters as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no start line and no summary")
    p.set_defaults(func=value_errors_as_usage(_cmd_feed))
