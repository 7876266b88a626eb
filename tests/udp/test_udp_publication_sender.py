"""PublicationSender: the composed sender of one network publication, driven by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from logbuf import ExclusivePublication, LogBuffers, Position
from logbuf.driver.udp import (
    MinMulticastFlowControl,
    OutgoingKind,
    PublicationSender,
    TaggedFlowControl,
    UnicastFlowControl,
)
from logbuf.driver.udp.flow_control import FlowControl
from logbuf.protocol import (
    REPLY_FLAG,
    ControlPacket,
    DataHeader,
    DataPacket,
    ErrorFrame,
    Nak,
    PacketKind,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    classify,
)
from logbuf.protocol.status_message import END_OF_STREAM_FLAG

T = 64 * 1024
MS = 1_000_000


class Rig:
    def __init__(self, make_log: Callable[..., LogBuffers], **kwargs: object) -> None:
        self.log = make_log(term_length=T, initial_term_id=5, session_id=77, stream_id=1001)
        self.publication = ExclusivePublication(self.log, Position.standalone(1 << 40))
        self.sender = PublicationSender(self.log, 0, **kwargs)  # type: ignore[arg-type]

    def sm(self, position: int, now: int, window: int = 32768, receiver_id: int = 9, flags: int = 0) -> None:
        self.sender.on_status_message(
            StatusMessage.at_position(77, 1001, position, 16, 5, window, receiver_id, flags), now)

    def send_all(self, now: int, max_datagrams: int = 8) -> list:
        out = self.sender.poll(now, max_datagrams)
        for item in out:
            assert self.sender.on_sent(item, len(item.buffer), now)
        return out


@pytest.fixture
def rig(make_log: Callable[..., LogBuffers]) -> Rig:
    return Rig(make_log)


def test_setup_first_and_no_data_before_a_status_message(rig: Rig) -> None:
    rig.publication.offer(b"early")
    out = rig.send_all(0)
    assert [o.kind for o in out] == [OutgoingKind.SETUP]
    assert classify(out[0].buffer) == ControlPacket((SetupFrame(0, 77, 1001, 5, 5, T, 1408),))
    assert not rig.sender.is_connected and rig.send_all(50 * MS) == []
    assert [o.kind for o in rig.send_all(100 * MS)] == [OutgoingKind.SETUP]
    assert rig.sender.counters.setups_sent == 2


def test_status_message_opens_the_window_and_data_flows(rig: Rig) -> None:
    rig.send_all(0)
    rig.sm(0, 1 * MS)
    assert rig.sender.is_connected and rig.sender.snd_lmt == 32768
    rig.publication.offer(b"a" * 10)
    rig.publication.offer(b"b" * 10)
    out = rig.send_all(2 * MS)
    assert [o.kind for o in out] == [OutgoingKind.DATA]
    packet = classify(out[0].buffer)
    assert isinstance(packet, DataPacket) and packet.frame_count == 2
    assert rig.sender.snd_pos == 128 and rig.sender.counters.bytes_sent == 40 + 128
    assert rig.send_all(200 * MS)[0].kind is OutgoingKind.HEARTBEAT  # no SETUP after the first SM


def test_heartbeat_carries_the_sender_position_and_eos(rig: Rig) -> None:
    rig.send_all(0)
    rig.sm(0, 0)
    rig.publication.offer(b"a" * 10)
    rig.send_all(1 * MS)
    assert rig.send_all(100 * MS) == []
    out = rig.send_all(101 * MS)
    assert classify(out[0].buffer).header == DataHeader.heartbeat(77, 1001, 5, 64)
    rig.sender.end_of_stream_position = 64
    out = rig.send_all(201 * MS)
    assert classify(out[0].buffer).header.is_end_of_stream and rig.sender.counters.heartbeats_sent == 2


def test_setup_requested_by_a_receiver_without_an_image(rig: Rig) -> None:
    rig.send_all(0)
    rig.sm(0, 1 * MS)
    rig.sm(0, 150 * MS, window=0, receiver_id=10, flags=0x80)
    assert rig.sender.snd_lmt == 32768  # a SETUP request is not flow-control input
    assert [o.kind for o in rig.send_all(150 * MS)] == [OutgoingKind.SETUP]
    assert rig.sender.counters.setups_sent == 2 and rig.send_all(200 * MS) == []


def test_nak_resends_the_term_bytes(rig: Rig) -> None:
    rig.send_all(0)
    rig.sm(0, 0)
    for i in range(6):
        rig.publication.offer(bytes([i]) * 600)  # 640-byte frames
    rig.send_all(1 * MS)
    assert rig.sender.snd_pos == 6 * 640
    out = rig.sender.on_nak(Nak(77, 1001, 5, 640, 1280), 2 * MS)
    assert [o.kind for o in out] == [OutgoingKind.RETRANSMIT]
    assert bytes(out[0].buffer) == rig.log.terms.get_bytes(640, 1280)
    for item in out:
        rig.sender.on_sent(item, len(item.buffer), 2 * MS)
    counters = rig.sender.counters
    assert counters.naks_received == 1 and counters.retransmits_sent == 1 and counters.retransmitted_bytes == 1280
    assert rig.sender.on_nak(Nak(77, 1001, 5, 640, 1280), 3 * MS) == []  # lingering


def test_short_control_send_is_retried(rig: Rig) -> None:
    out = rig.sender.poll(0)
    assert not rig.sender.on_sent(out[0], 3, 0) and rig.sender.counters.short_sends == 1
    assert [o.kind for o in rig.sender.poll(1)] == [OutgoingKind.SETUP]


def test_rtt_request_is_echoed_and_errors_are_recorded(rig: Rig) -> None:
    reply = rig.sender.on_rtt_measurement(RttMeasurement(77, 1001, 12345, 0, 9, REPLY_FLAG), 1)
    assert reply is not None
    assert classify(reply.buffer) == ControlPacket((RttMeasurement(77, 1001, 12345, 0, 9, 0),))
    assert rig.sender.on_rtt_measurement(RttMeasurement(77, 1001, 12345, 0, 9, 0), 1) is None
    error = ErrorFrame(77, 1001, 9, 0, 3, "no")
    rig.sender.on_error_frame(error, 2)
    assert rig.sender.last_error == error and rig.sender.counters.error_frames_received == 1


@pytest.mark.parametrize("fc", [UnicastFlowControl, MinMulticastFlowControl, lambda: TaggedFlowControl(7, 1)])
def test_a_receiver_that_rejected_the_image_leaves_flow_control(make_log: Callable[..., LogBuffers],
                                                                fc: Callable[[], FlowControl]) -> None:
    """Its ERR frame drops the receiver at once: not connected (it no longer holds the sender back)."""
    rig = Rig(make_log, flow_control=fc())
    sm = StatusMessage.at_position(77, 1001, 0, 16, 5, 32768, 9)
    rig.sender.on_status_message(sm._replace(feedback=(7).to_bytes(8, "little")), 0)
    assert rig.sender.flow_control.is_connected
    rig.sender.on_error_frame(ErrorFrame(77, 1001, 8, 0, 3, "another receiver"), 2)
    assert rig.sender.flow_control.is_connected
    rig.sender.on_error_frame(ErrorFrame(77, 1001, 9, 0, 3, "no"), 2)
    assert not rig.sender.flow_control.is_connected and rig.sender.flow_control.receiver_count == 0


def test_min_multicast_sender_waits_for_the_slowest(make_log: Callable[..., LogBuffers]) -> None:
    rig = Rig(make_log, flow_control=MinMulticastFlowControl())
    rig.send_all(0)
    rig.sm(0, 0, receiver_id=1)
    rig.sm(0, 0, window=1024, receiver_id=2)
    assert rig.sender.snd_lmt == 1024
    for _ in range(4):
        rig.publication.offer(b"x" * 400)  # 448-byte frames: two fit in 1024
    out = rig.send_all(1 * MS)
    assert sum(o.plan.length for o in out if o.plan) == 896 and rig.sender.snd_bpe == 0
    assert rig.send_all(2 * MS) == [] and rig.sender.snd_bpe == 1  # two frames wait behind receiver 2
    rig.sm(1024, 3 * MS, window=1024, receiver_id=2)
    assert sum(o.plan.length for o in rig.send_all(4 * MS) if o.plan) == 896


def test_min_multicast_a_receiver_at_end_of_stream_stops_holding_the_sender(
        make_log: Callable[..., LogBuffers]) -> None:
    """A receiver whose SMs carry EOS (aeronmd's, once its subscription went) leaves when idle, long before
    the receiver timeout: the other receiver alone sets the limit."""
    rig = Rig(make_log, flow_control=MinMulticastFlowControl())
    rig.sm(0, 0, window=1024, receiver_id=1)
    rig.sm(0, 0, window=4096, receiver_id=2)
    assert rig.sender.snd_lmt == 1024
    rig.sm(0, 1 * MS, window=1024, receiver_id=1, flags=END_OF_STREAM_FLAG)
    rig.send_all(2 * MS)
    assert rig.sender.snd_lmt == 4096 and rig.sender.flow_control.receiver_count == 1


def test_batch_stops_at_a_short_send(rig: Rig) -> None:
    rig.send_all(0)
    rig.sm(0, 0)
    for _ in range(4):
        rig.publication.offer(b"x" * 1000)
    out = rig.sender.poll(1 * MS, max_datagrams=4)
    assert [o.kind for o in out] == [OutgoingKind.DATA] * 4
    assert rig.sender.on_sent(out[0], out[0].plan.length, 1 * MS)
    assert not rig.sender.on_sent(out[1], 5, 1 * MS)
    assert not rig.sender.on_sent(out[2], out[2].plan.length, 1 * MS)
    assert rig.sender.snd_pos == 1056
    assert rig.sender.poll(2 * MS, 1)[0].plan.position == 1056
    assert classify(out[0].buffer).kind is PacketKind.DATA
