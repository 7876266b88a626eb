"""Distinct error log: record layout decoded independently, distinct/count/timestamps, full log."""

from __future__ import annotations

import struct

import pytest

from logbuf.cnc import error_log as el
from logbuf.native import AtomicBuffer

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms


def decode(raw: bytes) -> list[tuple[int, int, int, int, str]]:
    """Independent decoding: (offset, count, last ts, first ts, text) per record, 8-byte aligned."""
    out, offset = [], 0
    while offset + 24 <= len(raw):
        length, count, last, first = struct.unpack_from("<iiqq", raw, offset)
        if length == 0:
            break
        out.append((offset, count, last, first, bytes(raw[offset + 24 : offset + length]).decode()))
        offset += (length + 7) & ~7
    return out


def test_layout_constants_match_aeron():
    assert (el.LENGTH_OFFSET, el.OBSERVATION_COUNT_OFFSET) == (0, 4)
    assert (el.LAST_OBSERVATION_TIMESTAMP_OFFSET, el.FIRST_OBSERVATION_TIMESTAMP_OFFSET) == (8, 16)
    assert (el.ENCODED_ERROR_OFFSET, el.RECORD_ALIGNMENT) == (24, 8)


def test_distinct_errors_counted_with_timestamps():
    raw = bytearray(4096)
    clock = Clock()
    log = el.DistinctErrorLog(AtomicBuffer(raw), clock)
    assert log.record("first error")
    clock.now_ms = 2_000
    assert log.record("second, longer error text")
    clock.now_ms = 3_000
    assert log.record("first error")
    assert log.record("first error")
    assert log.distinct_count == 2
    assert decode(raw) == [
        (0, 3, 3_000, 1_000, "first error"),
        (40, 1, 2_000, 2_000, "second, longer error text"),  # 24 + 11 = 35 -> next record at 40
    ]
    reader = el.ErrorLogReader(AtomicBuffer(raw))
    assert list(reader) == [(3, 1_000, 3_000, "first error"), (1, 2_000, 2_000, "second, longer error text")]
    assert [o.text for o in reader.read(since_timestamp_ms=2_500)] == ["first error"]


def test_exceptions_are_recorded_with_their_traceback():
    raw = bytearray(8192)
    log = el.DistinctErrorLog(AtomicBuffer(raw), Clock())

    def fail() -> None:
        raise ValueError("bad channel")

    for _ in range(2):
        try:
            fail()
        except ValueError as exc:
            assert log.record(exc)
    [(count, _, _, text)] = list(el.ErrorLogReader(AtomicBuffer(raw)))
    assert count == 2
    assert "ValueError: bad channel" in text and "fail" in text
    assert log.record(ValueError("bad channel"))  # never raised: no traceback, so distinct
    assert log.distinct_count == 2


def test_full_log_returns_false_but_still_counts_known_errors():
    raw = bytearray(64)
    log = el.DistinctErrorLog(AtomicBuffer(raw), Clock())
    assert log.record("x" * 30)  # 54 bytes -> next record at 56
    assert not log.record("does not fit")
    assert log.record("x" * 30)
    assert [o.count for o in el.ErrorLogReader(AtomicBuffer(raw))] == [2]


def test_reader_stops_at_hostile_length_and_log_reopens_after_existing_records():
    raw = bytearray(256)
    clock = Clock()
    log = el.DistinctErrorLog(AtomicBuffer(raw), clock)
    log.record("one")
    again = el.DistinctErrorLog(AtomicBuffer(raw), clock)  # takes over the existing records
    again.record("one")
    again.record("two")
    assert [(o.count, o.text) for o in el.ErrorLogReader(AtomicBuffer(raw))] == [(2, "one"), (1, "two")]
    struct.pack_into("<i", raw, 32, 10_000)  # "two"'s length now points past the buffer
    assert [o.text for o in el.ErrorLogReader(AtomicBuffer(raw))] == ["one"]
