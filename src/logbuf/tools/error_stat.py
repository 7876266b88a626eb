"""``logbuf errors``: the driver's distinct error log from cnc.dat (Aeron's ErrorStat).

Each distinct error is stored once with an observation count and the first and last time it was seen
(``logbuf.cnc.error_log``).  Text output, one block per error in log order, then a summary line::

    3 observations from 2026-11-22T14:23:45.123+01:00 to 2026-11-22T14:25:00.004+01:00 for:
      logbuf.cnc.errors.MalformedCommandError: ADD_PUBLICATION body of 12 bytes ...

    1 distinct error observed (3 observations) - driver pid 4242, heartbeat age 12 ms, /dev/shm/x/cnc.dat

The log is read whether or not the driver is alive: a dead driver's errors are often the interesting ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from logbuf.tools import _fmt
from logbuf.tools.cnc_stat import DEFAULT_NOT_READY_WAIT_S, DriverHeader, DriverState, open_cnc


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
    clock_ms: Callable[[], int] = _fmt.epoch_ms,
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


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def format_errors(report: ErrorReport) -> str:
    blocks = []
    for e in report.entries:
        text = "\n".join("  " + line for line in e.text.splitlines() or [""])
        blocks.append(
            f"{_plural(e.count, 'observation')} from {_fmt.iso_ms(e.first_observation_ms)} "
            f"to {_fmt.iso_ms(e.last_observation_ms)} for:\n{text}\n"
        )
    header = report.header
    age = header.heartbeat_age_ms
    if header.state is DriverState.SHUT_DOWN:
        driver = f"driver pid {header.driver_pid} shut down"
    elif header.state is DriverState.STALE:
        driver = f"driver pid {header.driver_pid} not alive (heartbeat age {_fmt.duration(age or 0)})"
    else:
        driver = f"driver pid {header.driver_pid}, heartbeat age {age:,} ms"
    distinct = len(report.entries)
    summary = (
        f"{distinct:,} distinct error{'' if distinct == 1 else 's'} observed "
        f"({_plural(report.total_observations, 'observation')}) - {driver}, {header.cnc_path}\n"
    )
    return "\n".join([*blocks, summary])
