"""Unicast and min-multicast flow control: the sender limit from status messages, receiver tracking."""

from __future__ import annotations

from logbuf.driver.udp import MinMulticastFlowControl, UnicastFlowControl
from logbuf.protocol import END_OF_STREAM_FLAG, StatusMessage

BITS = 16  # term length 64 KiB
INITIAL = 100
S = 1_000_000_000


def sm(position: int, window: int = 32768, receiver_id: int = 1, flags: int = 0) -> StatusMessage:
    return StatusMessage.at_position(7, 1001, position, BITS, INITIAL, window, receiver_id, flags)


def test_unicast_limit_is_sm_position_plus_window_and_only_grows() -> None:
    fc = UnicastFlowControl()
    assert fc.receiver_count == 0
    limit = fc.on_status_message(sm(1000 * 32), 0, BITS, INITIAL, 0)
    assert limit == 32000 + 32768 and fc.receiver_count == 1
    limit = fc.on_status_message(sm(3 * 65536 + 64), limit, BITS, INITIAL, 1)  # across terms
    assert limit == 3 * 65536 + 64 + 32768
    stale = fc.on_status_message(sm(64), limit, BITS, INITIAL, 2)  # a reordered, older SM
    assert stale == limit
    assert fc.on_idle(3, limit, 0) == limit


def test_unicast_receiver_times_out_after_silence() -> None:
    fc = UnicastFlowControl(receiver_timeout_ns=5 * S)
    limit = fc.on_status_message(sm(0), 0, BITS, INITIAL, 0)
    assert fc.on_idle(5 * S, limit, 0) == limit and fc.receiver_count == 1
    assert fc.on_idle(5 * S + 1, limit, 0) == limit and fc.receiver_count == 0


def test_min_multicast_follows_the_slowest_receiver() -> None:
    fc = MinMulticastFlowControl()
    limit = fc.on_status_message(sm(64_000, receiver_id=1), 0, BITS, INITIAL, 0)
    assert limit == 64_000 + 32768
    limit = fc.on_status_message(sm(1_024, receiver_id=2), limit, BITS, INITIAL, 0)
    assert limit == 1_024 + 32768 and fc.receiver_count == 2
    limit = fc.on_status_message(sm(90_000, receiver_id=1), limit, BITS, INITIAL, 1)
    assert limit == 1_024 + 32768  # receiver 2 still holds the sender back
    limit = fc.on_status_message(sm(70_000, receiver_id=2), limit, BITS, INITIAL, 2)
    assert limit == 70_000 + 32768
    limit = fc.on_status_message(sm(2_048, receiver_id=2), limit, BITS, INITIAL, 3)  # reordered, older
    assert limit == 70_000 + 32768


def test_min_multicast_drops_a_silent_receiver() -> None:
    fc = MinMulticastFlowControl(receiver_timeout_ns=5 * S)
    fc.on_status_message(sm(64_000, receiver_id=1), 0, BITS, INITIAL, 0)
    limit = fc.on_status_message(sm(1_024, receiver_id=2), 0, BITS, INITIAL, 2 * S)
    fc.on_status_message(sm(96_000, receiver_id=1), limit, BITS, INITIAL, 6 * S)
    assert fc.on_idle(7 * S, limit, 0) == 1_024 + 32768 and fc.receiver_count == 2
    limit = fc.on_idle(7 * S + 1, limit, 0)  # receiver 2 silent for more than 5 s
    assert limit == 96_000 + 32768 and fc.receiver_count == 1 and set(fc.receivers) == {1}


def test_min_multicast_without_receivers_keeps_the_limit() -> None:
    fc = MinMulticastFlowControl(receiver_timeout_ns=5 * S)
    assert fc.on_idle(0, 4096, 1024) == 4096
    fc.on_status_message(sm(0), 0, BITS, INITIAL, 0)
    assert fc.on_idle(10 * S, 4096, 1024) == 4096 and fc.receiver_count == 0


def test_end_of_stream_flag_is_recorded_per_receiver() -> None:
    fc = MinMulticastFlowControl()
    fc.on_status_message(sm(0, receiver_id=1, flags=END_OF_STREAM_FLAG), 0, BITS, INITIAL, 0)
    fc.on_status_message(sm(0, receiver_id=2), 0, BITS, INITIAL, 0)
    assert fc.receivers[1].end_of_stream and not fc.receivers[2].end_of_stream
