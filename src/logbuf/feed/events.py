"""What the feed handler's sans-IO cores say: feeds, gap reasons, and the small typed events they return.

The arbiter (:mod:`logbuf.feed.arbiter`, the C engine) and its specification (:mod:`logbuf.feed.spec`) return
a list of events per call, in stream order: a :class:`GapUnrecoverable` always comes right before the delivery
that jumps over its range, so a consumer that publishes events in list order never skips silently.

Contract a consumer can rely on (one session):

- ``Deliver`` / ``DeliverBatch`` sequence numbers are strictly increasing and contiguous, except exactly over
  the ranges named by ``GapUnrecoverable`` events emitted in between.
- Every sequence a ``GapUnrecoverable`` names lies inside a range announced by an earlier ``GapDetected``. Once
  the stream has moved past a ``GapDetected`` range, either a ``GapRecovered`` for exactly that range follows
  (every message of it was delivered, from the retransmission server or a late feed) or part of it was named by
  ``GapUnrecoverable`` events.
- ``EndOfSession`` comes after the last message of the session was delivered (or declared unrecoverable).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from logbuf.marketdata import moldudp64


class Feed(IntEnum):
    """Where a packet came from. The values index the per-feed statistics (and the native ``LBF_FEED_*``)."""

    A = 0
    B = 1
    RETRANSMIT = 2  # answers of the re-request server: they fill gaps but never count as a live feed


LIVE_FEEDS = (Feed.A, Feed.B)


class FeedMode(IntEnum):
    """Which live feeds are arbitrated; packets of the other live feed are counted as ignored."""

    A_ONLY = 1
    B_ONLY = 2
    A_AND_B = 3

    @property
    def feeds(self) -> tuple[Feed, ...]:
        return tuple(f for f in LIVE_FEEDS if self.value & (1 << f))


class GapReason(IntEnum):
    """Why a gap was declared (``GapDetected``) or given up on (``GapUnrecoverable``)."""

    SEQUENCE_THRESHOLD = 1  # every arbitrated feed delivered ``out_of_order_max_interval`` packets past the hole
    WAIT_TIMEOUT = 2  # ``lost_packet_wait_time`` passed without the missing messages
    RECOVERY_OFF = 3  # declared with recovery disabled: lost at once
    GIVE_UP = 4  # re-requested for ``give_up`` without an answer
    QUEUE_OVERFLOW = 5  # the out-of-order/recovery queue was full
    SESSION_CHANGE = 6  # the session changed with the range still missing


class Event:
    """Base class of everything the arbiter returns."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Deliver(Event):
    """One arbitrated message, in sequence order (the slow path: out-of-order drains, recovery, pure Python)."""

    seq: int
    message: bytes
    feed: Feed
    arrival_ns: int


@dataclass(frozen=True, slots=True, eq=False)
class DeliverBatch(Event):
    """Arbitrated messages in sequence order: message ``i`` is ``buffer[offsets[i]:offsets[i]+lengths[i]]`` with
    sequence ``seqs[i]``; ``slots[i]`` indexes ``ring_feeds``/``ring_arrivals`` (its feed and arrival).

    From the engine, ``buffer`` is the receive ring's slab for messages of ring packets (a view, valid until the
    next receive: publish or copy it first) or a copy for messages of queued or copied packets.
    """

    seqs: np.ndarray  # uint64
    offsets: np.ndarray  # int64, into buffer
    lengths: np.ndarray  # int32
    slots: np.ndarray  # int32, index of each message into ring_feeds / ring_arrivals
    buffer: np.ndarray  # uint8: the receive ring's slab, or a copy
    ring_feeds: np.ndarray  # uint8 Feed values, indexed by slots
    ring_arrivals: np.ndarray  # int64 arrival times, indexed by slots

    def __len__(self) -> int:
        return int(self.seqs.size)

    @property
    def feeds(self) -> np.ndarray:
        """Feed of each message (uint8 Feed values; a new array)."""
        return self.ring_feeds[self.slots]

    @property
    def arrivals_ns(self) -> np.ndarray:
        """Arrival time of each message's packet (a new array)."""
        return self.ring_arrivals[self.slots]

    def message(self, i: int) -> bytes:
        start = int(self.offsets[i])
        return self.buffer[start : start + int(self.lengths[i])].tobytes()

    def delivers(self) -> list[Deliver]:
        """The same messages as :class:`Deliver` events (copies; for tests and slow consumers)."""
        columns = zip(self.seqs.tolist(), self.feeds.tolist(), self.arrivals_ns.tolist(), strict=True)
        return [Deliver(s, self.message(i), Feed(f), t) for i, (s, f, t) in enumerate(columns)]


@dataclass(frozen=True, slots=True)
class GapDetected(Event):
    """Messages ``first..last`` (inclusive) are missing on every arbitrated live feed."""

    session: bytes
    first: int
    last: int
    reason: GapReason

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class GapRecovered(Event):
    """Every message of the detected gap ``first..last`` has now been delivered."""

    session: bytes
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class GapUnrecoverable(Event):
    """Messages ``first..last`` will never be delivered; the stream continues at ``last + 1``."""

    session: bytes
    first: int
    last: int
    reason: GapReason

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class RecoveryRequest(Event):
    """Send a MoldUDP64 re-request for ``count`` messages from ``seq`` to the retransmission server."""

    session: bytes
    seq: int
    count: int

    def encode(self) -> bytes:
        """The 20-byte request packet."""
        return moldudp64.encode_request(self.session, self.seq, self.count)


@dataclass(frozen=True, slots=True)
class SessionChanged(Event):
    """The stream is now session ``session`` (``previous`` None: the first session joined) and continues at
    ``next_sequence``."""

    previous: bytes | None
    session: bytes
    next_sequence: int


@dataclass(frozen=True, slots=True)
class EndOfSession(Event):
    """The session ended after message ``next_sequence - 1``; everything before it has been delivered or
    declared unrecoverable."""

    session: bytes
    next_sequence: int


@dataclass(frozen=True, slots=True)
class QueueOverflow(Event):
    """The out-of-order queue reached ``capacity`` packets. With recovery on, packets that do not fit are shed
    (re-requested later; nothing is given up), one event per episode of a full queue; with recovery off the
    oldest holes are given up (``GapUnrecoverable`` with reason ``QUEUE_OVERFLOW`` follows) until it is back to
    ``capacity // 2``."""

    session: bytes
    queued_packets: int
    capacity: int
