"""A recording as Spark DataFrames: complete ``*.parquet`` files only, explicit schemas, one session."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from logbuf.pipeline.storage import Location
from logbuf.recording import schema
from logbuf.recording.schema import RecordingFormatError

if TYPE_CHECKING:  # pyspark is imported lazily: only the analyze job needs it
    from pyspark.sql import DataFrame

_SPARK_TYPES = {"int64": "BIGINT", "int32": "INT", "string": "STRING"}


def spark_ddl(dataset: str) -> str:
    """The dataset's Spark schema as DDL (strings for dictionary columns), partition columns last."""
    parts = []
    for f in schema.SCHEMAS[dataset]:
        arrow = f.type.value_type if hasattr(f.type, "value_type") else f.type
        parts.append(f"`{f.name}` {_SPARK_TYPES[str(arrow)]}")
    parts += [f"`{c}` STRING" for c in schema.PARTITION_COLUMNS]
    return ", ".join(parts)


def _root(root: str | os.PathLike | Location) -> Location:
    return root if isinstance(root, Location) else Location.parse(root)


def read_marker(root: str | os.PathLike | Location) -> dict:
    """The recording's format marker, through the filesystem layer (any URI the driver can open)."""
    import json

    loc = _root(root)
    if not loc.is_dir():
        raise RecordingFormatError(f"{loc}: no such recording directory")
    try:
        marker = json.loads(loc.read_text(schema.MARKER_FILE))
    except FileNotFoundError:
        raise RecordingFormatError(f"{loc}: not a logbuf recording (no {schema.MARKER_FILE})") from None
    except ValueError as exc:
        raise RecordingFormatError(f"{loc}/{schema.MARKER_FILE}: unreadable marker ({exc})") from None
    if marker.get("format") != schema.FORMAT_NAME or marker.get("version") != schema.FORMAT_VERSION:
        raise RecordingFormatError(
            f"{loc}: format {marker.get('format')!r} version {marker.get('version')!r}; this reader understands "
            f"{schema.FORMAT_NAME!r} version {schema.FORMAT_VERSION}")
    return marker


def complete_files(root: str | os.PathLike | Location, dataset: str) -> list[str]:
    """Complete Parquet files of one dataset, relative to the dataset's directory ("session=S/hour=H/x")."""
    out = []
    for rel in _root(root).child(dataset).files(schema.COMPLETE_SUFFIX):
        if not any(part.startswith(schema.HIDDEN_PREFIXES) for part in rel.split("/")):
            out.append(rel)
    return out


def sessions(root: str | os.PathLike | Location) -> list[str]:
    """Sessions that have complete packet or message files."""
    found = set()
    for dataset in (schema.PACKETS, schema.MESSAGES):
        for rel in complete_files(root, dataset):
            first = rel.split("/", 1)[0]
            if first.startswith(schema.SESSION_COLUMN + "="):
                found.add(first.split("=", 1)[1])
    return sorted(found)


def pick_session(root: str | os.PathLike | Location, session: str | None) -> str:
    read_marker(root)
    available = sessions(root)
    if not available:
        raise RecordingFormatError(f"{root}: the recording holds no complete packet or message files yet")
    if session is None:
        if len(available) > 1:
            raise RecordingFormatError(f"{root} holds several sessions ({', '.join(available)}): pick one "
                                       "with --session")
        return available[0]
    if session not in available:
        raise RecordingFormatError(f"session {session!r} is not in {root} (it has {', '.join(available)})")
    return session


def check_files(root: str | os.PathLike | Location, session: str) -> int:
    """Reads the footer of every complete file of ``session``: a truncated or foreign file fails here, named,
    before Spark starts (Spark would fail deep inside a job).  Returns the number of files checked."""
    import pyarrow.parquet as pq

    loc = _root(root)
    checked = 0
    for dataset in schema.DATASETS:
        base = loc.child(dataset)
        for rel in complete_files(loc, dataset):
            if rel.split("/", 1)[0] != f"{schema.SESSION_COLUMN}={session}":
                continue
            shown = base.local_path / rel if base.is_local else f"{base}/{rel}"
            try:
                with base.fs.open_input_file(f"{base.path}/{rel}") as f:
                    pq.read_metadata(f)
            except (OSError, ValueError) as exc:  # pyarrow: ArrowInvalid is a ValueError
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise RecordingFormatError(f"{shown}: not a complete Parquet file ({reason})") from None
            checked += 1
    return checked


@dataclass
class Sources:
    session: str
    packets: DataFrame
    messages: DataFrame
    gaps: DataFrame


def load(spark, root: str | os.PathLike | Location, session: str) -> Sources:
    """The three datasets of ``session``, read by Spark (Hadoop's FileSystem: any URI the cluster reads) from
    complete files only (``pathGlobFilter`` + hidden-file rule)."""
    from pyspark.sql import functions as F

    loc = _root(root)
    frames = {}
    for dataset in schema.DATASETS:
        ddl = spark_ddl(dataset)
        base = loc.child(dataset).spark_uri
        partition = f"{schema.SESSION_COLUMN}={session}"
        if any(rel.split("/", 1)[0] == partition for rel in complete_files(loc, dataset)):
            frame = (spark.read.schema(ddl).option("pathGlobFilter", "*" + schema.COMPLETE_SUFFIX)
                     .option("basePath", base).parquet(f"{base}/{partition}"))
        else:  # e.g. no gap was ever declared: an empty dataset, not an error
            frame = spark.createDataFrame([], ddl)
        frames[dataset] = frame.where(F.col(schema.SESSION_COLUMN) == session)
    return Sources(session, frames[schema.PACKETS], frames[schema.MESSAGES], frames[schema.GAPS])
