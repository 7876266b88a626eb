"""Reading a recording: its format marker and the complete files a reader may use (format: :mod:`.schema`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from logbuf.recording import schema
from logbuf.recording.schema import RecordingFormatError


def complete_files(root: str | os.PathLike, dataset: str) -> list[Path]:
    """Complete Parquet files of one dataset, sorted; in-progress (``.tmp``) and hidden files are skipped."""
    base = Path(root) / dataset
    if not base.is_dir():
        return []
    out = []
    for path in base.rglob("*" + schema.COMPLETE_SUFFIX):
        rel = path.relative_to(base)
        if any(part.startswith(schema.HIDDEN_PREFIXES) for part in rel.parts):
            continue
        out.append(path)
    return sorted(out)


def read_marker(root: str | os.PathLike) -> dict:
    """The recording's format marker; raises :class:`RecordingFormatError` if missing or of another version."""
    path = Path(root) / schema.MARKER_FILE
    if not Path(root).is_dir():
        raise RecordingFormatError(f"{root}: no such recording directory")
    try:
        marker = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordingFormatError(f"{root}: not a logbuf recording (no {schema.MARKER_FILE})") from None
    except json.JSONDecodeError as exc:
        raise RecordingFormatError(f"{path}: unreadable marker ({exc})") from None
    if marker.get("format") != schema.FORMAT_NAME or marker.get("version") != schema.FORMAT_VERSION:
        raise RecordingFormatError(
            f"{root}: format {marker.get('format')!r} version {marker.get('version')!r}; this reader understands "
            f"{schema.FORMAT_NAME!r} version {schema.FORMAT_VERSION}"
        )
    return marker


def read_dataset(root: str | os.PathLike, dataset: str, columns: Iterable[str] | None = None) -> pa.Table:
    """A whole dataset as one pyarrow table (partition columns included), for small recordings and checks."""
    files = complete_files(root, dataset)
    names = list(columns) if columns is not None else None
    tables = []
    for path in files:
        table = pq.read_table(path, columns=[c for c in names if c not in schema.PARTITION_COLUMNS]
                              if names is not None else None)
        parts = dict(p.split("=", 1) for p in path.parent.relative_to(Path(root) / dataset).parts)
        for column in schema.PARTITION_COLUMNS:
            if names is None or column in names:
                table = table.append_column(column, pa.array([parts.get(column, "")] * table.num_rows,
                                                             pa.string()))
        tables.append(table)
    if not tables:
        base = schema.SCHEMAS[dataset]
        fields = [f for f in base if names is None or f.name in names]
        fields += [pa.field(c, pa.string()) for c in schema.PARTITION_COLUMNS if names is None or c in names]
        return pa.schema(fields).empty_table()
    return pa.concat_tables(tables, promote_options="permissive")
