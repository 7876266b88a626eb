"""``logbuf record``: argument parsing, signals and progress; the work is :class:`~logbuf.recorder.Recorder`.

Exit status: 0 recorded and stopped cleanly (SIGTERM, ``--duration``, the end of the session), 130 the same
after Ctrl-C, 1 stopped by data loss or a lost driver (the recording is consistent up to the last commit),
2 bad arguments or a recording that cannot be opened.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import Any

from logbuf.cli_args import StopSignal, add_driver_dir, count, stopped_status, traceback_wanted
from logbuf.errors import USAGE_EXIT_STATUS, UsageError
from logbuf.feed import published
from logbuf.recorder.config import (
    DEFAULT_COMMIT_INTERVAL_S,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_ROWS_PER_FILE,
    DEFAULT_SESSION,
)

RUNTIME_ERROR = 1
_EXTRA_HINT = "install the recorder extra: pip install 'logbuf[recorder]'"


def _stream(text: str) -> int | None:
    if text.lower() in ("none", "off", "-"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a stream id (or 'none')") from None
    if not -(2**31) <= value < 2**31:
        raise argparse.ArgumentTypeError(f"stream id {value} does not fit in 32 bits")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0 seconds")
    return value


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


class _Progress:
    """One status line per second on stderr (rewritten in place on a terminal)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last_time = time.monotonic()
        self.last_messages = 0
        self.last_packets = 0

    def __call__(self, stats: Any, final: bool = False) -> None:
        now = time.monotonic()
        dt = max(now - self.last_time, 1e-9)
        rate = (stats.messages - self.last_messages) / dt
        packet_rate = (stats.packets - self.last_packets) / dt
        self.last_time, self.last_messages, self.last_packets = now, stats.messages, stats.packets
        line = (f"record: {stats.messages:,} messages ({rate:,.0f}/s), {stats.packets:,} packets "
                f"({packet_rate:,.0f}/s), {stats.gaps:,} gaps, {stats.files:,} files {_mb(stats.bytes)} | "
                f"session {stats.session} seq {stats.last_sequence if stats.last_sequence is not None else '-'}, "
                f"held {_mb(stats.held_bytes)}, lag {_mb(stats.lag_bytes)}")
        if stats.pending_join:
            line += f", {stats.pending_join:,} awaiting capture rows"
        if self.tty and not final:
            print("\r\x1b[K" + line, end="", file=sys.stderr, flush=True)
        else:
            print(("\r\x1b[K" if self.tty else "") + line, file=sys.stderr, flush=True)


def _cmd_record(args: argparse.Namespace) -> int:
    try:
        from logbuf.recorder.recorder import Recorder, RecorderConfig, RecorderDataLoss, RecorderError
    except ModuleNotFoundError as exc:
        print(f"logbuf record: error: {exc.name} is not installed ({_EXTRA_HINT})", file=sys.stderr)
        return USAGE_EXIT_STATUS
    from logbuf.errors import LogbufError
    from logbuf.recording.schema import RecordingFormatError

    options: dict[str, Any] = {}
    if args.rows_per_file is not None:
        options["rows_per_file"] = args.rows_per_file
    if args.row_group_rows is not None:
        options["row_group_rows"] = args.row_group_rows
    try:
        config = RecorderConfig(
            output=args.output, driver_directory=args.dir, channel=args.channel,
            messages_stream=args.messages_stream, events_stream=args.events_stream,
            capture_stream=args.capture_stream, default_session=args.session,
            commit_interval_s=args.commit_interval, allow_loss=args.allow_loss,
            connect_timeout_s=args.connect_timeout, **options,
        )
    except (ValueError, RecordingFormatError) as exc:
        raise UsageError(str(exc)) from exc
    progress = None if args.quiet else _Progress()
    if args.quiet:  # warnings (and allowed losses, which _recorder_losses.jsonl keeps) are not errors
        logging.getLogger("logbuf.recorder").setLevel(logging.ERROR)
    try:
        recorder = Recorder(config, progress=progress)
    except (RecordingFormatError, ValueError) as exc:  # OUT is not a recording we can continue
        raise UsageError(str(exc)) from exc
    # anything else (no driver, another recorder on OUT, ...): logbuf.cli prints it (status 1)
    stopped = StopSignal()

    def stop(signum: int, frame: object) -> None:
        stopped.signum = stopped.signum or signum
        stopped.set()
        recorder.stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    newline = "\n" if progress is not None and progress.tty else ""  # ends the progress line being rewritten
    try:
        if not args.quiet:
            what = ("until the end of the session" if args.until_end_of_session
                    else f"for {args.duration:g} s" if args.duration else "until Ctrl-C / SIGTERM")
            extra = ""
            if recorder.checkpoint is not None:
                extra = (f", resuming after commit {recorder.checkpoint.epoch} (rolled forward "
                         f"{recorder.rolled_forward}, removed {len(recorder.removed_stale)} stale .tmp)")
            print(f"logbuf record: {config.output} {what}{extra}", file=sys.stderr)
        stats = recorder.run(duration_s=args.duration, until_end_of_session=args.until_end_of_session)
        if progress is not None:
            progress(stats, final=True)
            totals = ", ".join(f"{name} {count:,}" for name, count in stats.counts.items())
            print(f"logbuf record: stopped cleanly after {stats.elapsed_s:.1f} s; {stats.commits} commits; "
                  f"recording totals: {totals}", file=sys.stderr)
    except RecorderDataLoss as exc:
        if traceback_wanted():
            raise
        print(f"{newline}logbuf record: error: data loss: {exc}", file=sys.stderr)
        status = RUNTIME_ERROR
    except (RecorderError, LogbufError, RuntimeError, OSError) as exc:  # a lost driver, a full disk, ...
        if traceback_wanted():
            raise
        print(f"{newline}logbuf record: error: {exc} (the recording is consistent up to its last commit)",
              file=sys.stderr)
        status = RUNTIME_ERROR
    finally:
        recorder.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return stopped_status("record", stopped, status)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "record",
        help="record the feed handler's streams into a crash-safe Parquet recording",
        description="Subscribe to the feed handler's messages, events and capture streams and write the "
                    "recording datasets (packets, messages, gaps) as rolling Parquet files partitioned by "
                    "session and hour.  Files being written are hidden .tmp files; a checkpoint makes a "
                    "restart continue without duplicates or gaps.  Counters: `logbuf stat --type 1200`.",
    )
    p.add_argument("output", metavar="OUT", help="recording directory (created; an existing one is continued)")
    add_driver_dir(p)
    p.add_argument("--channel", default="aeron:ipc", help="channel of the three streams (default: %(default)s)")
    p.add_argument("--stream", dest="messages_stream", type=_stream, default=published.MESSAGES_STREAM,
                   metavar="ID", help="ITCH messages stream, or 'none' (default: %(default)s)")
    p.add_argument("--events-stream", type=_stream, default=published.EVENTS_STREAM, metavar="ID",
                   help="gap/session events stream, or 'none' (default: %(default)s)")
    p.add_argument("--capture-stream", type=_stream, default=published.CAPTURE_STREAM, metavar="ID",
                   help="packet/delivery capture stream, or 'none' (default: %(default)s)")
    p.add_argument("--session", default=DEFAULT_SESSION,
                   help="session partition of what arrives before the first SESSION_CHANGED event "
                        "(default: %(default)s)")
    p.add_argument("--rows-per-file", type=count, metavar="N",
                   help=f"rows after which a file is completed, e.g. 16M (default: {DEFAULT_ROWS_PER_FILE:,}; "
                        "files also complete at every commit)")
    p.add_argument("--row-group-rows", type=count, metavar="N",
                   help=f"Parquet row group size, e.g. 1M (default: {DEFAULT_ROW_GROUP_ROWS:,})")
    p.add_argument("--commit-interval", type=_seconds, default=DEFAULT_COMMIT_INTERVAL_S, metavar="S",
                   help="longest time in seconds recorded data waits to become complete files (default: %(default)s)")
    p.add_argument("--allow-loss", action="store_true",
                   help="on data the driver no longer has: log it to OUT/_recorder_losses.jsonl and go on "
                        "(default: stop with exit status 1)")
    p.add_argument("--connect-timeout", type=_seconds, default=DEFAULT_CONNECT_TIMEOUT_S, metavar="S",
                   help="how long in seconds to wait for the media driver (default: %(default)s)")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=_seconds, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    stop.add_argument("--until-end-of-session", action="store_true",
                      help="stop once the END_OF_SESSION event and everything before it are recorded (default: off)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr, errors only (default: off)")
    p.set_defaults(func=_cmd_record)
