"""``logbuf book``: the example subscriber's command line (argument parsing and wiring only)."""

from __future__ import annotations

import argparse
import sys

from logbuf.cli_args import DefaultsHelpFormatter, UsageError, add_driver_dir, traceback_wanted
from logbuf.errors import LogbufError


def _cmd_book(args: argparse.Namespace) -> int:
    from logbuf.samples.book import run_top_of_book

    if args.interval <= 0 or (args.duration is not None and args.duration <= 0):
        raise UsageError("--interval and --duration must be > 0")
    try:
        return run_top_of_book(args)
    except LogbufError as exc:  # no driver, a bad channel, ...: one line, no traceback
        if traceback_wanted():
            raise
        print(f"logbuf book: error: {exc}", file=sys.stderr)
        return 1


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    d = DefaultsHelpFormatter
    p = subparsers.add_parser(
        "book", help="example subscriber: top of book from the feed handler's stream", formatter_class=d,
        description="Subscribes to the feed handler's messages and events streams, builds every symbol's "
        "order book from the ITCH messages and prints the top of book of the most active (or chosen) symbols.")
    add_driver_dir(p)
    p.add_argument("--channel", default="aeron:ipc", help="channel of the feed handler's publications")
    p.add_argument("--stream", type=int, default=1001, help="messages stream id")
    p.add_argument("--events-stream", type=int, default=1002, help="gap/session events stream id")
    p.add_argument("--symbols", default=None, help="comma-separated symbols to show (default: the most active)")
    p.add_argument("--interval", type=float, default=1.0, help="print the book every this many seconds")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the final book")
    p.add_argument("--verbose", "-v", action="store_true", help="print every gap event")
    p.set_defaults(func=_cmd_book)
