"""``loss-report.dat``: one entry per image that lost data, in Aeron's layout (its LossStat reads ours).

The driver's receiver records an observation every time it finds a new gap in an image: the first one creates
the image's entry, later ones add to it.  Entries are 64-byte aligned, back to back from offset 0; a reader
walks them until an observation count of 0 (never written yet)::

    0              8                  16                  24                 32          36         40
    +--------------+------------------+-------------------+------------------+-----------+----------+---------
    | observation  | total bytes lost | first observation | last observation | session   | stream   | channel
    | count i64    | i64              | epoch ms i64      | epoch ms i64     | id i32    | id i32   | i32 length
    +--------------+------------------+-------------------+------------------+-----------+----------+---------
        then the channel's ASCII, then the source (i32 length + ASCII) at the next 4-byte boundary

The writer fills an entry's fields, then stores its observation count with release: a reader that sees a
count sees the whole entry.  Later observations store the last timestamp, then add to the bytes and the count.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from logbuf.cnc.errors import CncFileError
from logbuf.directory import allocate, set_mode
from logbuf.native import AtomicBuffer, client

DEFAULT_LOSS_REPORT_LENGTH = 1024 * 1024

OBSERVATION_COUNT_OFFSET = 0
TOTAL_BYTES_LOST_OFFSET = 8
FIRST_OBSERVATION_OFFSET = 16
LAST_OBSERVATION_OFFSET = 24
SESSION_ID_OFFSET = 32
STREAM_ID_OFFSET = 36
CHANNEL_OFFSET = 40
ENTRY_ALIGNMENT = 64
_STRING_LENGTH_SIZE = 4


def _source_offset(channel: bytes) -> int:
    """Where the source's length sits in an entry: after the channel, on a 4-byte boundary."""
    return (CHANNEL_OFFSET + _STRING_LENGTH_SIZE + len(channel) + _STRING_LENGTH_SIZE - 1) & -_STRING_LENGTH_SIZE


def _entry_length(channel: bytes, source: bytes) -> int:
    required = _source_offset(channel) + _STRING_LENGTH_SIZE + len(source)
    return (required + ENTRY_ALIGNMENT - 1) & -ENTRY_ALIGNMENT


class LossEntry(NamedTuple):
    """One image's losses."""

    observation_count: int
    total_bytes_lost: int
    first_observation_ms: int  # epoch ms
    last_observation_ms: int
    session_id: int
    stream_id: int
    channel: str
    source: str

    def to_dict(self) -> dict[str, object]:
        return self._asdict()


class LossReport:
    """The writer (the driver's receiver).  ``create_entry`` once per image, then ``record_observation``."""

    def __init__(self, buffer: AtomicBuffer) -> None:
        self.buffer = buffer
        self.capacity = buffer.capacity
        self._next_offset = 0

    def create_entry(self, bytes_lost: int, timestamp_ms: int, session_id: int, stream_id: int, channel: str,
                     source: str) -> int:
        """Writes a new entry with one observation; returns its offset, or -1 when the file is full."""
        channel_bytes = channel.encode("ascii", "replace")
        source_bytes = source.encode("ascii", "replace")
        offset = self._next_offset
        length = _entry_length(channel_bytes, source_bytes)
        if offset + length > self.capacity:
            return -1
        b = self.buffer
        b.put_i64(offset + TOTAL_BYTES_LOST_OFFSET, bytes_lost)
        b.put_i64(offset + FIRST_OBSERVATION_OFFSET, timestamp_ms)
        b.put_i64(offset + LAST_OBSERVATION_OFFSET, timestamp_ms)
        b.put_i32(offset + SESSION_ID_OFFSET, session_id)
        b.put_i32(offset + STREAM_ID_OFFSET, stream_id)
        for at, text in ((CHANNEL_OFFSET, channel_bytes), (_source_offset(channel_bytes), source_bytes)):
            b.put_i32(offset + at, len(text))
            b.put_bytes(offset + at + _STRING_LENGTH_SIZE, text)
        b.put_i64_release(offset + OBSERVATION_COUNT_OFFSET, 1)
        self._next_offset = offset + length
        return offset

    def record_observation(self, offset: int, bytes_lost: int, timestamp_ms: int) -> None:
        """One more loss for the entry at ``offset``."""
        b = self.buffer
        b.put_i64_release(offset + LAST_OBSERVATION_OFFSET, timestamp_ms)
        b.get_and_add_i64(offset + TOTAL_BYTES_LOST_OFFSET, bytes_lost)
        b.get_and_add_i64(offset + OBSERVATION_COUNT_OFFSET, 1)


def read_loss_report(buffer: AtomicBuffer) -> list[LossEntry]:
    """Every entry written so far.  Lengths are checked against the buffer: a damaged file ends the walk."""
    entries: list[LossEntry] = []
    capacity = buffer.capacity
    offset = 0
    while offset + CHANNEL_OFFSET + _STRING_LENGTH_SIZE <= capacity:
        count = buffer.get_i64_acquire(offset + OBSERVATION_COUNT_OFFSET)
        if count <= 0:
            break
        at = offset + CHANNEL_OFFSET
        texts: list[bytes] = []
        for _ in range(2):
            if at + _STRING_LENGTH_SIZE > capacity:
                return entries
            length = buffer.get_i32(at)
            if length < 0 or at + _STRING_LENGTH_SIZE + length > capacity:
                return entries
            texts.append(buffer.get_bytes(at + _STRING_LENGTH_SIZE, length))
            at = offset + _source_offset(texts[0])
        entries.append(LossEntry(
            count,
            buffer.get_i64(offset + TOTAL_BYTES_LOST_OFFSET),
            buffer.get_i64(offset + FIRST_OBSERVATION_OFFSET),
            buffer.get_i64(offset + LAST_OBSERVATION_OFFSET),
            buffer.get_i32(offset + SESSION_ID_OFFSET),
            buffer.get_i32(offset + STREAM_ID_OFFSET),
            texts[0].decode("ascii", "replace"),
            texts[1].decode("ascii", "replace"),
        ))
        offset += _entry_length(texts[0], texts[1])
    return entries


class LossReportFile:
    """A mapped loss-report.dat: ``create`` (the driver) or ``open`` (tools); ``close()`` unmaps it."""

    def __init__(self, path: Path, mapping: mmap.mmap) -> None:
        self.path = path
        self._mmap = mapping
        self._guard = client.MappingGuard(mapping)  # truncating the file must not kill the driver (SIGBUS)
        self.buffer = AtomicBuffer(mapping, 0, len(mapping))

    @classmethod
    def create(cls, path: str | os.PathLike[str], length: int = DEFAULT_LOSS_REPORT_LENGTH,
               mode: int = 0o600) -> LossReportFile:
        """A new zeroed file of ``length`` bytes (an old one is unlinked first: readers keep their pages)."""
        path = Path(path)
        if length < ENTRY_ALIGNMENT:
            raise ValueError(f"loss report length {length} < {ENTRY_ALIGNMENT}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            set_mode(fd, mode)  # the umask must not narrow what was asked for
            allocate(fd, length, path)  # backed before mapped: a full disk is an error here, not a SIGBUS later
            mapping = mmap.mmap(fd, length)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # no half-made file for a client to find
            raise
        os.close(fd)
        return cls(path, mapping)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> LossReportFile:
        """Maps an existing file read-only in spirit (tools never write it)."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise CncFileError(f"no loss report at {path} (is a media driver running there?)") from None
        except OSError as exc:
            raise CncFileError(f"cannot open {path}: {exc.strerror}") from exc
        try:
            size = os.fstat(fd).st_size
            if size < ENTRY_ALIGNMENT:
                raise CncFileError(f"{path} is {size} bytes: too short for a loss report")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(path, mapping)

    @classmethod
    def from_bytes(cls, data: bytes) -> list[LossEntry]:
        """The entries of a loss report's bytes (a copy, e.g. a file saved elsewhere)."""
        return read_loss_report(AtomicBuffer(bytearray(data)))

    def report(self) -> LossReport:
        return LossReport(self.buffer)

    def entries(self) -> list[LossEntry]:
        return read_loss_report(self.buffer)

    def close(self) -> None:
        self.buffer.release()
        self._guard.release()
        self._mmap.close()

    def __enter__(self) -> LossReportFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_timestamp(epoch_ms: int) -> str:
    """``2026-11-23 20:13:27.303+0000``: how LossStat prints an observation time (UTC)."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{epoch_ms % 1000:03d}+0000"


LOSS_STAT_HEADER = ("OBSERVATION_COUNT, TOTAL_BYTES_LOST, FIRST_OBSERVATION,LAST_OBSERVATION, SESSION_ID, "
                    "STREAM_ID, CHANNEL, SOURCE")


def format_loss_stat(entries: list[LossEntry]) -> str:
    """The text LossStat prints for these entries: a header line, one CSV line per entry, a count."""
    lines = [LOSS_STAT_HEADER]
    for e in entries:
        lines.append(f"{e.observation_count},{e.total_bytes_lost},{format_timestamp(e.first_observation_ms)},"
                     f"{format_timestamp(e.last_observation_ms)},{e.session_id},{e.stream_id},{e.channel},{e.source}")
    lines.append(f"{len(entries)} entries read")
    return "\n".join(lines) + "\n"


__all__ = [
    "DEFAULT_LOSS_REPORT_LENGTH",
    "LOSS_STAT_HEADER",
    "LossEntry",
    "LossReport",
    "LossReportFile",
    "format_loss_stat",
    "format_timestamp",
    "read_loss_report",
]
