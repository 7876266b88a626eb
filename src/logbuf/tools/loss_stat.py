"""``logbuf loss``: the driver's loss report (``loss-report.dat``), printed as Aeron's LossStat prints it.

One CSV line per image that lost data, after a header line, then a count::

    OBSERVATION_COUNT, TOTAL_BYTES_LOST, FIRST_OBSERVATION,LAST_OBSERVATION, SESSION_ID, STREAM_ID, CHANNEL, SOURCE
    11,13440,2026-11-23 20:13:27.303+0000,2026-11-23 20:13:27.331+0000,137768944,1002,aeron:udp?endpoint=...,...
    1 entries read

An observation is one NAK the receiver sent for a gap; the bytes are the gaps' lengths.  The report is read
whether or not the driver is alive.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from logbuf.cnc.errors import CncFileError
from logbuf.cnc.loss_report import LossEntry, LossReportFile, format_loss_stat, format_timestamp
from logbuf.tools.exit_codes import MissingFileError, UnusableFileError


@dataclass(frozen=True)
class LossReportView:
    """The entries of one loss report file."""

    path: str
    entries: tuple[LossEntry, ...]

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps({
            "path": self.path,
            "entries": [dict(e.to_dict(), first_observation=format_timestamp(e.first_observation_ms),
                             last_observation=format_timestamp(e.last_observation_ms)) for e in self.entries],
        }, indent=indent)

    def format(self) -> str:
        return format_loss_stat(list(self.entries))


def read_loss(path: str | os.PathLike[str]) -> LossReportView:
    """Reads ``path`` (a loss-report.dat); MissingFileError / UnusableFileError say why it cannot."""
    if not os.path.exists(path):
        parent = os.path.dirname(os.fspath(path)) or "."
        where = "no driver directory" if not os.path.isdir(parent) else "no loss-report.dat"
        raise MissingFileError(f"{where} at {path} (is a media driver running there? see --dir / LOGBUF_DIR)")
    try:
        with LossReportFile.open(path) as report:
            entries = tuple(report.entries())
    except CncFileError as exc:
        raise UnusableFileError(str(exc)) from None
    except PermissionError as exc:
        raise UnusableFileError(f"cannot read {path}: {exc.strerror}") from None
    return LossReportView(os.fspath(path), entries)


__all__ = ["LossReportView", "read_loss"]
