"""Loss reporting: data the recording will not have is never silent.

A loss (the driver no longer had the positions a restart needed, a publisher of the checkpoint is gone, an
image closed before it was all read, messages without their DELIVERED rows) is an error
(:class:`RecorderDataLoss`) unless the recorder runs with ``allow_loss``; then it is a line in
``RECORDING/_recorder_losses.jsonl`` (fsync'ed), a count in the recorder's ``losses`` counter and a warning.
What was published while the recorder was deliberately stopped is logged the same way, never an error.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from logbuf.recorder.config import RecorderError

LOSSES_FILE = "_recorder_losses.jsonl"

log = logging.getLogger("logbuf.recorder")


class RecorderDataLoss(RecorderError):
    """Data the recording should contain can no longer be read (raised unless ``allow_loss``)."""


class LossReport:
    """Counts, records and raises the recorder's losses; warns once per kind of oddity."""

    def __init__(self, root: Path, allow_loss: bool) -> None:
        self.root = root
        self.allow_loss = allow_loss
        self.count = 0
        self._warned: set[str] = set()

    def loss(self, stream: str, what: str, *, after_stop: bool = False, **details: object) -> None:
        """Data the recording will not have.  After a deliberate stop (``after_stop``) it is what was published
        while nobody recorded: logged, never an error.  Otherwise an error unless ``allow_loss``."""
        self.count += 1
        if not after_stop and not self.allow_loss:
            raise RecorderDataLoss(f"{what}; rerun with --allow-loss to record the loss and continue")
        if after_stop:
            what += " (while the recorder was stopped)"
        entry = {"time_ns": time.time_ns(), "stream": stream, "what": what, "while_stopped": after_stop, **details}
        with open(self.root / LOSSES_FILE, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
        log.warning("logbuf record: %s: %s", "warning: not recorded" if after_stop else "data loss", what)

    def warn(self, text: str) -> None:
        log.warning("logbuf record: warning: %s", text)

    def warn_once(self, key: str, text: str) -> None:
        """Warns about ``key`` the first time only (a condition that persists is one warning, not one a cycle)."""
        if key not in self._warned:
            self._warned.add(key)
            self.warn(text)
