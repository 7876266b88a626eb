"""Exit statuses of ``logbuf stat``, ``logbuf errors`` and ``logbuf logdump``, and the errors behind them.

====  ==================  ==========================================================================
code  name                when
====  ==================  ==========================================================================
0     OK                  printed what was asked (``stat --watch``: stopped by Ctrl-C or ``--count``)
2     USAGE               bad arguments (argparse)
3     NOT_FOUND           nothing there: no driver directory, no ``cnc.dat`` in it, no such log file
4     UNUSABLE            a file is there but cannot be read as what it should be: truncated, foreign,
                          incompatible CnC version, still being initialised, no permission, not a log
5     DRIVER_INACTIVE     (``stat``) the driver's heartbeat is older than the staleness limit, or 0
                          (the driver shut down); counters are printed only with ``--force``
====  ==================  ==========================================================================

Library callers get the same information as exceptions: each ``ToolError`` carries its ``exit_code``.
"""

from __future__ import annotations

import enum

from logbuf.errors import USAGE_EXIT_STATUS, LogbufError


class ExitCode(enum.IntEnum):
    OK = 0
    USAGE = USAGE_EXIT_STATUS
    NOT_FOUND = 3
    UNUSABLE = 4
    DRIVER_INACTIVE = 5


class ToolError(LogbufError):
    """An inspection tool cannot do its job; ``str(error)`` is the one-line message for the user."""

    exit_code: ExitCode = ExitCode.UNUSABLE


class MissingFileError(ToolError):
    """No driver directory, no cnc.dat in it, or no such log buffer file."""

    exit_code = ExitCode.NOT_FOUND


class UnusableFileError(ToolError):
    """The file exists but is truncated, foreign, of another CnC version, half-initialised or unreadable."""

    exit_code = ExitCode.UNUSABLE


class DriverInactiveError(ToolError):
    """The driver's heartbeat in cnc.dat is stale (or 0: it shut down)."""

    exit_code = ExitCode.DRIVER_INACTIVE
