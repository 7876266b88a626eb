"""The recorder's checkpoint: how far a recording is durable, kept next to its datasets.

``RECORDING/_recorder_checkpoint.json`` (hidden from readers by its ``_`` prefix), replaced atomically (write
``.tmp``, fsync, rename, fsync the directory) at every commit::

    {"format": "logbuf-recorder-checkpoint", "version": 1, "epoch": 12,
     "streams": {                                  per role, one entry per publisher image (session id)
       "messages": [{"session_id": 5, "stream_id": 1001, "released": 8388608}],
       "events":   [{"session_id": 6, "stream_id": 1002, "released": 4096}],
       "capture":  [{"session_id": 7, "stream_id": 1003, "released": 65536,
                     "written_through": 66560, "skip_entries": 12}]},
     "last_durable": {"session": "SYNTH0001", "sequence": 123456},
     "sessions": {...}, "open_gaps": [...],        the session timeline and the unsettled gaps
     "publish": [[".part-...parquet.tmp", "part-...parquet"], ...],   files this epoch completes
     "clean_stop": false}                          true after a deliberate stop (not a crash)

``released``: the position the recorder released to the driver (its sub-pos); everything before it is in
complete files (or, for events, in this checkpoint's state) and a restart resumes there.  Capture frames
after ``released`` may be partly recorded: PACKET frames ending at or before ``written_through`` are, and
the first ``skip_entries`` DELIVERED entries of the frame at ``released`` were already joined.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from logbuf.errors import LogbufError
from logbuf.recorder.epoch_writer import fsync_path

CHECKPOINT_FILE = "_recorder_checkpoint.json"
FORMAT = "logbuf-recorder-checkpoint"
VERSION = 1
ROLES = ("messages", "events", "capture")


class CheckpointError(LogbufError, ValueError):
    """The checkpoint file exists but cannot be used."""


@dataclass
class ImageCheckpoint:
    session_id: int
    stream_id: int
    released: int
    written_through: int = 0
    skip_entries: int = 0
    ended: bool = False  # its publisher finished and everything to its end is recorded


@dataclass
class Checkpoint:
    epoch: int = 0
    streams: dict[str, list[ImageCheckpoint]] = field(default_factory=dict)
    last_durable: dict | None = None
    sessions: dict = field(default_factory=dict)
    open_gaps: list[dict] = field(default_factory=list)
    publish: list[list[str]] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)  # rows recorded per dataset over all runs
    clean_stop: bool = False  # the last run ended by a stop (not a crash): what it did not see is not a loss

    def image(self, role: str, session_id: int) -> ImageCheckpoint | None:
        for image in self.streams.get(role, ()):
            if image.session_id == session_id:
                return image
        return None

    def to_json(self) -> str:
        body = {"format": FORMAT, "version": VERSION, **asdict(self)}
        return json.dumps(body, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "checkpoint") -> Checkpoint:
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{where}: not JSON ({exc})") from None
        if body.get("format") != FORMAT or body.get("version") != VERSION:
            raise CheckpointError(f"{where}: format {body.get('format')!r} version {body.get('version')!r}, "
                                  f"expected {FORMAT!r} version {VERSION}")
        try:
            streams = {role: [ImageCheckpoint(**image) for image in images]
                       for role, images in body.get("streams", {}).items()}
            return cls(epoch=int(body["epoch"]), streams=streams, last_durable=body.get("last_durable"),
                       sessions=body.get("sessions", {}), open_gaps=body.get("open_gaps", []),
                       publish=[list(p) for p in body.get("publish", [])], totals=body.get("totals", {}),
                       clean_stop=bool(body.get("clean_stop", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: malformed ({exc})") from None

    # -- files -------------------------------------------------------------------------------------------

    def save(self, root: Path) -> None:
        path = root / CHECKPOINT_FILE
        tmp = root / (CHECKPOINT_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(self.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(root)

    @classmethod
    def load(cls, root: Path) -> Checkpoint | None:
        path = root / CHECKPOINT_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        return cls.from_json(text, str(path))
