"""What the feed handler publishes into logbuf, byte for byte: the contract with its subscribers.

Three streams on one channel (default ``aeron:ipc``), stream ids configurable (defaults below):

**messages** (``MESSAGES_STREAM`` 1001): every arbitrated ITCH 5.0 message, in MoldUDP64 sequence order,
exactly once, one message per frame; the payload is the ITCH message as it was on the wire (no MoldUDP64
length prefix) and the frame's **reserved value is the MoldUDP64 sequence number**.  ITCH messages are far
below one frame's payload (the channel's MTU less the 32-byte header: 1,376 bytes at the default MTU), but
MoldUDP64 allows a message block of up to 65,535 bytes and the handler publishes what came: a longer message
goes out as several fragments, each with the same reserved value (reassemble with ``FragmentAssembler``;
``logbuf record`` stops at such a frame with an error, as it takes one ITCH message per frame).  A sequence never
appears twice; a jump in sequences is always announced first by a GAP_UNRECOVERABLE record on the events
stream (published before the jump), so subscribers always know.

**events** (``EVENTS_STREAM`` 1002): one record per frame, little-endian, 8-byte aligned::

    0      1         8              16             24             32            42
    +------+---------+--------------+--------------+--------------+-------------+
    | kind | reason  | first u64    | last u64     | time_ns i64  | session     |
    | u8   | u8 +pad | (or next seq)|              | epoch ns     | 10 B ASCII  |
    +------+---------+--------------+--------------+--------------+-------------+

kinds: 1 GAP_DETECTED, 2 GAP_RECOVERED, 3 GAP_UNRECOVERABLE, 4 SESSION_CHANGED (first = next sequence),
5 END_OF_SESSION (first = next sequence), 6 QUEUE_OVERFLOW (first = queued packets, last = the packet bound,
``--queue-packets``; the byte bound ``--queue-bytes`` may be the one that was reached).
The reserved value of an events frame is the sequence of the next message on the messages stream after the
record (the records stay in stream order with the messages): for GAP_UNRECOVERABLE ``last + 1``, for
SESSION_CHANGED and END_OF_SESSION their next sequence, else the stream's next expected sequence then — so a
GAP_UNRECOVERABLE can be placed exactly in the message stream.

**capture** (``CAPTURE_STREAM`` 1003, optional ``--capture``): arrays of fixed-size rows, one kind per frame
(the frame's reserved value is the kind), whole rows in unfragmented frames (at most one MTU), for the
recorder::

    PACKET rows (kind 1), 32 bytes: one per received MoldUDP64 datagram
    0 feed u8 ('A','B','R') | 1 pad | 4 bytes i32 | 8 arrival_ns i64 | 16 sequence i64 | 24 count i32 | 28 pad

    DELIVERED rows (kind 2), 32 bytes: runs of delivered messages sharing a feed and an arrival time
    0 feed u8 | 1 pad | 4 count i32 | 8 arrival_ns i64 | 16 first sequence i64 | 24 pad

The session of capture rows is the one of the latest SESSION_CHANGED event.  Times are epoch nanoseconds
(the handler's monotonic receive stamps moved to the wall clock once at start).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

try:
    from logbuf._native import lib as _lib
except ImportError as exc:  # pragma: no cover - depends on how the package was installed
    raise ImportError("logbuf's native shim (logbuf._native) is not built; see logbuf.native") from exc

MESSAGES_STREAM = 1001
EVENTS_STREAM = 1002
CAPTURE_STREAM = 1003

# -- events ----------------------------------------------------------------------------------------------
GAP_DETECTED = 1
GAP_RECOVERED = 2
GAP_UNRECOVERABLE = 3
SESSION_CHANGED = 4
END_OF_SESSION = 5
QUEUE_OVERFLOW = 6
EVENT_NAMES = {
    GAP_DETECTED: "gap-detected",
    GAP_RECOVERED: "gap-recovered",
    GAP_UNRECOVERABLE: "gap-unrecoverable",
    SESSION_CHANGED: "session-changed",
    END_OF_SESSION: "end-of-session",
    QUEUE_OVERFLOW: "queue-overflow",
}
EVENT_KIND_OFFSET = 0
EVENT_REASON_OFFSET = 1
EVENT_FIRST_OFFSET = 8
EVENT_LAST_OFFSET = 16
EVENT_TIME_OFFSET = 24
EVENT_SESSION_OFFSET = 32
SESSION_LENGTH = 10
EVENT_LENGTH = 48  # 42 bytes used, padded to 8
_EVENT = struct.Struct("<BB6xQQq10s6x")  # first/last: MoldUDP64 sequences are u64


@dataclass(frozen=True)
class FeedEvent:
    kind: int
    reason: int
    first: int
    last: int
    time_ns: int
    session: bytes

    @property
    def name(self) -> str:
        return EVENT_NAMES.get(self.kind, f"kind-{self.kind}")

    def encode(self) -> bytes:
        return _EVENT.pack(self.kind, self.reason, self.first, self.last, self.time_ns,
                           self.session.ljust(SESSION_LENGTH)[:SESSION_LENGTH])

    @classmethod
    def decode(cls, data: bytes | memoryview) -> FeedEvent:
        if len(data) < EVENT_LENGTH:
            raise ValueError(f"feed event of {len(data)} bytes, expected {EVENT_LENGTH}")
        kind, reason, first, last, time_ns, session = _EVENT.unpack_from(data, 0)
        return cls(kind, reason, first, last, time_ns, session)


# -- capture ---------------------------------------------------------------------------------------------
# The row layout is defined once, in native/feed.h (the native round writes the rows): read from there.
CAPTURE_PACKETS = _lib.LBF_CAPTURE_PACKETS
CAPTURE_DELIVERED = _lib.LBF_CAPTURE_DELIVERED
CAPTURE_ROW_LENGTH = _lib.LBF_CAPTURE_ROW_LENGTH

PACKET_ROW = np.dtype(
    {"names": ["feed", "bytes", "arrival_ns", "sequence", "count"],
     "formats": ["u1", "<i4", "<i8", "<i8", "<i4"],
     "offsets": [_lib.LBF_PACKET_ROW_FEED, _lib.LBF_PACKET_ROW_BYTES, _lib.LBF_PACKET_ROW_ARRIVAL,
                 _lib.LBF_PACKET_ROW_SEQUENCE, _lib.LBF_PACKET_ROW_COUNT],
     "itemsize": CAPTURE_ROW_LENGTH}
)
DELIVERED_ROW = np.dtype(
    {"names": ["feed", "count", "arrival_ns", "first"],
     "formats": ["u1", "<i4", "<i8", "<i8"],
     "offsets": [_lib.LBF_DELIVERED_ROW_FEED, _lib.LBF_DELIVERED_ROW_COUNT, _lib.LBF_DELIVERED_ROW_ARRIVAL,
                 _lib.LBF_DELIVERED_ROW_FIRST],
     "itemsize": CAPTURE_ROW_LENGTH}
)
FEED_LETTERS = {0: ord("A"), 1: ord("B"), 2: ord("R")}  # Feed enum value -> row byte


def decode_capture(kind: int, payload: bytes | memoryview) -> np.ndarray:
    """The rows of one capture frame (a structured numpy array, copied)."""
    if len(payload) % CAPTURE_ROW_LENGTH:
        raise ValueError(f"capture frame of {len(payload)} bytes is not a whole number of rows")
    dtype = PACKET_ROW if kind == CAPTURE_PACKETS else DELIVERED_ROW if kind == CAPTURE_DELIVERED else None
    if dtype is None:
        raise ValueError(f"unknown capture kind {kind}")
    return np.frombuffer(bytes(payload), dtype=dtype)


def delivered_runs(seqs: np.ndarray, feeds: np.ndarray, arrivals: np.ndarray) -> np.ndarray:
    """Compresses per-message (sequence, feed, arrival) into DELIVERED rows: one per run of consecutive
    sequences with the same feed and arrival (a packet's delivered messages are one run)."""
    n = int(seqs.size)
    rows = np.zeros(0, dtype=DELIVERED_ROW)
    if n == 0:
        return rows
    seqs = seqs.astype(np.int64, copy=False)
    breaks = np.ones(n, dtype=bool)
    if n > 1:
        breaks[1:] = (np.diff(seqs) != 1) | (feeds[1:] != feeds[:-1]) | (arrivals[1:] != arrivals[:-1])
    starts = np.flatnonzero(breaks)
    counts = np.diff(np.append(starts, n))
    rows = np.zeros(starts.size, dtype=DELIVERED_ROW)
    rows["first"] = seqs[starts]
    rows["count"] = counts
    rows["feed"] = feeds[starts]
    rows["arrival_ns"] = arrivals[starts]
    return rows
