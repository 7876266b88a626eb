"""Hypothesis: hostile or broken datagrams into a receiver with a live image never crash anything - not the
dispatcher, not the image's rebuild / loss scan, not a subscriber reading the image - and every datagram
that is not well formed is counted as an invalid packet."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logbuf import Image, LogBuffers, Position
from logbuf.driver.udp import ImageReceiver, ReceiverDispatcher
from logbuf.protocol import (
    DataHeader,
    DataPacket,
    FrameType,
    MalformedFrameError,
    Nak,
    SetupFrame,
    StatusMessage,
    classify,
    encode_data_frame,
)
from support.fuzz import mutate

T = 64 * 1024
SESSION, STREAM, INITIAL = 77, 1001, 5
JOIN = T + 1024

in_window = st.integers(0, (32768 + 4096) // 32).map(lambda n: JOIN - 2048 + 32 * n)


@st.composite
def image_datagrams(draw: st.DrawFn) -> bytes:
    """Well-formed datagrams for the image's session, at positions around its window."""
    position = draw(in_window)
    term_id, term_offset = INITIAL + position // T, position % T
    kind = draw(st.sampled_from(["data", "pad", "heartbeat", "setup", "other"]))
    if kind == "data":
        out = b""
        for payload in draw(st.lists(st.binary(max_size=300), min_size=1, max_size=4)):
            out += encode_data_frame(payload, term_offset=term_offset + len(out), session_id=SESSION,
                                     stream_id=STREAM, term_id=term_id, flags=draw(st.integers(0, 255)))
        return out
    if kind == "pad":
        return DataHeader(draw(st.integers(1, 4096)) * 32, term_offset, SESSION, STREAM, term_id,
                          frame_type=FrameType.PAD).encode()
    if kind == "heartbeat":
        return DataHeader.heartbeat(SESSION, STREAM, term_id, term_offset, end_of_stream=draw(st.booleans())).encode()
    if kind == "setup":
        return SetupFrame(term_offset, draw(st.sampled_from([SESSION, 78])), STREAM, INITIAL, term_id, T, 1408).encode()
    return draw(st.sampled_from([StatusMessage(SESSION, STREAM, 6, 0, 100, 1).encode(),
                                 Nak(SESSION, STREAM, 6, 0, 64).encode()]))


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    return mutate(draw, draw(image_datagrams()))


datagrams = st.lists(st.one_of(hostile(), st.binary(max_size=200)), min_size=1, max_size=25)


def invalid(raw: bytes, image_live: bool) -> bool:
    """Malformed, or well formed but not fitting the live image's term (only the image can tell that)."""
    try:
        packet = classify(raw)
    except MalformedFrameError:
        return True
    if not image_live or not isinstance(packet, DataPacket):
        return False
    if (packet.session_id, packet.stream_id) != (SESSION, STREAM):
        return False
    return packet.term_offset >= T or packet.term_offset + packet.term_span > T


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datagrams)
def test_fuzzed_datagrams_into_a_live_image(batch: list[bytes]) -> None:
    directory = tempfile.mkdtemp(prefix="logbuf-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    log = LogBuffers.create(os.path.join(directory, "image.logbuffer"), term_length=T, session_id=SESSION,
                            stream_id=STREAM, initial_term_id=INITIAL)
    try:
        dispatcher = ReceiverDispatcher(receiver_id=1)
        dispatcher.add_subscription(STREAM)
        dispatcher.add_image(ImageReceiver(log, JOIN, 0, receiver_id=1, counters=dispatcher.counters), "src")
        subscriber = Image(log, Position.standalone(JOIN))
        now = 0
        expected_invalid = 0
        for raw in batch:
            now += 50_000
            expected_invalid += invalid(raw, dispatcher.image(SESSION, STREAM) is not None)
            dispatcher.on_datagram(raw, now, "src")
            dispatcher.poll(now, lambda image: subscriber.position)
            subscriber.poll(lambda buf, header: None, 100)
        assert dispatcher.counters.invalid_packets == expected_invalid
        assert dispatcher.counters.bytes_received == sum(map(len, batch))
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
