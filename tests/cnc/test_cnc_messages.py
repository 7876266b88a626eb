"""Command/response bodies: exact byte layouts against independent struct packing, round trips for every
message type, and fuzzing (random bytes decode or raise MalformedCommandError, never anything else)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.cnc import messages as m
from logbuf.cnc.errors import MalformedCommandError, UnknownCommandTypeError

pytestmark = pytest.mark.timeout(60)


def s(text: str) -> bytes:
    return struct.pack("<i", len(text)) + text.encode("ascii")


def test_ids_match_reference():
    assert [int(c) for c in m.ControlCommand] == [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B,
                                                  0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11]
    assert [int(r) for r in m.ControlResponse] == list(range(0x0F01, 0x0F0C))
    assert m.ControlResponse.ON_CLIENT_TIMEOUT == 0x0F0A and m.ControlResponse.ON_SUBSCRIPTION_READY == 0x0F07
    assert {e.name: int(e) for e in m.ErrorCode} == {
        "INVALID_CHANNEL": 1,
        "UNKNOWN_SUBSCRIPTION": 2,
        "UNKNOWN_PUBLICATION": 3,
        "CHANNEL_ENDPOINT_ERROR": 4,
        "UNKNOWN_COUNTER": 5,
        "UNKNOWN_COMMAND_TYPE_ID": 6,
        "MALFORMED_COMMAND": 7,
        "NOT_SUPPORTED": 8,
        "UNKNOWN_HOST": 9,
        "GENERIC_ERROR": 11,
        "STORAGE_SPACE": 12,
        "IMAGE_REJECTED": 13,  # the error code of an ERR frame that rejects an image
    }
    assert MalformedCommandError.error_code == 7 and UnknownCommandTypeError.error_code == 6


# (message, independently packed bytes)
EXACT = [
    (m.CorrelatedMessage(1, 2), struct.pack("<qq", 1, 2)),
    (m.PublicationMessage(1, 2, 1001, "aeron:ipc"), struct.pack("<qqi", 1, 2, 1001) + s("aeron:ipc")),
    (
        m.SubscriptionMessage(1, 2, -1, 1001, "aeron:udp?endpoint=h:1"),
        struct.pack("<qqqi", 1, 2, -1, 1001) + s("aeron:udp?endpoint=h:1"),
    ),
    (m.RemoveMessage(1, 2, 3), struct.pack("<qqq", 1, 2, 3)),
    (
        m.CounterMessage(1, 2, 1000, b"abcde", "my counter"),
        struct.pack("<qqii", 1, 2, 1000, 5) + b"abcde\0\0\0" + s("my counter"),
    ),
    (m.TerminateDriverMessage(1, 2, b"tok"), struct.pack("<qqi", 1, 2, 3) + b"tok"),
    (m.DestinationMessage(1, 2, 3, "aeron:udp?endpoint=h:1"), struct.pack("<qqq", 1, 2, 3) + s("aeron:udp?endpoint=h:1")),
    (m.DestinationByIdMessage(1, 2, 3, 4), struct.pack("<qqqq", 1, 2, 3, 4)),
    (
        m.StaticCounterMessage(1, 2, 42, 1001, b"abcde", "static"),
        struct.pack("<qqqii", 1, 2, 42, 1001, 5) + b"abcde\0\0\0" + s("static"),
    ),
    (m.RejectImageMessage(1, 2, 3, 64, "bad!"), struct.pack("<qqqq", 1, 2, 3, 64) + s("bad!")),
    (
        m.PublicationReady(5, 6, 7, 8, 9, 10, "/dev/shm/x/publications/6.logbuffer"),
        struct.pack("<qqiiii", 5, 6, 7, 8, 9, 10) + s("/dev/shm/x/publications/6.logbuffer"),
    ),
    (m.SubscriptionReady(5, 3), struct.pack("<qi", 5, 3)),
    (
        m.AvailableImage(5, 7, 8, 6, 11, "img.logbuffer", "127.0.0.1:4000"),
        struct.pack("<qiiqi", 5, 7, 8, 6, 11) + s("img.logbuffer") + b"\0\0\0" + s("127.0.0.1:4000"),
    ),
    (m.UnavailableImage(5, 6, 8, "aeron:ipc"), struct.pack("<qqi", 5, 6, 8) + s("aeron:ipc")),
    (m.OperationSuccess(5), struct.pack("<q", 5)),
    (m.ErrorResponse(5, m.ErrorCode.INVALID_CHANNEL, "bad uri"), struct.pack("<qi", 5, 1) + s("bad uri")),
    (m.ClientTimeout(99), struct.pack("<q", 99)),
    (m.CounterUpdate(5, 17), struct.pack("<qi", 5, 17)),
]


@pytest.mark.parametrize("message, expected", EXACT, ids=[type(msg).__name__ for msg, _ in EXACT])
def test_exact_bytes_and_round_trip(message, expected):
    assert message.encode() == expected
    assert type(message).decode(expected) == message
    assert type(message).decode(memoryview(expected + b"\xff" * 5)) == message  # trailing bytes tolerated


def test_offsets_of_strings_follow_the_reference():
    body = m.PublicationReady(1, 2, 3, 4, 5, 6, "f").encode()
    assert struct.unpack_from("<i", body, 32) == (1,) and body[36:] == b"f"
    body = m.AvailableImage(1, 2, 3, 4, 5, "ab", "src").encode()
    assert struct.unpack_from("<i", body, 28) == (2,) and body[32:34] == b"ab"
    assert struct.unpack_from("<i", body, 36) == (3,) and body[40:] == b"src"  # aligned to 4 after "ab"
    body = m.SubscriptionMessage(1, 2, 3, 4, "c").encode()
    assert struct.unpack_from("<ii", body, 24) == (4, 1) and body[32:] == b"c"


def test_every_type_id_dispatches():
    samples = {type(msg): msg for msg, _ in EXACT}
    for command, cls in m.COMMAND_TYPES.items():
        assert m.decode_command(command, samples[cls].encode()) == samples[cls]
    for response, cls in m.RESPONSE_TYPES.items():
        assert m.decode_response(response, samples[cls].encode()) == samples[cls]
    with pytest.raises(UnknownCommandTypeError):
        m.decode_command(0x77, b"")
    with pytest.raises(UnknownCommandTypeError):
        m.decode_response(0x01, b"")


@pytest.mark.parametrize(
    "cls, body",
    [
        (m.CorrelatedMessage, b"\0" * 15),
        (m.PublicationMessage, struct.pack("<qqi", 1, 2, 3)),  # no channel length
        (m.PublicationMessage, struct.pack("<qqii", 1, 2, 3, 10) + b"short"),  # length beyond the body
        (m.PublicationMessage, struct.pack("<qqii", 1, 2, 3, -1)),
        (m.PublicationMessage, struct.pack("<qqii", 1, 2, 3, 2) + b"\xc3\xa9"),  # not ASCII
        (m.CounterMessage, struct.pack("<qqii", 1, 2, 3, 113) + b"k" * 116 + s("l")),  # key > 112
        (m.AvailableImage, struct.pack("<qiiqi", 1, 2, 3, 4, 5) + s("abc")),  # no source identity
        (m.ErrorResponse, struct.pack("<qi", 1, 7) + struct.pack("<i", 2**31 - 1)),
    ],
)
def test_malformed_bodies_raise(cls, body):
    with pytest.raises(MalformedCommandError):
        cls.decode(body)


def test_unknown_error_code_is_kept_as_int():
    decoded = m.ErrorResponse.decode(struct.pack("<qi", 1, 99) + s("?"))
    assert decoded.error_code == 99 and not isinstance(decoded.error_code, m.ErrorCode)
    assert (
        m.ErrorResponse.decode(m.ErrorResponse(1, 7, "x").encode()).error_code
        is m.ErrorCode.MALFORMED_COMMAND
    )


def test_non_ascii_is_replaced_on_encode():
    assert m.PublicationMessage.decode(m.PublicationMessage(1, 2, 3, "caf\u00e9").encode()).channel == "caf?"


ALL_TYPE_IDS = [int(c) for c in m.ControlCommand] + [int(r) for r in m.ControlResponse]


@settings(max_examples=400, deadline=None)
@given(type_id=st.sampled_from(ALL_TYPE_IDS + [0, 0x07, 0x0F0B, -1]), body=st.binary(max_size=120))
def test_fuzz_random_bodies_decode_or_raise_malformed(type_id, body):
    decode = m.decode_command if type_id < 0x0F00 else m.decode_response
    try:
        message = decode(type_id, body)
    except MalformedCommandError:
        return
    assert type(message).decode(message.encode()) == message  # whatever decodes re-encodes consistently


@settings(max_examples=200, deadline=None)
@given(
    type_id=st.sampled_from([int(c) for c in m.ControlCommand]),
    prefix=st.binary(min_size=16, max_size=40),
    length=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    tail=st.binary(max_size=40),
)
def test_fuzz_hostile_string_lengths(type_id, prefix, length, tail):
    body = prefix + struct.pack("<i", length) + tail
    try:
        message = m.decode_command(type_id, body)
    except MalformedCommandError:
        return  # the driver answers ON_ERROR MALFORMED_COMMAND
    assert len(message.encode()) <= len(body)  # anything decoded came from within the body


ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
ints32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.builds(m.CorrelatedMessage, ints64, ints64),
        st.builds(m.PublicationMessage, ints64, ints64, ints32, text),
        st.builds(m.SubscriptionMessage, ints64, ints64, ints64, ints32, text),
        st.builds(m.RemoveMessage, ints64, ints64, ints64),
        st.builds(m.CounterMessage, ints64, ints64, ints32, st.binary(max_size=112), text),
        st.builds(m.TerminateDriverMessage, ints64, ints64, st.binary(max_size=64)),
        st.builds(m.PublicationReady, ints64, ints64, ints32, ints32, ints32, ints32, text),
        st.builds(m.SubscriptionReady, ints64, ints32),
        st.builds(m.AvailableImage, ints64, ints32, ints32, ints64, ints32, text, text),
        st.builds(m.UnavailableImage, ints64, ints64, ints32, text),
        st.builds(m.OperationSuccess, ints64),
        st.builds(m.ErrorResponse, ints64, st.sampled_from(list(m.ErrorCode)), text),
        st.builds(m.ClientTimeout, ints64),
        st.builds(m.CounterUpdate, ints64, ints32),
    )
)
def test_round_trip_every_message_type(message):
    assert type(message).decode(message.encode()) == message


def test_a_rejection_reason_is_utf8_as_aeron_clients_send_it():
    """REJECT_IMAGE's reason is the caller's text: UTF-8 both ways (Aeron's C client sends the caller's bytes;
    an ASCII-only decoder refused such a command as malformed), invalid bytes replaced, never refused."""
    reason = "refusé: ünïcode"
    body = m.RejectImageMessage(1, 2, 3, 64, reason).encode()
    assert reason.encode("utf-8") in body
    assert m.RejectImageMessage.decode(body).reason == reason
    raw = struct.pack("<qqqq", 1, 2, 3, 64) + struct.pack("<i", 2) + b"\xff\xfe" + b"\0" * 64
    assert m.RejectImageMessage.decode(raw).reason == "\ufffd\ufffd"
