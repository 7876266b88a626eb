"""The native receiver agent (``native/drv_receiver.c``) against its specification, the sans-IO
:class:`~logbuf.driver.udp.ImageReceiver`: the same datagrams (reordered, duplicated, dropped) and the same clock
ticks give the same rebuild position, high-water mark, NAKs and status messages, and the same term bytes."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from logbuf import LogBuffers
from logbuf.driver.receiver import Receiver
from logbuf.driver.udp import CreateImage, ImageReceiver, ReceiverDispatcher, Reply, UnicastNakDelay
from logbuf.logbuffer.frame import FRAME_ALIGNMENT
from logbuf.native import ffi, lib
from logbuf.protocol import DataHeader, DataPacket, FrameType, SetupFrame, classify, encode_data_frame
from logbuf.protocol.error_frame import ErrorFrame
from logbuf.protocol.header import MalformedFrameError

T = 64 * 1024
INITIAL = 5
SESSION, STREAM = 77, 1001
JOIN = T - 8192  # the stream crosses into the next term
SOURCE = b"\x02\x00\x30\x39\x7f\x00\x00\x01" + bytes(8)  # sockaddr_in 127.0.0.1:12345
US = 1_000


def _align(n: int) -> int:
    return (n + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT


def datagrams(groups: list[list[int]]) -> list[bytes]:
    """Datagrams of DATA frames from JOIN on; a PAD header fills a term's end, as a sender's scan does."""
    out = []
    position = JOIN
    for sizes in groups:
        span = sum(_align(32 + s) for s in sizes)
        if position % T + span > T:  # the rest of this term is one PAD
            rest = T - position % T
            out.append(DataHeader(rest, position % T, SESSION, STREAM, INITIAL + position // T,
                                  frame_type=FrameType.PAD).encode())
            position += rest
        raw = b""
        for size in sizes:
            raw += encode_data_frame(bytes([size % 251]) * size, term_offset=position % T + len(raw),
                                     session_id=SESSION, stream_id=STREAM, term_id=INITIAL + position // T)
        out.append(raw)
        position += span
    return out


class NativeRig:
    def __init__(self, log: LogBuffers, *, reliable: bool = True, nak_delay_ns: int = 100 * US) -> None:
        self.log = log
        self.receiver = Receiver()
        self.counters = ffi.new("int64_t[2]")
        r = self.receiver
        r.offer(r.command(lib.LBD_CMD_ADD_ENDPOINT, endpoint_id=1, fd=-1, send_fd=-1, receiver_id=9))
        r.offer(r.command(lib.LBD_CMD_ADD_SUBSCRIPTION, endpoint_id=1, stream_id=STREAM))
        r.offer(r.command(
            lib.LBD_CMD_ADD_IMAGE, endpoint_id=1, image_id=1, session_id=SESSION, stream_id=STREAM, term_length=T,
            initial_term_id=INITIAL, window_length=T // 2, join_position=JOIN,
            terms=ffi.cast("uint8_t *", log.term_pointer(0)), meta=ffi.cast("uint8_t *", log.meta.pointer(0)),
            rcv_hwm=self.counters, rcv_pos=self.counters + 1, liveness_timeout_ns=10**10, sm_timeout_ns=200_000_000,
            nak_delay_ns=nak_delay_ns, nak_retry_ns=100 * nak_delay_ns, give_up_ns=-1, address=SOURCE,
            reliable=int(reliable)))
        self.view = ffi.new("lbd_image_view_t *")
        self.out = ffi.new("uint8_t[64]")

    def sent(self) -> list[bytes]:
        frames = []
        while (n := lib.lbd_receiver_take_sent(self.receiver._native, self.out, 64)) >= 0:
            frames.append(bytes(ffi.buffer(self.out, n)))
        return frames

    def start(self, now: int) -> list[bytes]:
        self.receiver.do_work(now)
        return self.sent()

    def feed(self, raw: bytes, now: int) -> None:
        assert lib.lbd_receiver_feed(self.receiver._native, 1, raw, len(raw), SOURCE, len(SOURCE), now) == 1

    def poll(self, now: int) -> list[bytes]:
        lib.lbd_receiver_poll_images(self.receiver._native, now)
        return self.sent()

    def positions(self) -> tuple[int, int]:
        assert lib.lbd_receiver_image_view(self.receiver._native, 1, self.view) == 0
        assert (self.counters[0], self.counters[1]) == (self.view.hwm_position, self.view.rebuild_position)
        return self.view.rebuild_position, self.view.hwm_position


class SpecRig:
    def __init__(self, log: LogBuffers, *, reliable: bool = True, nak_delay_ns: int = 100 * US) -> None:
        self.log = log
        self.image = ImageReceiver(log, JOIN, 0, receiver_id=9, window_length=T // 2,
                                   nak_delay=UnicastNakDelay(nak_delay_ns, 100), reliable=reliable)

    def start(self, now: int) -> list[bytes]:
        return self.poll(now)

    def feed(self, raw: bytes, now: int) -> None:
        packet = classify(raw)
        assert isinstance(packet, DataPacket)
        self.image.on_data(packet, raw, now)

    def poll(self, now: int) -> list[bytes]:
        return [frame.encode() for frame in self.image.poll(now, self.image.rebuild_position)]

    def positions(self) -> tuple[int, int]:
        return self.image.rebuild_position, self.image.hwm_position


groups_strategy = st.lists(st.lists(st.integers(1, 400), min_size=1, max_size=3), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=groups_strategy, data=st.data(), reliable=st.booleans(),
       nak_delay_ns=st.sampled_from([100 * US, 0, 1, 3_000 * US]))
def test_native_receiver_matches_its_specification(make_log: Callable[..., LogBuffers], groups: list[list[int]],
                                                   data: Any, reliable: bool, nak_delay_ns: int) -> None:
    """Also per channel: ``nak-delay`` (the unicast NAK delay and its retries) and ``reliable=false`` (a gap
    whose NAK falls due is padded instead: the same PAD frames in both logs, no NAK)."""
    raws = datagrams(groups)
    order = data.draw(st.permutations(range(len(raws))))
    dropped = data.draw(st.sets(st.sampled_from(range(len(raws))), max_size=max(0, len(raws) // 4)))
    duplicates = data.draw(st.lists(st.sampled_from(range(len(raws))), max_size=5))
    steps = [i for i in order if i not in dropped] + duplicates
    ticks = data.draw(st.lists(st.integers(0, 20_000 * US), min_size=len(steps), max_size=len(steps)))
    native = NativeRig(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM),
                       reliable=reliable, nak_delay_ns=nak_delay_ns)
    spec = SpecRig(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM),
                   reliable=reliable, nak_delay_ns=nak_delay_ns)
    now = 1
    assert native.start(now) == spec.start(now)
    for index, tick in zip(steps, ticks, strict=True):
        native.feed(raws[index], now)
        spec.feed(raws[index], now)
        assert native.poll(now) == spec.poll(now)
        assert native.positions() == spec.positions()
        now += tick
        assert native.poll(now) == spec.poll(now)
    for _ in range(3):  # the retries of what was dropped
        now += 10_000 * US
        assert native.poll(now) == spec.poll(now)
    rebuild, hwm = spec.positions()
    assert native.positions() == (rebuild, hwm)
    if not reliable:
        assert rebuild == hwm  # every gap padded
        assert native.receiver.counters.naks_sent == spec.image.counters.naks_sent == 0
        assert native.receiver.counters.loss_gap_fills == spec.image.counters.loss_gap_fills
    for at in range(JOIN, hwm, T):  # the same bytes in both logs, term by term
        index = (at // T) % 3
        start = at % T
        end = min(T, start + hwm - at)
        a = native.log.terms.view[index * T + start: index * T + end]
        b = spec.log.terms.view[index * T + start: index * T + end]
        assert bytes(a) == bytes(b)
    native.receiver.close()


hostile_frame = st.tuples(
    st.integers(0, 8).map(lambda slot: slot * FRAME_ALIGNMENT),  # term offset near the join
    st.integers(1, 40) | st.integers(40, 600),  # payload length
    st.integers(-(2**31), 2**31 - 1).map(lambda v: struct.pack("<i", v)) | st.binary(max_size=16),  # payload head
    st.integers(0, 2),  # payload offset of that head, in words
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(hostile_frame, min_size=1, max_size=25))
# a frame inside another's aligned space whose payload puts an impossible length where the first says the
# next frame begins: the term breaks
@example(frames=[(0, 8, b"", 0), (32, 168, struct.pack("<i", 0x7FFFFFF0), 0)])
# the frame the stream waits for overlaps one already in the term: it can never be written (no NAK loop)
@example(frames=[(32, 168, b"", 0), (0, 8, b"", 0)])
def test_forged_frames_never_break_the_agent(make_log: Callable[..., LogBuffers],
                                             frames: list[tuple[int, int, bytes, int]]) -> None:
    """DATA frames of a forged session at any aligned offsets, overlapping as they like, with payloads that
    hold fake frame lengths: the agent keeps rcv-pos <= rcv-hwm and, when the term breaks (or the frame the
    stream waits for can never be written), closes the image once (one CORRUPT_IMAGE, one IMAGE_REMOVED) and
    never reports it again however often it is polled."""
    native = NativeRig(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM))
    now = 1
    native.start(now)
    term_id = INITIAL + JOIN // T
    for offset, length, head, at in frames:
        payload = bytearray(length)
        where = min(at * 4, max(0, length - len(head)))
        payload[where:where + len(head)] = head[: length - where]
        raw = encode_data_frame(bytes(payload), term_offset=JOIN % T + offset, session_id=SESSION,
                                stream_id=STREAM, term_id=term_id)
        native.feed(raw, now)
        native.poll(now)
        now += 50 * US
        if lib.lbd_receiver_image_view(native.receiver._native, 1, native.view) == 0:
            assert JOIN <= native.view.rebuild_position <= native.view.hwm_position
    for _ in range(50):
        now += 1_000 * US
        native.poll(now)
    events = native.receiver.poll_events()
    corrupt = [e for e in events if e.type == lib.LBD_EVENT_CORRUPT_IMAGE]
    removed = [e for e in events if e.type == lib.LBD_EVENT_IMAGE_REMOVED]
    assert len(corrupt) <= 1 and len(removed) == len(corrupt)
    event("image closed as corrupt" if corrupt else "image intact")
    if corrupt:
        assert removed[0].reason == lib.LBD_REASON_CORRUPT
        assert lib.lbd_receiver_image_view(native.receiver._native, 1, native.view) == -1
    native.receiver.close()


dispatch_op = st.one_of(
    st.tuples(st.just("setup"), st.integers(1, 4), st.sampled_from([STREAM, STREAM + 1]), st.sampled_from([0, 0x40])),
    st.tuples(st.just("data"), st.integers(1, 4), st.sampled_from([STREAM, STREAM + 1]), st.just(0)),
    st.tuples(st.just("heartbeat"), st.integers(1, 4), st.booleans(), st.just(0)),
    st.tuples(st.just("tick"), st.integers(0, 400_000_000), st.just(0), st.just(0)),
)


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(dispatch_op, max_size=40))
def test_native_dispatch_of_unknown_sessions_matches_the_dispatcher(ops: list[tuple[str, int, Any, int]]) -> None:
    """Sessions the agent has no image for, as ReceiverDispatcher: a SETUP of a subscribed stream asks for an
    image once per pending timeout (with the SETUP's flags: its group flag decides ``group=infer``, see
    ``treat_as_multicast``); DATA asks the sender for a SETUP at most once per elicit interval; an ended
    stream's heartbeat asks nothing; other streams are ignored."""
    spec = ReceiverDispatcher(9)
    spec.add_subscription(STREAM)
    receiver = Receiver()
    receiver.offer(receiver.command(lib.LBD_CMD_ADD_ENDPOINT, endpoint_id=1, fd=-1, send_fd=-1, receiver_id=9))
    receiver.offer(receiver.command(lib.LBD_CMD_ADD_SUBSCRIPTION, endpoint_id=1, stream_id=STREAM))
    receiver.do_work(0)
    out = ffi.new("uint8_t[64]")
    now = 1_000_000_000
    for kind, session, extra, flags in ops:
        if kind == "tick":
            now += session
            continue
        if kind == "setup":
            raw = SetupFrame(0, session, extra, 5, 5, T, 1408, 0, flags).encode()
        elif kind == "data":
            raw = encode_data_frame(b"x" * 10, term_offset=64, session_id=session, stream_id=extra, term_id=5)
        else:
            raw = DataHeader.heartbeat(session, STREAM, 5, 64, end_of_stream=extra).encode()
        expected = spec.on_datagram(raw, now, SOURCE)
        assert lib.lbd_receiver_feed(receiver._native, 1, raw, len(raw), SOURCE, len(SOURCE), now) == 1
        sent = []
        while (n := lib.lbd_receiver_take_sent(receiver._native, out, 64)) >= 0:
            sent.append(bytes(ffi.buffer(out, n)))
        created = [(e.session_id, e.stream_id, e.term_length, e.address, e.flags) for e in receiver.poll_events()
                   if e.type == lib.LBD_EVENT_CREATE_IMAGE]
        assert sent == [e.frame.encode() for e in expected if isinstance(e, Reply)]
        assert created == [(e.setup.session_id, e.setup.stream_id, e.setup.term_length, e.source, e.setup.flags)
                           for e in expected if isinstance(e, CreateImage)]
    receiver.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(receiver_id=st.integers(1, 2**63 - 1))
def test_multicast_nak_delays_stay_within_the_back_off(make_log: Callable[..., LogBuffers], receiver_id: int) -> None:
    """Multicast: a gap's first NAK and each retry come after a randomised delay in [0, max back-off] (as
    MulticastNakDelay's), whatever the receiver id that seeds them."""
    log = make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM)
    receiver = Receiver()
    counters = ffi.new("int64_t[2]")
    receiver.offer(receiver.command(lib.LBD_CMD_ADD_ENDPOINT, endpoint_id=1, fd=-1, send_fd=-1,
                                    receiver_id=receiver_id))
    receiver.offer(receiver.command(lib.LBD_CMD_ADD_SUBSCRIPTION, endpoint_id=1, stream_id=STREAM))
    backoff = 10_000 * US
    receiver.offer(receiver.command(
        lib.LBD_CMD_ADD_IMAGE, endpoint_id=1, image_id=1, session_id=SESSION, stream_id=STREAM, term_length=T,
        initial_term_id=INITIAL, window_length=T // 2, join_position=JOIN,
        terms=ffi.cast("uint8_t *", log.term_pointer(0)), meta=ffi.cast("uint8_t *", log.meta.pointer(0)),
        rcv_hwm=counters, rcv_pos=counters + 1, liveness_timeout_ns=10**12, sm_timeout_ns=10**12,
        multicast=1, nak_max_backoff_ns=backoff, nak_group_size=10, give_up_ns=-1, address=SOURCE))
    receiver.do_work(1)
    out = ffi.new("uint8_t[64]")

    def naks() -> int:
        count = 0
        while (n := lib.lbd_receiver_take_sent(receiver._native, out, 64)) >= 0:
            count += bytes(ffi.buffer(out, n))[6] == FrameType.NAK
        return count

    second = datagrams([[100], [100]])[1]  # the first is lost: a gap at JOIN
    assert lib.lbd_receiver_feed(receiver._native, 1, second, len(second), SOURCE, len(SOURCE), 1) == 1
    now, step, sent_at = 1, 100 * US, []
    while len(sent_at) < 4 and now < 10 * backoff:
        lib.lbd_receiver_poll_images(receiver._native, now)
        if naks():
            sent_at.append(now)
        now += step
    receiver.close()
    assert len(sent_at) == 4
    assert sent_at[0] - 1 <= backoff + step
    assert all(0 < b - a <= backoff + step for a, b in zip(sent_at, sent_at[1:], strict=False))


def _frame(frame_type: int, body: bytes, length_delta: int) -> bytes:
    return struct.pack("<iBBH", 8 + len(body) + length_delta, 0, 0, frame_type) + body


control_frame = st.builds(
    _frame,
    st.sampled_from([0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x0B, 0x55]),
    st.binary(max_size=48) | st.sampled_from([bytes(20), bytes(28), bytes(32), bytes(32) + b"\xff" * 4]),
    st.sampled_from([0, 0, 0, -4, 4]),
)
error_frame = st.builds(
    lambda text, code: struct.pack("<iBBHiiqqii", 40 + len(text), 0, 0, 0x04, 1, 2, 3, 4, code, len(text)) + text,
    st.binary(max_size=8) | st.text(max_size=4).map(str.encode), st.integers(0, 9))


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(control_frame | error_frame, min_size=1, max_size=3) | st.binary(max_size=80).map(lambda b: [b]))
def test_native_check_of_datagrams_matches_classify(frames: list[bytes]) -> None:
    """Every datagram the agent counts as invalid is one ``classify`` rejects, and the other way round."""
    raw = b"".join(frames)
    receiver = Receiver()
    receiver.offer(receiver.command(lib.LBD_CMD_ADD_ENDPOINT, endpoint_id=1, fd=-1, send_fd=-1, receiver_id=1))
    receiver.do_work(0)
    assert lib.lbd_receiver_feed(receiver._native, 1, raw, len(raw), SOURCE, len(SOURCE), 1) == 1
    try:
        classify(raw)
        malformed = 0
    except MalformedFrameError:
        malformed = 1
    invalid = receiver.counters.invalid_packets
    receiver.close()
    assert invalid == malformed


def test_a_forged_frame_below_the_rebuild_position_never_overwrites_delivered_payload(
        make_log: Callable[..., LogBuffers]) -> None:
    """A frame at an offset inside a complete frame whose payload bytes there are zero finds 'empty' slots;
    below the rebuild position nothing is written again, in the agent and in its specification alike."""
    term_id = INITIAL + JOIN // T
    genuine = encode_data_frame(bytes(1000), term_offset=JOIN % T, session_id=SESSION, stream_id=STREAM,
                                term_id=term_id)  # a zero payload: every slot inside it reads as empty
    forged = encode_data_frame(b"\xee" * 64, term_offset=JOIN % T + 64, session_id=SESSION, stream_id=STREAM,
                               term_id=term_id)
    for rig_type in (NativeRig, SpecRig):
        log = make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM)
        rig = rig_type(log)
        rig.start(1)
        rig.feed(genuine, 2)
        rig.poll(2)
        assert rig.positions() == (JOIN + _align(len(genuine)),) * 2
        rig.feed(forged, 3)
        rig.poll(3)
        start = JOIN % T
        assert bytes(log.terms.view[start : start + len(genuine)]) == genuine, rig_type.__name__
        assert rig.positions() == (JOIN + _align(len(genuine)),) * 2
        if isinstance(rig, NativeRig):
            rig.receiver.close()


def test_a_pad_header_covering_the_term_is_checked_only_up_to_the_high_water_mark(
        make_log: Callable[..., LogBuffers]) -> None:
    """A PAD frame sent as its header alone covers up to a whole term: the agent looks for frames in its way only
    below the high-water mark (nothing of the image lies past it), not slot by slot to the PAD's end - a peer
    cannot make each such datagram cost a term's scan.  A non-zero word past the high-water mark (bytes the
    cleaner has not reached) therefore does not refuse the PAD, in the agent as in its specification."""
    term_id = INITIAL + JOIN // T
    genuine = encode_data_frame(b"\x11" * 200, term_offset=JOIN % T, session_id=SESSION, stream_id=STREAM,
                                term_id=term_id)
    after = JOIN % T + _align(len(genuine))
    pad = DataHeader(T - after, after, SESSION, STREAM, term_id, frame_type=FrameType.PAD).encode()
    assert len(pad) == 32
    for rig_type in (NativeRig, SpecRig):
        log = make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM)
        rig = rig_type(log)
        rig.start(1)
        rig.feed(genuine, 2)
        rig.poll(2)
        assert rig.positions() == (JOIN + _align(len(genuine)),) * 2
        stale = after + 4096  # inside the PAD's cover, past the high-water mark
        log.terms.view[stale : stale + 4] = struct.pack("<i", 96)
        rig.feed(pad, 3)
        rig.poll(3)
        assert rig.positions() == (T, T), rig_type.__name__
        if isinstance(rig, NativeRig):
            events = rig.receiver.poll_events()
            assert [e.type for e in events if e.type == lib.LBD_EVENT_CORRUPT_IMAGE] == []
            rig.receiver.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rejoin=st.booleans(), waits=st.lists(st.integers(0, 3_000_000_000), min_size=1, max_size=4))
def test_an_image_that_timed_out_rejoins_as_the_dispatcher_says(make_log: Callable[..., LogBuffers], rejoin: bool,
                                                                 waits: list[int]) -> None:
    """``rejoin``: an image that timed out leaves its session cooling down for the cool-down (rejoin=true) or
    for as long as the stream is subscribed (rejoin=false); SETUPs after it ask for a new image only when the
    dispatcher's would."""
    log = make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM)
    receiver = Receiver()
    counters = ffi.new("int64_t[2]")
    receiver.offer(receiver.command(lib.LBD_CMD_ADD_ENDPOINT, endpoint_id=1, fd=-1, send_fd=-1, receiver_id=9))
    receiver.offer(receiver.command(lib.LBD_CMD_ADD_SUBSCRIPTION, endpoint_id=1, stream_id=STREAM))
    liveness = 1_000_000_000
    receiver.offer(receiver.command(
        lib.LBD_CMD_ADD_IMAGE, endpoint_id=1, image_id=1, session_id=SESSION, stream_id=STREAM, term_length=T,
        initial_term_id=INITIAL, window_length=T // 2, join_position=JOIN,
        terms=ffi.cast("uint8_t *", log.term_pointer(0)), meta=ffi.cast("uint8_t *", log.meta.pointer(0)),
        rcv_hwm=counters, rcv_pos=counters + 1, liveness_timeout_ns=liveness, sm_timeout_ns=200_000_000,
        nak_delay_ns=100 * US, nak_retry_ns=10_000 * US, give_up_ns=-1, address=SOURCE, rejoin=int(rejoin)))
    receiver.do_work(1)
    spec = ReceiverDispatcher(9)
    spec.add_subscription(STREAM)
    spec.add_image(ImageReceiver(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION,
                                          stream_id=STREAM), JOIN, 1, receiver_id=9, window_length=T // 2,
                                 liveness_timeout_ns=liveness), SOURCE, rejoin=rejoin)
    now = 1 + liveness + 1
    spec.poll(now, lambda image: image.rebuild_position)
    receiver.do_work(now)
    removed = [e.reason for e in receiver.poll_events() if e.type == lib.LBD_EVENT_IMAGE_REMOVED]
    assert removed == [lib.LBD_REASON_TIMED_OUT] and spec.image(SESSION, STREAM) is None
    setup = SetupFrame(JOIN % T, SESSION, STREAM, INITIAL, INITIAL, T, 1408, 0).encode()
    for wait in waits:
        now += wait
        expected = [e for e in spec.on_datagram(setup, now, SOURCE) if isinstance(e, CreateImage)]
        assert lib.lbd_receiver_feed(receiver._native, 1, setup, len(setup), SOURCE, len(SOURCE), now) == 1
        created = [e for e in receiver.poll_events() if e.type == lib.LBD_EVENT_CREATE_IMAGE]
        assert len(created) == len(expected)
        if not rejoin:
            assert not created
    receiver.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reason=st.text(max_size=30), ticks=st.lists(st.integers(0, 150_000_000), min_size=1, max_size=12))
def test_a_rejected_image_sends_error_frames_as_its_specification(make_log: Callable[..., LogBuffers], reason: str,
                                                                   ticks: list[int]) -> None:
    """REJECT_IMAGE: from then on no data is taken and the SMs become ERR frames (IMAGE_REJECTED, the reason, the
    receiver id) at the SM timeout, the same frames at the same ticks in the agent and its specification; the
    image ends when its liveness runs out."""
    native = NativeRig(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM))
    spec = SpecRig(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM))
    now = 1
    assert native.start(now) == spec.start(now)
    text = reason.encode()
    r = native.receiver
    r.offer(r.command(lib.LBD_CMD_REJECT_IMAGE, image_id=1, text=ffi.from_buffer(text), text_length=len(text)))
    r.do_work(now)
    spec.image.reject(reason)
    raws = datagrams([[100]] * len(ticks))
    sent = []
    for raw, tick in zip(raws, ticks, strict=True):
        now += tick
        native.feed(raw, now)
        spec.feed(raw, now)
        frames = spec.poll(now)
        assert native.poll(now) == [f[:64] for f in frames]
        assert native.positions() == spec.positions() == (JOIN, JOIN)
        sent += frames
    assert all(f[6] == FrameType.ERR and ErrorFrame.decode(f).message == reason for f in sent)
    assert len(sent) == r.counters.error_frames_sent
    now += 10**10 + 1  # its liveness
    native.poll(now)
    r.do_work(now)
    assert [e.reason for e in r.poll_events() if e.type == lib.LBD_EVENT_IMAGE_REMOVED] == [lib.LBD_REASON_TIMED_OUT]
    r.close()


@given(group=st.sampled_from(["true", "false", "infer"]), multicast=st.booleans(), flags=st.integers(0, 255))
def test_group_semantics_follow_the_group_key(group: str, multicast: bool, flags: int) -> None:
    """group=true: multicast NAK delays on any channel; false: never; infer: a multicast channel or a SETUP
    with the sender's group flag (0x40), as aeronmd decides for a new image."""
    from logbuf.driver.network_conductor import treat_as_multicast

    expected = {"true": True, "false": False, "infer": multicast or bool(flags & 0x40)}[group]
    assert treat_as_multicast(group, multicast, flags) is expected


SOURCE2 = b"\x02\x00\x30\x3a\x7f\x00\x00\x02" + bytes(8)  # sockaddr_in 127.0.0.2:12346
mds_op = st.one_of(
    st.tuples(st.just("data"), st.integers(1, 3), st.integers(0, 1), st.integers(0, 11)),
    st.tuples(st.just("setup"), st.integers(1, 3), st.integers(0, 1), st.just(0)),
    # ticks around the 5 s a destination stays answered, the 200 ms SM timeout, the 10 s liveness
    st.tuples(st.just("tick"), st.sampled_from([0, 150_000_000, 1_000_000_000, 2_500_000_000, 4_900_000_000,
                                                5_100_000_000]) | st.integers(0, 3_000_000_000),
              st.just(0), st.just(0)),
    st.tuples(st.just("remove"), st.integers(1, 3), st.just(0), st.just(0)),
    st.tuples(st.just("add"), st.integers(1, 3), st.just(0), st.just(0)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(mds_op, max_size=40))
def test_mds_image_answers_through_its_destinations_as_the_dispatcher(make_log: Callable[..., LogBuffers],
                                                                      ops: list[tuple[str, int, int, int]]) -> None:
    """An MDS endpoint (control-mode=manual): one image fed through several destinations from several
    sources; each status message and NAK goes through every destination the image heard its sender on in the
    last 5 s, to the source it heard there, as ReceiverDispatcher(manual=True) says; a removed destination
    gets nothing more; the same rebuild position and high-water mark."""
    sources = (SOURCE, SOURCE2)
    raws = datagrams([[100]] * 12)
    receiver = Receiver()
    native = receiver._native
    counters = ffi.new("int64_t[2]")
    log = make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM)
    receiver.offer(receiver.command(lib.LBD_CMD_ADD_ENDPOINT, endpoint_id=1, fd=-1, send_fd=-1, receiver_id=9,
                                    manual=1))
    for destination in (1, 2, 3):
        receiver.offer(receiver.command(lib.LBD_CMD_ADD_DESTINATION, endpoint_id=1, destination_id=destination,
                                        fd=-1, send_fd=-1))
    receiver.offer(receiver.command(lib.LBD_CMD_ADD_SUBSCRIPTION, endpoint_id=1, stream_id=STREAM))
    now = 1
    receiver.offer(receiver.command(
        lib.LBD_CMD_ADD_IMAGE, endpoint_id=1, image_id=1, session_id=SESSION, stream_id=STREAM, term_length=T,
        initial_term_id=INITIAL, window_length=T // 2, join_position=JOIN,
        terms=ffi.cast("uint8_t *", log.term_pointer(0)), meta=ffi.cast("uint8_t *", log.meta.pointer(0)),
        rcv_hwm=counters, rcv_pos=counters + 1, liveness_timeout_ns=10**10, sm_timeout_ns=200_000_000,
        nak_delay_ns=100 * US, nak_retry_ns=10_000 * US, give_up_ns=-1, address=SOURCE, destination_id=1))
    spec = ReceiverDispatcher(9, manual=True)
    spec.add_subscription(STREAM)
    image = ImageReceiver(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM),
                          JOIN, now, receiver_id=9, window_length=T // 2, nak_delay=UnicastNakDelay(100 * US, 100))
    spec.add_image(image, SOURCE, destination=1, now_ns=now)
    out = ffi.new("uint8_t[64]")
    address = ffi.new("uint8_t[32]")
    address_length = ffi.new("int32_t *")

    def sent() -> list[tuple[bytes, int, bytes]]:
        frames = []
        while (n := lib.lbd_receiver_take_sent(native, out, 64)) >= 0:
            destination = lib.lbd_receiver_sent_to(native, address, address_length)
            frames.append((bytes(ffi.buffer(out, n)), destination, bytes(ffi.buffer(address, address_length[0]))))
        return frames

    def expected(events: list[Any]) -> list[tuple[bytes, int, bytes]]:
        return [(e.frame.encode()[:64], e.destination[0], e.destination[1]) for e in events if isinstance(e, Reply)]

    def poll() -> None:
        lib.lbd_receiver_poll_images(native, now)
        assert sent() == expected(spec.poll(now, lambda i: i.rebuild_position))

    receiver.do_work(now)
    assert sent() == expected(spec.poll(now, lambda i: i.rebuild_position))
    live = {1, 2, 3}
    for kind, destination, source, index in ops:
        if kind == "tick":
            now += destination
            poll()
            continue
        if kind == "remove" or kind == "add":
            poll()  # what is due goes first; then the agent takes the command (and has nothing more to send)
            if kind == "remove" and destination in live:
                receiver.offer(receiver.command(lib.LBD_CMD_REMOVE_DESTINATION, endpoint_id=1,
                                                destination_id=destination))
                spec.remove_destination(destination)
                live.discard(destination)
            elif kind == "add" and destination not in live:
                receiver.offer(receiver.command(lib.LBD_CMD_ADD_DESTINATION, endpoint_id=1,
                                                destination_id=destination, fd=-1, send_fd=-1))
                live.add(destination)
            receiver.do_work(now)
            assert sent() == []
            receiver.poll_events()
            continue
        if destination not in live:
            continue
        raw = raws[index] if kind == "data" else SetupFrame(JOIN % T, SESSION, STREAM, INITIAL,
                                                            INITIAL + JOIN // T, T, 1408, 0).encode()
        events = spec.on_datagram(raw, now, sources[source], destination)
        assert lib.lbd_receiver_feed_via(native, 1, destination, raw, len(raw), sources[source], 16, now) == 1
        assert sent() == expected(events)
        poll()
        if spec.image(SESSION, STREAM) is not None:
            assert lib.lbd_receiver_image_view(native, 1, ffi.new("lbd_image_view_t *")) == 0
            assert (counters[0], counters[1]) == (image.hwm_position, image.rebuild_position)
        now += 50 * US
    receiver.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 400), min_size=1, max_size=6),
       ticks=st.lists(st.integers(0, 150_000_000), min_size=1, max_size=16), by_endpoint=st.booleans())
def test_an_image_whose_subscription_went_sends_eos_status_messages_as_its_specification(
        make_log: Callable[..., LogBuffers], sizes: list[int], ticks: list[int], by_endpoint: bool) -> None:
    """The stream's last subscription goes (REMOVE_SUBSCRIPTION, or the endpoint's REMOVE_ENDPOINT): as aeronmd,
    the image takes no more data and sends SMs with the EOS flag (0x40) at once and then every SM timeout, the same
    frames at the same ticks in the agent and in ImageReceiver.drain; after five SM timeouts it ends (REMOVED)."""
    native = NativeRig(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM))
    spec = SpecRig(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM))
    now = 1
    assert native.start(now) == spec.start(now)
    for raw in datagrams([sizes]):
        native.feed(raw, now)
        spec.feed(raw, now)
    now += 200_000_000  # an SM by timeout: the data's end is what the receiver last said
    assert len(native.poll(now)) == len(spec.poll(now)) == 1
    r = native.receiver
    if by_endpoint:
        r.offer(r.command(lib.LBD_CMD_REMOVE_ENDPOINT, endpoint_id=1))
    else:
        r.offer(r.command(lib.LBD_CMD_REMOVE_SUBSCRIPTION, endpoint_id=1, stream_id=STREAM))
    r.do_work(now)
    spec.image.drain(now)
    assert [e for e in r.poll_events() if e.type == lib.LBD_EVENT_IMAGE_REMOVED] == []  # it lingers
    first = native.sent()
    assert first == spec.poll(now) and len(first) == 1
    sent = list(first)
    late = datagrams([sizes, [64]])[-1]  # data after the drain began is not taken
    for tick in ticks:
        now += tick
        if not by_endpoint:  # (an endpoint being removed reads no more datagrams)
            native.feed(late, now)
            spec.feed(late, now)
        frames = spec.poll(now)
        assert native.poll(now) == frames
        assert native.positions() == spec.positions()
        sent += frames
    assert sent and all(f[6] == FrameType.SM and f[5] & 0x40 for f in sent)
    assert {struct.unpack_from("<ii", f, 16) for f in sent} == {(INITIAL + JOIN // T, JOIN % T + sum(_align(32 + s)
                                                                 for s in sizes))}
    now += 5 * 200_000_000
    native.poll(now)
    r.do_work(now)
    events = r.poll_events()
    assert [e.reason for e in events if e.type == lib.LBD_EVENT_IMAGE_REMOVED] == [lib.LBD_REASON_REMOVED]
    assert [e.type for e in events if e.type == lib.LBD_EVENT_ENDPOINT_REMOVED] == (
        [lib.LBD_EVENT_ENDPOINT_REMOVED] if by_endpoint else [])
    r.close()


def test_an_endpoint_removed_again_while_draining_ends_its_images_after_one_eos_status_message(
        make_log: Callable[..., LogBuffers]) -> None:
    """REMOVE_ENDPOINT twice before a poll (the channel wanted anew at once): every image still says EOS once, else
    a min or tagged sender would count the receiver until its receiver timeout; then the images and the endpoint
    end."""
    native = NativeRig(make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM))
    native.start(1)
    r = native.receiver
    r.offer(r.command(lib.LBD_CMD_REMOVE_ENDPOINT, endpoint_id=1))
    r.offer(r.command(lib.LBD_CMD_REMOVE_ENDPOINT, endpoint_id=1))
    r.do_work(2)
    sent = native.sent()
    assert len(sent) == 1 and sent[0][6] == FrameType.SM and sent[0][5] & 0x40
    r.do_work(3)
    events = [(e.type, e.reason) for e in r.poll_events()]
    assert events == [(lib.LBD_EVENT_IMAGE_REMOVED, lib.LBD_REASON_REMOVED), (lib.LBD_EVENT_ENDPOINT_REMOVED, 0)]
    assert native.sent() == []
    r.close()
