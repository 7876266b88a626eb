from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.exchange.dayfile import DayFileReader, DayFileWriter, read_messages
from logbuf.marketdata import itch

_ALPHA = st.integers(0x20, 0x7E).map(lambda i: bytes([i]))
_INT = {"H": 2**16 - 1, "I": 2**32 - 1, "Q": 2**64 - 1}


def _field(code: str) -> st.SearchStrategy:
    if code == "c":
        return _ALPHA
    if code.endswith("s"):
        width = int(code[:-1])
        return st.lists(_ALPHA, min_size=width, max_size=width).map(b"".join)
    return st.integers(0, _INT[code])


def message_strategy(code: bytes) -> st.SearchStrategy:
    cls, body = itch.BODY_FORMATS[code]
    fields = [st.integers(0, 2**16 - 1), st.integers(0, 2**16 - 1), st.integers(0, itch.MAX_TIMESTAMP)]
    fields += [_field(c) for c in itch._field_codes(body)]
    return st.tuples(*fields).map(lambda values: cls(*values))


any_message = st.one_of([message_strategy(code) for code in itch.MESSAGE_TYPES])


def test_all_23_types_with_published_lengths() -> None:
    assert len(itch.MESSAGE_TYPES) == 23
    assert set(itch.MESSAGE_TYPES) == set(b"SRHYLVWKJhAFECXDUPQBINO"[i : i + 1] for i in range(23))
    for code in itch.MESSAGE_TYPES:
        assert itch.message_dtype(code).itemsize == itch.LENGTHS[code]


@pytest.mark.parametrize("code", itch.MESSAGE_TYPES, ids=lambda c: c.decode())
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_round_trip_every_type(code: bytes, data: st.DataObject) -> None:
    message = data.draw(message_strategy(code))
    raw = itch.encode(message)
    assert len(raw) == itch.LENGTHS[code] and raw[:1] == code
    assert itch.decode(raw) == message
    assert itch.timestamp_of(raw) == message.timestamp
    assert itch.message_type(message) == code


@pytest.mark.parametrize("code", itch.MESSAGE_TYPES, ids=lambda c: c.decode())
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_itchfeed_reads_our_bytes_identically(code: bytes, data: st.DataObject) -> None:
    from itch.messages import messages as itchfeed_messages

    message = data.draw(message_strategy(code))
    raw = itch.encode(message)
    theirs = itchfeed_messages[code](raw)
    assert theirs.to_bytes() == raw
    assert theirs.timestamp == message.timestamp
    assert theirs.stock_locate == message.stock_locate


def test_alpha_fields_are_space_padded() -> None:
    raw = itch.encode(itch.AddOrder(1, 0, 5, 9, b"B", 100, b"AAPL", 1_500_000))
    assert raw[24:32] == b"AAPL    "
    assert itch.decode(raw).stock == b"AAPL    "


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"", "empty"),
        (b"Z" + bytes(11), "unknown ITCH message type"),
        (itch.encode(itch.OrderDelete(1, 0, 0, 1))[:-1], "must be 19 bytes, got 18"),
        (itch.encode(itch.OrderDelete(1, 0, 0, 1)) + b"\x00", "must be 19 bytes, got 20"),
    ],
)
def test_decode_rejects_malformed(raw: bytes, fragment: str) -> None:
    with pytest.raises(itch.ItchError, match=fragment):
        itch.decode(raw)


def test_encode_rejects_bad_values() -> None:
    with pytest.raises(itch.ItchError, match="48 bits"):
        itch.encode(itch.OrderDelete(1, 0, 2**48, 1))
    with pytest.raises(itch.ItchError, match="longer than 8"):
        itch.encode(itch.RegShoRestriction(1, 0, 0, b"TOOLONGSYM", b"0"))
    with pytest.raises(itch.ItchError, match="cannot encode"):
        itch.encode(itch.OrderDelete(1, 0, 0, -1))
    assert issubclass(itch.ItchError, ValueError)


@settings(max_examples=20, deadline=None)
@given(st.lists(any_message, min_size=1, max_size=60))
def test_vectorised_headers_and_types_match_scalar_decode(msgs: list) -> None:
    raws = [itch.encode(m) for m in msgs]
    offsets = np.cumsum([0] + [len(r) for r in raws[:-1]])
    buf = b"".join(raws)
    headers = itch.decode_headers(buf, offsets)
    assert headers.type.tobytes() == b"".join(itch.message_type(m) for m in msgs)
    assert headers.stock_locate.tolist() == [m.stock_locate for m in msgs]
    assert headers.tracking_number.tolist() == [m.tracking_number for m in msgs]
    assert headers.timestamp.tolist() == [m.timestamp for m in msgs]
    for code in {itch.message_type(m) for m in msgs}:
        picked = [(o, m) for o, m in zip(offsets, msgs, strict=True) if itch.message_type(m) == code]
        rows = itch.decode_type(buf, np.array([o for o, _ in picked]), code)
        for row, (_, message) in zip(rows, picked, strict=True):
            for name in message._fields[3:]:
                assert row[name] == getattr(message, name)
        assert itch.timestamps_of(rows).tolist() == [m.timestamp for _, m in picked]


def test_vectorised_decode_checks_bounds_and_type() -> None:
    raw = itch.encode(itch.OrderDelete(1, 0, 0, 1))
    with pytest.raises(itch.ItchError, match="outside the buffer"):
        itch.decode_headers(raw, np.array([10]))
    with pytest.raises(itch.ItchError, match="has type"):
        itch.decode_type(raw, np.array([0]), b"B")


@settings(max_examples=10, deadline=None)
@given(st.lists(any_message, max_size=200))
def test_day_file_round_trip(tmp_path_factory: pytest.TempPathFactory, msgs: list) -> None:
    path = tmp_path_factory.mktemp("day") / "d.itch"
    with DayFileWriter(path) as writer:
        writer.write_all(msgs)
    assert path.stat().st_size == sum(2 + itch.LENGTHS[itch.message_type(m)] for m in msgs)
    assert read_messages(path) == msgs
    with DayFileReader(path) as reader:
        blocks = list(reader.blocks(block_messages=7))
        assert sum(b.count for b in blocks) == len(msgs)
        assert [b.first_index for b in blocks] == list(range(0, len(msgs), 7))
        if msgs:
            ts = np.concatenate([b.headers().timestamp for b in blocks])
            assert ts.tolist() == [m.timestamp for m in msgs]


def test_truncated_day_file_is_reported(tmp_path) -> None:
    path = tmp_path / "cut.itch"
    with DayFileWriter(path) as writer:
        writer.write(itch.OrderDelete(1, 0, 0, 1))
        writer.write(itch.OrderDelete(1, 0, 0, 2))
    path.write_bytes(path.read_bytes()[:-3])
    with DayFileReader(path) as reader, pytest.raises(ValueError, match="truncated frame at byte 21"):
        list(reader)
