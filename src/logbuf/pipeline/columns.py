"""ITCH messages -> the ``messages`` dataset's columns, vectorised (for the recorder and the scenario generator).

Which ITCH field lands in which column (see :mod:`logbuf.recording.schema`)::

    type  order_ref           new_order_ref  side  shares            price             stock
    A F   order_ref           -              side  shares            price             stock
    E     order_ref           -              -     executed_shares   -                 -
    C     order_ref           -              -     executed_shares   execution_price   -
    X     order_ref           -              -     cancelled_shares  -                 -
    D     order_ref           -              -     -                 -                 -
    U     original_order_ref  new_order_ref  -     shares            price             -
    P     order_ref           -              side  shares            price             stock
    Q     -                   -              -     shares            cross_price       stock
    R H Y L I N K J h O  -    -              -     -                 -                 stock
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from logbuf.marketdata import itch
from logbuf.recording import schema

_INT_COLUMNS = ("order_ref", "new_order_ref", "shares", "price")

# type -> {column: ITCH field}
_FIELD_MAP: dict[bytes, dict[str, str]] = {
    b"A": {"order_ref": "order_ref", "side": "side", "shares": "shares", "price": "price", "stock": "stock"},
    b"F": {"order_ref": "order_ref", "side": "side", "shares": "shares", "price": "price", "stock": "stock"},
    b"E": {"order_ref": "order_ref", "shares": "executed_shares"},
    b"C": {"order_ref": "order_ref", "shares": "executed_shares", "price": "execution_price"},
    b"X": {"order_ref": "order_ref", "shares": "cancelled_shares"},
    b"D": {"order_ref": "order_ref"},
    b"U": {"order_ref": "original_order_ref", "new_order_ref": "new_order_ref", "shares": "shares",
           "price": "price"},
    b"P": {"order_ref": "order_ref", "side": "side", "shares": "shares", "price": "price", "stock": "stock"},
    b"Q": {"shares": "shares", "price": "cross_price", "stock": "stock"},
}
for _code in (b"R", b"H", b"Y", b"L", b"I", b"N", b"K", b"J", b"h", b"O"):
    _FIELD_MAP[_code] = {"stock": "stock"}


def dictionary_strings(codes: np.ndarray, valid: np.ndarray | None = None) -> pa.DictionaryArray:
    """A dictionary<int32, string> array from fixed-width bytes (``S1``/``S8``), trailing spaces stripped."""
    codes = np.asarray(codes)
    uniq, inverse = np.unique(codes, return_inverse=True)
    values = pa.array([u.decode("ascii", "replace").rstrip(" ") for u in uniq.tolist()], pa.string())
    indices = pa.array(inverse.astype(np.int32).reshape(-1), mask=None if valid is None else ~valid)
    return pa.DictionaryArray.from_arrays(indices, values)


def feed_array(labels: np.ndarray, names: tuple[str, ...]) -> pa.DictionaryArray:
    """``names[labels[i]]`` as a dictionary array (labels: small ints)."""
    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(labels, dtype=np.int32)), pa.array(list(names)))


def messages_table(buf: np.ndarray, offsets: np.ndarray, sequence: np.ndarray, feed: pa.Array,
                   arrival_ns: np.ndarray) -> pa.Table:
    """Rows of the ``messages`` dataset for the ITCH messages starting at ``buf[offsets]`` (no length prefix)."""
    data = itch.as_uint8(buf)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = offsets.size
    headers = itch.decode_headers(data, offsets)
    ints = {name: np.zeros(n, np.int64) for name in _INT_COLUMNS}
    valid = {name: np.zeros(n, bool) for name in (*_INT_COLUMNS, "side", "stock")}
    side = np.full(n, b" ", dtype="S1")
    stock = np.full(n, b"", dtype="S8")
    type_bytes = headers.type
    for code in np.unique(type_bytes).tolist():
        key = bytes([code])
        fields = _FIELD_MAP.get(key)
        if key not in itch.LENGTHS:
            raise itch.ItchError(f"unknown ITCH message type {key!r}")
        if not fields:
            continue
        where = np.flatnonzero(type_bytes == code)
        rows = itch.decode_type(data, offsets[where], key)
        for column, field in fields.items():
            values = rows[field]
            if column == "side":
                side[where] = values
            elif column == "stock":
                stock[where] = values
            else:
                ints[column][where] = values.astype(np.int64)
            valid[column][where] = True
    columns = {
        "sequence": pa.array(np.asarray(sequence, dtype=np.int64)),
        "feed": feed,
        "arrival_ns": pa.array(np.asarray(arrival_ns, dtype=np.int64)),
        "type": dictionary_strings(type_bytes.view("S1")),
        "stock_locate": pa.array(headers.stock_locate.astype(np.int32)),
        "itch_ns": pa.array(headers.timestamp.astype(np.int64)),
    }
    for name in ("order_ref", "new_order_ref"):
        columns[name] = pa.array(ints[name], mask=~valid[name])
    columns["side"] = dictionary_strings(side, valid["side"])
    for name in ("shares", "price"):
        columns[name] = pa.array(ints[name], mask=~valid[name])
    columns["stock"] = dictionary_strings(stock, valid["stock"])
    return pa.Table.from_pydict(columns, schema=schema.MESSAGES_SCHEMA)
