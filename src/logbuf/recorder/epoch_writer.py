"""``EpochWriter``: the recording's Parquet files, completed in atomic epochs (two-phase commit).

:class:`logbuf.recording.writer.DatasetWriter` completes a file by close + fsync + rename.  A recorder
must also remember *how far it has recorded* (its checkpoint), and the two must agree after any crash: a
renamed file whose rows the checkpoint does not cover would be recorded twice on restart.  So completion is
split in two phases around the checkpoint::

    seal     close + fsync every open file, still named .part-...parquet.tmp (never read)
    commit   write the checkpoint (atomic rename) naming those files and the stream positions they cover
    publish  rename each sealed file to part-...parquet, fsync its directory

    restart  roll forward: rename every file the checkpoint names that is still .tmp (it was sealed,
             complete and fsync'ed); delete every other .tmp (a file that was being written)

A crash before the commit leaves only .tmp files (deleted; the data is re-read from the log), after it the
roll-forward finishes the publish: complete files always hold exactly what the checkpoint says.

Files that fill up (``rows_per_file``) or whose hour ended are sealed by the dataset writer as it goes and
wait, sealed, for the next commit.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from logbuf.recorder.config import RecorderError
from logbuf.recording import DEFAULT_ROW_GROUP_ROWS, DEFAULT_ROWS_PER_FILE, reader, schema
from logbuf.recording import writer as dataset_writer
from logbuf.recording.writer import DatasetWriter

# The hooks this module relies on: DatasetWriter opens a file in ``_file(key, first_ns)`` and completes it in
# ``_complete(key)``, from ``_open[key]`` (``writer``, ``temp``, ``final``, ``rows``).  Fail loudly at import
# if that changes, never silently.
_OPEN_FILE_FIELDS = {"writer", "temp", "final", "rows"}
_open_file_slots = set(getattr(getattr(dataset_writer, "_OpenFile", None), "__slots__", ()))
if not all(callable(getattr(DatasetWriter, hook, None)) for hook in ("_file", "_complete")) or \
        not _open_file_slots.issuperset(_OPEN_FILE_FIELDS):
    raise ImportError("logbuf.recording.writer.DatasetWriter changed: the recorder's two-phase commit needs "
                      "its _file(key, first_ns) / _complete(key) / _open[key] (writer, temp, final, rows)")


class SealedFile(NamedTuple):
    temp: Path  # complete and fsync'ed, still hidden
    final: Path
    rows: int


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Columns that mostly increase row to row: delta encoding makes them small before compression even starts.
_DELTA_COLUMNS = {"sequence", "arrival_ns", "itch_ns", "order_ref", "detected_ns"}
# Columns readers filter on (row-group min/max); statistics elsewhere cost write time for little use.
_STATISTICS_COLUMNS = {"sequence", "arrival_ns", "itch_ns", "stock_locate", "first", "last", "detected_ns"}


def parquet_options(table_schema: pa.Schema) -> dict:
    """Encodings for the recorder's high-rate writes.  Parquet's default tries a dictionary for every
    column; for ns times, sequences and order numbers it never pays and costs most of the write time, so
    only the dictionary-typed (string) columns get one, increasing ints are delta-encoded and statistics
    are kept for the columns readers filter on (measured on 300 k messages, zstd: ~1.0 -> ~0.25 us a row,
    and 15 % smaller)."""
    names = table_schema.names
    return {
        "use_dictionary": [f.name for f in table_schema if pa.types.is_dictionary(f.type)],
        "column_encoding": {name: "DELTA_BINARY_PACKED" for name in names if name in _DELTA_COLUMNS},
        "write_statistics": [name for name in names if name in _STATISTICS_COLUMNS],
    }


class _SealingDatasetWriter(DatasetWriter):
    """A DatasetWriter whose completed files are sealed (closed, fsync'ed, left hidden) instead of renamed,
    and written with :func:`parquet_options`."""

    def __init__(self, root: str | os.PathLike, dataset: str, *, rows_per_file: int, row_group_rows: int,
                 compression: str) -> None:
        super().__init__(root, dataset, rows_per_file=rows_per_file, row_group_rows=row_group_rows,
                         compression=compression)
        self.sealed: list[SealedFile] = []
        self.parquet_options = parquet_options(self.schema)

    def _file(self, key: tuple[str, str], first_ns: int) -> dataset_writer._OpenFile:
        handle = self._open.get(key)
        if handle is None:
            handle = super()._file(key, first_ns)
            handle.writer.close()  # nothing written yet: reopen the same (hidden) file with our options
            handle.writer = pq.ParquetWriter(handle.temp, self.schema, compression=self.compression,
                                             **self.parquet_options)
        return handle

    def _complete(self, key: tuple[str, str]) -> None:
        handle = self._open.pop(key)
        handle.writer.close()
        fsync_path(handle.temp)
        self.sealed.append(SealedFile(handle.temp, handle.final, handle.rows))


def ensure_marker(root: Path) -> None:
    """Writes the recording's format marker (or checks the one there)."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / schema.MARKER_FILE
    if marker.exists():
        reader.read_marker(root)  # appending to a recording of another format would corrupt it
        return
    tmp = root / (schema.MARKER_FILE + ".tmp")
    tmp.write_text(json.dumps({"format": schema.FORMAT_NAME, "version": schema.FORMAT_VERSION}) + "\n")
    os.replace(tmp, marker)


class EpochWriter:
    """The three datasets of one recording; rows become complete files only through seal/commit/publish."""

    def __init__(self, root: str | os.PathLike, *, rows_per_file: int = DEFAULT_ROWS_PER_FILE,
                 row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, compression: str = "zstd") -> None:
        self.root = Path(root)
        ensure_marker(self.root)
        self.writers = {
            name: _SealingDatasetWriter(self.root, name, rows_per_file=rows_per_file,
                                        row_group_rows=min(row_group_rows, rows_per_file), compression=compression)
            for name in schema.DATASETS
        }
        self.files_published = 0
        self.bytes_published = 0

    def write(self, dataset: str, session: str, table: pa.Table | pa.RecordBatch) -> None:
        self.writers[dataset].write(session, table)

    def rows_written(self, dataset: str) -> int:
        return self.writers[dataset].rows_written

    @property
    def has_sealed(self) -> bool:
        return any(w.sealed for w in self.writers.values())

    @property
    def has_open(self) -> bool:
        return any(w._open or w._pending for w in self.writers.values())

    def seal(self) -> list[SealedFile]:
        """Phase 1: every buffered row into a sealed file; returns the files the next commit must name."""
        sealed: list[SealedFile] = []
        for writer in self.writers.values():
            writer.close()  # flushes pending rows and completes (here: seals) every open file
            sealed += writer.sealed
            writer.sealed = []
        return sealed

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def publish(self, sealed: list[SealedFile]) -> None:
        """Phase 3 (after the commit): make the sealed files visible (those already renamed are skipped)."""
        pending = [f for f in sealed if f.temp.exists()]
        publish_files(self.root, [(self.relative(f.temp), self.relative(f.final)) for f in pending])
        self.files_published += len(pending)
        self.bytes_published += sum(f.final.stat().st_size for f in pending)


class BackgroundWriter:
    """Runs an :class:`EpochWriter` on one worker thread: Parquet encoding, compression and the seal's fsyncs.

    Arrow releases the GIL while it encodes, so the recorder keeps polling and decoding meanwhile (on
    another core when there is one), and a commit's seal no longer stops the polling.  Operations run in
    submission order, so a seal covers exactly the writes queued before it.  A worker error fails the next
    call (and every seal after it): nothing written after an error is ever named by a checkpoint."""

    def __init__(self, writer: EpochWriter, max_pending: int = 4) -> None:
        self.writer = writer
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)  # bounded: the recorder waits, memory stays flat
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="logbuf-recorder-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if item[0] == "seal":
                    future: Future = item[1]
                    if self._error is not None:
                        future.set_exception(self._failure())
                    else:
                        try:
                            future.set_result(self.writer.seal())
                        except BaseException as exc:  # noqa: BLE001 - handed to the recorder's thread
                            self._error = exc
                            future.set_exception(self._failure())
                elif self._error is None:
                    try:
                        self.writer.write(*item[1:])
                    except BaseException as exc:  # noqa: BLE001 - handed to the recorder's thread
                        self._error = exc
            finally:
                self._queue.task_done()

    def _failure(self) -> RecorderError:
        error = RecorderError(f"writing the recording failed: {self._error}")
        error.__cause__ = self._error
        return error

    def write(self, dataset: str, session: str, table: object) -> None:
        if self._error is not None:
            raise self._failure()
        self._queue.put(("write", dataset, session, table))

    def seal_async(self) -> Future:
        """Seals (after every write queued so far) on the worker; the future gives the sealed files."""
        future: Future = Future()
        self._queue.put(("seal", future))
        return future

    def seal(self) -> list[SealedFile]:
        return self.seal_async().result()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


def publish_files(root: Path, pairs: list[tuple[str, str]]) -> int:
    """Renames each (temp, final) pair that is still pending; fsyncs the directories. Returns files renamed."""
    directories: set[Path] = set()
    renamed = 0
    for temp, final in pairs:
        src, dst = root / temp, root / final
        if src.exists():
            os.replace(src, dst)
            directories.add(dst.parent)
            renamed += 1
    for directory in directories:
        fsync_path(directory)
    return renamed


def remove_stale(root: Path) -> list[Path]:
    """Deletes every in-progress (.tmp) data file of the recording: what a crash left half-written."""
    removed = []
    for dataset in schema.DATASETS:
        base = root / dataset
        if base.is_dir():
            for path in base.rglob("*" + schema.IN_PROGRESS_SUFFIX):
                path.unlink()
                removed.append(path)
    return removed
