"""The per-partition worker: dense per-message arrivals, gaps cut at bucket edges, log-linear delay bins."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.pipeline import arrivals
from logbuf.pipeline.arrivals import A, B, R, bin_bounds, bin_of, summarize
from logbuf.pipeline.job import merge_feed_gaps

W = 1024


def _pieces(rows):
    """rows: (feed, arrival, first, last) -> pieces cut at bucket edges, like the Spark stage."""
    out = {"bucket": [], "feed": [], "arrival_ns": [], "lo": [], "hi": []}
    for feed, arrival, first, last in rows:
        for bucket in range(first // W, last // W + 1):
            out["bucket"].append(bucket)
            out["feed"].append(feed)
            out["arrival_ns"].append(arrival)
            out["lo"].append(max(first, bucket * W))
            out["hi"].append(min(last, bucket * W + W - 1))
    return pa.table({k: pa.array(v, pa.int8() if k == "feed" else pa.int64()) for k, v in out.items()})


def _by_kind(batches, kind):
    table = pa.Table.from_batches([b for b in batches if b.column(0)[0].as_py() == kind],
                                  schema=arrivals.OUTPUT_SCHEMA)
    return {c: table.column(c).to_numpy() for c in ("feed", "a", "b", "c", "d", "e")}


def test_gaps_across_a_bucket_edge_are_merged_dated_and_filled():
    # A misses 1021..1030 (across the bucket edge at 1024), B 5 ms later misses 1500..1509; a re-request
    # answer brings 1021..1022 once more, after B
    rows = [(A, 1_000, 1, 1020), (A, 2_000, 1031, 2000),
            (B, 5_000_000, 1, 1499), (B, 5_001_000, 1510, 2000), (R, 9_000_000, 1021, 1022)]
    pieces = _pieces(rows)
    params = arrivals.Params(W, 1, 2000)
    # the two buckets land in different partitions, as they may in Spark
    first = summarize(pieces.filter(pa.compute.equal(pieces.column("bucket"), 0)), params)
    second = summarize(pieces.filter(pa.compute.equal(pieces.column("bucket"), 1)), params)
    both = first + second
    gaps = merge_feed_gaps(_by_kind(both, arrivals.GAP), _by_kind(both, arrivals.HEAD), 2000)
    assert [(g["feed"], g["first"], g["last"]) for g in gaps] == [("A", 1021, 1030), ("B", 1500, 1509)]
    gap_a, gap_b = gaps
    assert gap_a["detected_ns"] == 2_000  # A's packet after the hole
    assert gap_a["filled_ns"] == 5_000_000 and gap_a["unfilled"] == 0  # B had all of it, before R
    assert gap_b["detected_ns"] == 5_001_000 and gap_b["filled_ns"] == 2_000  # A's second packet
    delay = _by_kind(both, arrivals.DELAY)
    assert int(delay["a"].sum()) == 2000 - 10 - 10  # seen on both feeds


def test_duplicates_take_the_earliest_copy_and_are_counted():
    rows = [(A, 500, 1, 10), (A, 100, 5, 6), (B, 1_000, 1, 10)]
    out = summarize(_pieces(rows), arrivals.Params(W, 1, 10))
    stats = _by_kind(out, arrivals.STATS)
    a = stats["feed"] == A
    assert int(stats["a"][a][0]) == 12 and int(stats["b"][a][0]) == 10  # copies, distinct
    hist = _by_kind(out, arrivals.HIST)
    lows, _ = bin_bounds(hist["a"])
    values = dict(zip(lows.tolist(), hist["b"].tolist(), strict=True))
    assert values == {500: 8, 900: 2}  # two messages came first at t=100


def test_pieces_outside_their_bucket_are_rejected():
    bad = pa.table({"bucket": [0], "feed": pa.array([0], pa.int8()), "arrival_ns": [1], "lo": [W - 1], "hi": [W]})
    with pytest.raises(ValueError, match="inside its bucket"):
        summarize(bad, arrivals.Params(W, 1, 2 * W))


def test_missing_at_the_end_of_the_domain_has_no_detection():
    out = summarize(_pieces([(A, 1, 1, 5), (B, 2, 1, 10)]), arrivals.Params(W, 1, 10))
    gaps = merge_feed_gaps(_by_kind(out, arrivals.GAP), _by_kind(out, arrivals.HEAD), 10)
    assert [(g["first"], g["last"], g["detected_ns"]) for g in gaps] == [(6, 10, arrivals.NONE)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=50), st.integers(1, 16))
def test_bins_are_monotone_and_hold_their_values(values, bits):
    v = np.array(sorted(values), dtype=np.int64)
    b = bin_of(v, bits)
    lo, hi = bin_bounds(b, bits)
    assert (np.diff(b) >= 0).all()
    assert ((lo <= v) & (v <= hi)).all()
    big = np.abs(v) >= 2 ** (bits + 1)
    assert ((hi - lo + 1)[big] <= np.abs(v[big]) / 2 ** (bits - 1)).all()  # relative width bound


def test_twenty_ranges_lost_on_both_feeds_get_exact_recovery_times_from_the_per_message_pass():
    # 20 ranges of 3 sequences missing on A and on B over a span of 200,000 sequences; each answered by
    # re-request in two packets (the later one sets the recovery time), one only half answered, one never
    ranges = [(5_000 + 9_973 * i, 5_002 + 9_973 * i) for i in range(20)]
    rows, expected = [], []
    previous = 0
    for i, (first, last) in enumerate(ranges):
        rows += [(A, 10 * first, previous + 1, first - 1), (B, 10 * first + 5, previous + 1, first - 1)]
        previous = last
        if i == 7:  # never recovered
            expected.append({"first": first, "last": last, "latest_recovery_ns": arrivals.NONE,
                             "recovered_messages": 0})
            continue
        rows.append((R, 10 * first + 900, first, first))
        if i == 11:  # partly
            expected.append({"first": first, "last": last, "latest_recovery_ns": 10 * first + 900,
                             "recovered_messages": 1})
            continue
        rows.append((R, 10 * first + 700 + i, first + 1, last))
        expected.append({"first": first, "last": last, "latest_recovery_ns": 10 * first + 900,
                         "recovered_messages": 3})
    rows += [(A, 3_000_000, previous + 1, 200_000), (B, 3_000_005, previous + 1, 200_000)]
    params = arrivals.Params(W, 1, 200_000)
    out = _by_kind(summarize(_pieces(rows), params), arrivals.BOTH)
    assert arrivals.merge_lost_on_both(out) == expected


def test_a_range_lost_on_both_across_a_bucket_edge_is_one_range_and_the_tail_of_an_ended_feed_is_not():
    # 1020..1030 lost on both (across the edge at 1024), answered in two packets, one per bucket;
    # A ends after 1500 (live_end), B carries on to 2000: 1501..2000 missing on A only
    rows = [(A, 100, 1, 1019), (B, 105, 1, 1019), (A, 200, 1031, 1500), (B, 205, 1031, 2000),
            (R, 300, 1020, 1023), (R, 310, 1024, 1030)]
    params = arrivals.Params(W, 1, 2000, live_end=(1500, 2000))
    out = _by_kind(summarize(_pieces(rows), params), arrivals.BOTH)
    assert arrivals.merge_lost_on_both(out) == [{"first": 1020, "last": 1030, "latest_recovery_ns": 310,
                                                 "recovered_messages": 11}]
