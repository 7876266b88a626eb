"""The two readers of `logbuf analyze` - pyarrow inside the Spark tasks (``arrow``, the default for a local
recording) and Spark's own Parquet reader (``spark``, any filesystem Spark reads) - give the same tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def by_spark(spark, scenario, tmp_path_factory):
    from logbuf.pipeline.job import analyze
    from logbuf.pipeline.options import AnalyzeConfig

    root, _ = scenario
    out = tmp_path_factory.mktemp("reader-spark")
    return analyze(spark, root, out, AnalyzeConfig(plots=False, reader="spark"), progress="off")


def test_the_shared_analysis_used_the_arrow_reader(analysis):
    assert analysis.summary["reader"] == "arrow"


def test_every_table_is_the_same_with_either_reader(analysis, by_spark):
    assert by_spark.summary["reader"] == "spark"
    assert set(analysis.tables) == set(by_spark.tables)
    for name, frame in by_spark.tables.items():
        pd.testing.assert_frame_equal(analysis.tables[name].reset_index(drop=True), frame.reset_index(drop=True),
                                      check_dtype=True, obj=name)


def test_the_summary_is_the_same_with_either_reader(analysis, by_spark):
    ignore = {"seconds", "stage_seconds", "reader"}
    arrow = {k: v for k, v in analysis.summary.items() if k not in ignore}
    spark = {k: v for k, v in by_spark.summary.items() if k not in ignore}
    assert arrow == spark
    assert analysis.delay_percentiles == by_spark.delay_percentiles


def test_bins_break_ties_by_sequence_and_merge_across_tasks():
    """A bin's first packet is the earliest arrival, then the lowest sequence, whichever task held it."""
    from logbuf.pipeline import direct

    def table(rows):
        feed, arrival, sequence, count = zip(*rows, strict=True)
        return pa.table({"feed": pa.array(feed).dictionary_encode(), "arrival_ns": np.array(arrival),
                         "sequence": np.array(sequence), "count": np.array(count, np.int32),
                         "bytes": np.full(len(rows), 100, np.int32)})

    # bin 0 (width 100): packets at arrival 10 (sequences 9 and 5) split across two tasks; a heartbeat
    first = direct.bins(table([("A", 10, 9, 2), ("A", 50, 20, 1), ("A", 60, 30, 0)]), 0, 100)
    second = direct.bins(table([("A", 10, 5, 3), ("B", 120, 7, 1)]), 0, 100)
    merged = direct.merge_bins(pa.concat_tables([first, second])).to_pylist()
    a, b = merged
    assert (a["feed"], a["bin"], a["min_arrival"], a["first_sequence"], a["min_first"]) == ("A", 0, 10, 5, 5)
    assert (a["max_arrival"], a["max_last"], a["packets"], a["messages"]) == (50, 20, 3, 6)
    assert (a["control_packets"], a["control_last"]) == (1, 29)
    assert (b["feed"], b["bin"], b["first_sequence"], b["control_packets"], b["control_last"]) == ("B", 1, 7, 0, None)
