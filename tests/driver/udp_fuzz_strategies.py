"""Hypothesis strategies for the UDP driver tests: well-formed datagrams of every kind, then mutated ones."""

from __future__ import annotations

from hypothesis import strategies as st

from logbuf.protocol import (
    DataHeader,
    ErrorFrame,
    FrameType,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    encode_data_frame,
)
from support.fuzz import mutate

T = 64 * 1024
SESSION, STREAM, INITIAL = 77, 1001, 5


@st.composite
def wellformed(draw: st.DrawFn, session: int = SESSION, stream: int = STREAM) -> bytes:
    term_offset = draw(st.integers(0, T // 32 - 1)) * 32
    term_id = INITIAL + draw(st.integers(0, 3))
    kind = draw(st.sampled_from(["data", "pad", "heartbeat", "setup", "sm", "nak", "rttm", "err"]))
    if kind == "data":
        out = b""
        for payload in draw(st.lists(st.binary(max_size=300), min_size=1, max_size=4)):
            out += encode_data_frame(payload, term_offset=term_offset + len(out), session_id=session,
                                     stream_id=stream, term_id=term_id, flags=draw(st.integers(0, 255)))
        if draw(st.booleans()):  # as Aeron's sender at a term end: a PAD header after the DATA frames
            out += DataHeader(draw(st.integers(1, 64)) * 32, term_offset + len(out), session, stream, term_id,
                              frame_type=FrameType.PAD).encode()
        return out
    if kind == "pad":
        return DataHeader(draw(st.integers(1, 2048)) * 32, term_offset, session, stream, term_id,
                          frame_type=FrameType.PAD).encode()
    if kind == "heartbeat":
        return DataHeader.heartbeat(session, stream, term_id, term_offset, end_of_stream=draw(st.booleans())).encode()
    if kind == "setup":
        return SetupFrame(term_offset, session, stream, INITIAL, term_id, T, 1408).encode()
    if kind == "sm":
        return StatusMessage(session, stream, term_id, term_offset, 4096, 9, draw(st.sampled_from([0, 0x80]))).encode()
    if kind == "nak":
        return Nak(session, stream, term_id, term_offset, draw(st.integers(1, 4096))).encode()
    if kind == "rttm":
        return RttMeasurement(session, stream, 1, 0, 9, draw(st.sampled_from([0, 0x80]))).encode()
    return ErrorFrame(session, stream, 9, 0, 1, "no").encode()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    return mutate(draw, draw(wellformed()))


datagram = st.one_of(mutated(), st.binary(max_size=200))
