"""``logbuf stat``, ``logbuf errors``, ``logbuf loss`` and ``logbuf logdump``: argument parsing and wiring only.

Exit statuses (``logbuf.tools.exit_codes``): 0 OK, 2 usage, 3 nothing there (no driver directory, no
cnc.dat, no log file), 4 unusable file (truncated, foreign, wrong CnC version, still initialising, not a
log buffer), 5 driver inactive (``stat`` only: stale or zero heartbeat; counters printed with ``--force``).
Errors are one line on stderr, ``logbuf <command>: error: <message>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import TextIO

from logbuf.cli_args import add_driver_dir
from logbuf.directory import (
    IMAGES_DIR,
    LOG_SUFFIX,
    PUBLICATIONS_DIR,
    cnc_path,
    loss_report_path,
    resolve_directory,
)
from logbuf.tools.cnc_stat import CncStatSource, CounterFilter, format_stat, read_stat
from logbuf.tools.counter_types import known_counter_types
from logbuf.tools.error_stat import format_errors, read_errors
from logbuf.tools.exit_codes import ExitCode, ToolError
from logbuf.tools.log_dump import DEFAULT_MAX_FRAMES, DEFAULT_PREVIEW_BYTES, format_log_dump, read_log_dump
from logbuf.tools.loss_stat import read_loss
from logbuf.tools.watch import watch

_EXIT_CODES_HELP = (
    "exit status: 0 ok, 2 usage, 3 no driver directory / cnc.dat / file, 4 unusable file (truncated, "
    "foreign, wrong version, not a log buffer), 5 driver not alive (stat)"
)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _frame_limit(text: str) -> int | None:
    if text.lower() == "all":
        return None
    return _non_negative_int(text)


def _fail(command: str, exc: ToolError) -> int:
    print(f"logbuf {command}: error: {exc}", file=sys.stderr)
    return int(exc.exit_code)


def _write(out: TextIO, text: str) -> None:
    out.write(text)
    out.flush()


def _on_broken_pipe() -> int:
    # `logbuf stat | head`: the reader went away; don't let the interpreter complain flushing stdout at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return int(ExitCode.OK)


# -- stat ----------------------------------------------------------------------------------------------


def _cmd_stat(args: argparse.Namespace) -> int:
    if args.count is not None and not args.watch:
        print("logbuf stat: error: --count needs --watch", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        keep = CounterFilter.parse(args.type, args.label)
    except ValueError as exc:
        print(f"logbuf stat: error: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    path = cnc_path(args.dir)
    try:
        if args.watch:
            # a terminal shows what fits: the counters that moved (unless chosen), cut to its height
            screen = sys.stdout.isatty() and not args.json and not args.all and not args.type and not args.label
            with CncStatSource(path, stale_after_ms=args.stale_ms) as source:
                return watch(
                    source.read,
                    sys.stdout,
                    interval_s=args.interval,
                    count=args.count,
                    json_lines=args.json,
                    keep=keep,
                    hide_zero=screen,
                    max_lines=shutil.get_terminal_size().lines - 1 if screen else None,
                )
        try:
            snapshot = read_stat(path, stale_after_ms=args.stale_ms)
        except ToolError as exc:
            return _fail("stat", exc)
        reason = snapshot.header.inactive_reason()
        if reason:
            print(
                f"logbuf stat: error: {reason}" + ("" if args.force else " (--force prints its counters)"),
                file=sys.stderr,
            )
            if not args.force:
                return int(ExitCode.DRIVER_INACTIVE)
        shown = snapshot.select(keep)
        _write(sys.stdout, shown.to_json(indent=2) + "\n" if args.json else format_stat(shown))
        return int(ExitCode.DRIVER_INACTIVE if reason else ExitCode.OK)
    except BrokenPipeError:
        return _on_broken_pipe()


# -- errors --------------------------------------------------------------------------------------------


def _cmd_errors(args: argparse.Namespace) -> int:
    try:
        report = read_errors(cnc_path(args.dir))
    except ToolError as exc:
        return _fail("errors", exc)
    reason = report.header.inactive_reason()
    if reason and not args.json:
        print(f"logbuf errors: WARNING: {reason}", file=sys.stderr)  # stdout stays ErrorStat's text
    try:
        _write(sys.stdout, report.to_json(indent=2) + "\n" if args.json else format_errors(report))
    except BrokenPipeError:
        return _on_broken_pipe()
    return int(ExitCode.OK)


# -- loss ----------------------------------------------------------------------------------------------


def _cmd_loss(args: argparse.Namespace) -> int:
    try:
        view = read_loss(loss_report_path(args.dir))
    except ToolError as exc:
        return _fail("loss", exc)
    try:
        _write(sys.stdout, view.to_json(indent=2) + "\n" if args.json else view.format())
    except BrokenPipeError:
        return _on_broken_pipe()
    return int(ExitCode.OK)


# -- logdump -------------------------------------------------------------------------------------------


def resolve_log_file(file: str, directory: str | None) -> Path:
    """``FILE`` as given if it exists; a bare registration/correlation id is looked up in the driver's
    ``publications/`` then ``images/`` directories."""
    path = Path(file)
    if path.exists() or not file.lstrip("-").isdigit():
        return path
    base = resolve_directory(directory)
    for sub in (PUBLICATIONS_DIR, IMAGES_DIR):
        candidate = base / sub / f"{file}{LOG_SUFFIX}"
        if candidate.exists():
            return candidate
    return path


def _cmd_logdump(args: argparse.Namespace) -> int:
    try:
        dump = read_log_dump(
            resolve_log_file(args.file, args.dir), max_frames=args.frames, preview_bytes=args.preview
        )
    except ToolError as exc:
        return _fail("logdump", exc)
    try:
        _write(sys.stdout, dump.to_json(indent=2) + "\n" if args.json else format_log_dump(dump))
    except BrokenPipeError:
        return _on_broken_pipe()
    return int(ExitCode.OK)


# -- registration --------------------------------------------------------------------------------------


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    type_names = ", ".join(f"{t.type_id} {t.name}" for t in known_counter_types())
    p = subparsers.add_parser(
        "stat",
        help="print the driver's counters (like AeronStat)",
        description="Print the media driver's counters from its cnc.dat: a header line (time, CnC version, "
        "driver pid, heartbeat age) and 'id: value - label' per counter.",
        epilog=_EXIT_CODES_HELP,
    )
    add_driver_dir(p)
    p.add_argument("--watch", "-w", action="store_true",
                   help="redraw every --interval seconds, with rates; on a terminal, without --type/--label/--all, "
                   "counters at 0 are left out and the frame is cut to the terminal's height (both said in the "
                   "frame)")
    p.add_argument("--all", "-a", action="store_true",
                   help="--watch on a terminal: every counter, at 0 or not, however long the frame")
    p.add_argument("--interval", type=_positive_float, default=1.0, metavar="S", help="--watch period (1 s)")
    p.add_argument(
        "--count",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="--watch: stop after N frames (default: until Ctrl-C)",
    )
    p.add_argument(
        "--json", action="store_true", help="one JSON object (with --watch: one JSON line per frame)"
    )
    p.add_argument(
        "--type",
        "-t",
        action="extend",
        nargs="+",
        metavar="T",
        help=f"only these counter types, by id or name ({type_names})",
    )
    p.add_argument("--label", "-l", metavar="REGEX", help="only counters whose label matches (re.search)")
    p.add_argument(
        "--force",
        "-f",
        action="store_true",
        help="print the counters even when the driver is not alive (exit status stays 5)",
    )
    p.add_argument(
        "--stale-ms",
        type=_non_negative_int,
        default=None,
        metavar="MS",
        help="heartbeat age beyond which the driver counts as dead (default: the client "
        "liveness timeout in cnc.dat)",
    )
    p.set_defaults(func=_cmd_stat)

    p = subparsers.add_parser(
        "errors",
        help="print the driver's distinct error log",
        description="Print the distinct errors the driver recorded in cnc.dat as Aeron's ErrorStat does: "
        "count, first and last observation (UTC) and text per error, then how many there are.  A driver "
        "that is not alive is noted on stderr.",
        epilog=_EXIT_CODES_HELP,
    )
    add_driver_dir(p)
    p.add_argument("--json", action="store_true", help="one JSON object (default: text)")
    p.set_defaults(func=_cmd_errors)

    p = subparsers.add_parser(
        "loss",
        help="print the driver's loss report (like LossStat)",
        description="Print the media driver's loss-report.dat: per image that lost data, the observations "
        "(NAKs sent), total bytes lost, first and last observation, session, stream, channel and source.",
        epilog=_EXIT_CODES_HELP,
    )
    add_driver_dir(p)
    p.add_argument("--json", action="store_true", help="one JSON object (default: LossStat's text)")
    p.set_defaults(func=_cmd_loss)

    p = subparsers.add_parser(
        "logdump",
        help="print a log buffer's metadata, tails and frames",
        description="Print a log buffer file's metadata, its three tail counters and the frames of each "
        "term from offset 0 up to its tail (in-flight claims shown with their negative length).",
        epilog=_EXIT_CODES_HELP,
    )
    p.add_argument(
        "file",
        metavar="FILE",
        help="a .logbuffer file, or a registration id looked up in the driver directory",
    )
    p.add_argument("--dir", default=None, help="driver directory used to resolve a registration id "
                   "(default: $LOGBUF_DIR or /dev/shm/logbuf-<user>)")
    p.add_argument(
        "--frames",
        type=_frame_limit,
        default=DEFAULT_MAX_FRAMES,
        metavar="N|all",
        help=f"frames shown per term (default {DEFAULT_MAX_FRAMES})",
    )
    p.add_argument(
        "--preview",
        type=_non_negative_int,
        default=DEFAULT_PREVIEW_BYTES,
        metavar="BYTES",
        help=f"payload bytes shown per frame (default {DEFAULT_PREVIEW_BYTES})",
    )
    p.add_argument("--json", action="store_true", help="one JSON object (default: text)")
    p.set_defaults(func=_cmd_logdump)
