"""Read-only inspection tools over the files a media driver writes.

* ``cnc_stat`` — ``logbuf stat``: counters and driver liveness from cnc.dat (``read_stat``, ``format_stat``)
* ``watch`` — ``logbuf stat --watch``: a live view with per-second rates
* ``error_stat`` — ``logbuf errors``: the distinct error log (``read_errors``, ``format_errors``)
* ``log_dump`` — ``logbuf logdump``: a log buffer's metadata, tails and frames (``read_log_dump``)
* ``counter_types`` — type id <-> name table (``register_counter_type`` for new counter types)
* ``exit_codes`` — the commands' exit statuses and the ``ToolError`` exceptions that carry them
"""

from logbuf.tools.cnc_stat import (
    CncStatSource,
    CounterFilter,
    CounterSample,
    DriverHeader,
    DriverState,
    StatSnapshot,
    format_stat,
    open_cnc,
    read_stat,
)
from logbuf.tools.counter_types import CounterType, parse_counter_type, register_counter_type, type_name
from logbuf.tools.error_stat import ErrorEntry, ErrorReport, format_errors, read_errors
from logbuf.tools.exit_codes import (
    DriverInactiveError,
    ExitCode,
    MissingFileError,
    ToolError,
    UnusableFileError,
)
from logbuf.tools.log_dump import FrameRecord, FrameState, LogDump, format_log_dump, read_log_dump
from logbuf.tools.watch import RateTracker, watch

__all__ = [
    "CncStatSource",
    "CounterFilter",
    "CounterSample",
    "CounterType",
    "DriverHeader",
    "DriverInactiveError",
    "DriverState",
    "ErrorEntry",
    "ErrorReport",
    "ExitCode",
    "FrameRecord",
    "FrameState",
    "LogDump",
    "MissingFileError",
    "RateTracker",
    "StatSnapshot",
    "ToolError",
    "UnusableFileError",
    "format_errors",
    "format_log_dump",
    "format_stat",
    "open_cnc",
    "parse_counter_type",
    "read_errors",
    "read_log_dump",
    "read_stat",
    "register_counter_type",
    "type_name",
    "watch",
]
