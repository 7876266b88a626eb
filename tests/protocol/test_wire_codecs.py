"""Every frame codec: fields at Aeron's offsets, round trips, and clear errors for short / inconsistent input."""

from __future__ import annotations

import struct

import pytest

from logbuf.protocol import (
    DataHeader,
    ErrorFrame,
    FrameType,
    MalformedFrameError,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    encode_data_frame,
)
from logbuf.protocol import error_frame as err
from logbuf.protocol import nak as nk
from logbuf.protocol import rttm as rt
from logbuf.protocol import setup as st
from logbuf.protocol import status_message as sm


def i32(buf: bytes, offset: int) -> int:
    return struct.unpack_from("<i", buf, offset)[0]


def i64(buf: bytes, offset: int) -> int:
    return struct.unpack_from("<q", buf, offset)[0]


def word(buf: bytes) -> tuple[int, int, int, int]:
    return struct.unpack_from("<iBBH", buf, 0)


SETUP = SetupFrame(term_offset=4096, session_id=-7, stream_id=1001, initial_term_id=-2**31, active_term_id=2**31 - 1,
                   term_length=1 << 24, mtu=1408, ttl=3, flags=0x10)
SM = StatusMessage(session_id=11, stream_id=22, consumption_term_id=-33, consumption_term_offset=4160,
                   receiver_window=131072, receiver_id=-(2**62), flags=0x80)
NAK = Nak(session_id=11, stream_id=22, term_id=33, term_offset=96, length=1408)
RTTM = RttMeasurement(session_id=11, stream_id=22, echo_timestamp_ns=2**62, reception_delta_ns=-5, receiver_id=77,
                      flags=0x80)
ERR = ErrorFrame(session_id=11, stream_id=22, receiver_id=99, group_tag=-1, error_code=7, message="bad stream é")
FRAMES = [SETUP, SM, NAK, RTTM, ERR]


def test_setup_fields_at_aeron_offsets() -> None:
    raw = SETUP.encode()
    assert len(raw) == st.SETUP_LENGTH == 40
    assert word(raw) == (40, 0, 0x10, FrameType.SETUP)
    assert i32(raw, st.TERM_OFFSET_FIELD_OFFSET) == 4096
    assert i32(raw, st.SESSION_ID_FIELD_OFFSET) == -7
    assert i32(raw, st.STREAM_ID_FIELD_OFFSET) == 1001
    assert i32(raw, st.INITIAL_TERM_ID_FIELD_OFFSET) == -2**31
    assert i32(raw, st.ACTIVE_TERM_ID_FIELD_OFFSET) == 2**31 - 1
    assert i32(raw, st.TERM_LENGTH_FIELD_OFFSET) == 1 << 24
    assert i32(raw, st.MTU_FIELD_OFFSET) == 1408
    assert i32(raw, st.TTL_FIELD_OFFSET) == 3
    assert (st.TERM_OFFSET_FIELD_OFFSET, st.SESSION_ID_FIELD_OFFSET, st.TTL_FIELD_OFFSET) == (8, 12, 36)


def test_setup_join_position_wraps_term_ids() -> None:
    # active term id wrapped past INT32_MAX relative to the initial one: 2 terms later
    setup = SetupFrame(64, 1, 2, 2**31 - 1, -(2**31) + 1, 1 << 16, 1408)
    assert setup.join_position() == 2 * (1 << 16) + 64


def test_status_message_fields_and_flags() -> None:
    raw = SM.encode()
    assert len(raw) == sm.STATUS_MESSAGE_LENGTH == 36
    assert word(raw) == (36, 0, sm.SEND_SETUP_FLAG, FrameType.SM)
    assert i32(raw, sm.SESSION_ID_FIELD_OFFSET) == 11
    assert i32(raw, sm.STREAM_ID_FIELD_OFFSET) == 22
    assert i32(raw, sm.CONSUMPTION_TERM_ID_FIELD_OFFSET) == -33
    assert i32(raw, sm.CONSUMPTION_TERM_OFFSET_FIELD_OFFSET) == 4160
    assert i32(raw, sm.RECEIVER_WINDOW_FIELD_OFFSET) == 131072
    assert i64(raw, sm.RECEIVER_ID_FIELD_OFFSET) == -(2**62)
    assert SM.is_setup_requested and not SM.is_end_of_stream
    eos = SM._replace(flags=sm.END_OF_STREAM_FLAG)
    assert eos.is_end_of_stream and not eos.is_setup_requested


def test_status_message_position_round_trip() -> None:
    msg = StatusMessage.at_position(1, 2, position=3 * 65536 + 320, position_bits=16, initial_term_id=-1,
                                    receiver_window=1024, receiver_id=5)
    assert (msg.consumption_term_id, msg.consumption_term_offset) == (2, 320)
    assert msg.position(16, -1) == 3 * 65536 + 320


def test_status_message_feedback_is_kept() -> None:
    msg = SM._replace(feedback=b"\x01\x02\x03\x04\x05\x06\x07\x08")
    raw = msg.encode()
    assert i32(raw, 0) == 44 and raw[sm.FEEDBACK_OFFSET:] == msg.feedback
    assert StatusMessage.decode(raw) == msg


def test_nak_fields() -> None:
    raw = NAK.encode()
    assert len(raw) == nk.NAK_LENGTH == 28
    assert word(raw) == (28, 0, 0, FrameType.NAK)
    assert [i32(raw, o) for o in (nk.SESSION_ID_FIELD_OFFSET, nk.STREAM_ID_FIELD_OFFSET, nk.TERM_ID_FIELD_OFFSET,
                                  nk.TERM_OFFSET_FIELD_OFFSET, nk.LENGTH_FIELD_OFFSET)] == [11, 22, 33, 96, 1408]


def test_rttm_fields() -> None:
    raw = RTTM.encode()
    assert len(raw) == rt.RTTM_LENGTH == 40
    assert word(raw) == (40, 0, rt.REPLY_FLAG, FrameType.RTTM)
    assert i64(raw, rt.ECHO_TIMESTAMP_FIELD_OFFSET) == 2**62
    assert i64(raw, rt.RECEPTION_DELTA_FIELD_OFFSET) == -5
    assert i64(raw, rt.RECEIVER_ID_FIELD_OFFSET) == 77
    assert RTTM.is_reply


def test_error_frame_fields() -> None:
    raw = ERR.encode()
    text = "bad stream é".encode()
    assert len(raw) == err.ERROR_HEADER_LENGTH + len(text)
    assert word(raw) == (len(raw), 0, 0, FrameType.ERR)
    assert i64(raw, err.RECEIVER_ID_FIELD_OFFSET) == 99
    assert i64(raw, err.GROUP_TAG_FIELD_OFFSET) == -1
    assert i32(raw, err.ERROR_CODE_FIELD_OFFSET) == 7
    assert i32(raw, err.ERROR_LENGTH_FIELD_OFFSET) == len(text)
    assert raw[err.ERROR_TEXT_OFFSET:] == text


def test_data_header_and_heartbeat() -> None:
    frame = encode_data_frame(b"hello", term_offset=64, session_id=1, stream_id=2, term_id=3, reserved_value=-9)
    assert len(frame) == 64 and frame[37:] == bytes(27)
    header = DataHeader.decode(frame)
    assert header == DataHeader(37, 64, 1, 2, 3, 0xC0, FrameType.DATA, -9)
    assert header.encode() == frame[:32]
    hb = DataHeader.heartbeat(1, 2, 3, 128, end_of_stream=True)
    assert hb.is_heartbeat and hb.is_end_of_stream and hb.frame_length == 0
    assert DataHeader.decode(hb.encode()) == hb
    assert len(encode_data_frame(b"x", term_offset=0, session_id=1, stream_id=2, term_id=3, aligned=False)) == 33


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: type(f).__name__)
def test_round_trip_and_encode_into(frame: object) -> None:
    raw = frame.encode()  # type: ignore[attr-defined]
    assert type(frame).decode(raw) == frame
    buffer = bytearray(len(raw) + 10)
    assert frame.encode_into(buffer, 10) == len(raw)  # type: ignore[attr-defined]
    assert bytes(buffer[10:]) == raw
    assert type(frame).decode(buffer, 10) == frame


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: type(f).__name__)
def test_every_truncation_is_rejected(frame: object) -> None:
    raw = frame.encode()  # type: ignore[attr-defined]
    for n in range(len(raw)):
        with pytest.raises(MalformedFrameError):
            type(frame).decode(raw[:n])
        with pytest.raises(MalformedFrameError):  # a length argument shorter than the buffer counts too
            type(frame).decode(raw, 0, n)


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: type(f).__name__)
def test_wrong_version_and_type_are_rejected(frame: object) -> None:
    raw = bytearray(frame.encode())  # type: ignore[attr-defined]
    raw[4] = 1
    with pytest.raises(MalformedFrameError, match="version"):
        type(frame).decode(bytes(raw))
    raw[4] = 0
    raw[6] = FrameType.DATA if raw[6] != FrameType.DATA else FrameType.NAK
    with pytest.raises(MalformedFrameError, match="type"):
        type(frame).decode(bytes(raw))


def test_fixed_length_frames_reject_other_lengths() -> None:
    for frame in (SETUP, NAK, RTTM):
        raw = bytearray(frame.encode() + bytes(8))
        struct.pack_into("<i", raw, 0, len(raw))
        with pytest.raises(MalformedFrameError, match="frame length"):
            type(frame).decode(bytes(raw))


def _patched(frame: object, offset: int, value: int) -> bytes:
    raw = bytearray(frame.encode())  # type: ignore[attr-defined]
    struct.pack_into("<i", raw, offset, value)
    return bytes(raw)


@pytest.mark.parametrize(
    ("offset", "value", "match"),
    [
        (st.TERM_LENGTH_FIELD_OFFSET, 65536 + 32, "term length"),
        (st.TERM_LENGTH_FIELD_OFFSET, 32768, "term length"),
        (st.MTU_FIELD_OFFSET, 1400, "mtu"),
        (st.MTU_FIELD_OFFSET, 32, "mtu"),
        (st.TERM_OFFSET_FIELD_OFFSET, 1 << 24, "term offset"),
        (st.TERM_OFFSET_FIELD_OFFSET, 100, "term offset"),
        (st.TTL_FIELD_OFFSET, -1, "ttl"),
    ],
)
def test_inconsistent_setup_is_rejected(offset: int, value: int, match: str) -> None:
    with pytest.raises(MalformedFrameError, match=match):
        SetupFrame.decode(_patched(SETUP, offset, value))


@pytest.mark.parametrize(
    ("frame", "offset", "value", "match"),
    [
        (NAK, nk.TERM_OFFSET_FIELD_OFFSET, 100, "frame boundary"),
        (NAK, nk.TERM_OFFSET_FIELD_OFFSET, -32, "frame boundary"),
        (NAK, nk.LENGTH_FIELD_OFFSET, 0, "positive"),
        (SM, sm.RECEIVER_WINDOW_FIELD_OFFSET, -1, "window"),
        (SM, sm.CONSUMPTION_TERM_OFFSET_FIELD_OFFSET, -64, "offset"),
        (ERR, err.ERROR_LENGTH_FIELD_OFFSET, 3, "text length"),
        (ERR, err.ERROR_LENGTH_FIELD_OFFSET, -1, "text length"),
    ],
)
def test_inconsistent_control_frames_are_rejected(frame: object, offset: int, value: int, match: str) -> None:
    with pytest.raises(MalformedFrameError, match=match):
        type(frame).decode(_patched(frame, offset, value))


def test_error_text_must_be_utf8() -> None:
    raw = bytearray(ErrorFrame(1, 2, 3, 4, 5, "ab").encode())
    raw[-1] = 0xFF
    with pytest.raises(MalformedFrameError, match="UTF-8"):
        ErrorFrame.decode(bytes(raw))


def test_bad_data_headers_are_rejected() -> None:
    good = encode_data_frame(b"abc", term_offset=0, session_id=1, stream_id=2, term_id=3)
    with pytest.raises(MalformedFrameError, match="frame length"):
        DataHeader.decode(_patched_bytes(good, 0, 16))
    with pytest.raises(MalformedFrameError, match="frame boundary"):
        DataHeader.decode(_patched_bytes(good, 8, 4))
    pad_of_zero = DataHeader(0, 0, 1, 2, 3, frame_type=FrameType.PAD)
    with pytest.raises(ValueError):
        pad_of_zero.encode()
    raw = bytearray(DataHeader(64, 0, 1, 2, 3, frame_type=FrameType.PAD).encode())
    struct.pack_into("<i", raw, 0, 0)
    with pytest.raises(MalformedFrameError, match="PAD"):
        DataHeader.decode(bytes(raw))


def _patched_bytes(raw: bytes, offset: int, value: int) -> bytes:
    out = bytearray(raw)
    struct.pack_into("<i", out, offset, value)
    return bytes(out)


@pytest.mark.parametrize(
    "bad",
    [
        SETUP._replace(session_id=2**31),
        SETUP._replace(term_length=1000),
        SM._replace(receiver_id=2**63),
        SM._replace(receiver_window=-1),
        NAK._replace(length=0),
        NAK._replace(flags=256),
        RTTM._replace(echo_timestamp_ns=-(2**63) - 1),
        ERR._replace(message="x" * 1024),
        DataHeader(33, 7, 1, 2, 3),
        DataHeader(31, 0, 1, 2, 3),
    ],
    ids=lambda f: type(f).__name__,
)
def test_encode_refuses_values_that_do_not_fit(bad: object) -> None:
    with pytest.raises(ValueError):
        bad.encode()  # type: ignore[attr-defined]


def test_malformed_frame_error_is_a_value_error_with_an_offset() -> None:
    with pytest.raises(ValueError) as info:
        Nak.decode(bytes(5))
    assert isinstance(info.value, MalformedFrameError) and info.value.offset == 0
