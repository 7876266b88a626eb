"""`logbuf analyze` on a scenario with known faults: the analytics must recover exactly what was injected."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from logbuf.recording import schema
from logbuf.recording.reader import read_dataset
from logbuf.units import NANOS_PER_MILLI

pytestmark = pytest.mark.spark


def _first_arrivals(packets, feed: str) -> dict[int, int]:
    """sequence -> earliest arrival on one feed, straight from the packets dataset (independent of Spark)."""
    sel = (packets["feed"] == feed) & (packets["count"] >= 1) & (packets["count"] <= schema.MAX_DATA_COUNT)
    first, count, arrival = (packets[c][sel].to_numpy() for c in ("sequence", "count", "arrival_ns"))
    seqs = np.repeat(first, count) + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    times = np.repeat(arrival, count)
    order = np.lexsort((times, seqs))
    seqs, times = seqs[order], times[order]
    keep = np.concatenate(([True], seqs[1:] != seqs[:-1]))
    return dict(zip(seqs[keep].tolist(), times[keep].tolist(), strict=True))


@pytest.fixture(scope="module")
def packets(scenario):
    root, _ = scenario
    return read_dataset(root, schema.PACKETS).to_pandas()


@pytest.fixture(scope="module")
def numpy_delays(packets) -> np.ndarray:
    a, b = _first_arrivals(packets, "A"), _first_arrivals(packets, "B")
    both = sorted(set(a) & set(b))
    return np.array([b[s] - a[s] for s in both], dtype=np.int64)


def test_gap_ranges_per_feed_are_exact(analysis, scenario):
    _, truth = scenario
    gaps = analysis.tables["gaps_feed"]
    for feed in ("A", "B"):
        found = [(int(f), int(l_)) for f, l_ in gaps[gaps["feed"] == feed][["first", "last"]].to_numpy()]
        assert found == [tuple(r) for r in truth.feed_gaps[feed]], feed
        assert analysis.summary["feeds"][feed]["missing"] == sum(l_ - f + 1 for f, l_ in truth.feed_gaps[feed])


def test_gaps_on_both_feeds_recovery_and_unrecovered(analysis, scenario):
    _, truth = scenario
    both = analysis.tables["gaps_both"]
    assert [(int(r.first), int(r.last)) for r in both.itertuples()] == [(g.first, g.last) for g in truth.both_gaps]
    for row, expected in zip(both.itertuples(), truth.both_gaps, strict=True):
        assert row.detected_ns == expected.detected_ns
        if expected.recovered_ns is None:
            assert row.status == "unrecovered" and row.recovered_messages == 0
        else:
            assert row.status == "recovered" and row.recovered_messages == row.size
            assert row.recovered_ns == expected.recovered_ns
            assert row.time_to_recover_ns == expected.recovered_ns - expected.detected_ns
        assert row.handler_event
    assert analysis.tables["handler_gaps_unmatched"].empty


def test_feed_gaps_are_dated_and_filled_by_the_other_feed(analysis):
    gaps = analysis.tables["gaps_feed"]
    only_one_feed = gaps[~gaps["on_both"]]
    assert len(only_one_feed) > 10
    assert only_one_feed["unfilled"].eq(0).all()  # every single-feed loss was delivered by the other feed
    assert only_one_feed["filled_ns"].notna().all() and only_one_feed["detected_ns"].notna().all()


def test_freeze_window_and_catch_up_burst(analysis, scenario):
    _, truth = scenario
    (expected,) = truth.freezes
    freezes = analysis.tables["freezes"]
    assert len(freezes) == 1, freezes
    f = freezes.iloc[0]
    assert f["feed"] == expected.feed
    assert abs(f["silence_start_ns"] - expected.silence_start_ns) <= 1 * NANOS_PER_MILLI
    assert abs(f["resume_ns"] - expected.resume_ns) <= 1 * NANOS_PER_MILLI
    assert abs(f["catch_up_end_ns"] - expected.catch_up_end_ns) <= 2 * NANOS_PER_MILLI
    assert f["held_first"] == expected.held_first
    assert f["held_last"] >= expected.held_last - 1
    assert f["burst_messages_per_packet"] > 5 * f["baseline_messages_per_packet"]
    assert f["other_new_messages"] > 0 and f["stale_messages"] > 0


def test_median_delay_is_b_configured_delay(analysis, scenario):
    _, truth = scenario
    median = analysis.delay_percentiles[0.5]
    configured = truth.config["b_delay_ns"]
    assert abs(median - configured) <= truth.config["jitter_ns"] // 2 + 50_000


def test_percentiles_are_exact_against_numpy(analysis, numpy_delays):
    assert analysis.delay_stats["messages_on_both"] == numpy_delays.size
    assert analysis.delay_stats["min_ns"] == numpy_delays.min()
    assert analysis.delay_stats["max_ns"] == numpy_delays.max()
    for q, value in analysis.delay_percentiles.items():
        assert value == int(np.percentile(numpy_delays, q * 100, method="inverted_cdf")), q


def test_message_type_counts_are_exact(analysis, scenario):
    root, truth = scenario
    types = analysis.tables["message_types"]
    assert dict(zip(types["type"], types["messages"].astype(int), strict=True)) == truth.type_counts
    direct = read_dataset(root, schema.MESSAGES, ["type"]).column("type").to_pandas().value_counts()
    assert {str(k): int(v) for k, v in direct.items()} == truth.type_counts


def test_win_share_and_feed_counts(analysis, scenario, packets):
    _, truth = scenario
    assert analysis.summary["wins"] == truth.wins
    wins = analysis.tables["wins"]
    assert int(wins[["wins_A", "wins_B", "wins_R"]].to_numpy().sum()) == truth.delivered
    shares = wins[["share_A", "share_B", "share_R"]].to_numpy().sum(axis=1)
    assert np.allclose(shares, 1.0)
    rates = analysis.tables["rates"]
    for feed in ("A", "B"):
        data = packets[(packets["feed"] == feed) & packets["count"].between(1, schema.MAX_DATA_COUNT)]
        assert int(rates[rates["feed"] == feed]["messages"].sum()) == int(data["count"].sum())
        assert int(rates[rates["feed"] == feed]["packets"].sum()) == len(data)
        assert analysis.summary["feeds"][feed]["duplicates"] == 0


def test_most_active_symbols(analysis, scenario):
    root, _ = scenario
    messages = read_dataset(root, schema.MESSAGES, ["stock_locate"]).column("stock_locate").to_numpy()
    counts = np.bincount(messages)
    symbols = analysis.tables["symbols"]
    top = np.argsort(-counts, kind="stable")[: len(symbols)]
    assert symbols["stock_locate"].tolist() == top.tolist()
    assert symbols["messages"].tolist() == counts[top].tolist()
    assert symbols["stock"].notna().all()


def test_report_plots_and_tables_are_written(analysis):
    import matplotlib.image as mpimg

    out = analysis.out
    report = (out / "report.md").read_text()
    assert analysis.plots, "no plots were drawn"
    for name, path in analysis.plots.items():
        assert f"plots/{path.name}" in report, name
        raw = path.read_bytes()
        assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 10_000, name
        image = mpimg.imread(path)
        assert image.shape[0] >= 300 and image.shape[1] >= 500, name
        assert float(image[..., :3].std()) > 0.02, f"{name} looks blank"
    assert {"freeze_1", "sequence_vs_time", "delay_histogram", "rate_timeline"} <= set(analysis.plots)
    for name, frame in analysis.tables.items():
        assert (out / "tables" / f"{name}.parquet").is_file() and (out / "tables" / f"{name}.csv").is_file()
        import pyarrow.parquet as pq

        assert pq.read_table(out / "tables" / f"{name}.parquet").num_rows == len(frame), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["freezes"] == 1 and summary["gaps_both"] == 2 and summary["gaps_both_unrecovered"] == 1


def test_the_report_opens_with_a_headline_and_shows_ms_without_inf_or_padded_floats(analysis, scenario):
    _, truth = scenario
    report = (analysis.out / "report.md").read_text()
    head = report.split("## Findings")[0]
    delivered = analysis.summary["messages_delivered"]
    assert f"**{delivered:,} of {analysis.summary['sequences']:,} messages delivered" in head
    recovered = analysis.summary["wins"]["R"]
    assert f"{recovered:,} of them recovered by re-request" in head and recovered > 0
    assert "- Feed A missed" in head and "- Feed B missed" in head
    assert "(1 recovered, 0 partly recovered, 1 unrecovered)" in head  # the scenario's two gaps on both feeds
    assert "gaps_timeline" in analysis.plots and "plots/gaps_timeline.png" in report
    numbers = re.sub(r"\d\d:\d\d:\d\d\.\d{3}", "", report)  # times of day keep their milliseconds
    assert not re.search(r"\.000\b", numbers) and not re.search(r"\binf\b", numbers), "padded float or inf"
    assert "_ns |" not in report  # durations in ms, times as UTC time of day
    assert report.count("\nColumns: ") >= 5  # every table's columns explained


def test_the_time_windows_are_sized_from_the_first_arrival(analysis):
    from logbuf.pipeline.freezes import FreezeParams
    from logbuf.pipeline.job import choose_window

    s = analysis.summary
    assert s["window_ns"] == choose_window(s["end_ns"] - s["start_ns"], FreezeParams().bin_ns)
    assert choose_window(61 * 1_000_000_000, 12_500_000) == 100 * NANOS_PER_MILLI  # a 61 s recording


def test_win_share_includes_recovery_by_re_request(analysis):
    wins = analysis.tables["wins"]
    assert {"share_A", "share_B", "share_R"} <= set(wins.columns)
    assert int(wins["wins_R"].sum()) == analysis.summary["wins"]["R"] > 0
    shares = wins[["share_A", "share_B", "share_R"]].sum(axis=1)
    assert np.allclose(shares, 1.0)


def test_core_numbers_equal_an_independent_numpy_computation_over_the_same_parquet(analysis, scenario, packets,
                                                                                     numpy_delays):
    """Delay p50/p99, gaps and missing per feed, messages per feed per window, type mix: numpy over the files."""
    root, _ = scenario
    for q in (0.5, 0.99):
        rank = max(1, int(np.ceil(q * numpy_delays.size)))
        assert analysis.delay_percentiles[q] == np.sort(numpy_delays)[rank - 1], q
    data = packets[packets["count"].between(1, schema.MAX_DATA_COUNT) & packets["feed"].isin(["A", "B"])]
    control = packets[~packets["count"].between(1, schema.MAX_DATA_COUNT)]
    first = int(data["sequence"].min())
    last = int(max((data["sequence"] + data["count"] - 1).max(), (control["sequence"] - 1).max()))
    for feed in ("A", "B"):
        seen = np.zeros(last - first + 1, bool)
        seen[np.fromiter(_first_arrivals(packets, feed), np.int64) - first] = True
        missing = ~seen
        runs = int(np.count_nonzero(np.diff(np.concatenate(([0], missing.view(np.int8)))) == 1))
        assert analysis.summary["feeds"][feed]["missing"] == int(missing.sum()), feed
        assert analysis.summary["feeds"][feed]["gaps"] == runs, feed
    window = analysis.summary["window_ns"]
    rates = analysis.tables["rates"]
    for feed in ("A", "B"):
        mine = data[data["feed"] == feed]
        expected = mine.groupby(mine["arrival_ns"] // window * window)["count"].sum()
        got = rates[rates["feed"] == feed].set_index("window_start_ns")["messages"]
        assert got.astype("int64").to_dict() == expected.astype("int64").to_dict(), feed
    types = read_dataset(root, schema.MESSAGES, ["type"]).column("type").to_numpy(zero_copy_only=False)
    values, counts = np.unique(types.astype(str), return_counts=True)
    table = analysis.tables["message_types"]
    assert dict(zip(table["type"], table["messages"].astype(int), strict=True)) == dict(
        zip(values.tolist(), counts.tolist(), strict=True))
