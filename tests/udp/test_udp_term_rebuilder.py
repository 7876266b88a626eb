"""TermRebuilder: frames land at their term offset, duplicates are left alone, subscribers read the result."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from logbuf import Image, LogBuffers, Position
from logbuf.driver.udp import TermRebuilder
from logbuf.protocol import DataHeader, FrameType, encode_data_frame

T = 64 * 1024


def frames(term_offset: int, *payloads: bytes, term_id: int = 5) -> bytes:
    out = b""
    for payload in payloads:
        out += encode_data_frame(payload, term_offset=term_offset + len(out), session_id=77, stream_id=1001,
                                 term_id=term_id)
    return out


def read_all(log: LogBuffers, position: int = 0) -> list[bytes]:
    got: list[bytes] = []
    image = Image(log, Position.standalone(position))
    while image.poll(lambda buf, _: got.append(bytes(buf)), 100):
        pass
    return got


@pytest.fixture
def log(make_log: Callable[..., LogBuffers]) -> LogBuffers:
    return make_log(term_length=T, initial_term_id=5)


def test_datagram_is_written_at_its_offset_and_readable(log: LogBuffers) -> None:
    rebuilder = TermRebuilder(log)
    first, second = frames(0, b"a" * 10, b"b" * 50), frames(160, b"c" * 5)
    assert rebuilder.insert(0, 160, second, len(second)) == 64  # out of order: the reader waits for the gap
    assert read_all(log) == []
    assert rebuilder.insert(0, 0, first, len(first)) == 64 + 96
    assert log.terms.get_bytes(0, len(first)) == first
    assert read_all(log) == [b"a" * 10, b"b" * 50, b"c" * 5]


def test_duplicate_is_not_rewritten(log: LogBuffers) -> None:
    rebuilder = TermRebuilder(log)
    original = frames(0, b"a" * 10)
    rebuilder.insert(0, 0, original, len(original))
    impostor = frames(0, b"X" * 10)
    assert rebuilder.insert(0, 0, impostor, len(impostor)) == 0
    assert log.terms.get_bytes(0, 64) == original


def test_datagram_overlapping_what_we_have_fills_only_the_rest(log: LogBuffers) -> None:
    rebuilder = TermRebuilder(log)
    head = frames(0, b"a" * 10)
    rebuilder.insert(0, 0, head, len(head))
    retransmit = frames(0, b"a" * 10, b"b" * 10, b"c" * 10)  # batched differently from the original
    assert rebuilder.insert(0, 0, retransmit, len(retransmit)) == 128
    assert read_all(log) == [b"a" * 10, b"b" * 10, b"c" * 10]


def test_header_only_pad_covers_the_rest_of_the_term(log: LogBuffers) -> None:
    rebuilder = TermRebuilder(log)
    body = frames(0, b"a" * 10)
    rebuilder.insert(0, 0, body, len(body))
    pad = DataHeader(T - 64, 64, 77, 1001, 5, frame_type=FrameType.PAD).encode()
    assert rebuilder.insert(0, 64, pad, 32) == 32
    next_term = frames(0, b"n" * 3, term_id=6)
    rebuilder.insert(1, 0, next_term, len(next_term))
    assert read_all(log) == [b"a" * 10, b"n" * 3]


def test_fill_gap_writes_a_pad_the_reader_skips(log: LogBuffers) -> None:
    rebuilder = TermRebuilder(log)
    after = frames(256, b"z" * 8)
    rebuilder.insert(0, 256, after, len(after))
    rebuilder.fill_gap(0, 5, 0, 256)
    assert log.terms.get_i32(0) == 256 and log.terms.get_bytes(6, 2) == FrameType.PAD.to_bytes(2, "little")
    assert read_all(log) == [b"z" * 8]
    with pytest.raises(ValueError):
        rebuilder.fill_gap(0, 5, 0, 48)


def test_frames_past_the_term_are_refused(log: LogBuffers) -> None:
    rebuilder = TermRebuilder(log)
    data = frames(T - 32, b"a" * 10)
    with pytest.raises(ValueError):
        rebuilder.insert(0, T - 32, data, len(data))
    assert rebuilder.is_present(0, T - 32) is False
