"""The counter-type table: Aeron's ids and names, parsing ``--type`` values, adding a type, key decoding."""

from __future__ import annotations

import struct

import pytest

from logbuf.cnc import counters as c
from logbuf.tools import counter_types as ct

pytestmark = pytest.mark.timeout(30)


def test_builtin_names_match_aeron_ids():
    expected = {
        0: "system",
        1: "pub-lmt",
        2: "snd-pos",
        3: "rcv-hwm",
        4: "sub-pos",
        5: "rcv-pos",
        6: "snd-channel",
        7: "rcv-channel",
        9: "snd-lmt",
        10: "per-image",
        11: "client-heartbeat",
        12: "pub-pos",
        13: "snd-bpe",
    }
    assert {t.type_id: t.name for t in ct.known_counter_types() if t.type_id < 100} == expected
    assert ct.type_name(8) == "type-8"


@pytest.mark.parametrize(
    ("text", "type_id"),
    [
        ("4", 4),
        ("0x0c", 12),
        ("sub-pos", 4),
        ("SUB_POS", 4),
        (" snd-bpe ", 13),
        ("pub-pos (sampled)", 12),
        ("client-heartbeat", 11),
        ("999", 999),
    ],
)
def test_parse(text: str, type_id: int):
    assert ct.parse_counter_type(text) == type_id


def test_parse_unknown_lists_the_names():
    with pytest.raises(ValueError, match="unknown counter type 'sub'.*system, pub-lmt"):
        ct.parse_counter_type("sub")


def test_register_a_new_type():
    feed = ct.CounterType(
        31_001, "feed-gaps-test", "gaps seen by a feed handler (test)", aliases=("gaps-test",)
    )
    ct.register_counter_type(feed)
    try:
        assert ct.parse_counter_type("feed-gaps-test") == ct.parse_counter_type("GAPS_TEST") == 31_001
        assert ct.type_name(31_001) == "feed-gaps-test"
        with pytest.raises(ValueError, match="already"):
            ct.register_counter_type(feed)
        with pytest.raises(ValueError, match="already registered"):
            ct.register_counter_type(ct.CounterType(31_002, "sub-pos", "clash"))
        ct.register_counter_type(ct.CounterType(31_001, "feed-gaps-2-test", "renamed"), replace=True)
        with pytest.raises(ValueError):
            ct.parse_counter_type("gaps-test")  # the old names went with the old entry
        assert ct.type_name(31_001) == "feed-gaps-2-test"
    finally:
        ct._BY_ID.pop(31_001, None)
        for name in ("feed-gaps-test", "gaps-test", "feed-gaps-2-test"):
            ct._BY_NAME.pop(name, None)


def test_key_decoding():
    key = c.stream_position_key(7, -3, 1001, "aeron:ipc").ljust(112, b"\0")
    assert ct.decode_key(c.PUBLISHER_LIMIT_TYPE_ID, key) == {
        "registration_id": 7,
        "session_id": -3,
        "stream_id": 1001,
        "channel": "aeron:ipc",
    }
    assert ct.decode_key(c.CLIENT_HEARTBEAT_TYPE_ID, struct.pack("<q", 42).ljust(112, b"\0")) == {
        "client_id": 42
    }
    assert ct.decode_key(0, struct.pack("<i", 19).ljust(112, b"\0")) == {"system_counter_id": 19}
    assert ct.decode_key(4, b"\x01\x02") == {}  # too short to be a key: nothing, not an exception
    assert ct.decode_key(12345, bytes(112)) == {}
