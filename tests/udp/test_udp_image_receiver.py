"""ImageReceiver: join, window checks, heartbeats, loss -> NAK, give-up fills, SMs, cleaning, EOS, liveness."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from logbuf import Image, LogBuffers, Position
from logbuf.driver.udp import ImageReceiver, ImageState, ReceiverCounters, UnicastNakDelay
from logbuf.protocol import (
    END_OF_STREAM_FLAG,
    DataHeader,
    DataPacket,
    FrameType,
    Nak,
    StatusMessage,
    classify,
    encode_data_frame,
)

T = 64 * 1024
INITIAL = 5
US = 1_000
MS = 1_000_000
S = 1_000_000_000
JOIN = 2 * T + 4096  # joined in the third term


def datagram(position: int, *sizes: int) -> bytes:
    out = b""
    for size in sizes:
        out += encode_data_frame(bytes([size % 256]) * size, term_offset=position % T + len(out), session_id=77,
                                 stream_id=1001, term_id=INITIAL + position // T)
    return out


class Rig:
    def __init__(self, make_log: Callable[..., LogBuffers], **kwargs: object) -> None:
        self.log = make_log(term_length=T, initial_term_id=INITIAL, session_id=77, stream_id=1001)
        self.counters = ReceiverCounters()
        kwargs.setdefault("nak_delay", UnicastNakDelay(100 * US, 100))
        self.image = ImageReceiver(self.log, JOIN, 0, receiver_id=9, counters=self.counters, **kwargs)  # type: ignore[arg-type]
        self.subscriber = Image(self.log, Position.standalone(JOIN))
        self.got: list[bytes] = []

    def feed(self, raw: bytes, now: int = 0) -> int:
        packet = classify(raw)
        assert isinstance(packet, DataPacket)
        return self.image.on_data(packet, raw, now)

    def poll(self, now: int, consumption: int | None = None) -> list:
        self.subscriber.poll(lambda buf, _: self.got.append(bytes(buf)), 1000)
        position = self.subscriber.position if consumption is None else consumption
        return self.image.poll(now, position)


@pytest.fixture
def rig(make_log: Callable[..., LogBuffers]) -> Rig:
    return Rig(make_log)


def test_first_poll_announces_the_image_with_an_sm(rig: Rig) -> None:
    frames = rig.poll(0)
    assert frames == [StatusMessage(77, 1001, INITIAL + 2, 4096, 32768, 9)]
    assert rig.counters.status_messages_sent == 1 and rig.poll(1) == []


def test_data_is_rebuilt_and_read_in_order(rig: Rig) -> None:
    rig.poll(0)
    assert rig.feed(datagram(JOIN + 128, 60)) == 96  # arrives first
    assert rig.image.hwm_position == JOIN + 224 and rig.image.rebuild_position == JOIN
    assert rig.feed(datagram(JOIN, 10, 20)) == 128
    rig.poll(1)
    assert rig.image.rebuild_position == JOIN + 224
    assert [len(x) for x in rig.got] == [10, 20, 60]


def test_loss_is_naked_after_the_delay_and_repaired(rig: Rig) -> None:
    rig.poll(0)
    rig.feed(datagram(JOIN, 10))
    rig.feed(datagram(JOIN + 128, 10))  # JOIN + 64 lost
    assert rig.poll(10 * US) == [] and rig.image.rebuild_position == JOIN + 64
    assert rig.poll(110 * US) == [Nak(77, 1001, INITIAL + 2, 4096 + 64, 64)]
    assert rig.counters.naks_sent == 1
    rig.feed(datagram(JOIN + 64, 10))
    rig.poll(120 * US)
    assert rig.image.rebuild_position == JOIN + 192 and len(rig.got) == 3


def test_heartbeat_moves_the_high_water_mark_and_reveals_tail_loss(rig: Rig) -> None:
    rig.poll(0)
    rig.feed(datagram(JOIN, 10))
    rig.feed(DataHeader.heartbeat(77, 1001, INITIAL + 2, 4096 + 256).encode())
    assert rig.image.hwm_position == JOIN + 256 and rig.counters.heartbeats_received == 1
    rig.poll(1)
    assert rig.poll(200 * US) == [Nak(77, 1001, INITIAL + 2, 4096 + 64, 192)]


def test_under_run_and_over_run_are_dropped_and_counted(rig: Rig) -> None:
    rig.poll(0)
    assert rig.feed(datagram(JOIN - 64, 10)) == 0 and rig.counters.flow_control_under_runs == 1
    assert rig.feed(datagram(JOIN + 32768 - 64, 10)) == 64  # ends exactly at the window
    assert rig.feed(datagram(JOIN + 32768, 10)) == 0 and rig.counters.flow_control_over_runs == 1
    assert rig.image.hwm_position == JOIN + 32768


def test_header_only_pad_past_the_window_is_accepted(rig: Rig) -> None:
    """Only the PAD's header travels: what it covers beyond the window is zeros to skip, not an over-run."""
    rig.poll(0)
    position = JOIN + 32768 - 32
    pad = DataHeader(T - position % T, position % T, 77, 1001, INITIAL + 2, frame_type=FrameType.PAD).encode()
    assert rig.feed(pad) == 32 and rig.image.hwm_position == 3 * T


def test_packets_that_do_not_fit_the_term_are_invalid(rig: Rig) -> None:
    rig.poll(0)
    big = DataHeader(2 * T, 4096, 77, 1001, INITIAL + 2, frame_type=FrameType.PAD).encode()
    assert rig.feed(big) == 0 and rig.counters.invalid_packets == 1
    other_session = encode_data_frame(b"x", term_offset=0, session_id=1, stream_id=1001, term_id=INITIAL)
    with pytest.raises(ValueError, match="given to image"):  # the dispatcher routes by session: a bug if not
        rig.image.on_data(classify(other_session), other_session, 0)  # type: ignore[arg-type]


def test_sm_on_progress_and_cleaning_behind_the_consumer(rig: Rig) -> None:
    rig.poll(0)
    position = JOIN
    now = 0
    messages = 0
    while position < JOIN + T + 8192:
        if position % T + 1056 > T:  # as the publication does: pad the term, the next frame starts the next
            raw = DataHeader(T - position % T, position % T, 77, 1001, INITIAL + position // T,
                             frame_type=FrameType.PAD).encode()
            rig.feed(raw, now)
            position += T - position % T
            continue
        raw = datagram(position, 1000)
        rig.feed(raw, now)
        position += len(raw)
        messages += 1
        now += 10 * US
        rig.poll(now)  # the subscriber keeps up, so SMs open the window as it goes
    assert rig.counters.status_messages_sent > (T + 8192) // 8192 - 2
    assert rig.counters.flow_control_over_runs == 0 and rig.counters.invalid_packets == 0
    assert len(rig.got) == messages and rig.subscriber.position == position
    # the consumer is more than a term ahead of the join: the image term behind it was zeroed
    assert rig.log.terms.get_i32(2 * T + 4096) == 0


def test_give_up_fills_the_gap_so_subscribers_move_on(make_log: Callable[..., LogBuffers]) -> None:
    rig = Rig(make_log, give_up_ns=5 * MS)
    rig.poll(0)
    rig.feed(datagram(JOIN, 10))
    rig.feed(datagram(JOIN + 128, 20))  # JOIN + 64 never comes back
    rig.poll(1 * MS)  # the gap is seen: its give-up clock starts
    assert len(rig.got) == 1
    rig.poll(6 * MS - 1)
    assert rig.counters.loss_gap_fills == 0
    rig.poll(6 * MS)
    rig.poll(6 * MS + 1)
    assert rig.counters.loss_gap_fills == 1 and [len(x) for x in rig.got] == [10, 20]
    assert rig.image.rebuild_position == JOIN + 192


def test_end_of_stream(rig: Rig) -> None:
    rig.poll(0)
    rig.feed(datagram(JOIN, 10))
    rig.feed(DataHeader.heartbeat(77, 1001, INITIAL + 2, 4096 + 64, end_of_stream=True).encode())
    assert rig.log.end_of_stream_position == JOIN + 64
    frames = rig.poll(1, consumption=JOIN)  # rebuilt to EOS, not yet consumed
    assert rig.image.state is ImageState.ACTIVE
    frames = rig.poll(2)  # the subscriber reads the last message
    assert rig.image.state is ImageState.END_OF_STREAM
    assert frames and frames[-1].flags == END_OF_STREAM_FLAG and frames[-1].consumption_term_offset == 4096 + 64
    assert rig.poll(3) == [] and rig.feed(datagram(JOIN + 64, 10)) == 0


def test_silent_sender_times_the_image_out(rig: Rig) -> None:
    rig.poll(0)
    rig.feed(datagram(JOIN, 10), 1 * S)
    rig.poll(11 * S)
    assert rig.image.state is ImageState.ACTIVE
    assert rig.image.next_deadline_ns() <= 11 * S
    assert rig.poll(11 * S + 1) == [] and rig.image.state is ImageState.TIMED_OUT
    assert rig.feed(datagram(JOIN + 64, 10), 12 * S) == 0


def test_setup_for_an_existing_image_forces_an_sm(rig: Rig) -> None:
    from logbuf.protocol import SetupFrame

    rig.poll(0)
    assert rig.poll(1) == []
    rig.image.on_setup(SetupFrame(4096, 77, 1001, INITIAL, INITIAL + 2, T, 1408), 2)
    assert [type(f) for f in rig.poll(3)] == [StatusMessage]


def test_rtt_from_an_echoed_measurement(rig: Rig) -> None:
    from logbuf.protocol import RttMeasurement

    request = rig.image.rtt_request(1000)
    assert request.is_reply and request.receiver_id == 9
    rig.image.on_rtt_measurement(RttMeasurement(77, 1001, 1000, 300, 9, 0), 5000)
    assert rig.image.rtt_ns == 3700


def test_window_must_fit_half_a_term(make_log: Callable[..., LogBuffers]) -> None:
    with pytest.raises(ValueError):
        Rig(make_log, window_length=T)
