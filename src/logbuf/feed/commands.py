"""``logbuf feed``: argument parsing and wiring only.

User errors (bad host:port, bad numbers) end in one line on stderr and exit status 2, runtime errors (a busy
port, no driver) in one line and 1, both printed by ``logbuf.cli``; SIGINT and SIGTERM stop the feed handler
cleanly: a stopped run still prints its summary, then Ctrl-C (SIGINT) ends with ``logbuf feed: interrupted``
and status 130, SIGTERM with 0.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from logbuf.cli_args import (
    DefaultsHelpFormatter,
    StopSignal,
    add_driver_dir,
    stop_on_signals,
    stopped_status,
    traceback_wanted,
    value_errors_as_usage,
)
from logbuf.errors import LogbufError, UsageError
from logbuf.units import NANOS_PER_MILLI as _NANOS_PER_MILLI
from logbuf.units import NANOS_PER_SECOND as _NANOS_PER_SECOND

if TYPE_CHECKING:
    from logbuf.feed.handler import FeedHandlerConfig


def _stop_on_signals() -> contextlib.AbstractContextManager[StopSignal]:
    """An event set by SIGINT or SIGTERM while the block runs (previous handlers restored afterwards)."""
    return stop_on_signals()


# ---- feed handler -------------------------------------------------------------------------------------------


def _cmd_feed(args: argparse.Namespace) -> int:
    from logbuf.feed.config import MODE_CHOICES, ArbiterConfig, RecoveryConfig
    from logbuf.feed.handler import FeedHandler, FeedHandlerConfig

    mode = MODE_CHOICES[args.mode]
    _refuse_what_is_not_honoured(args)
    checkpoint = args.checkpoint
    if checkpoint is None:  # beside the driver's files: a restart on the same driver resumes
        from logbuf.directory import resolve_directory

        checkpoint = os.path.join(str(resolve_directory(args.dir)), f"feed-{args.stream}.checkpoint")
    if os.path.isdir(checkpoint):
        raise UsageError(f"--checkpoint {checkpoint} is a directory (name a file, or off)")
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
    if handler.rcvbuf_granted < config.rcvbuf:
        print(f"logbuf feed: warning: --rcvbuf {config.rcvbuf} was capped at {handler.rcvbuf_granted} bytes per "
              "socket (net.core.rmem_max; raising past it needs CAP_NET_ADMIN): a burst longer than that is "
              "dropped by the kernel (counted as kernel_drops)", file=sys.stderr, flush=True)
    with handler, _stop_on_signals() as stop:

        def stop_when_signalled() -> None:
            stop.wait()
            handler.stop()

        threading.Thread(target=stop_when_signalled, daemon=True).start()
        if not args.quiet:
            print(f"logbuf feed: A={args.feed_a} B={args.feed_b} mode={args.mode} "
                  f"recovery={'off' if config.retransmit is None else config.retransmit} -> {args.channel} "
                  f"stream {args.stream}", file=sys.stderr, flush=True)
            resumed = handler.resumed
            if resumed is not None:
                repeat = (f"; up to {resumed.may_repeat} messages from there may be published a second time"
                          if resumed.may_repeat else "")
                print(f"logbuf feed: resuming session {resumed.session.decode('ascii', 'replace').rstrip()} at "
                      f"sequence {resumed.next_sequence} ({resumed.how}; checkpoint {checkpoint}{repeat})",
                      file=sys.stderr, flush=True)
        try:
            handler.run(duration_s=args.duration)
        except LogbufError as exc:
            if traceback_wanted():
                raise
            print(f"logbuf feed: error: {exc}", file=sys.stderr)
            if args.summary_json:  # the run's counters up to the failure (a restart resumes from the checkpoint)
                _write_json_atomically(args.summary_json, _summary(handler.counter_values(),
                                                                   handler.latency_percentiles_ns(), config))
            return 1
        values = handler.counter_values()
        latency = handler.latency_percentiles_ns()
        stop.set()  # ends the watcher thread (signum stays None unless a signal came)
    summary = _summary(values, latency, config)
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


def _summary(values: Mapping[str, float], latency: Mapping[str, float],
             config: FeedHandlerConfig) -> dict[str, float]:
    """The ``--summary-json`` object: the counters, the wire-to-log percentiles and the CPU per packet."""
    # the answers' counters are there whenever recovery is on (zeros included: a monitor reads fixed keys)
    summary: dict[str, float] = {k: v for k, v in values.items()
                                 if not k.startswith("RETRANSMIT.") or config.retransmit is not None}
    summary.update({f"wire_to_log_{k}_ns": v for k, v in latency.items()})
    received = sum(values.get(f"{feed}.packets", 0) for feed in ("A", "B", "RETRANSMIT"))
    summary["cpu_ns_per_packet"] = round(values["cpu_us"] * 1_000 / received, 1) if received else 0.0
    return summary


def _is_multicast(address: tuple[str, int] | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address[0]).is_multicast
    except ValueError:  # a host name: bound as given, never joined as a group
        return False


def _refuse_what_is_not_honoured(args: argparse.Namespace) -> None:
    """Settings the rest of the command line makes meaningless are refused by name, never silently ignored;
    so are publications that would share a stream and outputs that could not be written at the end."""
    from logbuf.feed.config import EXPLICIT, RECOVERY_ONLY

    given: frozenset[str] = getattr(args, EXPLICIT, frozenset())

    def flag(dest: str) -> str:
        return "--" + dest.replace("_", "-")

    if args.no_recovery and "retransmit" in given:
        raise UsageError("--retransmit and --no-recovery contradict each other (give one)")
    if args.no_recovery or args.retransmit is None:
        ignored = [flag(dest) for dest in RECOVERY_ONLY if dest in given]
        if ignored:
            why = "--no-recovery" if args.no_recovery else "no --retransmit server"
            raise UsageError(f"{', '.join(ignored)}: recovery is off ({why}), so "
                             f"{'these settings are' if len(ignored) > 1 else 'this setting is'} not used")
    for feed, others in (("a", "feed_b"), ("b", "feed_a")):
        if args.mode == feed and others in given and getattr(args, others) is not None:
            raise UsageError(f"{flag(others)} is not read with --mode {feed} (give {flag(others)} off or leave it "
                             "out)")
    used = [(name, address) for name, address, feed in (("--feed-a", args.feed_a, "a"), ("--feed-b", args.feed_b, "b"))
            if address is not None and args.mode in (feed, "ab")]
    if len(used) == 2 and used[0][1] == used[1][1] and used[0][1][1] != 0:  # port 0: two ephemeral ports
        # every datagram would arrive on both feeds: one forged datagram would be "confirmed by the other feed"
        raise UsageError(f"--feed-a and --feed-b are both {used[0][1][0]}:{used[0][1][1]}: A and B must be two "
                         "different sources (or use --mode a)")
    for name, address in used:
        if args.retransmit is not None and tuple(args.retransmit) == tuple(address):
            raise UsageError(f"--retransmit {address[0]}:{address[1]} is {name}'s address: the requests would go "
                             "to the handler's own feed")
    if "interface" in given and not any(_is_multicast(address) for address in (args.feed_a, args.feed_b)):
        raise UsageError("--interface is only used to join multicast groups (neither --feed-a nor --feed-b is one)")
    if "capture_stream" in given and not args.capture:
        raise UsageError("--capture-stream is only used with --capture")
    streams = {"--stream": args.stream, "--events-stream": args.events_stream}
    if args.capture:
        streams["--capture-stream"] = args.capture_stream
    seen: dict[int, str] = {}
    for name, stream_id in streams.items():
        if stream_id in seen:
            raise UsageError(f"{seen[stream_id]} and {name} are both {stream_id}: each stream needs its own id")
        seen[stream_id] = name
    if args.summary_json is not None:
        folder = os.path.dirname(os.path.abspath(args.summary_json))
        if not os.path.isdir(folder):
            raise UsageError(f"--summary-json {args.summary_json}: no directory {folder}")
        if os.path.isdir(args.summary_json):
            raise UsageError(f"--summary-json {args.summary_json} is a directory")


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
    add_driver_dir(p)
    add_feed_options(p)  # every setting, its default and help: logbuf.feed.config
    p.add_argument("--quiet", "-q", action="store_true", help="no start line and no summary")
    p.set_defaults(func=value_errors_as_usage(_cmd_feed))
