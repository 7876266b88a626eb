"""Hypothesis: whatever bytes arrive, ``classify`` either returns a packet that re-encodes to exactly those
bytes or raises MalformedFrameError - never anything else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.protocol import (
    ControlPacket,
    DataHeader,
    DataPacket,
    ErrorFrame,
    FrameType,
    MalformedFrameError,
    Nak,
    PacketKind,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    classify,
    encode_data_frame,
)
from support.fuzz import mutate

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
u8 = st.integers(0, 255)
offset = st.integers(0, 2**20).map(lambda x: x * 32)

frames = st.one_of(
    st.builds(SetupFrame, offset.map(lambda x: x % 65536), i32, i32, i32, i32, st.sampled_from([65536, 1 << 24]),
              st.sampled_from([64, 1408, 8192]), st.integers(0, 255), u8),
    st.builds(StatusMessage, i32, i32, i32, st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), i64, u8,
              st.binary(max_size=16)),
    st.builds(Nak, i32, i32, i32, offset, st.integers(1, 2**31 - 1), u8),
    st.builds(RttMeasurement, i32, i32, i64, i64, i64, u8),
    st.builds(ErrorFrame, i32, i32, i64, i64, i32, st.text(max_size=40), u8),
)


@st.composite
def data_datagrams(draw: st.DrawFn) -> bytes:
    ids = {"session_id": draw(i32), "stream_id": draw(i32), "term_id": draw(i32)}
    base = draw(offset)
    out = b""
    for payload in draw(st.lists(st.binary(max_size=200), min_size=1, max_size=5)):
        out += encode_data_frame(payload, term_offset=base + len(out), flags=draw(u8), **ids)
    if draw(st.booleans()):  # Aeron's sender at a term end: a PAD header after the last DATA frame
        pad_length = draw(st.integers(1, 2048)) * 32
        out += DataHeader(pad_length, base + len(out), ids["session_id"], ids["stream_id"], ids["term_id"],
                          flags=0xC0, frame_type=FrameType.PAD).encode()
    return out


valid = st.one_of(
    st.lists(frames, min_size=1, max_size=3).map(lambda fs: b"".join(f.encode() for f in fs)),
    data_datagrams(),
    st.builds(DataHeader.heartbeat, i32, i32, i32, offset, end_of_stream=st.booleans()).map(DataHeader.encode),
    st.builds(DataHeader, st.integers(1, 2048).map(lambda x: x * 32), offset, i32, i32, i32, st.just(0xC0),
              st.just(FrameType.PAD), st.just(0)).map(DataHeader.encode),
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    return mutate(draw, draw(valid), mutations=(1, 4), extend=40)


def reencode(packet: ControlPacket | DataPacket, raw: bytes) -> bytes:
    if isinstance(packet, ControlPacket):
        return b"".join(frame.encode() for frame in packet.frames)
    assert packet.length == len(raw)
    if packet.kind is PacketKind.DATA:
        assert packet.frame_count >= 1 and packet.term_span >= packet.length
        return packet.header.encode() + raw[32:]
    return packet.header.encode() + raw[32:]


def check(raw: bytes) -> None:
    try:
        packet = classify(raw)
    except MalformedFrameError:
        return
    assert reencode(packet, raw) == raw


@settings(max_examples=400, deadline=None)
@given(valid)
def test_valid_datagrams_classify_and_round_trip(raw: bytes) -> None:
    packet = classify(raw)
    assert reencode(packet, raw) == raw


@settings(max_examples=800, deadline=None)
@given(mutated())
def test_mutated_datagrams_never_crash(raw: bytes) -> None:
    check(raw)


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(raw: bytes) -> None:
    check(raw)
