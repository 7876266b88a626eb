"""The recording format: schemas, partitions, crash-safe rolling files, what readers may see."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logbuf.recording import schema
from logbuf.recording.reader import complete_files, read_dataset, read_marker
from logbuf.recording.schema import RecordingFormatError, hour_label, hour_start_ns
from logbuf.recording.writer import DatasetWriter, RecordingWriter

HOUR = schema.NANOS_PER_HOUR
T0 = 1_767_571_200_000_000_000  # 2026-01-05T00:00Z


def packets(arrivals, first=1):
    n = len(arrivals)
    return pa.Table.from_pydict({
        "feed": pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["A"])),
        "arrival_ns": pa.array(arrivals, pa.int64()),
        "sequence": pa.array(range(first, first + n), pa.int64()),
        "count": pa.array([1] * n, pa.int32()),
        "bytes": pa.array([56] * n, pa.int32()),
    }, schema=schema.PACKETS_SCHEMA)


def test_hour_labels_round_trip():
    assert hour_label(T0 + 14 * HOUR + 5) == "2026-01-05T14"
    assert hour_start_ns("2026-01-05T14") == T0 + 14 * HOUR
    with pytest.raises(RecordingFormatError):
        hour_start_ns("2026-01-05 14h")


def test_rows_are_split_by_hour_and_files_roll(tmp_path):
    writer = DatasetWriter(tmp_path, schema.PACKETS, rows_per_file=3, row_group_rows=2, writer_id="w1")
    writer.write("SYNTH0001", packets([T0 + 9 * HOUR + i for i in range(5)] + [T0 + 10 * HOUR]))
    writer.close()
    files = complete_files(tmp_path, schema.PACKETS)
    parts = sorted(str(f.relative_to(tmp_path)).rsplit("/", 1)[0] for f in files)
    assert parts == ["packets/session=SYNTH0001/hour=2026-01-05T09"] * 2 + ["packets/session=SYNTH0001/hour=2026-01-05T10"]
    assert sum(pq.read_metadata(f).num_rows for f in files) == 6
    table = read_dataset(tmp_path, schema.PACKETS)
    assert sorted(table.column("sequence").to_pylist()) == [1, 2, 3, 4, 5, 6]
    assert set(table.column("hour").to_pylist()) == {"2026-01-05T09", "2026-01-05T10"}


def test_a_file_being_written_is_invisible_until_complete(tmp_path):
    """A crash leaves a hidden .tmp file; readers never take it for data."""
    writer = DatasetWriter(tmp_path, schema.PACKETS, row_group_rows=1)
    writer.write("S1", packets([T0 + 1, T0 + 2]))  # row groups flushed into the open (.tmp) file
    temps = list(tmp_path.rglob("*" + schema.IN_PROGRESS_SUFFIX))
    assert len(temps) == 1 and temps[0].name.startswith(".")
    assert complete_files(tmp_path, schema.PACKETS) == []
    assert read_dataset(tmp_path, schema.PACKETS).num_rows == 0
    # ... the process dies here; a restarted writer appends new files, the old .tmp stays invisible
    again = DatasetWriter(tmp_path, schema.PACKETS)
    again.write("S1", packets([T0 + 3], first=3))
    again.close()
    assert read_dataset(tmp_path, schema.PACKETS).column("sequence").to_pylist() == [3]
    writer.close()
    assert sorted(read_dataset(tmp_path, schema.PACKETS).column("sequence").to_pylist()) == [1, 2, 3]


def test_columns_and_sessions_are_checked(tmp_path):
    writer = DatasetWriter(tmp_path, schema.PACKETS)
    with pytest.raises(RecordingFormatError, match="columns"):
        writer.write("S1", packets([T0]).drop_columns(["bytes"]))
    wrong = packets([T0]).set_column(1, "arrival_ns", pa.array([1.0]))
    with pytest.raises(RecordingFormatError, match="arrival_ns"):
        writer.write("S1", wrong)
    with pytest.raises(RecordingFormatError, match="session"):
        writer.write("a/b", packets([T0]))


def test_marker_guards_the_format_version(tmp_path):
    with RecordingWriter(tmp_path) as rec:
        rec.write(schema.PACKETS, "S1", packets([T0]))
    assert read_marker(tmp_path)["version"] == schema.FORMAT_VERSION
    (tmp_path / schema.MARKER_FILE).write_text(json.dumps({"format": schema.FORMAT_NAME, "version": 99}))
    with pytest.raises(RecordingFormatError, match="version"):
        read_marker(tmp_path)
    with pytest.raises(RecordingFormatError, match="version"):
        RecordingWriter(tmp_path)
    with pytest.raises(RecordingFormatError, match="not a logbuf recording"):
        read_marker(tmp_path / "packets")


def test_messages_columns_follow_the_itch_mapping():
    from logbuf.marketdata import itch
    from logbuf.pipeline.columns import feed_array, messages_table

    msgs = [itch.AddOrder(7, 0, 100, 42, b"B", 300, b"ABCD", 1_234_500),
            itch.OrderReplace(7, 0, 101, 42, 43, 200, 1_234_600),
            itch.OrderExecuted(7, 0, 102, 43, 100, 9),
            itch.SystemEvent(0, 0, 103, b"Q")]
    raw = [itch.encode(m) for m in msgs]
    buf = np.frombuffer(b"".join(raw), np.uint8)
    offsets = np.cumsum([0] + [len(r) for r in raw[:-1]])
    table = messages_table(buf, offsets, np.arange(1, 5), feed_array(np.zeros(4), ("A", "B", "R")),
                           np.arange(4) + T0).to_pylist()
    assert [r["type"] for r in table] == ["A", "U", "E", "S"]
    assert table[0] | {} == {**table[0], "order_ref": 42, "side": "B", "shares": 300, "stock": "ABCD",
                             "price": 1_234_500, "new_order_ref": None, "itch_ns": 100, "stock_locate": 7}
    assert (table[1]["order_ref"], table[1]["new_order_ref"], table[1]["shares"]) == (42, 43, 200)
    assert (table[2]["order_ref"], table[2]["shares"], table[2]["price"]) == (43, 100, None)
    assert table[3]["order_ref"] is None and table[3]["stock"] is None
