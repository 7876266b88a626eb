from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logbuf.marketdata import moldudp64 as m

sessions = st.binary(min_size=0, max_size=10).filter(lambda b: b.isascii())
sequences = st.integers(min_value=1, max_value=2**64 - 1)
messages = st.lists(st.binary(max_size=300), min_size=1, max_size=40)


@given(sessions, sequences, messages)
def test_downstream_round_trip(session: bytes, sequence: int, msgs: list[bytes]) -> None:
    packet = m.encode_downstream(session, sequence, msgs)
    assert len(packet) == m.HEADER_LENGTH + sum(2 + len(x) for x in msgs)
    decoded = m.decode(packet)
    assert decoded == m.DownstreamPacket(session.ljust(10), sequence, tuple(msgs))
    assert decoded.next_sequence == sequence + len(msgs)
    assert m.encode(decoded) == packet


@given(sessions, st.integers(min_value=0, max_value=2**64 - 1))
def test_heartbeat_and_end_of_session_round_trip(session: bytes, next_sequence: int) -> None:
    hb = m.encode_heartbeat(session, next_sequence)
    eos = m.encode_end_of_session(session, next_sequence)
    assert len(hb) == len(eos) == m.HEADER_LENGTH
    assert hb[m.COUNT_OFFSET :] == b"\x00\x00" and eos[m.COUNT_OFFSET :] == b"\xff\xff"
    assert m.decode(hb) == m.Heartbeat(session.ljust(10), next_sequence)
    assert m.decode(eos) == m.EndOfSession(session.ljust(10), next_sequence)


@given(sessions, sequences, st.integers(min_value=1, max_value=0xFFFE))
def test_request_round_trip(session: bytes, sequence: int, count: int) -> None:
    raw = m.encode_request(session, sequence, count)
    assert len(raw) == m.REQUEST_LENGTH
    assert m.decode_request(raw) == m.RequestPacket(session.ljust(10), sequence, count)


def test_layout_is_big_endian_with_space_padded_session() -> None:
    packet = m.encode_downstream("AB", 0x0102030405060708, [b"xyz"])
    assert packet == b"AB        " + bytes(range(1, 9)) + b"\x00\x01" + b"\x00\x03xyz"


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"", "shorter than the 20-byte header"),
        (b"S" * 19, "shorter than the 20-byte header"),
        (m.encode_header("S", 1, 1) + b"\x00", "before the length of message 0"),
        (m.encode_header("S", 1, 1) + b"\x00\x05abc", "claims 5 bytes"),
        (m.encode_header("S", 1, 2) + b"\x00\x01a", "before the length of message 1"),
        (m.encode_header("S", 1, 1) + b"\x00\x01ab", "1 bytes left over"),
        (m.encode_heartbeat("S", 1) + b"x", "heartbeat packet carries 1 trailing bytes"),
        (m.encode_end_of_session("S", 1) + b"xy", "end-of-session packet carries 2"),
        (m.encode_header("S", 0, 1) + b"\x00\x01a", "starts at sequence 0"),
    ],
)
def test_malformed_downstream_raises(raw: bytes, fragment: str) -> None:
    with pytest.raises(m.MoldUDP64Error, match=fragment):
        m.decode(raw)


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (m.encode_header("S", 1, 1) + b"x", "exactly 20"),
        (m.encode_header("S", 1, 1)[:19], "exactly 20"),
        (m.encode_header("S", 1, 0), "outside 1..65534"),
        (m.encode_header("S", 1, 0xFFFF), "outside 1..65534"),
        (m.encode_header("S", 0, 5), "below the first sequence"),
    ],
)
def test_malformed_request_raises(raw: bytes, fragment: str) -> None:
    with pytest.raises(m.MoldUDP64Error, match=fragment):
        m.decode_request(raw)


def test_encode_rejects_bad_values() -> None:
    with pytest.raises(m.MoldUDP64Error, match="longer than 10"):
        m.encode_session("ELEVENCHARS")
    with pytest.raises(m.MoldUDP64Error, match="at least one message"):
        m.encode_downstream("S", 1, [])
    with pytest.raises(m.MoldUDP64Error, match="16-bit block length"):
        m.encode_downstream("S", 1, [bytes(0x10000)])
    with pytest.raises(m.MoldUDP64Error, match="unsigned 64-bit"):
        m.encode_heartbeat("S", 2**64)
    with pytest.raises(m.MoldUDP64Error, match="outside 1..65534"):
        m.encode_request("S", 1, 0)
    assert issubclass(m.MoldUDP64Error, ValueError)


def test_packet_builder_respects_budget() -> None:
    builder = m.PacketBuilder("S", 7, budget=m.HEADER_LENGTH + 3 * 12)
    assert all(builder.try_append(bytes(10)) for _ in range(3))
    assert not builder.try_append(b"")  # 2 more bytes would exceed the budget
    first = builder.build()
    assert len(first) == m.HEADER_LENGTH + 36
    assert m.decode(first) == m.DownstreamPacket(b"S         ", 7, (bytes(10),) * 3)
    assert builder.try_append(b"z")
    assert m.decode(builder.build()).sequence == 10
    with pytest.raises(m.MoldUDP64Error):
        builder.build()
