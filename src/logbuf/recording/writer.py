"""Writing recordings (format: :mod:`logbuf.recording.schema`).

:class:`RecordingWriter` is what a recorder (and the scenario generator) uses: one rolling Parquet file per
(dataset, session, hour), row groups of ``row_group_rows``, a new file after ``rows_per_file`` rows, each file
written under a hidden ``.tmp`` name and renamed only once complete (:func:`logbuf.recording.reader.complete_files`
lists exactly the files a reader may use).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from logbuf.recording import DEFAULT_ROW_GROUP_ROWS, DEFAULT_ROWS_PER_FILE, schema
from logbuf.recording.reader import read_marker
from logbuf.recording.schema import RecordingFormatError


class _OpenFile:
    __slots__ = ("final", "temp", "writer", "rows")

    def __init__(self, final: Path, temp: Path, writer: pq.ParquetWriter) -> None:
        self.final = final
        self.temp = temp
        self.writer = writer
        self.rows = 0


class DatasetWriter:
    """Rolling, partitioned, crash-safe Parquet files of one dataset.

    ``write(session, table)`` splits the rows by UTC hour of the dataset's partition time column and appends
    them to that partition's open file; rows are buffered into row groups of ``row_group_rows``. ``close()``
    (or ``rows_per_file`` reached) finishes a file: close, fsync, rename ``.name.parquet.tmp`` -> ``name.parquet``.
    """

    def __init__(self, root: str | os.PathLike, dataset: str, *, writer_id: str | None = None,
                 rows_per_file: int = DEFAULT_ROWS_PER_FILE, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
                 compression: str = "zstd") -> None:
        if dataset not in schema.SCHEMAS:
            raise RecordingFormatError(f"unknown dataset {dataset!r}: use one of {', '.join(schema.DATASETS)}")
        if rows_per_file < 1 or row_group_rows < 1:
            raise RecordingFormatError("rows_per_file and row_group_rows must be positive")
        self.root = Path(root)
        self.dataset = dataset
        self.schema = schema.SCHEMAS[dataset]
        self.time_column = schema.PARTITION_TIME_COLUMN[dataset]
        self.writer_id = writer_id or uuid.uuid4().hex[:8]
        self.rows_per_file = rows_per_file
        self.row_group_rows = row_group_rows
        self.compression = compression
        self.rows_written = 0
        self.files_completed = 0
        self._open: dict[tuple[str, str], _OpenFile] = {}
        self._pending: dict[tuple[str, str], list[pa.Table]] = {}
        self._pending_rows: dict[tuple[str, str], int] = {}
        self._file_counter = 0
        self._newest_hour: dict[str, str] = {}

    def write(self, session: str, table: pa.Table | pa.RecordBatch) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        schema.check_columns(self.dataset, table)
        if table.num_rows == 0:
            return
        session = schema.check_session(session)
        times = table.column(self.time_column).to_numpy()
        hours = times // schema.NANOS_PER_HOUR
        if hours.size and hours[0] == hours[-1] and (hours == hours[0]).all():
            self._append((session, schema.hour_label(int(times[0]))), table)
            return
        order = np.argsort(hours, kind="stable")
        sorted_hours = hours[order]
        cuts = np.flatnonzero(np.diff(sorted_hours)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, order.size], strict=True):
            rows = table.take(pa.array(order[lo:hi]))
            self._append((session, schema.hour_label(int(sorted_hours[lo]) * schema.NANOS_PER_HOUR)), rows)

    def _append(self, key: tuple[str, str], table: pa.Table) -> None:
        session, hour = key
        newest = self._newest_hour.get(session)
        if newest is None or hour > newest:
            # rows arrive in time order: finish the partitions two hours back (one hour of slack for stragglers)
            if newest is not None:
                for old in [k for k in (*self._open, *self._pending) if k[0] == session and k[1] < newest]:
                    self._flush(old)
                    if old in self._open:
                        self._complete(old)
            self._newest_hour[session] = hour
        self._pending.setdefault(key, []).append(table)
        self._pending_rows[key] = self._pending_rows.get(key, 0) + table.num_rows
        if self._pending_rows[key] >= self.row_group_rows:
            self._flush(key)

    def _flush(self, key: tuple[str, str]) -> None:
        tables = self._pending.pop(key, [])
        self._pending_rows.pop(key, None)
        if not tables:
            return
        table = pa.concat_tables(tables).combine_chunks()
        start = 0
        while start < table.num_rows:
            handle = self._file(key, int(table.column(self.time_column)[start].as_py()))
            take = min(table.num_rows - start, self.rows_per_file - handle.rows)
            handle.writer.write_table(table.slice(start, take), row_group_size=self.row_group_rows)
            handle.rows += take
            self.rows_written += take
            start += take
            if handle.rows >= self.rows_per_file:
                self._complete(key)

    def _file(self, key: tuple[str, str], first_ns: int) -> _OpenFile:
        handle = self._open.get(key)
        if handle is not None:
            return handle
        session, hour = key
        directory = self.root / self.dataset / f"{schema.SESSION_COLUMN}={session}" / f"{schema.HOUR_COLUMN}={hour}"
        directory.mkdir(parents=True, exist_ok=True)
        self._file_counter += 1
        name = f"part-{first_ns:020d}-{self.writer_id}-{self._file_counter:05d}"
        final = directory / (name + schema.COMPLETE_SUFFIX)
        temp = directory / ("." + name + schema.IN_PROGRESS_SUFFIX)
        writer = pq.ParquetWriter(temp, self.schema, compression=self.compression)
        handle = self._open[key] = _OpenFile(final, temp, writer)
        return handle

    def _complete(self, key: tuple[str, str]) -> None:
        handle = self._open.pop(key)
        handle.writer.close()
        fd = os.open(handle.temp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(handle.temp, handle.final)  # atomic: readers see a complete file or none
        self.files_completed += 1

    def close(self) -> None:
        for key in list(self._pending):
            self._flush(key)
        for key in list(self._open):
            self._complete(key)


class RecordingWriter:
    """The three datasets of one recording plus its format marker (written first)."""

    def __init__(self, root: str | os.PathLike, *, writer_id: str | None = None,
                 rows_per_file: int = DEFAULT_ROWS_PER_FILE, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
                 compression: str = "zstd") -> None:
        """Options as for :class:`DatasetWriter`, applied to each dataset."""
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        marker = self.root / schema.MARKER_FILE
        if marker.exists():
            read_marker(self.root)  # appending to a recording of another format would corrupt it
        else:
            tmp = self.root / (schema.MARKER_FILE + ".tmp")
            tmp.write_text(json.dumps({"format": schema.FORMAT_NAME, "version": schema.FORMAT_VERSION}) + "\n")
            os.replace(tmp, marker)
        self.writers = {
            name: DatasetWriter(self.root, name, writer_id=writer_id, rows_per_file=rows_per_file,
                                row_group_rows=row_group_rows, compression=compression)
            for name in schema.DATASETS
        }

    def write(self, dataset: str, session: str, table: pa.Table | pa.RecordBatch) -> None:
        self.writers[dataset].write(session, table)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
