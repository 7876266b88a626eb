"""``classify``: each kind of datagram, and every way a datagram can be short or inconsistent."""

from __future__ import annotations

import struct

import pytest

from logbuf.protocol import (
    ControlPacket,
    DataHeader,
    DataPacket,
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

IDS = {"session_id": 7, "stream_id": 1001, "term_id": 42}


def data_datagram(*payloads: bytes, term_offset: int = 1024, aligned_last: bool = True) -> bytes:
    out = b""
    for i, payload in enumerate(payloads):
        last = i == len(payloads) - 1
        out += encode_data_frame(payload, term_offset=term_offset + len(out), aligned=aligned_last or not last, **IDS)
    return out


def patch(raw: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(raw)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_data_datagram_of_several_frames() -> None:
    raw = data_datagram(b"a" * 10, b"b" * 40, b"c" * 100)
    packet = classify(raw)
    assert isinstance(packet, DataPacket)
    assert packet.kind is PacketKind.DATA and packet.frame_count == 3
    assert packet.length == len(raw) == 64 + 96 + 160 and packet.term_span == len(raw)
    assert (packet.session_id, packet.stream_id, packet.term_id, packet.term_offset) == (7, 1001, 42, 1024)
    assert packet.header.frame_length == 42


def test_last_frame_may_omit_its_alignment_bytes() -> None:
    raw = data_datagram(b"a" * 10, b"b" * 5, aligned_last=False)
    packet = classify(raw)
    assert isinstance(packet, DataPacket)
    assert packet.length == 64 + 37 and packet.term_span == 128 and packet.frame_count == 2


def test_header_only_pad_covers_its_frame_length() -> None:
    raw = DataHeader(4096, 61440, 7, 1001, 42, frame_type=FrameType.PAD).encode()
    packet = classify(raw)
    assert isinstance(packet, DataPacket)
    assert packet.kind is PacketKind.PAD and packet.length == 32 and packet.term_span == 4096


def test_whole_pad_frame_is_accepted_too() -> None:
    raw = DataHeader(64, 0, 7, 1001, 42, frame_type=FrameType.PAD).encode() + bytes(32)
    packet = classify(raw)
    assert isinstance(packet, DataPacket) and packet.kind is PacketKind.PAD and packet.length == 64


def test_an_aborted_claims_unaligned_pad_is_accepted() -> None:
    """An aborted claim of 100 bytes leaves a PAD of length 132 (Aeron's sender sends the same shape): it
    covers its length aligned, header alone or whole."""
    alone = classify(DataHeader(132, 4096, 7, 1001, 42, frame_type=FrameType.PAD).encode())
    assert isinstance(alone, DataPacket)
    assert (alone.kind, alone.length, alone.term_span) == (PacketKind.PAD, 32, 160)
    whole = classify(DataHeader(132, 4096, 7, 1001, 42, frame_type=FrameType.PAD).encode() + bytes(100))
    assert isinstance(whole, DataPacket) and (whole.kind, whole.term_span) == (PacketKind.PAD, 160)
    then_data = classify(DataHeader(132, 4096, 7, 1001, 42, frame_type=FrameType.PAD).encode() + bytes(128)
                         + data_datagram(b"x" * 10, term_offset=4096 + 160))
    assert isinstance(then_data, DataPacket) and (then_data.frame_count, then_data.term_span) == (2, 160 + 64)


def test_data_frames_then_a_pad_header_cover_the_pad() -> None:
    """Aeron's sender at a term end: the last DATA frames and the PAD's header alone, in one datagram."""
    data = data_datagram(b"m" * 100, b"n" * 100, term_offset=65184 - 320)
    pad = DataHeader(352, 65184, 7, 1001, 42, frame_type=FrameType.PAD).encode()
    packet = classify(data + pad)
    assert isinstance(packet, DataPacket)
    assert packet.kind is PacketKind.DATA and packet.frame_count == 3
    assert packet.length == 320 + 32 and packet.term_span == 320 + 352  # up to the term end
    assert packet.term_offset + packet.term_span == 65536


def test_a_whole_32_byte_pad_may_be_followed_by_data() -> None:
    """A PAD of just its header does not end Aeron's term scan: frames may follow it."""
    pad = DataHeader(32, 1024, 7, 1001, 42, frame_type=FrameType.PAD).encode()
    packet = classify(pad + data_datagram(b"x" * 10, term_offset=1056))
    assert isinstance(packet, DataPacket)
    assert (packet.kind, packet.frame_count, packet.term_span) == (PacketKind.DATA, 2, 32 + 64)


def test_heartbeat() -> None:
    packet = classify(DataHeader.heartbeat(7, 1001, 42, 2048, end_of_stream=True).encode())
    assert isinstance(packet, DataPacket)
    assert packet.kind is PacketKind.HEARTBEAT and packet.term_span == 0 and packet.header.is_end_of_stream


def test_control_datagrams_one_or_several_frames() -> None:
    setup = SetupFrame(0, 7, 1001, 42, 42, 65536, 1408)
    sm = StatusMessage(7, 1001, 42, 0, 32768, 5)
    nak = Nak(7, 1001, 42, 64, 128)
    rttm = RttMeasurement(7, 1001, 1, 2, 3)
    assert classify(setup.encode()) == ControlPacket((setup,))
    packet = classify(sm.encode() + nak.encode() + rttm.encode())
    assert isinstance(packet, ControlPacket) and packet.kind is PacketKind.CONTROL
    assert packet.frames == (sm, nak, rttm)


def test_a_length_argument_limits_what_is_read() -> None:
    raw = Nak(7, 1001, 42, 64, 128).encode()
    assert classify(raw + b"junk", len(raw)) == ControlPacket((Nak(7, 1001, 42, 64, 128),))
    with pytest.raises(ValueError):
        classify(raw, len(raw) + 1)


GOOD = data_datagram(b"a" * 10, b"b" * 40)
PAD_AT_160 = DataHeader(96, 1024 + 160, 7, 1001, 42, frame_type=FrameType.PAD).encode()  # after GOOD, at 1024


@pytest.mark.parametrize(
    ("raw", "match", "offset"),
    [
        (b"", "empty", 0),
        (GOOD[:7], "too short", 0),
        (GOOD + b"\x00" * 8, "trailing", 160),
        (GOOD[:100], "runs past", 64),
        (patch(GOOD, 64 + 12, "<i", 8), "different sessions", 64),
        (patch(GOOD, 64 + 16, "<i", 8), "different sessions", 64),
        (patch(GOOD, 64 + 20, "<i", 43), "different sessions", 64),
        (patch(GOOD, 64 + 8, "<i", 1024), "term offset", 64),
        (patch(GOOD, 64 + 4, "<B", 1), "version", 64),
        (patch(patch(GOOD, 64 + 6, "<H", FrameType.PAD), 64, "<i", 16), "shorter than its header", 64),
        (patch(GOOD, 64 + 6, "<H", FrameType.SETUP), "type 0x5", 64),
        (GOOD + PAD_AT_160 + bytes(8), "PAD in a datagram", 160),
        (GOOD + PAD_AT_160 + GOOD, "term offset", 256),
        (GOOD + patch(PAD_AT_160, 8, "<i", 192), "term offset", 160),
        (GOOD + patch(PAD_AT_160, 12, "<i", 8), "different sessions", 160),
        (DataHeader(32, 0, 7, 1001, 42, frame_type=FrameType.PAD).encode() + GOOD, "term offset", 32),
        (patch(GOOD, 64, "<i", 0), "length 0", 64),
        (patch(GOOD, 64, "<i", -64), "length", 64),
        (patch(GOOD, 0, "<i", 4096), "runs past", 0),
        (patch(GOOD, 0, "<i", 16), "frame length", 0),
        (patch(GOOD, 8, "<i", 1000), "frame boundary", 0),
        (DataHeader.heartbeat(7, 1001, 42, 0).encode() + bytes(32), "heartbeat", 0),
        (DataHeader(4096, 0, 7, 1001, 42, frame_type=FrameType.PAD).encode() + bytes(32), "PAD in a datagram", 0),
        (patch(DataHeader(64, 0, 7, 1001, 42, frame_type=FrameType.PAD).encode() + bytes(8), 0, "<i", 72),
         "PAD in a datagram", 0),
        (patch(Nak(7, 1001, 42, 64, 128).encode(), 6, "<H", FrameType.RES), "not handled", 0),
        (patch(Nak(7, 1001, 42, 64, 128).encode(), 6, "<H", 0x55), "unknown", 0),
        (Nak(7, 1001, 42, 64, 128).encode() + GOOD, "not handled|type", 28),
        (Nak(7, 1001, 42, 64, 128).encode() + b"\x00\x00", "too short", 28),
        (patch(StatusMessage(7, 1001, 42, 0, 32768, 5).encode(), 0, "<i", 8), "SM frame length", 0),
    ],
)
def test_malformed_datagrams(raw: bytes, match: str, offset: int) -> None:
    with pytest.raises(MalformedFrameError, match=match) as info:
        classify(raw)
    assert info.value.offset == offset
