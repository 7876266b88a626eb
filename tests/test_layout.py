"""Layout constants against the reference tables, and frames decoded by an independent struct decoder."""

from __future__ import annotations

import struct

import pytest

from logbuf import PublicationResult
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f

# (name, offset) straight from the reference's metadata table
METADATA_TABLE = [
    ("TERM_TAIL_COUNTERS_OFFSET", 0),
    ("LOG_ACTIVE_TERM_COUNT_OFFSET", 24),
    ("LOG_END_OF_STREAM_POSITION_OFFSET", 128),
    ("LOG_IS_CONNECTED_OFFSET", 136),
    ("LOG_ACTIVE_TRANSPORT_COUNT_OFFSET", 140),
    ("LOG_CORRELATION_ID_OFFSET", 256),
    ("LOG_INITIAL_TERM_ID_OFFSET", 264),
    ("LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET", 268),
    ("LOG_MTU_LENGTH_OFFSET", 272),
    ("LOG_TERM_LENGTH_OFFSET", 276),
    ("LOG_PAGE_SIZE_OFFSET", 280),
    ("LOG_PUBLICATION_WINDOW_LENGTH_OFFSET", 284),
    ("LOG_RECEIVER_WINDOW_LENGTH_OFFSET", 288),
    ("LOG_SOCKET_SNDBUF_LENGTH_OFFSET", 292),
    ("LOG_OS_MAX_SOCKET_RCVBUF_LENGTH_OFFSET", 312),
    ("LOG_MAX_RESEND_OFFSET", 316),
    ("LOG_DEFAULT_FRAME_HEADER_OFFSET", 320),
    ("LOG_ENTITY_TAG_OFFSET", 448),
    ("LOG_RESPONSE_CORRELATION_ID_OFFSET", 456),
    ("LOG_LINGER_TIMEOUT_NS_OFFSET", 464),
    ("LOG_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS_OFFSET", 472),
    ("LOG_UNTETHERED_RESTING_TIMEOUT_NS_OFFSET", 480),
    ("LOG_GROUP_OFFSET", 488),
    ("LOG_TETHER_OFFSET", 495),
]


@pytest.mark.parametrize(("name", "offset"), METADATA_TABLE)
def test_metadata_offsets_match_reference(name: str, offset: int) -> None:
    assert getattr(d, name) == offset


def test_frame_header_offsets_match_reference() -> None:
    assert (f.FRAME_LENGTH_OFFSET, f.VERSION_OFFSET, f.FLAGS_OFFSET, f.TYPE_OFFSET) == (0, 4, 5, 6)
    assert (f.TERM_OFFSET_OFFSET, f.SESSION_ID_OFFSET, f.STREAM_ID_OFFSET, f.TERM_ID_OFFSET) == (8, 12, 16, 20)
    assert f.RESERVED_VALUE_OFFSET == 24 and f.HEADER_LENGTH == 32 and f.FRAME_ALIGNMENT == 32
    assert (f.BEGIN_FLAG, f.END_FLAG, f.EOS_FLAG, f.UNFRAGMENTED) == (0x80, 0x40, 0x20, 0xC0)
    types = (f.HDR_TYPE_PAD, f.HDR_TYPE_DATA, f.HDR_TYPE_NAK, f.HDR_TYPE_SM, f.HDR_TYPE_ERR, f.HDR_TYPE_SETUP)
    assert types == (0, 1, 2, 3, 4, 5)
    assert (f.HDR_TYPE_RTTM, f.HDR_TYPE_RES, f.HDR_TYPE_RSP_SETUP, f.HDR_TYPE_EXT) == (6, 7, 0x0B, 0xFFFF)


def test_result_codes_match_aeron() -> None:
    assert [(r.name, r.value) for r in PublicationResult] == [
        ("NOT_CONNECTED", -1),
        ("BACK_PRESSURED", -2),
        ("ADMIN_ACTION", -3),
        ("CLOSED", -4),
        ("MAX_POSITION_EXCEEDED", -5),
    ]


def test_file_length_is_three_terms_plus_metadata_page_aligned() -> None:
    assert d.compute_log_length(64 * 1024, 4096) == 3 * 64 * 1024 + 4096
    # with a 2 MiB page the metadata still sits in the last 4096 bytes of an aligned file
    assert d.compute_log_length(64 * 1024, 2 * 1024 * 1024) == 2 * 1024 * 1024


def test_new_log_metadata_fields(make_log) -> None:
    log = make_log(term_length=128 * 1024, mtu=4096, session_id=-3, stream_id=9, initial_term_id=2**31 - 2,
                   correlation_id=42)
    raw = bytes(log.meta.view)
    tails = struct.unpack_from("<qqq", raw, 0)
    assert tails[0] == (2**31 - 2) << 32
    # unused terms carry the id of three terms before the one they will hold (wrapping int32)
    assert [d.tail_term_id(t) for t in tails[1:]] == [2**31 - 4, 2**31 - 3]
    assert struct.unpack_from("<i", raw, 24)[0] == 0
    assert struct.unpack_from("<q", raw, 128)[0] == 2**63 - 1
    assert struct.unpack_from("<q", raw, 256)[0] == 42
    assert struct.unpack_from("<iiiii", raw, 264) == (2**31 - 2, 32, 4096, 128 * 1024, log.page_size)
    version, flags, htype, _, session, stream, term_id, reserved = struct.unpack_from("<BBHiiiiq", raw, 324)
    assert (version, flags, htype, session, stream, term_id, reserved) == (0, 0xC0, 1, -3, 9, 2**31 - 2, 0)
    assert log.file_length == d.compute_log_length(128 * 1024, log.page_size)


def test_frame_written_by_publisher_decoded_field_by_field(pipe) -> None:
    p = pipe(term_length=64 * 1024, session_id=1234, stream_id=99, initial_term_id=7)
    p.pub.offer(b"first")
    payload = bytes(range(200))
    position = p.pub.offer(payload, reserved_value=-5)
    term = bytes(p.log.terms.view[: p.log.term_length])
    # independent decoder: the second frame starts after the first, aligned to 32
    offset = (32 + 5 + 31) // 32 * 32
    length, version, flags, ftype, term_offset, session, stream, term_id, reserved = struct.unpack_from(
        "<iBBHiiiiq", term, offset
    )
    assert length == 32 + 200
    assert (version, flags, ftype) == (0, 0xC0, 1)
    assert (term_offset, session, stream, term_id, reserved) == (offset, 1234, 99, 7, -5)
    assert term[offset + 32 : offset + 232] == payload
    assert position == offset + (232 + 31) // 32 * 32
    # the tail counter says the same: termId 7 in the high word, the next offset in the low word
    assert p.log.raw_tail(0) == (7 << 32) | position


def test_fragments_of_a_long_message_carry_begin_and_end_flags(pipe) -> None:
    p = pipe(term_length=64 * 1024, mtu=1408)
    message = bytes(i % 251 for i in range(3000))
    p.pub.offer(message)
    term = bytes(p.log.terms.view[: p.log.term_length])
    offset, flags_seen, body = 0, [], b""
    while True:
        length, _, flags, ftype = struct.unpack_from("<iBBH", term, offset)
        if length <= 0:
            break
        flags_seen.append(flags)
        body += term[offset + 32 : offset + length]
        offset += (length + 31) // 32 * 32
    assert flags_seen == [0x80, 0x00, 0x40]  # 1376 + 1376 + 248 bytes
    assert body == message
