"""The two-phase completion of files: sealed files stay hidden until a checkpoint names them; a restart
finishes the publish of the last commit and deletes every other in-progress file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import logbuf
from logbuf.recorder import Recorder, RecorderConfig
from logbuf.recorder.checkpoint import Checkpoint, CheckpointError
from logbuf.recorder.columns import IN_FLIGHT, TableBuilder, decode_columns, raw_bytes
from logbuf.recorder.epoch_writer import EpochWriter
from logbuf.recording import schema
from logbuf.recording.reader import complete_files, read_dataset

HOUR_NS = 1_767_600_000_000_000_000  # 2026-01-05T08


def message_rows(first: int, count: int) -> object:
    """``count`` Order Delete messages with sequences from ``first``, decoded."""
    rows = np.zeros(count, dtype=IN_FLIGHT)
    rows["sequence"] = np.arange(first, first + count)
    rows["arrival_ns"] = HOUR_NS + rows["sequence"]
    rows["feed"] = ord("A")
    rows["length"] = 19
    raw = raw_bytes(rows)
    raw[:, 0] = ord("D")
    raw[:, 11:19] = (rows["sequence"] * 10).astype(">u8").view(np.uint8).reshape(count, 8)
    return decode_columns(rows)


def test_sealed_files_are_invisible_until_published(tmp_path: Path) -> None:
    writer = EpochWriter(tmp_path, rows_per_file=300, row_group_rows=100)
    writer.write(schema.MESSAGES, "S", TableBuilder().messages(message_rows(1, 700)))
    assert complete_files(tmp_path, schema.MESSAGES) == []  # 2 full files sealed by the writer, still hidden
    sealed = writer.seal()
    assert [f.rows for f in sealed] == [300, 300, 100]
    assert all(f.temp.name.startswith(".") and f.temp.exists() and not f.final.exists() for f in sealed)
    assert complete_files(tmp_path, schema.MESSAGES) == []
    writer.publish(sealed)
    assert complete_files(tmp_path, schema.MESSAGES) == sorted(f.final for f in sealed)
    assert read_dataset(tmp_path, schema.MESSAGES).column("sequence").to_pylist() == list(range(1, 701))


def test_a_restart_rolls_the_last_commit_forward_and_deletes_half_written_files(tmp_path: Path) -> None:
    root = tmp_path / "rec"
    builder = TableBuilder()
    writer = EpochWriter(root, rows_per_file=1_000, row_group_rows=100)
    writer.write(schema.MESSAGES, "S", builder.messages(message_rows(1, 250)))
    sealed = writer.seal()
    checkpoint = Checkpoint(epoch=1, publish=[[writer.relative(f.temp), writer.relative(f.final)] for f in sealed])
    checkpoint.save(root)
    # ... the process dies here, before the publish; meanwhile another file was half written:
    writer.write(schema.MESSAGES, "S", builder.messages(message_rows(251, 150)))
    writer.writers[schema.MESSAGES]._flush(("S", schema.hour_label(HOUR_NS)))  # one row group on disk
    half = list(root.rglob("*" + schema.IN_PROGRESS_SUFFIX))
    assert len(half) == 2 and complete_files(root, schema.MESSAGES) == []
    with logbuf.MediaDriver.launch(tmp_path / "drv"), \
            Recorder(RecorderConfig(output=root, driver_directory=tmp_path / "drv")) as recorder:
        assert recorder.rolled_forward == 1
        assert [p.name for p in recorder.removed_stale] == [p.name for p in half if p != sealed[0].temp]
    assert complete_files(root, schema.MESSAGES) == [sealed[0].final]
    assert read_dataset(root, schema.MESSAGES).column("sequence").to_pylist() == list(range(1, 251))
    assert not list(root.rglob("*.tmp"))


def test_a_checkpoint_of_another_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "_recorder_checkpoint.json").write_text('{"format": "something-else", "version": 1}')
    with pytest.raises(CheckpointError, match="something-else"):
        Checkpoint.load(tmp_path)
    assert Checkpoint.load(tmp_path / "nowhere") is None
