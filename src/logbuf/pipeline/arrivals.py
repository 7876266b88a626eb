"""Per-message arrivals on each feed, computed one block of the sequence space at a time (numpy).

``logbuf analyze`` cuts every data packet's range ``[sequence, sequence + count)`` at multiples of the bucket
size W and hash-partitions the pieces by bucket (``sequence // W``), so a Spark partition holds *whole* buckets:
every copy of every message of a bucket, from every feed. :func:`summarize` then works on one partition with
dense arrays (W slots per bucket and feed), without any further shuffle::

    pieces (bucket, feed, arrival_ns, lo, hi) --expand--> arrival[feed][slot] = min over copies
                                                           copies[feed][slot]
    delay = arrival[B] - arrival[A]        -> log-linear histogram + count/sum/min/max   (HIST, DELAY)
    runs of slots missing on A (on B)      -> gap pieces: first, last, detection, fill     (GAP)
    runs missing on both A and B           -> pieces lost on both: recovery by re-request  (BOTH)
    arrival of the bucket's first slot     -> lets the driver date gaps ending at a bucket edge  (HEAD)
    per feed: copies, distinct, earliest   -> (STATS)
    delays, exactly: distinct value, count -> (EXACT): summed over partitions in Spark, they give the exact
                                              percentiles without a second pass over the messages
    fallback passes: delays in given ranges -> (VALUE), or sub-histograms (HIST with a range index), for
                                              exact percentiles when the distinct delays are too many to collect

Output rows share one schema ``(kind, feed, a, b, c, d, e)``; :data:`OUTPUT_SCHEMA` says what a..e hold per kind.

The delay histogram's bins are log-linear (like HdrHistogram): exact below 2^(P+1) ns, then 2^P bins per
power of two (relative width <= 2^-P), mirrored for negative delays; :func:`bin_of` and :func:`bin_bounds`
are exact integer maps, so a bin always holds exactly the values it claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from logbuf.pipeline.errors import PipelineConfigError
from logbuf.pipeline.quantiles import sub_bin_of

FEED_CODES = {"A": 0, "B": 1, "R": 2}
FEED_NAMES = ("A", "B", "R")
A, B, R = 0, 1, 2

HIST, DELAY, GAP, HEAD, STATS, VALUE, BOTH, EXACT = 1, 2, 3, 4, 5, 6, 7, 8
# rows of these kinds merge across partitions by summing b (their other columns are the key)
SUMMED_KINDS = (HIST, EXACT)
NONE = -1  # "no such time" in the integer columns

DEFAULT_PRECISION_BITS = 12

# kind -> meaning of (a, b, c, d, e); feed column: FEED_CODES or -1
OUTPUT_FIELDS = {
    HIST: ("bin", "messages", "refined range", "-", "-"),
    DELAY: ("messages", "sum_ns", "min_ns", "max_ns", "-"),
    GAP: ("first", "last", "detected_ns", "filled_ns", "unfilled"),
    HEAD: ("sequence", "arrival_ns", "-", "-", "-"),
    STATS: ("copies", "distinct", "earliest", "-", "-"),
    VALUE: ("delay_ns", "-", "-", "-", "-"),
    BOTH: ("first", "last", "recovered_ns", "recovered_messages", "-"),  # recovered_ns: latest R arrival
    EXACT: ("delay_ns", "messages", "-", "-", "-"),  # one row per distinct delay of the partition
}
OUTPUT_SCHEMA = pa.schema([
    ("kind", pa.int8()), ("feed", pa.int8()),
    ("a", pa.int64()), ("b", pa.int64()), ("c", pa.int64()), ("d", pa.int64()), ("e", pa.int64()),
])
INPUT_COLUMNS = ("bucket", "feed", "arrival_ns", "lo", "hi")
_NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Params:
    bucket_size: int
    domain_first: int  # sequences outside [domain_first, domain_last] are ignored
    domain_last: int
    precision_bits: int = DEFAULT_PRECISION_BITS
    select: tuple[tuple[int, int], ...] = ()  # non-empty: return only the delays within these inclusive ranges
    refine: tuple[tuple[int, int], ...] = ()  # non-empty: return only uniform sub-histograms of these ranges
    split: int = 4096  # sub-bins per refined range
    # last sequence each live feed (A, B) was on the air for; empty: domain_last. Past it a feed that ended
    # early carried nothing, which is not a loss on both feeds.
    live_end: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.bucket_size < 1 or self.domain_first > self.domain_last:
            raise PipelineConfigError("bucket_size must be >= 1 and domain_first <= domain_last")
        if not 1 <= self.precision_bits <= 20:
            raise PipelineConfigError("precision_bits must be within 1..20")


# ---- log-linear bins ------------------------------------------------------------------------------------


def _magnitude_bin(a: np.ndarray, p: int) -> np.ndarray:
    """Bin of non-negative values: identity below 2^(p+1), then 2^p bins per power of two."""
    a = a.astype(np.int64)
    top = np.zeros(a.shape, np.int64)
    big = a >= (1 << (p + 1))
    if big.any():
        # highest set bit, exactly (frexp is exact for integers below 2^53; larger ones are corrected below)
        _, exponent = np.frexp(a[big].astype(np.float64))
        high = exponent.astype(np.int64) - 1
        values = a[big]
        high = np.where((values >> high) == 0, high - 1, high)
        high = np.where((values >> high) > 1, high + 1, high)
        top[big] = high - p
    shift = top
    return np.where(big, (shift << p) + (a >> shift), a)


def bin_of(values: np.ndarray, precision_bits: int = DEFAULT_PRECISION_BITS) -> np.ndarray:
    """Monotone bin index of int64 values (negative values get negative bins)."""
    v = np.asarray(values, dtype=np.int64)
    mag = _magnitude_bin(np.abs(v), precision_bits)
    return np.where(v < 0, -mag - 1, mag)


def _magnitude_bounds(index: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    index = np.asarray(index, dtype=np.int64)
    shift = np.maximum((index >> p) - 1, 0)
    lo = np.where(index < (1 << (p + 1)), index, (index - (shift << p)) << shift)
    width = np.where(index < (1 << (p + 1)), 1, np.int64(1) << shift)
    return lo, lo + width - 1


def bin_bounds(index: np.ndarray, precision_bits: int = DEFAULT_PRECISION_BITS) -> tuple[np.ndarray, np.ndarray]:
    """Inclusive (low, high) values of bins from :func:`bin_of`."""
    index = np.asarray(index, dtype=np.int64)
    neg = index < 0
    mag = np.where(neg, -index - 1, index)
    lo, hi = _magnitude_bounds(mag, precision_bits)
    return np.where(neg, -hi, lo), np.where(neg, -lo, hi)


# ---- the partition worker -------------------------------------------------------------------------------


def _expand(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64)
    offsets = np.cumsum(counts) - counts
    return np.repeat(starts - offsets, counts) + np.arange(total, dtype=np.int64)


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    edges = np.diff(np.concatenate(([0], mask.view(np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1


def _rows(kind: int, feed: int | np.ndarray, *cols: np.ndarray | int) -> pa.RecordBatch:
    arrays = [np.asarray(c, dtype=np.int64) for c in cols]
    n = max((a.size for a in arrays if a.ndim), default=1)
    arrays = [np.broadcast_to(a, (n,)) for a in arrays] + [np.zeros(n, np.int64)] * (5 - len(arrays))
    return pa.RecordBatch.from_arrays(
        [pa.array(np.full(n, kind, np.int8)), pa.array(np.broadcast_to(np.asarray(feed, np.int8), (n,)))]
        + [pa.array(np.ascontiguousarray(a)) for a in arrays],
        schema=OUTPUT_SCHEMA,
    )


class _Block:
    """Dense per-slot arrays of the buckets in one partition."""

    def __init__(self, table: pa.Table, params: Params) -> None:
        w = params.bucket_size
        bucket = table.column("bucket").to_numpy()
        # a partition holds few buckets: a sort of them and a search beat np.unique's argsort of every piece
        self.buckets = np.unique(bucket)
        slot_of_bucket = np.searchsorted(self.buckets, bucket)
        self.size = self.buckets.size * w
        self.base = self.buckets * w  # sequence of each bucket's first slot
        feed = table.column("feed").to_numpy().astype(np.int64)
        arrival = table.column("arrival_ns").to_numpy()
        lo = table.column("lo").to_numpy()
        hi = table.column("hi").to_numpy()
        counts = hi - lo + 1
        if (counts < 1).any() or (lo // w != bucket).any() or (hi // w != bucket).any():
            raise PipelineConfigError("every piece must lie inside its bucket with lo <= hi")
        start_slot = slot_of_bucket.reshape(-1) * w + (lo - bucket * w)
        slots = _expand(start_slot, counts)
        feeds = np.repeat(feed, counts)
        times = np.repeat(arrival, counts)
        self.arrival = np.full((3, self.size), _NEVER, np.int64)
        self.copies = np.zeros((3, self.size), np.int64)
        for f in (A, B, R):
            sel = feeds == f
            if sel.any():
                np.minimum.at(self.arrival[f], slots[sel], times[sel])
                self.copies[f] = np.bincount(slots[sel], minlength=self.size)
        seq = np.repeat(self.base, w) + np.tile(np.arange(w, dtype=np.int64), self.buckets.size)
        self.sequence = seq
        self.in_domain = (seq >= params.domain_first) & (seq <= params.domain_last)

    def delays(self) -> np.ndarray:
        both = self.in_domain & (self.arrival[A] != _NEVER) & (self.arrival[B] != _NEVER)
        return self.arrival[B][both] - self.arrival[A][both]


def distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_counts=True)``; by counting instead of sorting when the values span a range
    not much wider than their number (delays of a few hundred microseconds in nanoseconds usually do)."""
    low, high = int(values.min()), int(values.max())
    if high - low < 4 * values.size + 1024:
        counts = np.bincount(values - low)
        present = np.flatnonzero(counts)
        return present + low, counts[present]
    return np.unique(values, return_counts=True)


def summarize(table: pa.Table, params: Params) -> list[pa.RecordBatch]:
    """The output rows (see module doc) of one partition's pieces."""
    if table.num_rows == 0:
        return []
    block = _Block(table, params)
    if params.refine:
        d = block.delays()
        refined: list[pa.RecordBatch] = []
        for index, (lo, hi) in enumerate(params.refine):
            inside = d[(d >= lo) & (d <= hi)]
            if inside.size:
                sub, counts = np.unique(sub_bin_of(inside, lo, hi, params.split), return_counts=True)
                refined.append(_rows(HIST, -1, sub, counts, index))
        return refined
    if params.select:
        d = block.delays()
        keep = np.zeros(d.size, bool)
        for lo, hi in params.select:
            keep |= (d >= lo) & (d <= hi)
        return [_rows(VALUE, -1, d[keep])] if keep.any() else []
    out: list[pa.RecordBatch] = []
    d = block.delays()
    if d.size:
        values, counts = distinct(d)
        out.append(_rows(EXACT, -1, values, counts))
        # the histogram from the distinct values (sorted, so their bins are sorted too)
        bins = bin_of(values, params.precision_bits)
        starts = np.flatnonzero(np.concatenate(([True], bins[1:] != bins[:-1])))
        out.append(_rows(HIST, -1, bins[starts], np.add.reduceat(counts, starts)))
        out.append(_rows(DELAY, -1, d.size, int(d.sum()), int(values[0]), int(values[-1])))
    w = params.bucket_size
    dom = block.in_domain
    earliest_ab = np.minimum(block.arrival[A], block.arrival[B])
    for f in (A, B, R):
        present = dom & (block.arrival[f] != _NEVER)
        earliest = int((present & (block.arrival[f] == earliest_ab)).sum()) if f != R else 0  # ties: both
        out.append(_rows(STATS, f, int(block.copies[f][dom].sum()), int(present.sum()), earliest))
        heads = block.arrival[f][::w]
        has_head = dom[::w] & (heads != _NEVER)
        if has_head.any():
            out.append(_rows(HEAD, f, block.base[has_head], heads[has_head]))
    slot = np.arange(block.size, dtype=np.int64)
    first_slot, last_slot = slot % w == 0, slot % w == w - 1
    for f in (A, B):
        missing = dom & (block.arrival[f] == _NEVER)
        if not missing.any():
            continue
        # runs of missing slots, cut at bucket edges (neighbouring buckets in the block need not be adjacent)
        before = np.concatenate(([False], missing[:-1]))
        after = np.concatenate((missing[1:], [False]))
        starts = np.flatnonzero(missing & (~before | first_slot))
        ends = np.flatnonzero(missing & (~after | last_slot))
        lengths = ends - starts + 1
        others = np.minimum(block.arrival[B - f], block.arrival[R])  # A <-> B, and re-request answers
        run_slots = _expand(starts, lengths)
        run_offsets = np.cumsum(lengths) - lengths
        unfilled = np.add.reduceat((others == _NEVER)[run_slots].astype(np.int64), run_offsets)
        fill = np.where(others == _NEVER, NONE, others)
        filled = np.maximum.reduceat(fill[run_slots], run_offsets)
        filled = np.where(unfilled == lengths, NONE, filled)
        nxt = ends + 1
        detected = np.full(starts.size, NONE, np.int64)
        inside = nxt % w != 0
        detected[inside] = block.arrival[f][nxt[inside]]
        detected = np.where(detected == _NEVER, NONE, detected)
        out.append(_rows(GAP, f, block.sequence[starts], block.sequence[ends], detected, filled, unfilled))
    out += _lost_on_both(block, params, first_slot, last_slot)
    return out


def _lost_on_both(block: _Block, params: Params, first_slot: np.ndarray, last_slot: np.ndarray) -> list[pa.RecordBatch]:
    """Runs missing on both live feeds (while both were on the air), cut at bucket edges, with their recovery
    by re-request: the latest R arrival in the run (NONE if none) and how many of its sequences R delivered.
    Computed here, next to every message's arrivals, so no per-gap table is ever built on the driver."""
    ends = params.live_end or (params.domain_last, params.domain_last)
    both = (block.in_domain & (block.arrival[A] == _NEVER) & (block.arrival[B] == _NEVER)
            & (block.sequence <= min(ends)))
    if not both.any():
        return []
    before = np.concatenate(([False], both[:-1]))
    after = np.concatenate((both[1:], [False]))
    starts = np.flatnonzero(both & (~before | first_slot))
    stops = np.flatnonzero(both & (~after | last_slot))
    lengths = stops - starts + 1
    run_slots = _expand(starts, lengths)
    offsets = np.cumsum(lengths) - lengths
    r = block.arrival[R][run_slots]
    got = r != _NEVER
    recovered = np.add.reduceat(got.astype(np.int64), offsets)
    latest = np.maximum.reduceat(np.where(got, r, NONE), offsets)
    return [_rows(BOTH, -1, block.sequence[starts], block.sequence[stops], latest, recovered)]


def merge_lost_on_both(rows: dict[str, np.ndarray]) -> list[dict]:
    """BOTH pieces (cut at bucket edges) -> whole ranges lost on both feeds: first, last, recovered_messages,
    latest_recovery_ns (the latest re-request arrival inside the range; NONE when none arrived)."""
    order = np.argsort(rows["a"], kind="stable")
    merged: list[dict] = []
    for i in order.tolist():
        first, last = int(rows["a"][i]), int(rows["b"][i])
        latest, recovered = int(rows["c"][i]), int(rows["d"][i])
        if merged and merged[-1]["last"] + 1 == first:
            g = merged[-1]
            g["last"] = last
            g["latest_recovery_ns"] = max(g["latest_recovery_ns"], latest)
            g["recovered_messages"] += recovered
        else:
            merged.append({"first": first, "last": last, "latest_recovery_ns": latest,
                           "recovered_messages": recovered})
    return merged


ROW_KEY = "k"
ROW_KEY_SCHEMA = OUTPUT_SCHEMA.append(pa.field(ROW_KEY, pa.int64()))


def keyed(batches: Iterable[pa.RecordBatch], partition: int) -> Iterator[pa.RecordBatch]:
    """``batches`` with a merge key column: 0 for rows of :data:`SUMMED_KINDS` (rows alike but for ``b`` merge,
    ``b`` summed), a key unique across partitions for every other row (such rows never merge)."""
    row = 0
    for batch in batches:
        kind = batch.column(0).to_numpy()
        n = batch.num_rows
        unique = (np.int64(partition + 1) << 32) + row + np.arange(n, dtype=np.int64)
        key = np.where(np.isin(kind, SUMMED_KINDS), 0, unique)
        row += n
        yield pa.RecordBatch.from_arrays([*batch.columns, pa.array(key)], schema=ROW_KEY_SCHEMA)


def map_partition(batches: Iterable[pa.RecordBatch], params: Params) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: a partition's pieces, all at once (a partition holds whole buckets); the rows carry
    the merge key of :func:`keyed`."""
    from pyspark import TaskContext

    batches = list(batches)
    if not batches:
        return
    table = pa.Table.from_batches(batches).select(list(INPUT_COLUMNS))
    del batches
    context = TaskContext.get()
    yield from keyed(summarize(table, params), context.partitionId() if context is not None else 0)
