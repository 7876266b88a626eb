"""Vectorised conversion of what the feed handler publishes into the recording's columns.

Nothing here loops over messages in Python.  A message travels in two steps:

1. **capture** (at poll time, :func:`capture_messages`): the ITCH bytes are copied out of the term into a
   fixed 64-byte slot of an :data:`IN_FLIGHT` row, with the frame's sequence (reserved value) and stream
   position.  Frames are 32-byte aligned and an ITCH message is at most 50 bytes, so every payload starts on
   a 32-byte block and fits in two: one row take of a 64-byte window per message, no per-byte gather::

       term   |hdr 32|payload ...|pad|hdr 32|payload ...   |hdr 32|payload|pad| ...
       window         [b, b+64)           [b', b'+64)              [b'', b''+64)

2. **decode** (when rows are written, :func:`decode_columns`, ~250 k rows at a time): one pass of header
   fields over all rows, then per ITCH type present a reinterpretation of its rows as that type's numpy
   layout (:func:`logbuf.marketdata.itch.message_dtype`, widened to 64 bytes) and a scatter of its fields into
   plain column arrays.  Doing this per quarter-million rows instead of per poll batch makes the numpy call
   overhead vanish.

Nullable columns are present exactly for the ITCH types that carry them (:data:`CARRIED_BY`), so validity is
a table lookup on ``type``::

    column         types carrying it      ITCH field
    order_ref      A F E C X D P / U      order_ref / original_order_ref
    new_order_ref  U                      new_order_ref
    side           A F P                  side
    shares         A F P Q U / E C / X    shares / executed_shares / cancelled_shares
    price          A F P U / C / Q        price / execution_price / cross_price
    stock          R H Y L K J h A F P Q I N O   stock (8 alpha, trailing spaces stripped)

A message whose length is not its type's (or of an unknown type) keeps its header columns and has no body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from logbuf.errors import LogbufError
from logbuf.marketdata import itch

if TYPE_CHECKING:  # pyarrow is imported lazily: the module stays importable without the analytics extra
    import pyarrow as pa

RAW_BYTES = 64  # longest ITCH 5.0 message: 50 bytes
BLOCK = 32  # frame alignment: every payload starts on a block

# One in-flight message: its bytes, the frame's sequence (reserved value) and start position, and what the
# DELIVERED join adds (feed letter, arrival time).  ``raw`` is one opaque 64-byte item, so taking rows copies
# whole items (about twice as fast as a (n, 64) byte gather); :func:`raw_bytes` views it as bytes.
_IN_FLIGHT_FIELDS = [("sequence", "<i8"), ("start_position", "<i8"), ("arrival_ns", "<i8"), ("length", "<i4"),
                     ("feed", "u1")]
IN_FLIGHT = np.dtype([("raw", f"V{RAW_BYTES}"), *_IN_FLIGHT_FIELDS])
_IN_FLIGHT_BYTES = np.dtype([("raw", "u1", (RAW_BYTES,)), *_IN_FLIGHT_FIELDS])
assert IN_FLIGHT.itemsize == _IN_FLIGHT_BYTES.itemsize


def raw_bytes(rows: np.ndarray) -> np.ndarray:
    """The ``raw`` field of :data:`IN_FLIGHT` rows as an (n, 64) uint8 view."""
    return rows.view(_IN_FLIGHT_BYTES)["raw"]


def concat_rows(chunks: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Concatenates structured chunks of one dtype by copying rows (``np.concatenate`` promotes structured
    dtypes field by field, which costs more than the copy)."""
    if len(chunks) == 1:
        return chunks[0]
    out = np.empty(sum(int(c.size) for c in chunks), dtype=dtype)
    flat = out.view(np.uint8)  # as bytes: one memcpy per chunk (a structured assignment goes field by field)
    position = 0
    for chunk in chunks:
        if chunk.dtype != dtype:
            raise TypeError(f"chunk of dtype {chunk.dtype} among {dtype}")
        size = chunk.nbytes
        flat[position : position + size] = np.ascontiguousarray(chunk).view(np.uint8)
        position += size
    return out

def _field_names(code: bytes) -> tuple[str, ...]:
    """The field names of an ITCH message type's (structured) dtype."""
    names = itch.message_dtype(code).names
    assert names is not None  # message dtypes are structured
    return names


# column -> {type byte: ITCH field name}
_FIELD_OF: dict[str, dict[bytes, str]] = {
    "order_ref": {**{t: "order_ref" for t in (b"A", b"F", b"E", b"C", b"X", b"D", b"P")}, b"U": "original_order_ref"},
    "new_order_ref": {b"U": "new_order_ref"},
    "side": {t: "side" for t in (b"A", b"F", b"P")},
    "shares": {**{t: "shares" for t in (b"A", b"F", b"P", b"Q", b"U")}, b"E": "executed_shares",
               b"C": "executed_shares", b"X": "cancelled_shares"},
    "price": {**{t: "price" for t in (b"A", b"F", b"P", b"U")}, b"C": "execution_price", b"Q": "cross_price"},
    "stock": {t: "stock" for t in itch.MESSAGE_TYPES if "stock" in _field_names(t)},
}
_INT_COLUMNS = ("order_ref", "new_order_ref", "shares", "price")

# column -> bool[256]: does a message of this type byte carry the column
CARRIED_BY: dict[str, np.ndarray] = {}
for _column, _fields in _FIELD_OF.items():
    _table = np.zeros(256, dtype=bool)
    _table[[t[0] for t in _fields]] = True
    CARRIED_BY[_column] = _table


def _widened(code: bytes) -> np.dtype:
    """The type's big-endian layout in a 64-byte record: a row of IN_FLIGHT ``raw`` viewed in place."""
    fields = itch.message_dtype(code).fields
    assert fields is not None  # message dtypes are structured
    names = _field_names(code)
    return np.dtype({"names": list(names), "formats": [fields[n][0] for n in names],
                     "offsets": [fields[n][1] for n in names], "itemsize": RAW_BYTES})


_WIDE: dict[int, np.dtype] = {t[0]: _widened(t) for t in itch.MESSAGE_TYPES}
# type byte -> [(column, field)] to copy out of that type's records
_COPIES: dict[int, list[tuple[str, str]]] = {
    t[0]: [(column, fields[t]) for column, fields in _FIELD_OF.items() if t in fields] for t in itch.MESSAGE_TYPES
}
_TIMESTAMP_MASK = np.uint64((1 << 48) - 1)


class MessageDecodeError(LogbufError, ValueError):
    """A messages-stream frame that cannot be a message of the published contract (not even an ITCH header)."""


# -- step 1: capture at poll time -------------------------------------------------------------------------


def capture_messages(buffer: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, sequences: np.ndarray,
                     start_positions: np.ndarray) -> np.ndarray:
    """Copies the messages at ``buffer[offsets[i]:][:lengths[i]]`` (a term, uint8) into :data:`IN_FLIGHT` rows.

    Raises :class:`MessageDecodeError` for a frame shorter than the 11-byte ITCH header."""
    n = int(offsets.size)
    rows = np.empty(n, dtype=IN_FLIGHT)
    if n == 0:
        return rows
    if int(lengths.min()) < itch.HEADER_LENGTH:
        bad = int(np.flatnonzero(lengths < itch.HEADER_LENGTH)[0])
        raise MessageDecodeError(f"message with sequence {int(sequences[bad])} has {int(lengths[bad])} bytes: "
                                 f"shorter than the {itch.HEADER_LENGTH}-byte ITCH header")
    rows["sequence"] = sequences
    rows["start_position"] = start_positions
    rows["length"] = lengths  # feed and arrival_ns are set by the join
    offsets = offsets.astype(np.int64, copy=False)
    blocks = buffer.size // BLOCK
    if buffer.size % BLOCK == 0 and blocks >= 2 and buffer.flags.c_contiguous and not (offsets & (BLOCK - 1)).any():
        index = offsets // BLOCK
        # every 64-byte window that starts on a block, as one opaque item each (a view, nothing copied)
        windows = np.ndarray(shape=(blocks - 1,), dtype=np.dtype(f"V{RAW_BYTES}"), buffer=buffer, strides=(BLOCK,))
        last = index == blocks - 1  # a payload in the term's last block: its window would run past the term
        if last.any():
            inner = np.flatnonzero(~last)
            rows["raw"][inner] = windows[index[inner]]
            tail = raw_bytes(rows)
            tail[last] = 0
            tail[last, :BLOCK] = buffer[-BLOCK:]
        else:
            rows["raw"] = windows[index]
    else:  # not frame-aligned (a caller's own buffer): the general gather
        span = np.minimum(lengths, RAW_BYTES)
        within = np.arange(RAW_BYTES)
        take = np.minimum(offsets[:, None] + within, buffer.size - 1)
        raw_bytes(rows)[:] = np.where(within < span[:, None], buffer[take], 0)
    return rows


# -- step 2: decode when written ---------------------------------------------------------------------------


@dataclass
class MessageColumns:
    """Decoded ``messages`` columns as plain numpy arrays (validity: see :data:`CARRIED_BY`)."""

    sequence: np.ndarray
    feed: np.ndarray  # u1 letter
    arrival_ns: np.ndarray
    type: np.ndarray  # u1 type byte
    stock_locate: np.ndarray  # i4
    itch_ns: np.ndarray
    order_ref: np.ndarray
    new_order_ref: np.ndarray
    shares: np.ndarray
    price: np.ndarray
    side: np.ndarray  # u1
    stock: np.ndarray  # u8: the 8 raw bytes
    malformed: np.ndarray  # bool

    def __len__(self) -> int:
        return int(self.sequence.size)

    def present(self, column: str) -> np.ndarray:
        return CARRIED_BY[column][self.type] & ~self.malformed


def decode_columns(rows: np.ndarray) -> MessageColumns:
    """:data:`IN_FLIGHT` rows -> decoded columns (see the module doc)."""
    n = int(rows.size)
    raw = raw_bytes(rows)
    items = rows["raw"]  # the same bytes as opaque 64-byte items: row takes copy whole items
    types = np.ascontiguousarray(raw[:, 0])
    lengths = rows["length"]
    malformed = itch.LENGTH_BY_TYPE_BYTE[types] != lengths
    locate = np.ascontiguousarray(raw[:, 1:3]).view(">u2").reshape(n).astype(np.int32)
    # tracking number + 48-bit timestamp are 8 bytes from offset 3: one big-endian u64, masked
    itch_ns = (np.ascontiguousarray(raw[:, 3:11]).view(">u8").reshape(n) & _TIMESTAMP_MASK).astype(np.int64)
    columns = {name: np.zeros(n, dtype=np.int64) for name in _INT_COLUMNS}
    side = np.zeros(n, dtype=np.uint8)
    stock = np.zeros(n, dtype=np.uint64)
    grouping = np.where(malformed, 0, types)  # 0: no body to decode
    order = np.argsort(grouping, kind="stable")
    sorted_types = grouping[order]
    cuts = np.flatnonzero(sorted_types[1:] != sorted_types[:-1]) + 1
    for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, n].tolist(), strict=True):
        code = int(sorted_types[lo])
        if code == 0:
            continue
        where = order[lo:hi]
        records = items[where].view(_WIDE[code])
        for column, field in _COPIES[code]:
            values = records[field]
            if column == "side":
                side[where] = values.view(np.uint8)
            elif column == "stock":
                stock[where] = values.view("<u8")
            else:
                columns[column][where] = values.astype(np.uint64).view(np.int64)  # u64 on the wire -> int64
    return MessageColumns(
        sequence=np.ascontiguousarray(rows["sequence"]), feed=np.ascontiguousarray(rows["feed"]),
        arrival_ns=np.ascontiguousarray(rows["arrival_ns"]), type=types, stock_locate=locate, itch_ns=itch_ns,
        side=side, stock=stock, malformed=malformed, **columns,
    )


# -- Arrow ------------------------------------------------------------------------------------------------


class CharDictionary:
    """A growing Arrow string dictionary for one-byte codes (feed, type, side): byte -> index by table lookup.

    Seeded with the expected values so the usual batch costs one ``take``; an unexpected byte is appended
    (the dictionary only grows, so earlier indices stay valid)."""

    def __init__(self, seed: bytes) -> None:
        self._index = np.full(256, -1, dtype=np.int32)
        self._values: list[str] = []
        self._arrow: pa.Array | None = None
        for b in seed:
            self._add(b)

    def _add(self, byte: int) -> None:
        self._index[byte] = len(self._values)
        self._values.append(chr(byte))  # latin-1: every byte is one character
        self._arrow = None

    def indices(self, codes: np.ndarray) -> np.ndarray:
        found = self._index[codes]
        if (found < 0).any():
            for byte in np.unique(codes[found < 0]).tolist():
                self._add(byte)
            found = self._index[codes]
        return found

    @property
    def values(self) -> pa.Array:
        import pyarrow as pa

        if self._arrow is None:
            self._arrow = pa.array(self._values, pa.string())
        return self._arrow


class StockDictionary:
    """Arrow dictionary of 8-byte stock symbols.

    ITCH gives every symbol a stock locate code for the day, so the usual lookup is a table indexed by locate,
    checked against the symbol's bytes; only a new (or re-used) locate goes through a dictionary of bytes."""

    def __init__(self) -> None:
        self._by_locate = np.full(1 << 16, -1, dtype=np.int32)
        self._keys = np.zeros(64, dtype=np.uint64)  # dictionary index -> the 8 raw bytes
        self._index: dict[int, int] = {}
        self._values: list[str] = []
        self._arrow: pa.Array | None = None

    def indices(self, locates: np.ndarray, keys: np.ndarray) -> np.ndarray:
        found = self._by_locate[locates]
        known = found >= 0
        known[known] = self._keys[found[known]] == keys[known]
        if not known.all():
            new = np.flatnonzero(~known)
            unique, inverse = np.unique(keys[new], return_inverse=True)
            index_of = np.array([self._intern(int(k)) for k in unique.tolist()], dtype=np.int32)
            found[new] = index_of[inverse.reshape(-1)]
            self._by_locate[locates[new]] = found[new]
        return found

    def _intern(self, key: int) -> int:
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self._values)
            if index >= self._keys.size:
                self._keys = np.concatenate((self._keys, np.zeros(self._keys.size, dtype=np.uint64)))
            self._keys[index] = key
            self._values.append(key.to_bytes(8, "little").decode("latin-1").rstrip(" "))
            self._arrow = None
        return index

    @property
    def values(self) -> pa.Array:
        import pyarrow as pa

        if self._arrow is None:
            self._arrow = pa.array(self._values, pa.string())
        return self._arrow


class TableBuilder:
    """numpy columns -> Arrow tables in the recording schema (:mod:`logbuf.recording.schema`), with the string
    dictionaries kept across batches."""

    def __init__(self) -> None:
        self.feeds = CharDictionary(b"ABR")
        self.types = CharDictionary(b"".join(itch.MESSAGE_TYPES))
        self.sides = CharDictionary(b"BS")
        self.stocks = StockDictionary()

    @staticmethod
    def _dictionary(indices: np.ndarray, values: pa.Array, valid: np.ndarray | None = None) -> pa.Array:
        import pyarrow as pa

        mask = None if valid is None or valid.all() else ~valid
        return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32(), mask=mask), values)

    def messages(self, cols: MessageColumns) -> pa.Table:
        import pyarrow as pa

        from logbuf.recording import schema

        def nullable_int(column: str) -> pa.Array:
            valid = cols.present(column)
            return pa.array(getattr(cols, column), pa.int64(), mask=None if valid.all() else ~valid)

        side_valid = cols.present("side")
        stock_valid = cols.present("stock")
        stock_indices = np.zeros(len(cols), dtype=np.int32)
        if stock_valid.any():
            stock_indices[stock_valid] = self.stocks.indices(cols.stock_locate[stock_valid], cols.stock[stock_valid])
        side_codes = np.where(side_valid, cols.side, ord("B")).astype(np.uint8)
        columns = [
            pa.array(cols.sequence, pa.int64()),
            self._dictionary(self.feeds.indices(cols.feed), self.feeds.values),
            pa.array(cols.arrival_ns, pa.int64()),
            self._dictionary(self.types.indices(cols.type), self.types.values),
            pa.array(cols.stock_locate, pa.int32()),
            pa.array(cols.itch_ns, pa.int64()),
            nullable_int("order_ref"),
            nullable_int("new_order_ref"),
            self._dictionary(self.sides.indices(side_codes), self.sides.values, side_valid),
            nullable_int("shares"),
            nullable_int("price"),
            self._dictionary(stock_indices, self.stocks.values, stock_valid),
        ]
        return pa.Table.from_arrays(columns, schema=schema.MESSAGES_SCHEMA)

    def packets(self, rows: np.ndarray) -> pa.Table:
        """PACKET capture rows (:data:`logbuf.feed.published.PACKET_ROW`) -> a ``packets`` table."""
        import pyarrow as pa

        from logbuf.recording import schema

        columns = [
            self._dictionary(self.feeds.indices(np.ascontiguousarray(rows["feed"])), self.feeds.values),
            pa.array(np.ascontiguousarray(rows["arrival_ns"]), pa.int64()),
            pa.array(np.ascontiguousarray(rows["sequence"]), pa.int64()),
            pa.array(np.ascontiguousarray(rows["count"]), pa.int32()),
            pa.array(np.ascontiguousarray(rows["bytes"]), pa.int32()),
        ]
        return pa.Table.from_arrays(columns, schema=schema.PACKETS_SCHEMA)

    @staticmethod
    def gaps(rows: list[tuple[str, int, int, int, int | None]]) -> pa.Table:
        """(feed, first, last, detected_ns, recovered_ns or None) tuples -> a ``gaps`` table."""
        import pyarrow as pa

        from logbuf.recording import schema

        feeds = sorted({r[0] for r in rows})
        feed_index = {f: i for i, f in enumerate(feeds)}
        columns = [
            pa.DictionaryArray.from_arrays(pa.array([feed_index[r[0]] for r in rows], pa.int32()),
                                           pa.array(feeds, pa.string())),
            pa.array([r[1] for r in rows], pa.int64()),
            pa.array([r[2] for r in rows], pa.int64()),
            pa.array([r[3] for r in rows], pa.int64()),
            pa.array([r[4] for r in rows], pa.int64()),
        ]
        return pa.Table.from_arrays(columns, schema=schema.GAPS_SCHEMA)
