"""TaggedFlowControl (``fc=tagged,g:<tag>[/<min group size>]``): only receivers whose status messages carry the
group tag hold the sender back; the minimum group size gates the limit and the connection (sans-IO)."""

from __future__ import annotations

from logbuf.driver.udp import TaggedFlowControl
from logbuf.driver.udp.flow_control import group_tag_of
from logbuf.logbuffer import descriptor as d
from logbuf.protocol import StatusMessage

T = 64 * 1024
BITS = d.position_bits_to_shift(T)
INITIAL = 3
WINDOW = 16 * 1024
S = 1_000_000_000


def sm(receiver: int, position: int, tag: int | None = None, flags: int = 0) -> StatusMessage:
    feedback = b"" if tag is None else tag.to_bytes(8, "little", signed=True)
    return StatusMessage(1, 2, INITIAL + position // T, position % T, WINDOW, receiver, flags, feedback)


def on_sm(fc: TaggedFlowControl, message: StatusMessage, snd_lmt: int, now: int = 0) -> int:
    return fc.on_status_message(message, snd_lmt, BITS, INITIAL, now)


def test_the_group_tag_is_the_8_byte_extension() -> None:
    assert group_tag_of(sm(1, 0, tag=-7)) == -7
    assert group_tag_of(sm(1, 0)) is None
    assert group_tag_of(StatusMessage(1, 2, 0, 0, 0, 1, 0, b"\x07\0\0\0")) is None  # not 8 bytes: no tag


def test_an_untagged_slow_receiver_does_not_hold_the_sender_back() -> None:
    fc = TaggedFlowControl(7)
    lmt = on_sm(fc, sm(1, 1000, tag=7), 0)
    assert lmt == 1000 + WINDOW and fc.receiver_count == 1
    lmt = on_sm(fc, sm(2, 0), lmt)  # untagged, behind: not tracked, the limit stays
    assert lmt == 1000 + WINDOW and fc.receiver_count == 1
    lmt = on_sm(fc, sm(1, 9000, tag=7), lmt)
    assert lmt == 9000 + WINDOW
    assert fc.on_idle(1, lmt, 9000) == 9000 + WINDOW


def test_a_slow_tagged_receiver_holds_the_sender_back() -> None:
    fc = TaggedFlowControl(7)
    lmt = on_sm(fc, sm(1, 1000, tag=7), 0)
    lmt = on_sm(fc, sm(2, 1200, tag=7), lmt)
    lmt = on_sm(fc, sm(1, 20000, tag=7), lmt)
    assert lmt == 1200 + WINDOW  # the slowest tagged receiver's limit (never moved back by an SM)
    assert fc.on_idle(1, lmt, 5000) == 1200 + WINDOW
    # another group's tag counts as untagged
    assert on_sm(fc, sm(3, 0, tag=8), lmt) == lmt and fc.receiver_count == 2


def test_a_tagged_receiver_more_than_a_window_behind_does_not_join() -> None:
    fc = TaggedFlowControl(7)
    lmt = on_sm(fc, sm(1, 4 * WINDOW, tag=7), 0)
    assert on_sm(fc, sm(2, WINDOW // 2, tag=7), lmt) == lmt and fc.receiver_count == 1


def test_the_minimum_group_size_gates_the_limit_and_the_connection() -> None:
    fc = TaggedFlowControl(7, group_min_size=2)
    assert on_sm(fc, sm(1, 1000, tag=7), 0) == 0 and not fc.is_connected
    assert on_sm(fc, sm(9, 5000), 0) == 0 and not fc.is_connected  # an untagged one does not count
    lmt = on_sm(fc, sm(2, 1100, tag=7), 0)
    assert lmt == 1000 + WINDOW and fc.is_connected
    # one goes silent: below the group's size the limit holds where it was and the publication disconnects
    assert fc.on_idle(6 * S, lmt, 1000) == lmt and fc.receiver_count == 0 and not fc.is_connected


def test_with_no_tagged_receiver_any_status_message_moves_the_limit() -> None:
    fc = TaggedFlowControl(7)
    assert on_sm(fc, sm(1, 3000), 0) == 3000 + WINDOW and fc.receiver_count == 0 and fc.is_connected
    assert fc.on_idle(6 * S, 3000 + WINDOW, 3000) == 3000 + WINDOW and not fc.is_connected


def test_receivers_at_end_of_stream_leave_the_group() -> None:
    fc = TaggedFlowControl(7)
    lmt = on_sm(fc, sm(1, 1000, tag=7), 0)
    on_sm(fc, sm(1, 1000, tag=7, flags=0x40), lmt)
    assert fc.receivers_at_end_of_stream
    fc.on_idle(1, lmt, 1000)
    assert fc.receiver_count == 0
