"""Subscriber side: poll, controlled_poll, batch_poll, positions, and hostile frames in shared memory."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logbuf import ControlledPollAction, LogCorruptedError
from logbuf.logbuffer.term_scanner import scan_for_availability


def test_poll_respects_fragment_limit_and_publishes_position(pipe) -> None:
    p = pipe()
    for i in range(5):
        p.pub.offer(bytes([i]) * 8)
    seen = []
    assert p.image.poll(lambda b, h: seen.append((bytes(b), h.position, h.session_id, h.stream_id)), 2) == 2
    assert p.sub_pos.get() == 128
    assert seen == [(b"\x00" * 8, 64, 77, 1001), (b"\x01" * 8, 128, 77, 1001)]
    assert p.image.poll(lambda b, h: None, 10) == 3
    assert p.sub_pos.get() == p.pub.position == 320
    assert p.image.poll(lambda b, h: None, 10) == 0


def test_header_fields(pipe) -> None:
    p = pipe(initial_term_id=100)
    p.pub.offer(b"abc", reserved_value=-1)
    headers = []
    p.image.poll(lambda b, h: headers.append((h.term_id, h.term_offset, h.flags, h.type, h.frame_length,
                                              h.reserved_value, h.position)), 1)
    assert headers == [(100, 0, 0xC0, 1, 35, -1, 64)]


def test_handler_exception_consumes_that_fragment_and_propagates(pipe) -> None:
    p = pipe()
    for m in (b"a", b"boom", b"c"):
        p.pub.offer(m)

    def handler(buf, header):
        if bytes(buf) == b"boom":
            raise ValueError("bad message")

    with pytest.raises(ValueError):
        p.image.poll(handler, 10)
    assert p.sub_pos.get() == 128  # past "a" and "boom"
    assert [g[0] for g in p.drain()] == [b"c"]


def test_controlled_poll_actions(pipe) -> None:
    p = pipe()
    for i in range(6):
        p.pub.offer(bytes([i]))
    seen: list[int] = []
    actions = iter([ControlledPollAction.CONTINUE, ControlledPollAction.ABORT])

    def handler(buf, header):
        seen.append(buf[0])
        return next(actions)

    assert p.image.controlled_poll(handler, 10) == 1
    assert p.sub_pos.get() == 32 * 2 * 1 and seen == [0, 1]  # fragment 1 aborted: delivered again next time

    seen.clear()
    actions = iter([ControlledPollAction.COMMIT, ControlledPollAction.BREAK])
    positions = []

    def committing(buf, header):
        seen.append(buf[0])
        positions.append(p.sub_pos.get())
        return next(actions)

    assert p.image.controlled_poll(committing, 10) == 2
    assert seen == [1, 2]
    assert positions == [64, 128]  # COMMIT published the position before the next fragment
    assert p.sub_pos.get() == 192
    assert p.image.controlled_poll(lambda b, h: ControlledPollAction.CONTINUE, 10) == 3
    assert p.sub_pos.get() == p.pub.position


def test_batch_poll_arrays_and_commit(pipe) -> None:
    p = pipe()
    messages = [bytes([i]) * (i + 1) for i in range(10)]
    p.pub.offer_batch(messages, reserved_values=list(range(100, 110)))
    batch = p.image.batch_poll(4)
    assert batch.count == 4
    assert batch.lengths.tolist() == [1, 2, 3, 4]
    assert batch.reserved_values.tolist() == [100, 101, 102, 103]
    assert batch.positions.tolist() == [64, 128, 192, 256]
    assert [batch.payload(i).tobytes() for i in range(4)] == messages[:4]
    assert p.sub_pos.get() == 0  # not committed yet: the views are still protected
    batch.commit()
    assert p.sub_pos.get() == 256
    with p.image.batch_poll() as rest:
        data, starts = rest.gather()
        assert data.tobytes() == b"".join(messages[4:])
        assert starts.tolist() == np.cumsum([0] + [len(m) for m in messages[4:-1]]).tolist()
        assert (rest.flags == 0xC0).all()
    assert p.sub_pos.get() == p.pub.position


def _write_raw(log, offset: int, data: bytes) -> None:
    log.terms.view[offset : offset + len(data)] = data


@pytest.mark.parametrize(
    "length",
    [5, 31, 64 * 1024 + 32, 2**31 - 1],
)
def test_impossible_frame_length_raises_not_crashes(pipe, length) -> None:
    p = pipe(term_length=64 * 1024)
    p.pub.offer(b"good")
    # a hostile positive length after the good frame (in a header that says where it is: the length alone is bad)
    _write_raw(p.log, 64, struct.pack("<iBBHi", length, 0, 0xC0, 1, 64))
    got = []
    assert p.image.poll(lambda b, h: got.append(bytes(b)), 10) == 1
    assert got == [b"good"]
    with pytest.raises(LogCorruptedError) as info:
        p.image.poll(lambda b, h: got.append(bytes(b)), 10)
    assert info.value.position == 64
    with pytest.raises(LogCorruptedError):
        p.image.batch_poll()
    with pytest.raises(LogCorruptedError):
        scan_for_availability(p.log.term_pointer(0), p.log.term_length, 64, 4096)


def test_unknown_frame_type_is_corruption(pipe) -> None:
    p = pipe()
    _write_raw(p.log, 0, struct.pack("<iBBH", 64, 0, 0xC0, 0x55))
    with pytest.raises(LogCorruptedError):
        p.image.poll(lambda b, h: None, 10)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=8, max_size=4096), at=st.integers(min_value=0, max_value=2047))
def test_random_garbage_never_escapes_the_term(pipe, garbage, at) -> None:
    p = pipe(term_length=64 * 1024)
    offset = (p.log.term_length - 4096) if at % 2 else at * 32 % (p.log.term_length - 4096)
    _write_raw(p.log, offset, garbage)
    p.image._position = offset - offset % 32
    delivered = []
    try:
        while p.image.poll(lambda b, h: delivered.append(len(b)), 100):
            pass
    except LogCorruptedError:
        pass
    # anything delivered lies inside the term
    assert all(0 <= n <= p.log.term_length for n in delivered)
    assert p.image.position <= p.log.term_length
    p.log.terms.view[offset : offset + len(garbage)] = bytes(len(garbage))


def test_scanner_takes_whole_frames_up_to_limit_and_leading_pad(pipe) -> None:
    p = pipe(term_length=64 * 1024)
    for _ in range(4):
        p.pub.offer(b"s" * 100)  # 160 aligned each
    term0 = p.log.term_pointer(0)
    assert scan_for_availability(term0, 64 * 1024, 0, 400) == (320, 0)  # never splits a frame
    assert scan_for_availability(term0, 64 * 1024, 0, 4096) == (640, 0)
    claim = p.pub.try_claim(10)
    claim.abort()  # a PAD frame of 64 bytes at 640
    p.pub.offer(b"t")
    assert scan_for_availability(term0, 64 * 1024, 480, 4096) == (160, 0)  # stops before the pad
    assert scan_for_availability(term0, 64 * 1024, 640, 4096) == (32, 32)  # pad first: header only


@pytest.mark.parametrize("length", [64, 96, 200])
def test_a_length_that_lands_inside_another_frame_is_corruption_for_every_reader(pipe, length: int) -> None:
    p = pipe(term_length=64 * 1024)
    for i in range(6):
        assert p.pub.offer(bytes([65 + i]) * 96) > 0  # 128-byte frames
    _write_raw(p.log, 2 * 128, struct.pack("<i", length))  # the third frame's length
    got: list[bytes] = []
    assert p.image.poll(lambda b, h: got.append(bytes(b)), 10) == 2  # the two before it, intact
    assert got == [b"A" * 96, b"B" * 96]
    with pytest.raises(LogCorruptedError) as info:
        p.image.poll(lambda b, h: got.append(bytes(b)), 10)
    assert info.value.position == 2 * 128 and len(got) == 2
    with pytest.raises(LogCorruptedError):
        p.image.batch_poll()


def test_a_header_that_is_not_where_it_says_is_corruption(pipe) -> None:
    p = pipe(term_length=64 * 1024)
    assert p.pub.offer(b"x" * 10) > 0
    _write_raw(p.log, 8, struct.pack("<i", 4096))  # the term-offset field
    with pytest.raises(LogCorruptedError):
        p.image.poll(lambda b, h: None, 10)
