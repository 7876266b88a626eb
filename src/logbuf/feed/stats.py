"""The statistics layout the arbitration engine (``native/feed_engine.c``) and its specification share.

Per feed, ``feed_stats[feed, FS_*]`` (int64, rows are :class:`~logbuf.feed.events.Feed` values); for the
stream, ``counters[C_*]`` (int64); the A−B arrival delay ``delay_stats[DELAY_*]`` over messages seen on both live
feeds (arrival on A minus arrival on B, paired through a ring of the last ``2**delay_window_bits`` deliveries).
Every index mirrors an ``LBF_*`` constant of ``native/feed.h``; :mod:`logbuf.feed.arbiter` checks them at import.
"""

from __future__ import annotations

import numpy as np

from logbuf.feed.events import Feed

# Per-feed statistics (LBF_FS_*).
FS_PACKETS = 0  # datagrams received on the feed (every kind, malformed included)
FS_BYTES = 1  # their bytes
FS_MESSAGES = 2  # messages carried by well-formed data packets of the current session
FS_DELIVERED = 3  # messages this feed delivered first ("wins")
FS_DUPLICATES = 4  # messages already delivered (or queued) when this feed's copy was processed
FS_OUT_OF_ORDER = 5  # data packets that arrived ahead of the expected sequence (queued)
FS_HEARTBEATS = 6
FS_END_OF_SESSION = 7
FS_DECODE_ERRORS = 8  # malformed packets (short, lengths running past the end, trailing bytes, truncated, ...)
FS_FOREIGN_SESSION = 9  # packets of another (or a retired) session, ignored
FS_IGNORED = 10  # packets of a live feed the mode does not arbitrate
FS_COUNT = 11
FEED_STAT_NAMES = ("packets", "bytes", "messages", "delivered", "duplicates", "out_of_order", "heartbeats",
                   "end_of_session", "decode_errors", "foreign_session", "ignored")

# Stream counters (LBF_C_*).
C_GAPS_DETECTED = 0
C_GAPS_RECOVERED = 1
C_GAPS_UNRECOVERABLE = 2  # GapUnrecoverable events
C_MESSAGES_UNRECOVERABLE = 3  # sequences they named
C_DROPPED_PACKETS = 4  # queued packets dropped when a gap is resolved with recovery off
C_RECOVERY_REQUESTS = 5
C_QUEUE_OVERFLOWS = 6  # overflow episodes (recovery on: until a packet fits again)
C_SESSION_CHANGES = 7  # joins included
C_JUMPS_HELD = 8  # packets announcing a jump past max_jump, held until confirmed
C_JUMPS_CONFIRMED = 9  # jumps confirmed by a second packet (the other feed's, or the next one)
C_SHED_PACKETS = 10  # packets not queued for a full queue (recovery on): their range is fetched again
C_JUMPS_FORGED = 11  # jumps revealed as forged by the traffic that continued below them (nothing published)
C_SESSIONS_FORGED = 12  # first datagrams of a session never confirmed by a second (dropped, nothing published)
C_ENDS_FORGED = 13  # END_OF_SESSION markers revealed as forged by traffic past them on their feed
C_COUNT = 14
COUNTER_NAMES = ("gaps_detected", "gaps_recovered", "gaps_unrecoverable", "messages_unrecoverable",
                 "dropped_packets", "recovery_requests", "queue_overflows", "session_changes", "jumps_held",
                 "jumps_confirmed", "shed_packets", "jumps_forged", "sessions_forged", "ends_forged")

# A−B arrival delay (LBF_DELAY_*).
DELAY_COUNT = 0
DELAY_SUM_NS = 1
DELAY_MIN_NS = 2
DELAY_MAX_NS = 3
DELAY_STAT_COUNT = 4
RING_NO_FEED = 0xFF  # ring slot not pairable (empty, retransmitted, or already paired)

I64_MAX = int(np.iinfo(np.int64).max)
I64_MIN = int(np.iinfo(np.int64).min)


def new_delay_stats() -> np.ndarray:
    return np.array([0, 0, I64_MAX, I64_MIN], dtype=np.int64)


class FeedStats:
    """Named, read-only view of one feed's row of ``feed_stats``."""

    __slots__ = ("_row",)

    def __init__(self, row: np.ndarray) -> None:
        self._row = row

    def __getattr__(self, name: str) -> int:
        try:
            return int(self._row[FEED_STAT_NAMES.index(name)])
        except ValueError:
            raise AttributeError(name) from None

    def as_dict(self) -> dict[str, int]:
        return dict(zip(FEED_STAT_NAMES, (int(v) for v in self._row), strict=True))

    def __repr__(self) -> str:
        return f"FeedStats({self.as_dict()})"


class Counters:
    """Named view of the stream ``counters`` array (``counters.gaps_detected``, ...); writable."""

    __slots__ = ("_array",)
    _array: np.ndarray

    def __init__(self, array: np.ndarray) -> None:
        object.__setattr__(self, "_array", array)

    def __getattr__(self, name: str) -> int:
        try:
            return int(self._array[COUNTER_NAMES.index(name)])
        except ValueError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: int) -> None:
        try:
            self._array[COUNTER_NAMES.index(name)] = value
        except ValueError:
            raise AttributeError(name) from None

    def as_dict(self) -> dict[str, int]:
        return dict(zip(COUNTER_NAMES, (int(v) for v in self._array), strict=True))

    def __repr__(self) -> str:
        return f"Counters({self.as_dict()})"


def counter_values(feed_stats: np.ndarray, counters: np.ndarray, delay_stats: np.ndarray,
                   queued_packets: int) -> dict[str, int]:
    """Every counter by name (``A.packets``, ..., ``gaps_detected``, ``ab_delay_count``, ...)."""
    values: dict[str, int] = {}
    for feed in Feed:
        for name, value in zip(FEED_STAT_NAMES, feed_stats[feed].tolist(), strict=True):
            values[f"{feed.name}.{name}"] = int(value)
    values.update(zip(COUNTER_NAMES, (int(v) for v in counters), strict=True))
    count = int(delay_stats[DELAY_COUNT])
    values["ab_delay_count"] = count
    values["ab_delay_sum_ns"] = int(delay_stats[DELAY_SUM_NS])
    values["ab_delay_min_ns"] = int(delay_stats[DELAY_MIN_NS]) if count else 0
    values["ab_delay_max_ns"] = int(delay_stats[DELAY_MAX_NS]) if count else 0
    values["queued_packets"] = queued_packets
    return values
