"""Exact percentiles of a distributed integer column, by histogram refinement (driver-side logic, pure).

Definition: the **nearest-rank** percentile - for fraction q of N values, the value of rank
``k = max(1, ceil(q * N))`` in ascending order (numpy's ``method="inverted_cdf"``). It is always an observed
value, which is what a latency percentile should be. ``q`` is taken as an exact decimal (``0.999`` means
999/1000), so the rank does not depend on float rounding.

Procedure (each step is one pass over the data, done by the caller's callbacks):

1. a histogram of the values in bins of known bounds (the caller's first pass);
2. for every wanted rank, the bin holding it and the rank inside that bin;
3. bins holding at most ``max_collect`` values: fetch their values and select - exact;
   larger bins: split into ``split`` uniform sub-bins (one more histogram pass over those bins) and repeat.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from logbuf.pipeline.errors import PipelineConfigError, PipelineError

Range = tuple[int, int]  # inclusive bounds
FetchValues = Callable[[list[Range]], np.ndarray]  # all values inside any of the ranges
FetchHistogram = Callable[[list[Range], int], list[np.ndarray]]  # per range: counts of `split` uniform sub-bins

DEFAULT_MAX_COLLECT = 2_000_000
DEFAULT_SPLIT = 4096


def rank_of(q: float, n: int) -> int:
    """1-based nearest rank of fraction ``q`` in ``n`` values."""
    if not 0.0 <= q <= 1.0:
        raise PipelineConfigError(f"quantile {q} must be within [0, 1]")
    if n <= 0:
        raise PipelineConfigError("no values")
    exact = Fraction(str(q)) if isinstance(q, float) else Fraction(q)
    return max(1, min(n, math.ceil(exact * n)))


def _sub_bounds(lo: int, hi: int, split: int) -> tuple[np.ndarray, np.ndarray]:
    """Inclusive bounds of ``split`` near-equal integer sub-bins of [lo, hi] (fewer if the range is small)."""
    span = hi - lo + 1
    parts = min(split, span)
    edges = lo + (np.arange(parts + 1, dtype=object) * span) // parts  # python ints: no overflow
    return np.array(edges[:-1], dtype=np.int64), np.array(edges[1:] - 1, dtype=np.int64)


def sub_bin_of(values: np.ndarray, lo: int, hi: int, split: int) -> np.ndarray:
    """Index of each value's sub-bin in :func:`_sub_bounds` (values must lie in [lo, hi])."""
    starts, _ = _sub_bounds(lo, hi, split)
    return np.searchsorted(starts, np.asarray(values, dtype=np.int64), side="right") - 1


def quantiles_of_counts(qs: Sequence[float], values: np.ndarray, counts: np.ndarray) -> dict[float, int]:
    """Nearest-rank quantiles of a distribution given as distinct values and their counts (any order)."""
    values = np.asarray(values, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(counts[order])
    total = int(cumulative[-1]) if cumulative.size else 0
    if total == 0:
        return {}
    return {q: int(values[int(np.searchsorted(cumulative, rank_of(q, total), side="left"))]) for q in qs}


def exact_quantiles(qs: Sequence[float], lows: np.ndarray, highs: np.ndarray, counts: np.ndarray,
                    fetch_values: FetchValues, fetch_histogram: FetchHistogram, *,
                    max_collect: int = DEFAULT_MAX_COLLECT, split: int = DEFAULT_SPLIT) -> dict[float, int]:
    """Nearest-rank quantiles from a histogram (bins sorted, disjoint, inclusive bounds) plus refinement."""
    lows = np.asarray(lows, dtype=np.int64)
    highs = np.asarray(highs, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    order = np.argsort(lows)
    lows, highs, counts = lows[order], highs[order], counts[order]
    total = int(counts.sum())
    if total == 0:
        return {}
    if max_collect < 1 or split < 2:
        raise PipelineConfigError("max_collect must be >= 1 and split >= 2")
    # pending: quantile -> (bin bounds, rank within that bin)
    pending: dict[float, tuple[Range, int]] = {}
    cumulative = np.cumsum(counts)
    for q in qs:
        k = rank_of(q, total)
        i = int(np.searchsorted(cumulative, k, side="left"))
        before = int(cumulative[i - 1]) if i else 0
        pending[q] = ((int(lows[i]), int(highs[i])), k - before)
    sizes = {(int(lo), int(hi)): int(c) for lo, hi, c in zip(lows, highs, counts, strict=True)}
    result: dict[float, int] = {}
    while pending:
        small = sorted({r for r, _ in pending.values() if sizes[r] <= max_collect or r[0] == r[1]})
        large = sorted({r for r, _ in pending.values() if r not in small})
        if small:
            values = np.sort(fetch_values(small))
            for q, (r, k) in list(pending.items()):
                if r in small:
                    if r[0] == r[1]:
                        result[q] = r[0]
                    else:
                        inside = values[(values >= r[0]) & (values <= r[1])]
                        if inside.size != sizes[r]:
                            raise PipelineError(f"bin {r}: histogram said {sizes[r]} values, the data has "
                                               f"{inside.size} (the data changed between passes?)")
                        result[q] = int(inside[k - 1])
                    del pending[q]
        if large:
            histograms = fetch_histogram(large, split)
            for r, sub_counts in zip(large, histograms, strict=True):
                starts, ends = _sub_bounds(r[0], r[1], split)
                sub_counts = np.asarray(sub_counts, dtype=np.int64)
                if int(sub_counts.sum()) != sizes[r]:
                    raise PipelineError(f"bin {r}: refinement found {int(sub_counts.sum())} values, expected "
                                       f"{sizes[r]}")
                cum = np.cumsum(sub_counts)
                for q, (rq, k) in list(pending.items()):
                    if rq != r:
                        continue
                    j = int(np.searchsorted(cum, k, side="left"))
                    before = int(cum[j - 1]) if j else 0
                    sub = (int(starts[j]), int(ends[j]))
                    sizes[sub] = int(sub_counts[j])
                    pending[q] = (sub, k - before)
    return result
