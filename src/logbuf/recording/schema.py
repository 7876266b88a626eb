"""The recording format: what ``logbuf record`` writes and ``logbuf analyze`` reads (format version 1).

A recording is a directory of Parquet datasets, Hive-partitioned by MoldUDP64 session and UTC hour::

    RECORDING/
      _logbuf_recording.json                       format marker {"format": "logbuf-recording", "version": 1}
      packets/session=SYNTH0001/hour=2026-01-05T14/part-<first-ns>-<writer>-<n>.parquet
      messages/session=SYNTH0001/hour=.../part-....parquet
      gaps/session=SYNTH0001/hour=.../part-....parquet
      .../.part-....parquet.tmp                    a file being written: never read

Conventions every writer and reader follows:

- **Times are int64 nanoseconds.** ``*_ns`` arrival/detection times count from the Unix epoch (the recorder's
  CLOCK_REALTIME, or the NIC's timestamp); ``itch_ns`` is the ITCH timestamp, nanoseconds since the exchange's
  midnight. No Parquet TIMESTAMP type (Spark rejects nanosecond timestamps).
- **Partitions** are directories ``session=<MoldUDP64 session, trailing spaces stripped>`` and
  ``hour=<YYYY-MM-DDTHH>`` (UTC hour of the row's partition time: ``arrival_ns`` for packets and messages,
  ``detected_ns`` for gaps). Partition values are strings; the partition columns are *not* stored in the files.
- **Crash safety**: a file is written as ``.<name>.parquet.tmp`` (hidden, wrong suffix), closed, fsync'ed and
  renamed to ``<name>.parquet``. Readers take only ``*.parquet`` files whose name does not start with ``.`` or
  ``_`` (Spark's ``pathGlobFilter`` plus its hidden-file rule; :func:`logbuf.recording.reader.complete_files`
  for pyarrow). A crash leaves at most one ``.tmp`` per open file; it is never mistaken for data.
- **Sequences** are MoldUDP64 message sequence numbers (u64 on the wire, int64 here: 2^63 messages is enough).
- Unsigned ITCH fields (order references, shares, prices) are stored as int64; Price(4) keeps its 4 implied
  decimals (``price / 10_000`` dollars).

Datasets (columns in file order; ``?`` = nullable):

``packets`` - one row per received MoldUDP64 downstream packet, data and control::

    feed        string   'A' / 'B' (the live feeds) or 'R' (a re-request answer, unicast)
    arrival_ns  int64    receive time
    sequence    int64    header sequence: first message's (data) or next expected (heartbeat / end of session)
    count       int32    header count: messages in the packet, 0 = heartbeat, 65535 = end of session
    bytes       int32    UDP payload length, header included

``messages`` - one row per message *delivered* by the feed handler (each sequence at most once)::

    sequence       int64    MoldUDP64 sequence
    feed           string   the copy that was delivered: 'A', 'B' or 'R' (recovered by re-request)
    arrival_ns     int64    arrival of the delivered copy (its packet's arrival_ns)
    type           string   ITCH message type, one character
    stock_locate   int32
    itch_ns        int64    ITCH timestamp
    order_ref      int64?   A F E C X D P: order reference number; U: the original reference
    new_order_ref  int64?   U: the new reference
    side           string?  A F P: 'B' or 'S'
    shares         int64?   A F P Q U: shares; E C: executed shares; X: cancelled shares
    price          int64?   A F P U: price; C: execution price; Q: cross price (Price(4))
    stock          string?  types carrying a stock field (R H Y L A F P Q I N K J h O), trailing spaces stripped

``gaps`` - one row per gap the feed handler declared (a range lost on the feeds it arbitrates)::

    feed          string   'both' (lost on every live feed: what arbitration reports), or 'A' / 'B'
    first         int64    first missing sequence
    last          int64    last missing sequence (inclusive)
    detected_ns   int64    when the handler declared the gap
    recovered_ns  int64?   when the last message of the range was recovered; null = unrecovered

**A-vs-B delay needs no dataset of its own.** A MoldUDP64 packet carries the contiguous messages
``[sequence, sequence + count)`` and all of them arrive with the packet, so message ``s`` arrived on feed F at
``min(arrival_ns)`` over F's packets whose range holds ``s``. ``packets`` therefore *is* the per-feed,
per-message arrival record (N/messages-per-packet rows instead of N per feed); ``logbuf analyze`` expands the
ranges where it needs per-message rows.
"""

from __future__ import annotations

import datetime as _dt

import pyarrow as pa

from logbuf.errors import LogbufError
from logbuf.units import NANOS_PER_SECOND

FORMAT_NAME = "logbuf-recording"
FORMAT_VERSION = 1
MARKER_FILE = "_logbuf_recording.json"

PACKETS = "packets"
MESSAGES = "messages"
GAPS = "gaps"
DATASETS = (PACKETS, MESSAGES, GAPS)

SESSION_COLUMN = "session"
HOUR_COLUMN = "hour"
PARTITION_COLUMNS = (SESSION_COLUMN, HOUR_COLUMN)

FEED_A = "A"
FEED_B = "B"
FEED_RETRANSMIT = "R"
LIVE_FEEDS = (FEED_A, FEED_B)
GAP_BOTH = "both"

HEARTBEAT_COUNT = 0
END_OF_SESSION_COUNT = 0xFFFF
MAX_DATA_COUNT = 0xFFFE  # counts 1..0xFFFE are data packets

COMPLETE_SUFFIX = ".parquet"
IN_PROGRESS_SUFFIX = ".parquet.tmp"
HIDDEN_PREFIXES = (".", "_")

NANOS_PER_HOUR = 3_600_000_000_000
_HOUR_FORMAT = "%Y-%m-%dT%H"

_STR = pa.dictionary(pa.int32(), pa.string())  # few distinct values: dictionary-encoded in memory and on disk

PACKETS_SCHEMA = pa.schema([
    pa.field("feed", _STR, nullable=False),
    pa.field("arrival_ns", pa.int64(), nullable=False),
    pa.field("sequence", pa.int64(), nullable=False),
    pa.field("count", pa.int32(), nullable=False),
    pa.field("bytes", pa.int32(), nullable=False),
])

MESSAGES_SCHEMA = pa.schema([
    pa.field("sequence", pa.int64(), nullable=False),
    pa.field("feed", _STR, nullable=False),
    pa.field("arrival_ns", pa.int64(), nullable=False),
    pa.field("type", _STR, nullable=False),
    pa.field("stock_locate", pa.int32(), nullable=False),
    pa.field("itch_ns", pa.int64(), nullable=False),
    pa.field("order_ref", pa.int64()),
    pa.field("new_order_ref", pa.int64()),
    pa.field("side", _STR),
    pa.field("shares", pa.int64()),
    pa.field("price", pa.int64()),
    pa.field("stock", _STR),
])

GAPS_SCHEMA = pa.schema([
    pa.field("feed", _STR, nullable=False),
    pa.field("first", pa.int64(), nullable=False),
    pa.field("last", pa.int64(), nullable=False),
    pa.field("detected_ns", pa.int64(), nullable=False),
    pa.field("recovered_ns", pa.int64()),
])

SCHEMAS: dict[str, pa.Schema] = {PACKETS: PACKETS_SCHEMA, MESSAGES: MESSAGES_SCHEMA, GAPS: GAPS_SCHEMA}

# The column whose UTC hour names a row's ``hour`` partition.
PARTITION_TIME_COLUMN: dict[str, str] = {PACKETS: "arrival_ns", MESSAGES: "arrival_ns", GAPS: "detected_ns"}


class RecordingFormatError(LogbufError, ValueError):
    """A recording (or a batch about to be written) does not follow this format."""


def hour_label(epoch_ns: int) -> str:
    """The ``hour`` partition value of an epoch-nanosecond time: ``2026-01-05T14`` (UTC)."""
    hour_start = (epoch_ns // NANOS_PER_HOUR) * 3600
    return _dt.datetime.fromtimestamp(hour_start, tz=_dt.timezone.utc).strftime(_HOUR_FORMAT)


def hour_start_ns(label: str) -> int:
    """Inverse of :func:`hour_label`: the first nanosecond of that UTC hour."""
    try:
        moment = _dt.datetime.strptime(label, _HOUR_FORMAT).replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        raise RecordingFormatError(f"hour partition {label!r} is not YYYY-MM-DDTHH") from None
    return int(moment.timestamp()) * NANOS_PER_SECOND


def check_session(session: str) -> str:
    """A MoldUDP64 session as a partition value: 1-10 printable ASCII characters, trailing spaces stripped."""
    value = session.rstrip(" ")
    if not value or len(value) > 10 or not value.isascii() or not value.isprintable() or any(
        c in value for c in "/\\=%"
    ):
        raise RecordingFormatError(f"session {session!r} must be 1-10 printable ASCII characters (no / \\ = %)")
    return value


def check_columns(dataset: str, table: pa.Table | pa.RecordBatch) -> None:
    """Raise :class:`RecordingFormatError` unless ``table`` has exactly the dataset's columns and types."""
    expected = SCHEMAS[dataset]
    if table.schema.names != expected.names:
        raise RecordingFormatError(f"{dataset}: columns {table.schema.names} differ from {expected.names}")
    for field in expected:
        actual = table.schema.field(field.name).type
        if actual != field.type:
            raise RecordingFormatError(f"{dataset}.{field.name}: type {actual} differs from {field.type}")
