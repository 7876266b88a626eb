"""A recording as Spark DataFrames: complete ``*.parquet`` files only, explicit schemas, one session."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from logbuf.recording import schema
from logbuf.recording.reader import complete_files, read_marker
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


def sessions(root: str | os.PathLike) -> list[str]:
    """Sessions that have complete packet or message files."""
    found = set()
    for dataset in (schema.PACKETS, schema.MESSAGES):
        base = Path(root) / dataset
        for path in complete_files(root, dataset):
            first = path.relative_to(base).parts[0]
            if first.startswith(schema.SESSION_COLUMN + "="):
                found.add(first.split("=", 1)[1])
    return sorted(found)


def pick_session(root: str | os.PathLike, session: str | None) -> str:
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


def check_files(root: str | os.PathLike, session: str) -> int:
    """Reads the footer of every complete file of ``session``: a truncated or foreign file fails here, named,
    before Spark starts (Spark would fail deep inside a job).  Returns the number of files checked."""
    import pyarrow.parquet as pq

    checked = 0
    for dataset in schema.DATASETS:
        for path in complete_files(root, dataset):
            if path.relative_to(Path(root) / dataset).parts[0] != f"{schema.SESSION_COLUMN}={session}":
                continue
            try:
                pq.read_metadata(path)
            except (OSError, ValueError) as exc:  # pyarrow: ArrowInvalid is a ValueError
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise RecordingFormatError(f"{path}: not a complete Parquet file ({reason})") from None
            checked += 1
    return checked


@dataclass
class Sources:
    session: str
    packets: DataFrame
    messages: DataFrame
    gaps: DataFrame


def load(spark, root: str | os.PathLike, session: str) -> Sources:
    """The three datasets of ``session``, read from complete files only (``pathGlobFilter`` + hidden-file rule)."""
    from pyspark.sql import functions as F

    frames = {}
    for dataset in schema.DATASETS:
        ddl = spark_ddl(dataset)
        base = Path(root) / dataset
        partition = f"{schema.SESSION_COLUMN}={session}"
        if any(partition in f.parts for f in complete_files(root, dataset)):
            frame = (spark.read.schema(ddl).option("pathGlobFilter", "*" + schema.COMPLETE_SUFFIX)
                     .option("basePath", str(base)).parquet(str(base / partition)))
        else:  # e.g. no gap was ever declared: an empty dataset, not an error
            frame = spark.createDataFrame([], ddl)
        frames[dataset] = frame.where(F.col(schema.SESSION_COLUMN) == session)
    return Sources(session, frames[schema.PACKETS], frames[schema.MESSAGES], frames[schema.GAPS])
