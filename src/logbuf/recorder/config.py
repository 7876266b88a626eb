"""What a :class:`~logbuf.recorder.recorder.Recorder` is told (:class:`RecorderConfig`), what it reports
(:class:`RecorderStats`) and its base error.  No pyarrow at import: the CLI builds its help from here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from logbuf.errors import LogbufError
from logbuf.feed import published as pub
from logbuf.recording import DEFAULT_ROW_GROUP_ROWS, DEFAULT_ROWS_PER_FILE

DEFAULT_SESSION = "UNKNOWN"
DEFAULT_COMMIT_INTERVAL_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0


class RecorderError(LogbufError):
    """The recorder cannot run (bad configuration, another recorder on the same recording, a failed write, ...)."""


class RecorderConfigError(RecorderError, ValueError):
    """A :class:`RecorderConfig` that cannot work (checked before anything is opened)."""


@dataclass
class RecorderConfig:
    """Where to record from and to, and when files complete; validated on creation."""

    output: str | os.PathLike[str]
    driver_directory: str | os.PathLike[str] | None = None
    channel: str = "aeron:ipc"
    messages_stream: int | None = pub.MESSAGES_STREAM
    events_stream: int | None = pub.EVENTS_STREAM
    capture_stream: int | None = pub.CAPTURE_STREAM
    default_session: str = DEFAULT_SESSION  # partition of what comes before the first SESSION_CHANGED
    rows_per_file: int = DEFAULT_ROWS_PER_FILE
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS
    commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S  # longest time recorded data waits to become complete files
    allow_loss: bool = False  # record losses in _recorder_losses.jsonl instead of stopping
    compression: str = "zstd"
    stage_rows: int = 262_144  # rows converted to Arrow at once
    max_batches_per_cycle: int = 16  # messages poll batches between looks at the other streams
    hold_bytes: int | None = None  # commit when this much is held back (default: half the publication window)
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S  # how long to wait for the media driver

    def __post_init__(self) -> None:
        if self.messages_stream is None and self.events_stream is None and self.capture_stream is None:
            raise RecorderConfigError("nothing to record: every stream is disabled")
        if self.messages_stream is not None and self.capture_stream is None:
            raise RecorderConfigError("the messages dataset needs the capture stream's DELIVERED rows (feed and "
                                      "arrival time of each message): enable the capture stream (feed handler "
                                      "--capture)")
        ids = [s for s in (self.messages_stream, self.events_stream, self.capture_stream) if s is not None]
        if len(set(ids)) != len(ids):
            raise RecorderConfigError(f"stream ids must differ, got {ids}")
        from logbuf.recording import schema  # pyarrow: imported when a recorder is configured, not by the CLI

        try:
            schema.check_session(self.default_session)
        except schema.RecordingFormatError as exc:
            raise RecorderConfigError(str(exc)) from None
        for name in ("rows_per_file", "row_group_rows", "stage_rows", "max_batches_per_cycle"):
            if int(getattr(self, name)) < 1:
                raise RecorderConfigError(f"{name} must be >= 1")
        if self.commit_interval_s <= 0:
            raise RecorderConfigError("commit_interval_s must be > 0")
        if self.connect_timeout_s <= 0:
            raise RecorderConfigError("connect_timeout_s must be > 0")


@dataclass
class RecorderStats:
    """A snapshot of a running (or finished) recorder: rows and files of this run, how far behind it is."""

    elapsed_s: float = 0.0
    messages: int = 0  # rows written this run, per dataset
    packets: int = 0
    gaps: int = 0
    files: int = 0  # complete files published this run
    bytes: int = 0
    commits: int = 0
    held_bytes: int = 0  # read but not yet released (largest over the streams)
    lag_bytes: int = 0  # published but not yet read (messages stream)
    pending_join: int = 0  # messages waiting for their DELIVERED rows
    duplicates: int = 0
    orphans: int = 0
    mismatches: int = 0  # DELIVERED entries whose sequence disagreed with the message's (then re-aligned)
    skipped_entries: int = 0  # DELIVERED entries of messages published before the recorder joined
    malformed: int = 0
    losses: int = 0
    last_sequence: int | None = None
    session: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.elapsed_s if self.elapsed_s > 0 else 0.0
