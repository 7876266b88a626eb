"""Argument types shared by the ``logbuf`` sub-commands (argparse ``type=`` callables).

Each type raises ``argparse.ArgumentTypeError`` with a short reason, which argparse turns into the usual
one-line ``logbuf <command>: error: argument --x: <reason>`` (exit status 2) before any work starts.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from logbuf.errors import INTERRUPTED_EXIT_STATUS, UsageError

TRACEBACK_ENV = "LOGBUF_TRACEBACK"


def traceback_wanted() -> bool:
    """``LOGBUF_TRACEBACK=1``: a command that prints an error line itself re-raises instead (``logbuf.cli``
    then shows the traceback)."""
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")

_SUFFIXES = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}

# duration units -> seconds; a bare number is seconds
_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")


DRIVER_DIR_HELP = "driver directory (default: $LOGBUF_DIR or /dev/shm/logbuf-<user>)"


def add_driver_dir(parser: argparse.ArgumentParser) -> None:
    """The ``--dir`` option every command that talks to a media driver shares."""
    parser.add_argument("--dir", default=None, help=DRIVER_DIR_HELP)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none (``None``), for on/off flags, and where the
    help text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.nargs == 0 or "default" in text:
            return text
        return super()._get_help_string(action)


def count(text: str) -> int:
    """A positive whole number of things: ``5000``, ``50k``, ``2M``, ``1_000_000`` (decimal suffixes)."""
    raw = text.strip().lower().replace("_", "")
    scale = _SUFFIXES.get(raw[-1:], 1)
    digits = raw[:-1] if scale != 1 else raw
    try:
        value = float(digits) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (e.g. 5000, 50k, 2M)") from None
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive whole number")
    return int(value)


def duration(text: str) -> float:
    """A positive duration in seconds: ``30``, ``2.5``, ``500ms``, ``250us``, ``2m``, ``1h`` (bare = seconds)."""
    match = _DURATION.match(text.lower())
    unit = match.group(2) if match else None
    if match is None or unit not in _DURATION_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 30, 2.5, 500ms, 2m)")
    seconds = float(match.group(1)) * _DURATION_UNITS[unit]
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than 0 s")
    return seconds


_T = TypeVar("_T")


def off_or(parse: Callable[[str], _T]) -> Callable[[str], _T | None]:
    """An argument type: ``off`` is None, anything else ``parse(text)``, whose ``ValueError`` becomes the usage
    message (e.g. ``off_or(logbuf.channel.parse_endpoint)`` for an address that may be switched off)."""

    def argument(text: str) -> _T | None:
        if text.lower() == "off":
            return None
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return argument


class StopSignal(threading.Event):
    """Set by SIGINT or SIGTERM while :func:`stop_on_signals` is active; :attr:`signum` says which came first."""

    signum: int | None = None


def value_errors_as_usage(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A command whose bad values met after parsing (a library's ``ValueError``) are usage errors (status 2);
    ``logbuf.cli`` prints one as one line (and an ``OSError``, e.g. a busy port, with status 1)."""

    @functools.wraps(func)  # keeps the command's own module and name (the command table checks them)
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc

    return run


@contextmanager
def stop_on_signals() -> Iterator[StopSignal]:
    """A long-running command's clean stop: SIGINT (Ctrl-C) and SIGTERM set the event the command's loop
    watches, instead of raising in the middle of its work; the previous handlers come back afterwards.

    Outside the main thread (signals cannot be caught there) the event is only set by the caller."""
    stop = StopSignal()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: object) -> None:
        if stop.signum is None:
            stop.signum = signum
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stopped_status(command: str, stop: StopSignal, status: int = 0) -> int:
    """The exit status of a command that stopped cleanly: Ctrl-C (SIGINT) prints ``logbuf <command>:
    interrupted`` and gives 130, as for any command; SIGTERM (a service manager's stop) keeps ``status``."""
    if stop.signum == signal.SIGINT and status == 0:  # an error's own status says more
        print(f"logbuf {command}: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT_STATUS
    return status
