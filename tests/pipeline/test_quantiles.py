"""Exact nearest-rank percentiles by histogram refinement, against numpy on the same data."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from logbuf.pipeline import arrivals
from logbuf.pipeline.errors import PipelineError
from logbuf.pipeline.quantiles import exact_quantiles, rank_of

QS = (0.0, 0.001, 0.01, 0.07, 0.25, 0.5, 0.57, 0.9, 0.99, 0.999, 1.0)
FLOAT_NOISE = {0.07, 0.57}


def _numpy_backend(values: np.ndarray, bits: int = 6):
    """Histogram + callbacks answering from an in-memory array (counts how often each is called)."""
    calls = {"values": 0, "histogram": 0}
    bins = arrivals.bin_of(values, bits)
    uniq, counts = np.unique(bins, return_counts=True)
    lows, highs = arrivals.bin_bounds(uniq, bits)

    def fetch_values(ranges):
        calls["values"] += 1
        keep = np.zeros(values.size, bool)
        for lo, hi in ranges:
            keep |= (values >= lo) & (values <= hi)
        return values[keep]

    def fetch_histogram(ranges, split):
        from logbuf.pipeline.quantiles import sub_bin_of

        calls["histogram"] += 1
        out = []
        for lo, hi in ranges:
            inside = values[(values >= lo) & (values <= hi)]
            out.append(np.bincount(sub_bin_of(inside, lo, hi, split), minlength=split))
        return out

    return lows, highs, counts, fetch_values, fetch_histogram, calls


@pytest.mark.parametrize("max_collect", [10**9, 50])
def test_matches_numpy_inverted_cdf(max_collect):
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.normal(5e6, 2e5, 20_000).astype(np.int64),  # a delay-like bulk
                             rng.integers(-150_000_000, 0, 300),  # freeze outliers
                             np.full(500, 4_999_999)])  # heavy ties
    lows, highs, counts, fv, fh, calls = _numpy_backend(values)
    result = exact_quantiles(QS, lows, highs, counts, fv, fh, max_collect=max_collect, split=64)
    ordered = np.sort(values)
    for q in QS:
        assert result[q] == ordered[rank_of(q, values.size) - 1], q
        if q not in FLOAT_NOISE:  # numpy multiplies q * n in floats; 0.07 * 20800 lands just above 1456
            assert result[q] == int(np.percentile(values, q * 100, method="inverted_cdf")), q
    if max_collect == 50:
        assert calls["histogram"] >= 1  # the big bins had to be refined


def test_rank_is_decimal_exact():
    assert rank_of(0.07, 100) == 7  # 0.07 * 100 is 7.000000000000001 in floats
    assert rank_of(0.0, 10) == 1 and rank_of(1.0, 10) == 10 and rank_of(0.5, 3) == 2
    with pytest.raises(ValueError):
        rank_of(1.5, 10)


def test_data_changing_between_passes_is_an_error():
    values = np.arange(1000, dtype=np.int64)
    lows, highs, counts, fv, fh, _ = _numpy_backend(values)
    with pytest.raises(PipelineError, match="changed"):
        exact_quantiles([0.5], lows, highs, counts, lambda r: fv(r)[:-1], fh)


def test_spark_worker_refine_and_select_modes_agree_with_numpy():
    """The partition worker's pass-2 modes (select / refine) plugged into the same procedure."""
    rng = np.random.default_rng(5)
    n = 5_000
    delay = rng.integers(3_000_000, 3_000_400, n)  # narrow: big bins at low precision
    pieces = pa.table({
        "bucket": np.zeros(2 * n, np.int64),
        "feed": np.r_[np.zeros(n), np.ones(n)].astype(np.int8),
        "arrival_ns": np.r_[np.arange(n) * 1000, np.arange(n) * 1000 + delay].astype(np.int64),
        "lo": np.r_[np.arange(1, n + 1), np.arange(1, n + 1)].astype(np.int64),
        "hi": np.r_[np.arange(1, n + 1), np.arange(1, n + 1)].astype(np.int64),
    })
    base = dict(bucket_size=1 << 16, domain_first=1, domain_last=n, precision_bits=4)
    rows = arrivals.summarize(pieces, arrivals.Params(**base))
    hist = pa.Table.from_batches([r for r in rows if r.column(0)[0].as_py() == arrivals.HIST])
    lows, highs = arrivals.bin_bounds(hist.column("a").to_numpy(), 4)

    def fetch_values(ranges):
        out = arrivals.summarize(pieces, arrivals.Params(**base, select=tuple(ranges)))
        return np.concatenate([b.column("a").to_numpy() for b in out])

    def fetch_histogram(ranges, split):
        out = arrivals.summarize(pieces, arrivals.Params(**base, refine=tuple(ranges), split=split))
        table = pa.Table.from_batches(out)
        result = []
        for i in range(len(ranges)):
            sel = table.column("c").to_numpy() == i
            counts = np.zeros(split, np.int64)
            np.add.at(counts, table.column("a").to_numpy()[sel], table.column("b").to_numpy()[sel])
            result.append(counts)
        return result

    result = exact_quantiles(QS, lows, highs, hist.column("b").to_numpy(), fetch_values, fetch_histogram,
                             max_collect=100, split=16)
    ordered = np.sort(delay)
    for q in QS:
        assert result[q] == ordered[rank_of(q, n) - 1], q


def test_quantiles_of_distinct_values_and_counts_match_numpy():
    from logbuf.pipeline.quantiles import quantiles_of_counts

    rng = np.random.default_rng(5)
    values = rng.integers(-50, 200, 5_000)
    uniq, counts = np.unique(values, return_counts=True)
    shuffled = rng.permutation(uniq.size)  # any order
    got = quantiles_of_counts(QS, uniq[shuffled], counts[shuffled])
    for q in QS:
        if q not in FLOAT_NOISE:
            assert got[q] == int(np.quantile(values, q, method="inverted_cdf")), q
        assert got[q] == int(np.sort(values)[rank_of(q, values.size) - 1]), q


@pytest.mark.spark
@pytest.mark.parametrize("max_collect", [10**9, 40])
def test_spark_refinement_over_distinct_delays_matches_numpy(spark, max_collect):
    """The fallback when the distinct delays are too many to collect: bins refined in Spark (decimal sub-bin
    arithmetic, values far apart so no product fits a long) give the same ranks as numpy."""
    from logbuf.pipeline.job import refined_quantiles

    rng = np.random.default_rng(9)
    values = np.concatenate([rng.integers(-3_000, 90_000, 4_000), rng.integers(2**61, 2**61 + 5_000, 300),
                             [-(2**62), 2**62]])
    uniq, counts = np.unique(values, return_counts=True)
    exact = spark.createDataFrame(pa.table({"value": uniq, "messages": counts}).to_pandas())
    bits = 3  # wide bins: the refinement has to run
    bins, bin_counts = np.unique(arrivals.bin_of(values, bits), return_counts=True)
    lows, highs = arrivals.bin_bounds(bins, bits)
    got = refined_quantiles(exact, QS, lows, highs, bin_counts, max_collect=max_collect, split=16)
    ordered = np.sort(values)
    assert got == {q: int(ordered[rank_of(q, values.size) - 1]) for q in QS}
