"""The recording's Parquet row groups read straight into numpy inside Spark tasks (pyarrow), no JVM scan.

For a recording every worker can open through ``pyarrow.fs`` (a local or shared path; ``--reader auto`` picks
this reader for local paths), the three large products are computed in Spark tasks that each read their own
row groups - Spark schedules the tasks and merges what they return, but no packet or message ever becomes a
JVM row::

    bins      per (feed, arrival bin) the aggregates of :func:`freezes.feed_bins`: partial per task (a few row
              groups), merged on the driver (:func:`merge_bins`)
    pieces    the per-message pass's input: a task owns a contiguous range of buckets and reads only the row
              groups whose ``sequence`` statistics overlap it (and reach it: a packet covers at most
              MAX_DATA_COUNT sequences), then cuts the packets at bucket edges (:func:`pieces`)
    messages  the type mix, per-symbol counts and delivered copies per (window, feed), partial per task
              (:func:`message_counts`), merged on the driver (:func:`merge_message_counts`)
    near      the data packets inside given arrival windows (the freeze search), from the row groups whose
              ``arrival_ns`` statistics overlap them

The JVM's row-by-row work - the Parquet scan into rows, the explode and shuffle of the packet ranges, the rows
turned into Arrow again for the Python workers, the grouping sets over every message - was most of the job's
time; here each row group is decoded once, by Arrow, into the arrays numpy works on. The results are the
same as the Spark reader's (``--reader spark``): a test compares every table.

Integer semantics follow Spark SQL's: ``div`` and ``%`` truncate toward zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logbuf.pipeline.storage import Location
from logbuf.recording import schema

_MIN = np.iinfo(np.int64).min
_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class RowGroup:
    """One row group of one complete file; ``low``/``high``: the planning column's statistics (None: none
    recorded, so every task that plans by it reads this row group)."""

    path: str  # inside the recording's filesystem
    index: int
    rows: int
    low: int | None = None
    high: int | None = None

    def overlaps(self, low: int, high: int) -> bool:
        return self.low is None or self.high is None or (self.high >= low and self.low <= high)


def row_groups(loc: Location, dataset: str, session: str, column: str | None = None) -> list[RowGroup]:
    """Every row group of ``session``'s complete files of ``dataset``, with ``column``'s min/max statistics."""
    import pyarrow.parquet as pq

    from logbuf.pipeline.sources import complete_files

    base = loc.child(dataset)
    prefix = f"{schema.SESSION_COLUMN}={session}/"
    out = []
    for rel in complete_files(loc, dataset):
        if not rel.startswith(prefix):
            continue
        path = f"{base.path}/{rel}"
        with base.fs.open_input_file(path) as f:
            meta = pq.read_metadata(f)
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        col = names.index(column) if column in names else None
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            low = high = None
            if col is not None:
                stats = group.column(col).statistics
                if stats is not None and stats.has_min_max and isinstance(stats.min, int):
                    low, high = int(stats.min), int(stats.max)
            out.append(RowGroup(path, i, group.num_rows, low, high))
    return out


def batches(groups: Sequence[RowGroup], rows: int) -> list[list[RowGroup]]:
    """Consecutive row groups in tasks of about ``rows`` rows (at least one row group each)."""
    out: list[list[RowGroup]] = []
    size = 0
    for group in groups:
        if not out or size >= rows:
            out.append([])
            size = 0
        out[-1].append(group)
        size += group.rows
    return out


def read(loc: Location, groups: Iterable[RowGroup], columns: Sequence[str]) -> pa.Table:
    """The row groups' ``columns`` as one table (one thread: the task is one of as many as there are cores)."""
    import pyarrow.parquet as pq

    fs = loc.fs
    tables = []
    for group in groups:
        with fs.open_input_file(group.path) as f:
            tables.append(pq.ParquetFile(f).read_row_group(group.index, columns=list(columns), use_threads=False))
    if not tables:
        return pa.table({c: pa.array([], pa.int64()) for c in columns})
    return pa.concat_tables(tables, promote_options="permissive")


def tdiv(a: np.ndarray, b: int) -> np.ndarray:
    """``a div b`` as Spark SQL computes it (truncated toward zero), b > 0."""
    q = a // b
    if not a.size or a.min() >= 0:
        return q
    return np.where((a < 0) & (q * b != a), q + 1, q)


def tmod(a: np.ndarray, b: int) -> np.ndarray:
    """``a % b`` as Spark SQL computes it (the sign of a), b > 0."""
    return a - tdiv(a, b) * b


def ints(table: pa.Table, name: str) -> np.ndarray:
    """A column as int64 (nulls as 0: the packet columns are not nullable)."""
    column = table.column(name)
    if column.null_count:
        column = column.fill_null(0)
    return column.to_numpy().astype(np.int64, copy=False)


def labels(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str | None]]:
    """(code per row, names): ``names[code]`` is the row's value (None for null), whatever the column's
    encoding (dictionary or plain strings). Chunk by chunk: unifying the dictionaries of many chunks costs
    more than mapping each chunk's few entries."""
    ids: dict[str | None, int] = {}
    out = []
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        entries = [*chunk.dictionary.to_pylist(), None]  # the last one: null rows
        lut = np.array([ids.setdefault(name, len(ids)) for name in entries], np.int64)
        indices = chunk.indices
        if indices.null_count:
            indices = indices.fill_null(len(entries) - 1)
        out.append(lut[indices.to_numpy().astype(np.int64, copy=False)])
    codes = np.concatenate(out) if out else np.empty(0, np.int64)
    return codes, list(ids)


def codes_of(column: pa.ChunkedArray, names: Sequence[str]) -> np.ndarray:
    """Index of each row's value in ``names``; -1 for other values and nulls."""
    codes, found = labels(column)
    lut = np.array([names.index(n) if n in names else -1 for n in found], np.int64)
    return lut[codes]


def _groups(by: Sequence[np.ndarray], then: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): rows sorted by the keys ``by`` (first key primary), within equal keys by ``then``
    (first key primary), and where each run of equal ``by`` keys starts in that order."""
    order = np.lexsort([*reversed(then), *reversed(by)])
    n = order.size
    if n == 0:
        return order, np.empty(0, np.int64)
    change = np.zeros(n, bool)
    change[0] = True
    for key in by:
        k = key[order]
        change[1:] |= k[1:] != k[:-1]
    return order, np.flatnonzero(change)


# ---- bins ---------------------------------------------------------------------------------------------


BIN_FIELDS = ("min_arrival", "max_arrival", "max_last", "first_sequence", "min_first", "packets", "messages",
              "bytes", "control_packets", "control_last")
BIN_SCHEMA = pa.schema([("feed", pa.string()), ("bin", pa.int64())]
                       + [(name, pa.int64()) for name in BIN_FIELDS])
PACKET_COLUMNS = ("feed", "arrival_ns", "sequence", "count", "bytes")


def _by_time(arrival: np.ndarray, sequence: np.ndarray) -> np.ndarray | None:
    """The order that sorts rows by (arrival, sequence); None when they already are (the files hold packets
    in arrival order, so only equal stamps stored out of sequence order, or odd files, need a sort)."""
    if arrival.size < 2:
        return None
    step = np.diff(arrival)
    if (step > 0).all() or ((step >= 0).all() and (np.diff(sequence)[step == 0] >= 0).all()):
        return None
    return np.lexsort((sequence, arrival))


def bins(table: pa.Table, t0: int, bin_ns: int) -> pa.Table:
    """Per (feed, bin) aggregates of the packets in ``table`` (see :func:`freezes.feed_bins`); null where the
    bin had no data (or no control) packet. Partial: :func:`merge_bins` combines tables of several tasks."""
    codes, names = labels(table.column("feed"))
    arrival, sequence = ints(table, "arrival_ns"), ints(table, "sequence")
    count, size = ints(table, "count"), ints(table, "bytes")
    parts = []
    for code in np.unique(codes).tolist():
        rows = np.flatnonzero(codes == code)
        order = _by_time(arrival[rows], sequence[rows])
        if order is not None:
            rows = rows[order]
        parts.append(_feed_bins(names[code], arrival[rows], sequence[rows], count[rows], size[rows], t0, bin_ns))
    return pa.concat_tables(parts) if parts else BIN_SCHEMA.empty_table()


def _feed_bins(feed: str | None, a: np.ndarray, s: np.ndarray, c: np.ndarray, size: np.ndarray, t0: int,
               bin_ns: int) -> pa.Table:
    """:func:`bins` of one feed's packets, given sorted by (arrival, sequence): a bin is a run of rows, and
    its first data row is its first packet."""
    d = (c >= 1) & (c <= schema.MAX_DATA_COUNT)
    bin_ = tdiv(a - t0, bin_ns)
    starts = np.flatnonzero(np.concatenate(([True], bin_[1:] != bin_[:-1])))
    packets = np.add.reduceat(d.astype(np.int64), starts)
    control = np.add.reduceat((~d).astype(np.int64), starts)
    head = np.minimum.reduceat(np.where(d, np.arange(a.size), a.size - 1), starts)  # first data row
    has = packets > 0
    columns = {
        "min_arrival": (a[head], has),
        "max_arrival": (np.maximum.reduceat(np.where(d, a, _MIN), starts), has),
        "max_last": (np.maximum.reduceat(np.where(d, s + c - 1, _MIN), starts), has),
        "first_sequence": (s[head], has),
        "min_first": (np.minimum.reduceat(np.where(d, s, _MAX), starts), has),
        "packets": (packets, None),
        "messages": (np.add.reduceat(np.where(d, c, 0), starts), None),
        "bytes": (np.add.reduceat(np.where(d, size, 0), starts), None),
        "control_packets": (control, None),
        "control_last": (np.maximum.reduceat(np.where(d, _MIN, s - 1), starts), control > 0),
    }
    arrays = [pa.array([feed] * starts.size, pa.string()), pa.array(bin_[starts])]
    for name in BIN_FIELDS:
        values, valid = columns[name]
        arrays.append(pa.array(values, pa.int64(), mask=None if valid is None else ~valid))
    return pa.Table.from_arrays(arrays, schema=BIN_SCHEMA)


def merge_bins(partials: pa.Table) -> pa.Table:
    """Partial bins of several tasks (a bin may appear in more than one) -> one row per (feed, bin), sorted."""
    if not partials.num_rows:
        return BIN_SCHEMA.empty_table()
    codes, names = labels(partials.column("feed"))
    bin_ = ints(partials, "bin")
    col = {name: partials.column(name) for name in BIN_FIELDS}
    has_data = ints(partials, "packets") > 0
    min_arrival = col["min_arrival"].fill_null(_MAX).to_numpy()
    first_sequence = col["first_sequence"].fill_null(_MAX).to_numpy()
    # data-holding partials first, by their first packet (arrival, sequence): the merged bin's first packet
    order, starts = _groups((codes, bin_), (~has_data, min_arrival, first_sequence))
    head = order[starts]

    def reduce(name: str, op, empty: int) -> np.ndarray:
        values = col[name].fill_null(empty).to_numpy()[order]
        return op.reduceat(values, starts)

    packets = reduce("packets", np.add, 0)
    control = reduce("control_packets", np.add, 0)
    merged = {
        "min_arrival": (min_arrival[head], packets > 0),
        "max_arrival": (reduce("max_arrival", np.maximum, _MIN), packets > 0),
        "max_last": (reduce("max_last", np.maximum, _MIN), packets > 0),
        "first_sequence": (first_sequence[head], packets > 0),
        "min_first": (reduce("min_first", np.minimum, _MAX), packets > 0),
        "packets": (packets, None),
        "messages": (reduce("messages", np.add, 0), None),
        "bytes": (reduce("bytes", np.add, 0), None),
        "control_packets": (control, None),
        "control_last": (reduce("control_last", np.maximum, _MIN), control > 0),
    }
    arrays = [pa.array([names[i] for i in codes[head].tolist()], pa.string()), pa.array(bin_[head])]
    for name in BIN_FIELDS:
        values, valid = merged[name]
        arrays.append(pa.array(values, pa.int64(), mask=None if valid is None else ~valid))
    return pa.Table.from_arrays(arrays, schema=BIN_SCHEMA)


# ---- pieces of the per-message pass ----------------------------------------------------------------


@dataclass(frozen=True)
class PieceTask:
    """Buckets ``first_bucket..last_bucket`` (inclusive) of the sequence space and the row groups to read."""

    first_bucket: int
    last_bucket: int
    groups: tuple[RowGroup, ...]


def plan_pieces(groups: Sequence[RowGroup], first: int, last: int, bucket_size: int, tasks: int) -> list[PieceTask]:
    """The bucket range of the sequences ``first..last`` cut into ``tasks`` contiguous ranges, each with the
    row groups (planned by ``sequence``) holding a data packet that can reach it."""
    w = bucket_size
    lo_bucket, hi_bucket = first // w, last // w
    total = hi_bucket - lo_bucket + 1
    tasks = max(1, min(tasks, total))
    edges = [lo_bucket + (total * k) // tasks for k in range(tasks + 1)]
    out = []
    for k in range(tasks):
        b0, b1 = edges[k], edges[k + 1] - 1
        low, high = b0 * w - schema.MAX_DATA_COUNT + 1, b1 * w + w - 1
        out.append(PieceTask(b0, b1, tuple(g for g in groups if g.overlaps(low, high))))
    return out


PIECE_COLUMNS = ("feed", "arrival_ns", "sequence", "count")
FEED_NAMES = ("A", "B", "R")  # codes as arrivals.FEED_CODES


def pieces(table: pa.Table, task: PieceTask, bucket_size: int) -> pa.Table:
    """The task's pieces (bucket, feed, arrival_ns, lo, hi): every data packet of feed A, B or R cut at bucket
    edges, the parts inside the task's buckets - what the Spark reader's explode and shuffle give the task."""
    w = bucket_size
    feed = codes_of(table.column("feed"), FEED_NAMES)
    arrival, first, count = ints(table, "arrival_ns"), ints(table, "sequence"), ints(table, "count")
    last = first + count - 1
    lo_seq, hi_seq = task.first_bucket * w, task.last_bucket * w + w - 1
    keep = (feed >= 0) & (count >= 1) & (count <= schema.MAX_DATA_COUNT) & (last >= lo_seq) & (first <= hi_seq)
    feed, arrival = feed[keep].astype(np.int8), arrival[keep]
    lo, hi = np.maximum(first[keep], lo_seq), np.minimum(last[keep], hi_seq)
    b0 = lo // w
    spans = hi // w - b0 + 1
    one = spans == 1  # nearly every packet: only those crossing a bucket edge need cutting
    if one.all():
        return pa.table({"bucket": b0, "feed": feed, "arrival_ns": arrival, "lo": lo, "hi": hi})
    cut = np.flatnonzero(~one)
    spans = spans[cut]
    total = int(spans.sum())
    offsets = np.cumsum(spans) - spans
    bucket = np.repeat(b0[cut], spans) + np.arange(total, dtype=np.int64) - np.repeat(offsets, spans)
    return pa.table({
        "bucket": np.concatenate((b0[one], bucket)),
        "feed": np.concatenate((feed[one], np.repeat(feed[cut], spans))),
        "arrival_ns": np.concatenate((arrival[one], np.repeat(arrival[cut], spans))),
        "lo": np.concatenate((lo[one], np.maximum(np.repeat(lo[cut], spans), bucket * w))),
        "hi": np.concatenate((hi[one], np.minimum(np.repeat(hi[cut], spans), bucket * w + (w - 1)))),
    })


# ---- messages -------------------------------------------------------------------------------------------


MESSAGE_COLUMNS = ("type", "stock_locate", "stock", "feed", "arrival_ns", "shares")
# one schema for the three groupings (gid as Spark's grouping_id over (type, stock_locate, stock, window, feed))
MESSAGE_SCHEMA = pa.schema([
    ("gid", pa.int64()), ("type", pa.string()), ("stock_locate", pa.int32()), ("stock", pa.string()),
    ("window", pa.int64()), ("feed", pa.string()), ("messages", pa.int64()), ("adds", pa.int64()),
    ("executions", pa.int64()), ("executed_shares", pa.int64()),
])
GID_TYPE, GID_SYMBOL, GID_WINDOW = 0b01111, 0b10011, 0b11100
_ADDS, _EXECUTIONS = ("A", "F"), ("E", "C", "P")


def message_counts(table: pa.Table, t0: int, window_ns: int) -> pa.Table:
    """Partial counts of the messages in ``table``: per type; per (stock_locate, stock) the messages, adds,
    executions and executed shares; per (window, feed) the messages. Rows as :data:`MESSAGE_SCHEMA`."""
    n = table.num_rows
    if not n:
        return MESSAGE_SCHEMA.empty_table()
    type_codes, type_names = labels(table.column("type"))
    adds = np.isin(type_codes, [i for i, t in enumerate(type_names) if t in _ADDS])
    executions = np.isin(type_codes, [i for i, t in enumerate(type_names) if t in _EXECUTIONS])
    shares_column = table.column("shares")
    shares = ints(table, "shares")
    shares_valid = (np.ones(n, bool) if not shares_column.null_count
                    else shares_column.is_valid().to_numpy(zero_copy_only=False))
    out = []

    type_counts = np.bincount(type_codes, minlength=len(type_names))
    present = np.flatnonzero(type_counts)
    out.append(_message_rows(GID_TYPE, present.size, type=[type_names[i] for i in present.tolist()],
                             messages=type_counts[present]))

    stock_codes, stock_names = labels(table.column("stock"))
    locate_column = table.column("stock_locate")
    locate = ints(table, "stock_locate")
    if locate_column.null_count:  # a null locate is a group of its own: a value no int32 takes
        locate = np.where(locate_column.is_valid().to_numpy(zero_copy_only=False), locate, _MIN)
    group, head = _factor(locate, stock_codes)
    groups = head.size
    # SUM(CASE WHEN execution THEN shares ELSE 0 END): null only when every term is a null share
    terms = executions & shares_valid
    null_terms = np.bincount(group, weights=executions & ~shares_valid, minlength=groups)
    messages = np.bincount(group, minlength=groups)
    out.append(_message_rows(
        GID_SYMBOL, groups,
        stock_locate=pa.array(locate[head].astype(np.int32), mask=locate[head] == _MIN),
        stock=[stock_names[i] for i in stock_codes[head].tolist()],
        messages=messages,
        adds=np.bincount(group, weights=adds, minlength=groups).astype(np.int64),
        executions=np.bincount(group, weights=executions, minlength=groups).astype(np.int64),
        executed_shares=pa.array(_sum_by(group, groups, np.where(terms, shares, 0)),
                                 mask=null_terms == messages)))

    feed_codes, feed_names = labels(table.column("feed"))
    window = tdiv(ints(table, "arrival_ns") - t0, window_ns)
    group, head = _factor(window, feed_codes)
    out.append(_message_rows(GID_WINDOW, head.size, window=window[head],
                             feed=[feed_names[i] for i in feed_codes[head].tolist()],
                             messages=np.bincount(group, minlength=head.size)))
    return pa.concat_tables(out)


def _factor(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group per row, first row of each group) for the distinct tuples of ``keys`` (hashing, no sort); groups
    are numbered in the order they first appear."""
    import pandas as pd

    group = np.zeros(keys[0].size, np.int64)
    for key in keys:
        codes, uniques = pd.factorize(key)
        group = pd.factorize(group * len(uniques) + codes)[0].astype(np.int64, copy=False)
    if not group.size:
        return group, group
    seen = np.maximum.accumulate(group)
    return group, np.flatnonzero(np.concatenate(([True], seen[1:] > seen[:-1])))


def _sum_by(group: np.ndarray, groups: int, values: np.ndarray) -> np.ndarray:
    """Exact int64 sums of ``values`` per group (float weights are exact while every partial sum fits in
    53 bits; larger values take a sort)."""
    if not values.size or np.abs(values).max() < (1 << 53) // max(values.size, 1):
        return np.rint(np.bincount(group, weights=values, minlength=groups)).astype(np.int64)
    order = np.argsort(group, kind="stable")
    starts = np.searchsorted(group[order], np.arange(groups))
    return np.add.reduceat(values[order], starts)


def _message_rows(gid: int, n: int, **columns) -> pa.Table:
    arrays = []
    for field in MESSAGE_SCHEMA:
        if field.name == "gid":
            arrays.append(pa.array(np.full(n, gid, np.int64)))
        elif field.name in columns:
            value = columns[field.name]
            arrays.append(value if isinstance(value, pa.Array) else pa.array(value, field.type))
        elif field.name in ("adds", "executions", "executed_shares"):  # sums of zeros, as in SQL
            arrays.append(pa.array(np.zeros(n, np.int64)))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(arrays, schema=MESSAGE_SCHEMA)


def merge_message_counts(partials: pa.Table) -> pa.Table:
    """Partial counts of several tasks -> one row per group (as the GROUPING SETS query gives them)."""
    import pandas as pd

    if not partials.num_rows:
        return MESSAGE_SCHEMA.empty_table()
    frame = partials.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}.get)
    keys = ["gid", "type", "stock_locate", "stock", "window", "feed"]
    sums = (frame.groupby(keys, dropna=False, sort=True)
            .agg(messages=("messages", "sum"), adds=("adds", "sum"), executions=("executions", "sum"),
                 executed_shares=("executed_shares", lambda s: s.sum(min_count=1)))
            .reset_index())
    # without pandas' metadata: converted back, the columns take the dtypes the Spark reader's rows get
    return pa.Table.from_pandas(sums, schema=MESSAGE_SCHEMA, preserve_index=False).replace_schema_metadata(None)


# ---- packets inside arrival windows ------------------------------------------------------------------


NEAR_SCHEMA = pa.schema([("feed", pa.string()), ("arrival_ns", pa.int64()), ("sequence", pa.int64()),
                         ("count", pa.int64())])


def near(table: pa.Table, windows: np.ndarray) -> pa.Table:
    """The data packets of ``table`` whose arrival lies in one of ``windows`` (n x 2, inclusive bounds)."""
    arrival, count = ints(table, "arrival_ns"), ints(table, "count")
    inside = np.zeros(arrival.size, bool)
    for lo, hi in windows.tolist():
        inside |= (arrival >= lo) & (arrival <= hi)
    keep = inside & (count >= 1) & (count <= schema.MAX_DATA_COUNT)
    codes, names = labels(table.column("feed"))
    return pa.Table.from_arrays([pa.array([names[i] for i in codes[keep].tolist()], pa.string()),
                                 pa.array(arrival[keep]), pa.array(ints(table, "sequence")[keep]),
                                 pa.array(count[keep])], schema=NEAR_SCHEMA)


# ---- running the tasks in Spark -----------------------------------------------------------------------


def run_tasks(spark, tasks: Sequence, body, out_schema: pa.Schema):
    """A DataFrame of what ``body(task_index)`` yields (Arrow record batches of ``out_schema``), one Spark task
    per element of ``tasks``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    n = max(1, len(tasks))

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_numpy().tolist():
                for piece in body(int(index)):
                    yield from (piece.to_batches() if isinstance(piece, pa.Table) else [piece])

    return spark.range(0, len(tasks), 1, n).mapInArrow(run, from_arrow_schema(out_schema))


def collect_tasks(spark, tasks: Sequence, body, out_schema: pa.Schema) -> pa.Table:
    """What ``body(task_index)`` yields for every task, collected on the driver as one table. Each task sends
    its tables as ONE row holding an Arrow IPC stream: the JVM passes a few opaque values instead of turning
    every row into a Spark row and back into Arrow."""
    import pyarrow.ipc as ipc
    from pyspark.sql.types import BinaryType, StructField, StructType

    n = max(1, len(tasks))

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_numpy().tolist():
                sink = pa.BufferOutputStream()
                with ipc.new_stream(sink, out_schema) as writer:
                    for piece in body(int(index)):
                        writer.write_table(piece) if isinstance(piece, pa.Table) else writer.write_batch(piece)
                yield pa.RecordBatch.from_arrays([pa.array([sink.getvalue().to_pybytes()], pa.binary())],
                                                 names=["arrow"])

    frame = spark.range(0, len(tasks), 1, n).mapInArrow(run, StructType([StructField("arrow", BinaryType())]))
    blobs = frame.toArrow().column("arrow").to_pylist() if tasks else []
    tables = [ipc.open_stream(pa.py_buffer(blob)).read_all() for blob in blobs]
    return pa.concat_tables(tables) if tables else out_schema.empty_table()

