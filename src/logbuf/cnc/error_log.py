"""The driver's distinct error log in cnc.dat (Aeron's ``DistinctErrorLog`` and ``ErrorLogReader``).

Each distinct error is recorded once and then only counted.  Records follow each other from offset 0,
each starting at an 8-byte boundary (Aeron's RECORD_ALIGNMENT = sizeof(long)), so the i64 timestamps are
naturally aligned for atomic access::

    0           4                   8                         16                         24
    +-----------+-------------------+-------------------------+--------------------------+---------------+
    | length    | observation count | last observation        | first observation        | encoded error |
    | i32       | i32 (atomic add)  | timestamp ms  i64       | timestamp ms  i64        | UTF-8 ...     |
    +-----------+-------------------+-------------------------+--------------------------+---------------+
    <--------------------------------------- length (header + text, unaligned) -------------------------->

A new error is written completely and its ``length`` stored last with release: a reader stops at the
first length of 0.  Observing it again adds 1 to the count (atomically) and release-stores the last
timestamp.  (Right after publication a reader may briefly see a count of 0, as in Aeron.)
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator
from typing import NamedTuple

from logbuf.cnc.layout import align
from logbuf.native import AtomicBuffer
from logbuf.units import epoch_ms

LENGTH_OFFSET = 0
OBSERVATION_COUNT_OFFSET = 4
LAST_OBSERVATION_TIMESTAMP_OFFSET = 8
FIRST_OBSERVATION_TIMESTAMP_OFFSET = 16
ENCODED_ERROR_OFFSET = 24
RECORD_ALIGNMENT = 8


def encode_error(error: BaseException | str) -> str:
    """The text recorded for ``error``: a string as is; an exception as its formatted traceback (so the same
    exception type and message raised from different places are distinct, as in Aeron)."""
    if isinstance(error, str):
        return error
    return "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip("\n")


class DistinctErrorLog:
    """Records distinct errors into ``buffer`` (single process; thread-safe within it)."""

    def __init__(self, buffer: AtomicBuffer, clock_ms: Callable[[], int] = epoch_ms) -> None:
        self._buffer = buffer
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._offsets: dict[str, int] = {}
        self._next_offset = 0
        # Continue after what is already there (e.g. a log reopened by the same driver).
        for offset, text in _walk(buffer):
            self._offsets.setdefault(text, offset)
            self._next_offset = align(offset + buffer.get_i32(offset + LENGTH_OFFSET), RECORD_ALIGNMENT)

    def record(self, error: BaseException | str) -> bool:
        """Records one observation; False if it is new and there is no room left for it."""
        timestamp_ms = self._clock_ms()
        text = encode_error(error)
        buffer = self._buffer
        with self._lock:
            offset = self._offsets.get(text)
            if offset is None:
                encoded = text.encode("utf-8")
                length = ENCODED_ERROR_OFFSET + len(encoded)
                offset = self._next_offset
                if offset + length > buffer.capacity:
                    return False
                buffer.put_bytes(offset + ENCODED_ERROR_OFFSET, encoded)
                buffer.put_i64(offset + FIRST_OBSERVATION_TIMESTAMP_OFFSET, timestamp_ms)
                buffer.put_i64(offset + LAST_OBSERVATION_TIMESTAMP_OFFSET, timestamp_ms)
                self._next_offset = align(offset + length, RECORD_ALIGNMENT)
                buffer.put_i32_release(offset + LENGTH_OFFSET, length)  # publishes the record
                self._offsets[text] = offset
        buffer.get_and_add_i32(offset + OBSERVATION_COUNT_OFFSET, 1)
        buffer.put_i64_release(offset + LAST_OBSERVATION_TIMESTAMP_OFFSET, timestamp_ms)
        return True

    @property
    def distinct_count(self) -> int:
        return len(self._offsets)


class ErrorObservation(NamedTuple):
    count: int  # type: ignore[assignment]  # Aeron's name for the field; shadows tuple.count on purpose
    first_timestamp_ms: int
    last_timestamp_ms: int
    text: str


def _walk(buffer: AtomicBuffer) -> Iterator[tuple[int, str]]:
    offset = 0
    capacity = buffer.capacity
    while offset + ENCODED_ERROR_OFFSET <= capacity:
        length = buffer.get_i32_acquire(offset + LENGTH_OFFSET)
        # Shared memory: stop at the end or at a length that cannot be a record.
        if length < ENCODED_ERROR_OFFSET or offset + length > capacity:
            return
        text = buffer.get_bytes(offset + ENCODED_ERROR_OFFSET, length - ENCODED_ERROR_OFFSET)
        yield offset, text.decode("utf-8", errors="replace")
        offset = align(offset + length, RECORD_ALIGNMENT)


class ErrorLogReader:
    """Reads a distinct error log (any process): ``for count, first, last, text in reader``."""

    def __init__(self, buffer: AtomicBuffer) -> None:
        self._buffer = buffer

    def read(self, since_timestamp_ms: int = 0) -> Iterator[ErrorObservation]:
        """Observations whose last timestamp is at or after ``since_timestamp_ms``."""
        buffer = self._buffer
        for offset, text in _walk(buffer):
            last = buffer.get_i64_acquire(offset + LAST_OBSERVATION_TIMESTAMP_OFFSET)
            if last >= since_timestamp_ms:
                yield ErrorObservation(
                    buffer.get_i32_acquire(offset + OBSERVATION_COUNT_OFFSET),
                    buffer.get_i64_acquire(offset + FIRST_OBSERVATION_TIMESTAMP_OFFSET),
                    last,
                    text,
                )

    def __iter__(self) -> Iterator[ErrorObservation]:
        return self.read()
