"""The vectorised ITCH decoder and the Arrow tables, checked against the scalar codec for every type."""

from __future__ import annotations

import numpy as np
import pytest
from recorder_rig import expected_columns

from logbuf.feed import published as out
from logbuf.marketdata import itch
from logbuf.recorder.columns import MessageDecodeError, TableBuilder, capture_messages, decode_columns
from logbuf.recording import schema


def sample(code: bytes, k: int) -> bytes:
    """A message of type ``code`` whose every field has a distinct, type-appropriate value."""
    cls, _ = itch.BODY_FORMATS[code]
    dtype = itch.message_dtype(code)
    values = []
    for i, name in enumerate(dtype.names[5:]):
        kind = dtype.fields[name][0]
        if name == "side":
            values.append(b"BS"[k % 2 : k % 2 + 1])
        elif name == "stock":
            values.append(f"S{code.decode()}{k}"[:8].encode())
        elif kind.kind == "S":
            values.append(bytes([65 + (k + i) % 26]) * kind.itemsize)
        elif kind.itemsize == 8:
            values.append((1 << 40) + 1_000 * k + i)  # > 32 bits: catches a 64-bit field read as 32
        else:
            values.append(100_000 + 17 * k + i)
    return itch.encode(cls(1 + k, 7, 34_200_000_000_000 + 1_003 * k, *values))


def pack(messages: list[bytes], gap: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The messages in one buffer with junk between them, plus offsets and lengths."""
    parts, offsets, position = [], [], 0
    for m in messages:
        parts.append(b"\xee" * gap)
        position += gap
        offsets.append(position)
        parts.append(m)
        position += len(m)
    return (np.frombuffer(b"".join(parts), np.uint8), np.array(offsets, np.int32),
            np.array([len(m) for m in messages], np.int32))


def term_of(messages: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The messages as frames of a term: 32-byte header (junk), payload, padding to 32; the last payload in the
    term's last 32-byte block (its 64-byte window would run past the term)."""
    term = bytearray()
    offsets = []
    for m in messages:
        term += b"\xab" * 32
        offsets.append(len(term))
        term += m + b"\xcd" * (-len(m) % 32)
    assert len(messages[-1]) <= 32
    return np.frombuffer(bytes(term), np.uint8), np.array(offsets, np.int32), np.array([len(m) for m in messages],
                                                                                      np.int32)


def decode(buffer: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, seqs: np.ndarray):  # type: ignore[no-untyped-def]
    rows = capture_messages(buffer, offsets, lengths, seqs, np.zeros(seqs.size, np.int64))
    rows["feed"] = ord("B")
    rows["arrival_ns"] = 42
    return decode_columns(rows)


@pytest.mark.parametrize("layout", [term_of, pack], ids=["frames-in-a-term", "unaligned-buffer"])
def test_every_itch_type_decodes_to_the_columns_the_scalar_codec_gives(layout) -> None:  # type: ignore[no-untyped-def]
    messages = [sample(code, k) for k in range(3) for code in itch.MESSAGE_TYPES] + [sample(b"D", 9)]
    buffer, offsets, lengths = layout(messages)
    seqs = np.arange(100, 100 + len(messages), dtype=np.int64)
    columns = decode(buffer, offsets, lengths, seqs)
    assert not columns.malformed.any()
    table = TableBuilder().messages(columns)
    schema.check_columns(schema.MESSAGES, table)
    got = table.to_pylist()
    for seq, raw, row in zip(seqs.tolist(), messages, got, strict=True):
        assert row.pop("sequence") == seq
        assert (row.pop("feed"), row.pop("arrival_ns")) == ("B", 42)
        assert row == expected_columns(raw), raw[:1]


def test_many_batches_share_growing_dictionaries() -> None:
    builder = TableBuilder()
    tables = []
    for k in range(3):
        messages = [sample(code, 10 * k + j) for j in range(4) for code in (b"A", b"R", b"X")]
        buffer, offsets, lengths = term_of(messages)
        tables.append(builder.messages(decode(buffer, offsets, lengths, np.arange(len(messages)))))
    import pyarrow as pa

    merged = pa.concat_tables(tables).combine_chunks()
    stocks = [s for s in merged.column("stock").to_pylist() if s is not None]
    assert len(set(stocks)) == 3 * 4 * 2  # A and R carry a stock, X does not
    assert merged.column("stock").null_count == 12


def test_a_message_of_the_wrong_length_keeps_its_header_and_has_no_body() -> None:
    good = sample(b"A", 1)
    odd = sample(b"E", 2) + b"\x00\x00"  # two bytes too long
    unknown = b"Z" + sample(b"D", 3)[1:]  # unknown type
    buffer, offsets, lengths = term_of([good, odd, unknown])
    columns = decode(buffer, offsets, lengths, np.array([1, 2, 3]))
    assert columns.malformed.tolist() == [False, True, True]
    table = TableBuilder().messages(columns).to_pylist()
    assert table[1]["type"] == "E" and table[1]["stock_locate"] == 3 and table[1]["itch_ns"] == 34_200_000_002_006
    assert table[1]["order_ref"] is None and table[1]["shares"] is None
    assert table[2]["type"] == "Z" and table[2]["order_ref"] is None
    assert table[0]["order_ref"] == (1 << 40) + 1_000


def test_a_frame_shorter_than_an_itch_header_is_refused() -> None:
    buffer, offsets, lengths = pack([sample(b"S", 1), b"S\x00\x01"])
    with pytest.raises(MessageDecodeError, match="sequence 8 has 3 bytes"):
        capture_messages(buffer, offsets, lengths, np.array([7, 8]), np.zeros(2, np.int64))


def test_packet_rows_become_a_packets_table() -> None:
    rows = np.zeros(3, dtype=out.PACKET_ROW)
    rows["feed"] = [ord("A"), ord("R"), ord("B")]
    rows["bytes"] = [120, 60, 20]
    rows["arrival_ns"] = [10, 20, 30]
    rows["sequence"] = [1, 4, 9]
    rows["count"] = [3, 1, 0]
    table = TableBuilder().packets(rows)
    schema.check_columns(schema.PACKETS, table)
    assert table.to_pylist() == [
        {"feed": "A", "arrival_ns": 10, "sequence": 1, "count": 3, "bytes": 120},
        {"feed": "R", "arrival_ns": 20, "sequence": 4, "count": 1, "bytes": 60},
        {"feed": "B", "arrival_ns": 30, "sequence": 9, "count": 0, "bytes": 20},
    ]

