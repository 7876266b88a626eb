"""ITCH day files: each message preceded by a 2-byte big-endian length (a MoldUDP64 message block)::

    +-------+---------------------+-------+---------------------+----
    |len u16| message (len bytes) |len u16| message (len bytes) | ...
    +-------+---------------------+-------+---------------------+----
    ^ frame offset  ^ message offset = frame offset + 2

Because a frame is byte-for-byte a MoldUDP64 message block, a run of consecutive frames copied from the file is
the body of a downstream packet. :class:`DayFileReader` memory-maps the file and hands out
:class:`MessageBlock` s (frame offsets as a numpy vector, plus the mapped bytes) so callers can decode headers
vectorised, slice packets, or decode messages one by one.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import BinaryIO, NamedTuple

import numpy as np

from logbuf.errors import LogbufError
from logbuf.marketdata import itch

LENGTH_PREFIX_SIZE = 2
DEFAULT_BLOCK_MESSAGES = 65_536
_WRITE_BUFFER_BYTES = 1 << 20


class DayFileError(LogbufError, ValueError):
    """A day file is truncated or a frame cannot be an ITCH message."""


def _scan_frames_python(buf: bytes | mmap.mmap | memoryview | np.ndarray, start: int, limit: int,
                        end: int) -> tuple[list[int], int]:
    offsets: list[int] = []
    append = offsets.append
    offset = start
    while len(offsets) < limit and offset + LENGTH_PREFIX_SIZE <= end:
        frame_end = offset + LENGTH_PREFIX_SIZE + ((buf[offset] << 8) | buf[offset + 1])
        if frame_end > end:
            break
        append(offset)
        offset = frame_end
    return offsets, offset


# ITCH 5.0 message length by type byte (-1: not an ITCH type); every ITCH message is shorter than 256 bytes.
_ITCH_LENGTH = np.where(itch.LENGTH_BY_TYPE_BYTE > 0, itch.LENGTH_BY_TYPE_BYTE, -1).astype(np.int64)
_WINDOW_BYTES = 1 << 18
_MAX_FRAME_BYTES = LENGTH_PREFIX_SIZE + 255  # an ITCH frame: the prefix and a message shorter than 256 bytes


def _itch_chain(data: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, int] | None:
    """The run of ITCH frames chained from ``start`` within ``data[start:stop]``, found without a Python loop.

    Every position whose 2-byte length equals the ITCH length of the type byte after it is a candidate (the
    real frames and a few coincidences); each candidate points at the candidate its length leads to, and
    pointer doubling marks everything reachable from ``start`` — which is exactly the chain of frames, because
    each frame has one successor. Returns (absolute offsets, offset after the last), or None when ``start`` is
    not an ITCH frame (the caller scans that stretch the plain way).
    """
    seg = data[start:stop]
    n = seg.size - 2
    if n <= 0:
        return None
    zeros = np.flatnonzero(seg[:n] == 0)
    lengths = seg[zeros + 1].astype(np.int64)
    hit = _ITCH_LENGTH[seg[zeros + 2]] == lengths
    candidates = zeros[hit]
    if candidates.size == 0 or candidates[0] != 0:
        return None
    following = candidates + LENGTH_PREFIX_SIZE + lengths[hit]
    m = candidates.size
    j = np.searchsorted(candidates, following)
    linked = (j < m) & (candidates[np.minimum(j, m - 1)] == following)
    jump = np.empty(m + 1, dtype=np.int64)
    jump[:m] = np.where(linked, j, m)  # m: a sink that points at itself
    jump[m] = m
    reached = np.zeros(m + 1, dtype=bool)
    reached[0] = True
    span = 1
    while span < m:  # after k rounds: everything within 2**k steps of the start
        reached[jump[reached]] = True
        jump = jump[jump]
        span *= 2
    chain = np.flatnonzero(reached[:m])
    return candidates[chain] + start, start + int(following[chain[-1]])


def scan_frames(buf: bytes | mmap.mmap | memoryview | np.ndarray, start: int, limit: int) -> tuple[np.ndarray, int]:
    """Frame offsets of up to ``limit`` complete frames from ``start``; returns (offsets, offset after the last).

    Each length says where the next frame begins, so the scan is sequential by nature; runs of ITCH frames are
    found vectorised (:func:`_itch_chain`, several times faster), anything else frame by frame. A trailing
    partial frame is left for the caller to report.
    """
    data = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    plain_view = data.data if isinstance(buf, np.ndarray) else buf  # a memoryview: indexes to Python ints
    end = data.size
    parts: list[np.ndarray] = []
    found = 0
    offset = start
    while found < limit and offset + LENGTH_PREFIX_SIZE <= end:
        # a window no longer than the frames still wanted could take (a small limit scans a small window)
        window = min(_WINDOW_BYTES, (limit - found) * _MAX_FRAME_BYTES)
        run = _itch_chain(data, offset, min(end, offset + window))
        if run is None:
            plain, after = _scan_frames_python(plain_view, offset, min(limit - found, 4_096), end)
            if not plain:
                break
            parts.append(np.asarray(plain, dtype=np.int64))
            found += len(plain)
            offset = after
            continue
        offsets, after = run
        if offsets.size > limit - found:
            after = int(offsets[limit - found])
            offsets = offsets[: limit - found]
        if after > end:  # the last frame runs past the end of the data: leave it to the plain scan
            offsets, after = offsets[:-1], int(offsets[-1])
            if not offsets.size:
                plain, after = _scan_frames_python(plain_view, offset, 1, end)
                if not plain:
                    break
                offsets = np.asarray(plain, dtype=np.int64)
        parts.append(offsets)
        found += offsets.size
        offset = after
    frames = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    return frames, offset


class MessageBlock(NamedTuple):
    """Consecutive frames of a day file: ``frames[i]`` is the offset of message i's length prefix."""

    buffer: np.ndarray  # the whole file as uint8 (memory-mapped)
    frames: np.ndarray  # int64 frame offsets
    end: int  # offset just after the last frame
    first_index: int  # index (0-based) of the first message of the block in the file

    @property
    def count(self) -> int:  # type: ignore[override]  # the field's name; shadows tuple.count on purpose
        return int(self.frames.size)

    @property
    def message_offsets(self) -> np.ndarray:
        return self.frames + LENGTH_PREFIX_SIZE

    @property
    def frame_ends(self) -> np.ndarray:
        """Offset after each frame (the next frame's offset, or ``end`` for the last)."""
        ends = np.empty_like(self.frames)
        ends[:-1] = self.frames[1:]
        if self.frames.size:
            ends[-1] = self.end
        return ends

    def headers(self) -> itch.HeaderColumns:
        return itch.decode_headers(self.buffer, self.message_offsets)

    def message(self, i: int) -> bytes:
        start = int(self.frames[i]) + LENGTH_PREFIX_SIZE
        stop = int(self.frames[i + 1]) if i + 1 < self.count else self.end
        return self.buffer[start:stop].tobytes()


class DayFileReader:
    """A memory-mapped day file read as blocks of frames, raw messages or decoded messages."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._file = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        size = os.fstat(self._file.fileno()).st_size
        # mmap cannot map an empty file; an empty day file is simply one with no blocks.
        self._map: mmap.mmap | None = (
            mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        )
        self.size = size
        self._index: np.ndarray | None = None
        self.buffer = np.frombuffer(self._map, dtype=np.uint8) if self._map is not None else np.empty(0, np.uint8)

    def __enter__(self) -> DayFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.buffer = np.empty(0, np.uint8)  # drop the export before closing the map
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view: closed when collected
                self._map.close()
            self._map = None
        self._file.close()

    def blocks(self, block_messages: int = DEFAULT_BLOCK_MESSAGES, start: int = 0) -> Iterator[MessageBlock]:
        """Consecutive blocks of up to ``block_messages`` frames; raises DayFileError on a truncated tail.

        After :meth:`index` (or :meth:`verify`) the blocks are slices of the kept index: no scanning."""
        if block_messages <= 0:
            raise DayFileError("block_messages must be positive")
        if self._index is not None and start == 0:
            index = self._index
            for first in range(0, index.size, block_messages):
                frames = index[first : first + block_messages]
                end = int(index[first + block_messages]) if first + block_messages < index.size else self.size
                yield MessageBlock(self.buffer, frames, end, first)
            return
        source = self._map if self._map is not None else b""
        offset = start
        count = 0
        while offset < self.size:
            frames, end = scan_frames(source, offset, block_messages)
            if frames.size == 0:
                raise self._truncated(offset)
            yield MessageBlock(self.buffer, frames, end, count)
            count += frames.size
            offset = end

    def _truncated(self, offset: int) -> DayFileError:
        return DayFileError(
            f"{self.path}: truncated day file (truncated frame at byte {offset}, {self.size - offset} bytes left)"
        )

    def index(self) -> np.ndarray:
        """Every frame's offset (int64; 8 bytes a message, about a quarter of the file), scanned once and kept
        for :meth:`blocks`. DayFileError when the file ends inside a frame (truncated)."""
        if self._index is None:
            frames, end = scan_frames(self._map if self._map is not None else b"", 0, 1 << 62)
            if end != self.size:
                raise self._truncated(end)
            self._index = frames
        return self._index

    def verify(self) -> int:
        """Check the whole file (see :meth:`index`); its message count."""
        return int(self.index().size)

    def raw_messages(self) -> Iterator[bytes]:
        """Every message's bytes, without the length prefix."""
        for block in self.blocks():
            for i in range(block.count):
                yield block.message(i)

    def __iter__(self) -> Iterator[itch.Message]:
        for raw in self.raw_messages():
            yield itch.decode(raw)


class DayFileWriter:
    """Appends framed messages to a day file, buffered.

    Given a path, the writer fills a temporary file next to it and renames it to the path on :meth:`close`,
    so a day file is either complete or absent: an error or Ctrl-C in between (``__exit__`` with an exception,
    or :meth:`abort`) removes the temporary file and leaves whatever was at the path untouched.
    """

    def __init__(self, target: str | os.PathLike[str] | BinaryIO) -> None:
        self.path: str | None = None
        self._temporary: str | None = None
        if isinstance(target, str | os.PathLike):
            self.path = os.fspath(target)
            directory, name = os.path.split(os.path.abspath(self.path))
            fd, self._temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=directory)
            self._file: BinaryIO = os.fdopen(fd, "wb")
            self._owns = True
        else:
            self._file = target
            self._owns = False
        self._pending = bytearray()
        self.messages = 0
        self.bytes_written = 0

    def __enter__(self) -> DayFileWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write_raw(self, message: bytes) -> None:
        """One message given as its wire bytes (the length prefix is added here)."""
        if len(message) > 0xFFFF:
            raise DayFileError(f"message of {len(message)} bytes does not fit a 16-bit length prefix")
        self._pending += len(message).to_bytes(LENGTH_PREFIX_SIZE, "big")
        self._pending += message
        self.messages += 1
        if len(self._pending) >= _WRITE_BUFFER_BYTES:
            self.flush()

    def write(self, message: itch.Message) -> None:
        self.write_raw(itch.encode(message))

    def write_all(self, messages: Iterable[itch.Message]) -> None:
        for message in messages:
            self.write(message)

    def write_frames(self, frames: bytes | memoryview | np.ndarray, count: int) -> None:
        """Already framed bytes holding ``count`` messages (the synthetic generator's fast path)."""
        self.flush()
        data = memoryview(frames).cast("B") if not isinstance(frames, np.ndarray) else memoryview(frames.data)
        self._file.write(data)
        self.bytes_written += len(data)
        self.messages += count

    def flush(self) -> None:
        if self._pending:
            self._file.write(self._pending)
            self.bytes_written += len(self._pending)
            self._pending.clear()

    def close(self) -> None:
        """Flush; for a path, move the complete file into place (atomically)."""
        if self._file.closed:
            return
        self.flush()
        if self._owns:
            self._file.close()
            if self._temporary is not None and self.path is not None:
                os.chmod(self._temporary, 0o666 & ~_umask())
                os.replace(self._temporary, self.path)
                self._temporary = None
        else:
            self._file.flush()

    def abort(self) -> None:
        """Give up: for a path, remove the temporary file (the path keeps what it had)."""
        self._pending.clear()
        if self._owns:
            self._file.close()
            if self._temporary is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._temporary)
                self._temporary = None


def _umask() -> int:
    """The process umask, read without changing it (os.umask would, for a moment, for every thread)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def read_messages(path: str | os.PathLike[str]) -> list[itch.Message]:
    """Every message of a (small) day file, decoded."""
    with DayFileReader(path) as reader:
        return list(reader)
