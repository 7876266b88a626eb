"""What the report may claim, decided on the driver without Spark: a feed that ended early is not loss, a host
that ran late is said to, empty windows are zero, and input/output may be any filesystem's URI."""

from __future__ import annotations

import pandas as pd
import pytest

from logbuf.pipeline.host import late_warnings
from logbuf.pipeline.job import Domain, ended_early
from logbuf.pipeline.storage import Location

MS = 1_000_000


def _domain(a: dict, b: dict, last: int = 1000) -> Domain:
    return Domain(first=1, last=last, start_ns=0, end_ns=10 * MS, feeds={"A": a, "B": b})


def test_a_feed_silent_after_its_last_packet_ended_early_one_that_announced_more_lost_its_tail():
    # A's last data packet carried up to 600 and nothing came after it: ended early (not on the air)
    assert ended_early(_domain({"last": 600, "control_last": None}, {"last": 1000, "control_last": 1000})) == {
        "A": 600}
    # a heartbeat said 800 had been sent: A was on the air, its tail was lost
    assert ended_early(_domain({"last": 600, "control_last": 800}, {"last": 1000, "control_last": None})) == {}
    # both reached the end
    assert ended_early(_domain({"last": 1000, "control_last": None}, {"last": 1000, "control_last": None})) == {}


def test_late_replay_or_handler_is_a_warning_that_delays_reflect_the_host():
    replay = {"max_late_ms": 11_109.0, "late_packets": 4_000}
    handler = {"wire_to_log_p99_ns": 900 * MS}
    quiet = [{"max_late_ms": 3.0, "late_packets": 2}, {"wire_to_log_p99_ns": 2 * MS}]
    warnings = late_warnings([replay, handler], 50 * MS)
    assert len(warnings) == 2
    assert "replay ran up to 11,109.0 ms late" in warnings[0] and "reflect the host" in warnings[0]
    assert "feed handler ran late" in warnings[1] and "reflect the host" in warnings[1]
    assert late_warnings(quiet, 50 * MS) == []


def test_empty_windows_are_rows_for_the_plots_to_draw_as_zero():
    from logbuf.pipeline.plots import dense_windows

    frame = pd.DataFrame({"window_start_ns": [0, 300], "messages_per_s": [10.0, 20.0]})
    dense = dense_windows(frame, 100, 0, 399)
    assert dense["window_start_ns"].tolist() == [0, 100, 200, 300]
    assert dense["messages_per_s"].fillna(0.0).tolist() == [10.0, 0.0, 0.0, 20.0]


@pytest.mark.parametrize("text", ["hdfs://namenode:8020/data/rec", "s3a://bucket/recordings/day1",
                                  "file:///tmp/rec", "/tmp/rec", "rec"])
def test_recording_and_output_accept_paths_and_filesystem_uris(text):
    loc = Location.parse(text)
    if "://" in text:
        assert loc.spark_uri == text  # Spark gets the URI as typed (Hadoop's FileSystem resolves it)
        assert loc.is_local == text.startswith("file://")
    else:
        assert loc.is_local and loc.spark_uri.startswith("/")


def test_a_file_uri_lists_the_same_files_as_the_path(tmp_path):
    (tmp_path / "d" / "x=1").mkdir(parents=True)
    (tmp_path / "d" / "x=1" / "a.parquet").write_bytes(b"")
    (tmp_path / "d" / "b.txt").write_bytes(b"")
    by_uri, by_path = Location.parse(tmp_path.as_uri()), Location.parse(str(tmp_path))
    assert by_uri.child("d").files(".parquet") == by_path.child("d").files(".parquet") == ["x=1/a.parquet"]
