"""``logbuf driver``: the media driver as a foreground process (Ctrl-C / SIGTERM stop it cleanly)."""

from __future__ import annotations

import argparse
import sys

from logbuf.channel import InvalidChannelError, parse_size
from logbuf.driver.context import MS, SECOND
from logbuf.errors import LogbufError


def _size(text: str) -> int:
    try:
        return parse_size(text, "size")
    except InvalidChannelError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return int(value * SECOND)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "driver",
        help="run a media driver in the foreground",
        description="Runs a media driver: owns cnc.dat and every log buffer of its directory. "
        "Ctrl-C or SIGTERM shut it down cleanly (clients see the driver go at once).",
    )
    p.add_argument("--dir", help="driver directory (default: $LOGBUF_DIR or /dev/shm/logbuf-<user>)")
    p.add_argument("--ipc-term-length", type=_size, help="term length of IPC logs (default 64m)")
    p.add_argument("--mtu", type=_size, help="max frame length incl. header (default 1408)")
    p.add_argument("--publication-window", type=_size, help="IPC publication window (default half a term)")
    p.add_argument("--unblock-timeout", type=_seconds, help="seconds before a stalled claim is padded (15)")
    p.add_argument("--client-liveness-timeout", type=_seconds, help="seconds without a client heartbeat (10)")
    p.add_argument("--linger-timeout", type=_seconds, help="seconds a closed publication may drain (5)")
    p.add_argument("--timer-interval", type=_seconds, help="seconds between timer duties (1)")
    p.add_argument("--idle", help="idle strategy: backoff[:max_park_ns] (default backoff:4000000), sleep[:ns], yield, spin")
    p.add_argument("--group-access", action="store_true", help="directory 0770 and files 0660 (default 0700/0600)")
    p.add_argument("--pre-touch", action="store_true", help="fault log pages in when a log is created")
    p.set_defaults(func=_run_driver)


def _run_driver(args: argparse.Namespace) -> int:
    from logbuf.driver.media_driver import MediaDriver

    try:
        driver = MediaDriver(
            directory=args.dir,
            ipc_term_length=args.ipc_term_length,
            mtu=args.mtu,
            ipc_publication_window=args.publication_window,
            unblock_timeout_ns=args.unblock_timeout,
            client_liveness_timeout_ns=args.client_liveness_timeout,
            publication_linger_timeout_ns=args.linger_timeout,
            timer_interval_ns=args.timer_interval,
            idle_strategy=args.idle,
            group_access=args.group_access or None,
            pre_touch=args.pre_touch or None,
        )
    except (LogbufError, ValueError) as exc:
        print(f"logbuf driver: {exc}", file=sys.stderr)
        return 1
    ctx = driver.ctx
    print(
        f"logbuf driver: pid {driver.cnc.layout.pid if driver.cnc else '?'} in {driver.directory} "
        f"(ipc term {ctx.ipc_term_length >> 10} KiB, mtu {ctx.mtu}, idle {ctx.idle_strategy}, "
        f"client liveness {ctx.client_liveness_timeout_ns // MS} ms, unblock {ctx.unblock_timeout_ns // MS} ms); "
        f"Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    driver.run_foreground()
    print("logbuf driver: stopped", file=sys.stderr, flush=True)
    return 0
