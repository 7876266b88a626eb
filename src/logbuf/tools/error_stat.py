"""``logbuf errors``: the driver's distinct error log from cnc.dat (Aeron's ErrorStat).

Each distinct error is stored once with an observation count and the first and last time it was seen
(``logbuf.cnc.error_log``).  Text output is ErrorStat's, one block per error in log order, then a count::

    ***
    3 observations from 2026-11-22 14:23:45.123+0000 to 2026-11-22 14:25:00.004+0000 for:
     logbuf.cnc.errors.MalformedCommandError: ADD_PUBLICATION body of 12 bytes ...

    1 distinct errors observed.

``--json`` adds the driver's pid, state and heartbeat age.

The log is read whether or not the driver is alive: a dead driver's errors are often the interesting ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from logbuf.cnc.loss_report import format_timestamp
from logbuf.tools import _fmt
from logbuf.tools.cnc_stat import DEFAULT_NOT_READY_WAIT_S, DriverHeader, open_cnc
from logbuf.units import epoch_ms


@dataclass(frozen=True)
class ErrorEntry:
    count: int
    first_observation_ms: int
    last_observation_ms: int
    text: str

    def to_dict(self) -> dict[str, object]:
        return {
            "count": self.count,
            "first_observation_ms": self.first_observation_ms,
            "first_observation": _fmt.iso_ms(self.first_observation_ms),
            "last_observation_ms": self.last_observation_ms,
            "last_observation": _fmt.iso_ms(self.last_observation_ms),
            "text": self.text,
        }


@dataclass(frozen=True)
class ErrorReport:
    header: DriverHeader
    entries: tuple[ErrorEntry, ...]

    @property
    def total_observations(self) -> int:
        return sum(e.count for e in self.entries)

    def to_dict(self) -> dict[str, object]:
        out = self.header.to_dict()
        out["distinct_errors"] = len(self.entries)
        out["observations"] = self.total_observations
        out["errors"] = [e.to_dict() for e in self.entries]
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def read_errors(
    cnc_path: str | os.PathLike[str],
    *,
    since_ms: int = 0,
    clock_ms: Callable[[], int] = epoch_ms,
    not_ready_wait_s: float = DEFAULT_NOT_READY_WAIT_S,
) -> ErrorReport:
    """The distinct errors (last seen at or after ``since_ms``) of the driver owning ``cnc_path``.

    Raises MissingFileError / UnusableFileError as ``read_stat`` does.
    """
    cnc = open_cnc(cnc_path, not_ready_wait_s)
    try:
        entries = tuple(
            ErrorEntry(obs.count, obs.first_timestamp_ms, obs.last_timestamp_ms, obs.text)
            for obs in cnc.error_log_reader().read(since_ms)
        )
        return ErrorReport(DriverHeader.read(cnc, clock_ms()), entries)
    finally:
        cnc.close()


def format_errors(report: ErrorReport) -> str:
    """ErrorStat's text: per distinct error ``***``, ``<n> observations from <first> to <last> for:`` and the
    error's text after a space, then ``<n> distinct errors observed.`` (times in UTC, as LossStat's)."""
    blocks = [
        f"***\n{e.count} observations from {format_timestamp(e.first_observation_ms)} to "
        f"{format_timestamp(e.last_observation_ms)} for:\n {e.text}\n"
        for e in report.entries
    ]
    return "".join(blocks) + f"\n{len(report.entries)} distinct errors observed.\n"
