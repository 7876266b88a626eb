"""ReceiverDispatcher: invalid packets, SETUP elicitation, image creation, routing, removal and cool-down."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from logbuf import LogBuffers
from logbuf.driver.udp import CreateImage, ImageReceiver, ImageRemoved, ImageState, ReceiverDispatcher, Reply
from logbuf.protocol import SEND_SETUP_FLAG, DataHeader, Nak, SetupFrame, StatusMessage, encode_data_frame

T = 64 * 1024
MS = 1_000_000
S = 1_000_000_000
SETUP = SetupFrame(1024, 77, 1001, 5, 6, T, 1408)


def data(term_offset: int = 1024, session_id: int = 77, stream_id: int = 1001) -> bytes:
    return encode_data_frame(b"hello", term_offset=term_offset, session_id=session_id, stream_id=stream_id,
                             term_id=6)


@pytest.fixture
def dispatcher() -> ReceiverDispatcher:
    d = ReceiverDispatcher(receiver_id=42)
    d.add_subscription(1001)
    return d


def add_image(d: ReceiverDispatcher, make_log: Callable[..., LogBuffers], now: int = 0) -> ImageReceiver:
    log = make_log(term_length=T, initial_term_id=5, session_id=77, stream_id=1001)
    image = ImageReceiver(log, SETUP.join_position(), now, receiver_id=d.receiver_id, counters=d.counters)
    d.add_image(image, "sender:1")
    return image


def test_malformed_datagrams_are_counted_and_dropped(dispatcher: ReceiverDispatcher) -> None:
    for junk in (b"", b"\x00" * 7, b"\xff" * 64, data()[:40], Nak(1, 2, 3, 64, 5).encode()[:27]):
        assert dispatcher.on_datagram(junk, 0, "x") == []
    assert dispatcher.counters.invalid_packets == 5
    assert dispatcher.counters.bytes_received == 0 + 7 + 64 + 40 + 27


def test_data_for_an_unknown_session_asks_for_setup_at_a_bounded_rate(dispatcher: ReceiverDispatcher) -> None:
    events = dispatcher.on_datagram(data(), 0, "sender:1")
    assert events == [Reply(StatusMessage(77, 1001, 0, 0, 0, 42, SEND_SETUP_FLAG), "sender:1")]
    assert dispatcher.on_datagram(data(), 50 * MS, "sender:1") == []
    assert len(dispatcher.on_datagram(data(), 100 * MS, "sender:1")) == 1
    assert dispatcher.on_datagram(data(stream_id=9), 0, "sender:1") == []  # not subscribed


def test_setup_creates_one_image(dispatcher: ReceiverDispatcher, make_log: Callable[..., LogBuffers]) -> None:
    assert dispatcher.on_datagram(SETUP.encode(), 0, "sender:1") == [CreateImage(SETUP, "sender:1")]
    assert dispatcher.on_datagram(SETUP.encode(), 100 * MS, "sender:1") == []  # being created
    assert dispatcher.on_datagram(data(), 150 * MS, "sender:1") == []  # no SETUP request while pending
    assert dispatcher.on_datagram(SETUP.encode(), 1100 * MS, "sender:1") == [CreateImage(SETUP, "sender:1")]
    assert dispatcher.on_datagram(SETUP._replace(stream_id=9).encode(), 0, "sender:1") == []


def test_routing_to_the_image_and_polling(dispatcher: ReceiverDispatcher, make_log: Callable[..., LogBuffers]) -> None:
    image = add_image(dispatcher, make_log)
    dispatcher.on_datagram(data(), 1, "sender:1")
    assert image.hwm_position == SETUP.join_position() + 64
    assert image.rebuild_position == image.hwm_position  # in order: contiguous at once, no gap scan needed
    events = dispatcher.poll(2, lambda img: SETUP.join_position())  # no subscriber has read anything yet
    assert [type(e.frame) for e in events] == [StatusMessage] and events[0].destination == "sender:1"
    assert events[0].frame.consumption_term_offset == 1024  # the new image announces its join position
    assert image.rebuild_position == SETUP.join_position() + 64
    dispatcher.on_datagram(SETUP.encode(), 3, "sender:1")  # sender has not heard us: answer at once
    assert len(dispatcher.poll(4, lambda img: img.rebuild_position)) == 1


def test_control_frames_for_senders_are_ignored(dispatcher: ReceiverDispatcher) -> None:
    assert dispatcher.on_datagram(StatusMessage(77, 1001, 0, 0, 0, 1).encode(), 0) == []
    assert dispatcher.on_datagram(Nak(77, 1001, 6, 0, 64).encode(), 0) == []
    assert dispatcher.counters.invalid_packets == 0


def test_timed_out_image_is_removed_then_cools_down(
    dispatcher: ReceiverDispatcher, make_log: Callable[..., LogBuffers]
) -> None:
    add_image(dispatcher, make_log)
    dispatcher.poll(0, lambda img: img.rebuild_position)
    events = dispatcher.poll(10 * S + 1, lambda img: img.rebuild_position)
    assert events == [ImageRemoved(77, 1001, ImageState.TIMED_OUT)] and dispatcher.image(77, 1001) is None
    assert dispatcher.on_datagram(SETUP.encode(), 10 * S + 2, "sender:1") == []  # cooling down
    assert dispatcher.on_datagram(data(), 10 * S + 3, "sender:1") == []
    assert dispatcher.on_datagram(data(), 11 * S + 1, "sender:1") != []  # rejoin: ask for SETUP again


def test_removing_the_subscription_drains_its_images_with_eos_status_messages(
    dispatcher: ReceiverDispatcher, make_log: Callable[..., LogBuffers]
) -> None:
    """As aeronmd: the image takes no more data, sends SMs with the EOS flag every SM timeout for five of them
    (a min or tagged sender lets the receiver go), then is removed."""
    add_image(dispatcher, make_log)
    dispatcher.poll(0, lambda img: img.rebuild_position)
    dispatcher.remove_subscription(1001, now_ns=S)
    assert dispatcher.on_datagram(data(), S) == [] and dispatcher.image(77, 1001) is None
    sms = []
    now = S
    while not (events := dispatcher.poll(now, lambda img: img.rebuild_position)) or isinstance(events[-1], Reply):
        sms += [e.frame for e in events if isinstance(e, Reply)]
        now += 50_000_000
    assert events == [ImageRemoved(77, 1001, ImageState.REMOVED)] and now == S + 5 * 200_000_000
    assert len(sms) == 5 and all(isinstance(f, StatusMessage) and f.is_end_of_stream for f in sms)
    assert dispatcher.poll(now + S, lambda img: img.rebuild_position) == []


def test_heartbeat_of_an_unknown_session_also_asks_for_setup(dispatcher: ReceiverDispatcher) -> None:
    events = dispatcher.on_datagram(DataHeader.heartbeat(77, 1001, 6, 0).encode(), 0, "s")
    assert len(events) == 1 and events[0].frame.is_setup_requested


def test_an_ended_stream_is_not_joined(dispatcher: ReceiverDispatcher) -> None:
    eos = DataHeader.heartbeat(77, 1001, 6, 0, end_of_stream=True).encode()
    assert dispatcher.on_datagram(eos, 0, "s") == []
