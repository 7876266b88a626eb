"""Nasdaq TotalView-ITCH 5.0: the 23 message types as NamedTuples, scalar encode/decode and numpy views.

Every message starts with the same 11-byte header; integers are unsigned big-endian, alpha fields are
left-justified and space-padded, Price(4) is a u32 with 4 implied decimals, Price(8) a u64 with 8::

     0   1       3       5                       11
    +---+-------+-------+-----------------------+---------------------------+
    |typ|locate |trackng| timestamp (48-bit ns  | body (type-specific,      |
    | 1 |  u16  |  u16  | since midnight)       | see BODY_FORMATS)         |
    +---+-------+-------+-----------------------+---------------------------+

Bodies (struct codes: ``c`` = 1 ASCII char, ``Ns`` = N-byte alpha, ``I`` = u32, ``Q`` = u64)::

    S System Event          12  event_code c
    R Stock Directory       39  stock 8s, market_category c, financial_status c, round_lot_size I,
                                round_lots_only c, issue_classification c, issue_sub_type 2s, authenticity c,
                                short_sale_threshold c, ipo_flag c, luld_tier c, etp_flag c,
                                etp_leverage_factor I, inverse_indicator c
    H Stock Trading Action  25  stock 8s, trading_state c, reserved c, reason 4s
    Y Reg SHO Restriction   20  stock 8s, reg_sho_action c
    L Market Participant    26  mpid 4s, stock 8s, primary_market_maker c, market_maker_mode c,
                                participant_state c
    V MWCB Decline Level    35  level1 Q, level2 Q, level3 Q                       (Price(8))
    W MWCB Status           12  breached_level c
    K IPO Quoting Period    28  stock 8s, release_time I, release_qualifier c, ipo_price I
    J LULD Auction Collar   35  stock 8s, reference_price I, upper_price I, lower_price I, extension I
    h Operational Halt      21  stock 8s, market_code c, halt_action c
    A Add Order             36  order_ref Q, side c, shares I, stock 8s, price I
    F Add Order with MPID   40  order_ref Q, side c, shares I, stock 8s, price I, attribution 4s
    E Order Executed        31  order_ref Q, executed_shares I, match_number Q
    C Executed with Price   36  order_ref Q, executed_shares I, match_number Q, printable c, execution_price I
    X Order Cancel          23  order_ref Q, cancelled_shares I
    D Order Delete          19  order_ref Q
    U Order Replace         35  original_order_ref Q, new_order_ref Q, shares I, price I
    P Trade (non-cross)     44  order_ref Q, side c, shares I, stock 8s, price I, match_number Q
    Q Cross Trade           40  shares Q, stock 8s, cross_price I, match_number Q, cross_type c
    B Broken Trade          19  match_number Q
    I NOII                  50  paired_shares Q, imbalance_shares Q, imbalance_direction c, stock 8s,
                                far_price I, near_price I, current_reference_price I, cross_type c,
                                price_variation c
    N RPII                  20  stock 8s, interest_flag c
    O DLCR Price Discovery  48  stock 8s, open_eligibility c, min_allowable_price I, max_allowable_price I,
                                near_execution_price I, near_execution_time Q, lower_price_range_collar I,
                                upper_price_range_collar I

The numpy side (:data:`HEADER_DTYPE`, :func:`message_dtype`, :func:`decode_headers`, :func:`decode_type`)
decodes many messages at once from a buffer and a vector of message offsets.
"""

from __future__ import annotations

import re
import struct
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from logbuf.errors import LogbufError

TYPE_OFFSET = 0
STOCK_LOCATE_OFFSET = 1
TRACKING_NUMBER_OFFSET = 3
TIMESTAMP_OFFSET = 5
TIMESTAMP_LENGTH = 6
HEADER_LENGTH = 11
MAX_TIMESTAMP = 2**48 - 1
PRICE4_SCALE = 10_000
PRICE8_SCALE = 100_000_000
NANOS_PER_SECOND = 1_000_000_000

# Header as struct: the 48-bit timestamp travels as a u16 high part and a u32 low part.
_HEADER_FORMAT = ">cHHHI"
_TIMESTAMP_LOW_BITS = 32
_TIMESTAMP_LOW_MASK = (1 << _TIMESTAMP_LOW_BITS) - 1


class ItchError(LogbufError, ValueError):
    """An ITCH message (or a value to put in one) is malformed: unknown type, wrong length, bad field."""


class SystemEvent(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    event_code: bytes


class StockDirectory(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    stock: bytes
    market_category: bytes
    financial_status: bytes
    round_lot_size: int
    round_lots_only: bytes
    issue_classification: bytes
    issue_sub_type: bytes
    authenticity: bytes
    short_sale_threshold: bytes
    ipo_flag: bytes
    luld_tier: bytes
    etp_flag: bytes
    etp_leverage_factor: int
    inverse_indicator: bytes


class StockTradingAction(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    stock: bytes
    trading_state: bytes
    reserved: bytes
    reason: bytes


class RegShoRestriction(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    stock: bytes
    reg_sho_action: bytes


class MarketParticipantPosition(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    mpid: bytes
    stock: bytes
    primary_market_maker: bytes
    market_maker_mode: bytes
    participant_state: bytes


class MwcbDeclineLevel(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    level1: int
    level2: int
    level3: int


class MwcbStatus(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    breached_level: bytes


class IpoQuotingPeriodUpdate(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    stock: bytes
    release_time: int
    release_qualifier: bytes
    ipo_price: int


class LuldAuctionCollar(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    stock: bytes
    reference_price: int
    upper_price: int
    lower_price: int
    extension: int


class OperationalHalt(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    stock: bytes
    market_code: bytes
    halt_action: bytes


class AddOrder(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    order_ref: int
    side: bytes
    shares: int
    stock: bytes
    price: int


class AddOrderMpid(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    order_ref: int
    side: bytes
    shares: int
    stock: bytes
    price: int
    attribution: bytes


class OrderExecuted(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    order_ref: int
    executed_shares: int
    match_number: int


class OrderExecutedWithPrice(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    order_ref: int
    executed_shares: int
    match_number: int
    printable: bytes
    execution_price: int


class OrderCancel(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    order_ref: int
    cancelled_shares: int


class OrderDelete(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    order_ref: int


class OrderReplace(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    original_order_ref: int
    new_order_ref: int
    shares: int
    price: int


class Trade(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    order_ref: int
    side: bytes
    shares: int
    stock: bytes
    price: int
    match_number: int


class CrossTrade(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    shares: int
    stock: bytes
    cross_price: int
    match_number: int
    cross_type: bytes


class BrokenTrade(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    match_number: int


class Noii(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    paired_shares: int
    imbalance_shares: int
    imbalance_direction: bytes
    stock: bytes
    far_price: int
    near_price: int
    current_reference_price: int
    cross_type: bytes
    price_variation: bytes


class Rpii(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    stock: bytes
    interest_flag: bytes


class DlcrPriceDiscovery(NamedTuple):
    stock_locate: int
    tracking_number: int
    timestamp: int
    stock: bytes
    open_eligibility: bytes
    min_allowable_price: int
    max_allowable_price: int
    near_execution_price: int
    near_execution_time: int
    lower_price_range_collar: int
    upper_price_range_collar: int


Message = (
    SystemEvent | StockDirectory | StockTradingAction | RegShoRestriction | MarketParticipantPosition
    | MwcbDeclineLevel | MwcbStatus | IpoQuotingPeriodUpdate | LuldAuctionCollar | OperationalHalt | AddOrder
    | AddOrderMpid | OrderExecuted | OrderExecutedWithPrice | OrderCancel | OrderDelete | OrderReplace | Trade
    | CrossTrade | BrokenTrade | Noii | Rpii | DlcrPriceDiscovery
)

# type byte -> (class, struct format of the body). The single source of truth for every layout below.
BODY_FORMATS: dict[bytes, tuple[type[Message], str]] = {
    b"S": (SystemEvent, "c"),
    b"R": (StockDirectory, "8sccIcc2scccccIc"),
    b"H": (StockTradingAction, "8scc4s"),
    b"Y": (RegShoRestriction, "8sc"),
    b"L": (MarketParticipantPosition, "4s8sccc"),
    b"V": (MwcbDeclineLevel, "QQQ"),
    b"W": (MwcbStatus, "c"),
    b"K": (IpoQuotingPeriodUpdate, "8sIcI"),
    b"J": (LuldAuctionCollar, "8sIIII"),
    b"h": (OperationalHalt, "8scc"),
    b"A": (AddOrder, "QcI8sI"),
    b"F": (AddOrderMpid, "QcI8sI4s"),
    b"E": (OrderExecuted, "QIQ"),
    b"C": (OrderExecutedWithPrice, "QIQcI"),
    b"X": (OrderCancel, "QI"),
    b"D": (OrderDelete, "Q"),
    b"U": (OrderReplace, "QQII"),
    b"P": (Trade, "QcI8sIQ"),
    b"Q": (CrossTrade, "Q8sIQc"),
    b"B": (BrokenTrade, "Q"),
    b"I": (Noii, "QQc8sIIIcc"),
    b"N": (Rpii, "8sc"),
    b"O": (DlcrPriceDiscovery, "8scIIIQII"),
}

# The lengths the specification publishes; checked against the struct layouts at import.
LENGTHS: dict[bytes, int] = {
    b"S": 12, b"R": 39, b"H": 25, b"Y": 20, b"L": 26, b"V": 35, b"W": 12, b"K": 28, b"J": 35, b"h": 21,
    b"A": 36, b"F": 40, b"E": 31, b"C": 36, b"X": 23, b"D": 19, b"U": 35, b"P": 44, b"Q": 40, b"B": 19,
    b"I": 50, b"N": 20, b"O": 48,
}
MESSAGE_TYPES: tuple[bytes, ...] = tuple(BODY_FORMATS)
TYPE_OF_CLASS: dict[type[Message], bytes] = {cls: code for code, (cls, _) in BODY_FORMATS.items()}

_FIELD_CODE = re.compile(r"(\d*)([csIQH])")
_NUMPY_CODE = {"c": "S1", "H": ">u2", "I": ">u4", "Q": ">u8"}


def _field_codes(body_format: str) -> list[str]:
    """``"8scI"`` -> ``["8s", "c", "I"]``: one code per field."""
    return [count + code for count, code in _FIELD_CODE.findall(body_format)]


class _Layout:
    """Everything derived from one BODY_FORMATS entry, computed once."""

    __slots__ = ("code", "cls", "struct", "length", "alpha_widths", "dtype")

    def __init__(self, code: bytes, cls: type[Message], body_format: str) -> None:
        self.code = code
        self.cls = cls
        self.struct = struct.Struct(_HEADER_FORMAT + body_format)
        self.length = self.struct.size
        fields = _field_codes(body_format)
        body_names = cls._fields[3:]
        if len(fields) != len(body_names) or self.length != LENGTHS[code]:
            raise AssertionError(f"ITCH layout of {code!r} disagrees with its class or published length")
        # field index (in the tuple) -> width, for the alpha fields encode() pads with spaces
        self.alpha_widths = {
            3 + i: int(f[:-1]) if f.endswith("s") else 1 for i, f in enumerate(fields) if f[-1] in "sc"
        }
        numpy_fields = [(name, f"S{f[:-1]}" if f.endswith("s") else _NUMPY_CODE[f]) for name, f in
                        zip(body_names, fields, strict=True)]
        self.dtype = np.dtype(_HEADER_FIELDS + numpy_fields)
        assert self.dtype.itemsize == self.length


# numpy header: the timestamp is split the same way as in struct, join it with timestamps_of().
_HEADER_FIELDS = [
    ("type", "S1"), ("stock_locate", ">u2"), ("tracking_number", ">u2"),
    ("timestamp_high", ">u2"), ("timestamp_low", ">u4"),
]
HEADER_DTYPE = np.dtype(_HEADER_FIELDS)
_LAYOUTS: dict[bytes, _Layout] = {code: _Layout(code, cls, fmt) for code, (cls, fmt) in BODY_FORMATS.items()}
_LAYOUT_BY_CLASS: dict[type[Message], _Layout] = {layout.cls: layout for layout in _LAYOUTS.values()}
_LAYOUT_BY_BYTE: dict[int, _Layout] = {code[0]: layout for code, layout in _LAYOUTS.items()}

# Lookup table byte -> message length (0 for unknown types), for vectorised validation.
LENGTH_BY_TYPE_BYTE = np.zeros(256, dtype=np.int64)
for _code, _length in LENGTHS.items():
    LENGTH_BY_TYPE_BYTE[_code[0]] = _length


def message_type(message: Message) -> bytes:
    """The one-byte type code of a message tuple."""
    return _LAYOUT_BY_CLASS[type(message)].code


def message_dtype(code: bytes) -> np.dtype[np.void]:
    """numpy structured dtype (big-endian) of one message type, header included."""
    try:
        return _LAYOUTS[code].dtype
    except KeyError:
        raise ItchError(f"unknown ITCH message type {code!r}") from None


def _to_field_bytes(value: bytes | str, width: int, name: str) -> bytes:
    raw = value.encode("ascii") if isinstance(value, str) else bytes(value)
    if len(raw) > width:
        raise ItchError(f"field {name} = {raw!r} is longer than {width} bytes")
    return raw.ljust(width, b" ")


def encode(message: Message) -> bytes:
    """The wire bytes of one message (no length prefix)."""
    layout = _LAYOUT_BY_CLASS.get(type(message))
    if layout is None:
        raise ItchError(f"not an ITCH message tuple: {type(message).__name__}")
    values: list[Any] = list(message)  # fields of mixed types, in wire order; struct.pack checks each
    timestamp = message.timestamp
    if not 0 <= timestamp <= MAX_TIMESTAMP:
        raise ItchError(f"timestamp {timestamp} does not fit in 48 bits")
    for index, width in layout.alpha_widths.items():
        values[index] = _to_field_bytes(values[index], width, message._fields[index])
    try:
        return layout.struct.pack(
            layout.code, values[0], values[1], timestamp >> _TIMESTAMP_LOW_BITS, timestamp & _TIMESTAMP_LOW_MASK,
            *values[3:],
        )
    except struct.error as exc:
        raise ItchError(f"cannot encode {type(message).__name__}: {exc}") from None


def decode(buf: bytes | bytearray | memoryview) -> Message:
    """One message from exactly its bytes (no length prefix); the length must match the type."""
    if len(buf) == 0:
        raise ItchError("empty ITCH message")
    layout = _LAYOUT_BY_BYTE.get(buf[TYPE_OFFSET])
    if layout is None:
        raise ItchError(f"unknown ITCH message type {bytes(buf[:1])!r}")
    if len(buf) != layout.length:
        raise ItchError(f"ITCH {layout.code.decode()} message must be {layout.length} bytes, got {len(buf)}")
    _, locate, tracking, high, low, *body = layout.struct.unpack(buf)
    return layout.cls(locate, tracking, (high << _TIMESTAMP_LOW_BITS) | low, *body)


def timestamp_of(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """The 48-bit timestamp of the message starting at ``buf[offset]``."""
    start = offset + TIMESTAMP_OFFSET
    return int.from_bytes(buf[start : start + TIMESTAMP_LENGTH], "big")


# ---- vectorised views ---------------------------------------------------------------------------------


def _gather(buf: NDArray[np.uint8], offsets: NDArray[np.int64], width: int) -> NDArray[np.uint8]:
    """Rows ``buf[offsets[i] : offsets[i] + width]`` as an (n, width) uint8 array."""
    return buf[offsets[:, None] + np.arange(width, dtype=np.int64)]


def as_uint8(buf: bytes | bytearray | memoryview | NDArray[np.uint8]) -> NDArray[np.uint8]:
    """The bytes as a uint8 array (an array is returned as it is)."""
    return buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)


def timestamps_of(headers: NDArray[np.void]) -> NDArray[np.uint64]:
    """uint64 timestamps from a structured array with the split ``timestamp_high``/``timestamp_low`` fields."""
    return (headers["timestamp_high"].astype(np.uint64) << np.uint64(_TIMESTAMP_LOW_BITS)) | headers[
        "timestamp_low"
    ].astype(np.uint64)


class HeaderColumns(NamedTuple):
    """The common header of N messages as columns."""

    type: NDArray[np.uint8]  # type byte
    stock_locate: NDArray[np.uint16]
    tracking_number: NDArray[np.uint16]
    timestamp: NDArray[np.uint64]  # ns since midnight


def decode_headers(
    buf: bytes | bytearray | memoryview | NDArray[np.uint8], offsets: NDArray[np.integer[Any]]
) -> HeaderColumns:
    """Decode the 11-byte header of every message starting at ``offsets`` (byte offsets of the type byte)."""
    data = as_uint8(buf)
    starts = np.asarray(offsets, dtype=np.int64)
    if starts.size and (starts.min() < 0 or starts.max() + HEADER_LENGTH > data.size):
        raise ItchError("a message offset points outside the buffer")
    rows = np.ascontiguousarray(_gather(data, starts, HEADER_LENGTH)).view(HEADER_DTYPE).reshape(-1)
    return HeaderColumns(
        rows["type"].view(np.uint8),
        rows["stock_locate"].astype(np.uint16),
        rows["tracking_number"].astype(np.uint16),
        timestamps_of(rows),
    )


def decode_type(
    buf: bytes | bytearray | memoryview | NDArray[np.uint8], offsets: NDArray[np.integer[Any]], code: bytes
) -> NDArray[np.void]:
    """Structured array (dtype :func:`message_dtype`) of the messages of type ``code`` at ``offsets``."""
    dtype = message_dtype(code)
    data = as_uint8(buf)
    starts = np.asarray(offsets, dtype=np.int64)
    if starts.size == 0:
        return np.empty(0, dtype=dtype)
    if starts.min() < 0 or starts.max() + dtype.itemsize > data.size:
        raise ItchError("a message offset points outside the buffer")
    rows = np.ascontiguousarray(_gather(data, starts, dtype.itemsize))
    if np.any(rows[:, TYPE_OFFSET] != code[0]):
        raise ItchError(f"not every message at the given offsets has type {code!r}")
    return rows.view(dtype).reshape(-1)
