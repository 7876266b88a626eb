"""The executable specification of A/B arbitration and gap detection for MoldUDP64 feeds (pure Python).

The feed handler runs the same state machine in C (``native/feed_engine.c``, behind :class:`logbuf.feed.arbiter.Arbiter`);
property tests feed both the same random packet streams and require identical events, deliveries and counters.
This module is the readable statement of the rules; it is not on the hot path.

Fed packets (raw bytes or decoded :mod:`~logbuf.marketdata.moldudp64` tuples) with their feed and arrival time, and
clock ticks; returns :mod:`~logbuf.feed.events` in stream order. No sockets, no clock, no threads.

**Per-message arbitration** (arbitrating per packet instead loses the fresh tail of a catch-up packet). Messages are processed by sequence number across feeds; a packet
``[first, first + count)`` delivers every message ``>= expected`` and counts the rest as duplicates — a catch-up
packet that starts with already-delivered messages still delivers its fresh tail.

**Out-of-order queue and gap detection** (the usual feed-handler rules). A packet starting past ``expected`` is queued. The first
hole not yet declared becomes a *gap* when either criterion holds — they are independent:

- sequence: every arbitrated live feed has delivered ``out_of_order_max_interval`` packets (data or heartbeat)
  past the hole since the wait for it began — checked per feed, so under A+B arbitrage a fast feed alone never
  declares a gap that the slower feed is about to fill. (MoldUDP64 numbers messages, not packets, and packets
  carry 1–70 messages; counting packets keeps the threshold's meaning, "N packets later", independent of
  batching. For a single-message-per-packet feed it is exactly ``seq > lastAccepted + interval``.)
- time: ``lost_packet_wait_time`` has passed since the wait began (the hole appeared, or was partly filled from
  its front).

*Recovery off* — the classic resolution. The gap is ``[expected, H - 1]`` where ``H`` is the head of the most recent
contiguous run of queued messages; ``GapDetected`` and ``GapUnrecoverable`` name it, older queued packets are
dropped and the run is delivered::

    expected=1001   queued: 1002 | 1005 | 1007 1008          ->  gap [1001, 1006]
                            drop   drop   accept (the run)       1007, 1008 delivered

*Recovery on* (:class:`~logbuf.feed.recovery.Recovery`) — nothing received is dropped. Every hole of
``[expected, highest seen]`` not declared yet is declared (one ``GapDetected`` per hole: [1001], [1003, 1004],
[1006] above) and re-requested; answers, fed in as feed ``RETRANSMIT``, fill the stream in order and a filled
gap gets its ``GapRecovered``. What was asked of a hole and not answered for ``give_up`` becomes a
``GapUnrecoverable`` (the rest of the hole stays one, asked for next) and everything received after it is still delivered. Holes that appear meanwhile wait for the criteria like the
first one. The stream stays in recovery until it has caught up (no hole left).

**Heartbeats and end of session** carry the next sequence: a value past ``expected`` reveals tail loss (it joins
the hole like a zero-length packet) and never advances ``expected``. An end of session acts only once confirmed
(``confirm``) by ``end_of_session_quiet_ns`` without traffic past it (the other feed's copy is no confirmation: a
forger may send both); data or a marker past it on either live feed reveals it as forged (``ends_forged``). ``EndOfSession`` is emitted once confirmed and the stream reached it.
**Sessions**: a session is adopted only when a second datagram confirms its first (``confirm``): the other live
feed's (within ``max_jump`` of it) or the same feed's next one at or past its end (with both feeds arbitrated,
only once the other has been silent for ``end_of_session_quiet_ns``: one feed is one source); until then the first is held
(one per session, of ``CANDIDATES_PER_FEED`` sessions per live feed, counted as foreign); confirming one session,
or the current session continuing on that feed, reveals the others as forged (``sessions_forged``); a feed's
unconfirmed end of session is confirmed by that feed moving to a new (confirmed) session; on confirmation the
held datagrams are processed first (lowest position first), so joining wherever the stream is
(``start_sequence`` None) starts at a confirmed datagram. Answers never choose a
session. Another session is switched to only once the current one has ended with nothing of it missing, or has
been silent for ``session_change_idle``; until then its packets are counted as foreign and ignored (a stray
packet must not hijack the stream; what was ignored is re-requested after the switch, since the new session is
expected from sequence 1). Packets of retired sessions are always ignored.

**Bounded queue**: at ``max_queue_packets`` queued datagrams or ``max_queue_bytes`` of them a ``QueueOverflow``
is emitted. With recovery on, queue pressure never costs a recoverable message: a packet that does not fit is
*shed* (not queued, counted in ``shed_packets``) and its range stays a hole that recovery fetches again — so
only the server's refusal or give-up loses messages. One ``QueueOverflow`` per episode (until a packet fits
again). With recovery off nothing can be fetched again: the oldest holes are given up until the queue is half
empty (in packets and in bytes).

**Validation first**: a datagram is checked completely (length, sequence, every message block) before it may
choose or switch the session. **Answers**: a retransmitted packet counts only when it starts exactly where a
request started (:meth:`SpecArbiter.note_requests`; the oldest of ``MAX_REQUESTED_RANGES`` are forgotten) and is
cut at the furthest end of the requests starting there; anything else from the server is ignored and never
published (``RETRANSMIT.ignored``). One that starts inside a request in flight is at most a hint to the pacing
(:meth:`~logbuf.feed.recovery.Recovery.on_hint`): it asks from that sequence on in a request of its own, and only
that request's answer is taken. **Unconfirmed jumps**: a live packet or heartbeat
past the end of its feed's last packet taken (its feed skipped sequences) that announces something not delivered
yet is held back: not queued, no gap, nothing delivered. Its feed continuing after it (a packet from its end on, a
marker repeating or passing its next sequence) confirms it; so does the other feed announcing all it carries, and
then the other feed's copies win (a held data packet starting before the confirming one is cut where that one's
messages begin; one starting at or after it is taken after it). Its feed continuing below it with new traffic (not
a late duplicate of what it sent before) reveals it as forged (dropped, ``jumps_forged``). Once confirmed it stays provisional until the stream reaches it:
a feed that carried it (the same datagram on both feeds is two copies, not two sources) going back below it with
traffic new since before the jump undoes it like a large jump (a feed's true sequences only grow). Before a feed's first packet (nothing to jump from) this does not apply. A packet or
heartbeat more than ``max_jump`` messages past everything known is held back until the other feed's copy (within ``max_jump``) or
the same feed continuing after it confirms the jump; the same feed continuing more than ``max_jump`` below it
drops it (``jumps_forged``). A confirmed jump stays provisional until the stream reaches it: a live packet
with fresh messages more than ``max_jump`` below it undoes it (queued packets from its position on, the holes,
gaps and end of session past what is left are forgotten) — nothing of a forged range is ever delivered.
**Resuming**: with ``resume = (session, next)``, that session is joined at ``next`` (a restart).

**Statistics** use the layout of :mod:`logbuf.feed.stats` (shared with C).
"""

from __future__ import annotations

import heapq
import itertools
import struct
from collections import deque

import numpy as np

from logbuf.feed.config import (  # noqa: F401  (re-exported: the settings the specification runs under)
    DEFAULT_MAX_JUMP,
    DEFAULT_MAX_QUEUE_BYTES,
    DEFAULT_MAX_QUEUE_PACKETS,
    MAX_REQUESTED_RANGES,
    NANOS_PER_MILLI,
    NANOS_PER_SECOND,
    ArbiterConfig,
)
from logbuf.feed.coverage import Coverage, Hole, OpenGap, parse_blocks
from logbuf.feed.events import (
    Deliver,
    EndOfSession,
    Event,
    Feed,
    FeedMode,
    GapDetected,
    GapReason,
    GapRecovered,
    GapUnrecoverable,
    QueueOverflow,
    RecoveryRequest,
    SessionChanged,
)
from logbuf.feed.recovery import Recovery
from logbuf.feed.stats import (
    C_COUNT,
    DELAY_COUNT,
    DELAY_MAX_NS,
    DELAY_MIN_NS,
    DELAY_SUM_NS,
    FS_BYTES,
    FS_COUNT,
    FS_DECODE_ERRORS,
    FS_DELIVERED,
    FS_DUPLICATES,
    FS_END_OF_SESSION,
    FS_FOREIGN_SESSION,
    FS_HEARTBEATS,
    FS_IGNORED,
    FS_MESSAGES,
    FS_OUT_OF_ORDER,
    FS_PACKETS,
    I64_MAX,
    RING_NO_FEED,
    Counters,
    FeedStats,
    counter_values,
    new_delay_stats,
)
from logbuf.marketdata import moldudp64
from logbuf.marketdata.moldudp64 import (
    END_OF_SESSION_COUNT,
    HEADER_LENGTH,
    HEARTBEAT_COUNT,
    MAX_SEQUENCE,
)

_HEADER = struct.Struct(">10sQH")
_U64 = (1 << 64) - 1
LIVE_FEEDS_MASK = (1 << Feed.A) | (1 << Feed.B)  # both live feeds carried a jump
_REVEALED = 1 << 8  # (in a small jump's feeds) a feed that carried it revealed it as forged already


class _Queued:
    """A data packet waiting ahead of the expected sequence (a copy of the datagram)."""

    __slots__ = ("first", "count", "feed", "arrival_ns", "data")

    def __init__(self, first: int, count: int, feed: Feed, arrival_ns: int, data: bytes) -> None:
        self.first = first
        self.count = count
        self.feed = feed
        self.arrival_ns = arrival_ns
        self.data = data


CANDIDATES_PER_FEED = 2  # sessions a live feed may hold a first datagram of at once
HELD_PER_SESSION = 4096  # datagrams of one session a feed holds awaiting confirmation (C: ENG_HELD_PER_SESSION)


class _Candidate:
    """The first datagram of a session not adopted yet (a copy), held until a second datagram confirms it."""

    __slots__ = ("session", "feed", "data", "start", "end", "arrival_ns")

    def __init__(self, session: bytes, feed: Feed, data: bytes, start: int, end: int, arrival_ns: int) -> None:
        self.session = session
        self.feed = feed
        self.data = data
        self.start = start  # a data packet's first sequence, a marker's next sequence
        self.end = end  # the sequence after it (a marker's next sequence)
        self.arrival_ns = arrival_ns


class _Held:
    """A packet (or marker) held back for announcing an unconfirmed jump (a copy of the datagram). ``small``: a
    jump of at most ``max_jump`` past everything known, on a feed that skipped sequences to announce it."""

    __slots__ = ("feed", "data", "position", "first", "count", "marker", "arrival_ns", "small")

    def __init__(self, feed: Feed, data: bytes, position: int, first: int, count: int, marker: bool,
                 arrival_ns: int, small: bool) -> None:
        self.feed = feed
        self.data = data
        self.position = position
        self.first = first
        self.count = count
        self.marker = marker
        self.arrival_ns = arrival_ns
        self.small = small

    @property
    def end(self) -> int:
        """One past the last sequence it announces (a marker announces up to its next sequence - 1)."""
        return self.first if self.marker else self.first + self.count


class SpecArbiter:
    """The sans-IO arbiter in pure Python: ``on_packet`` / ``on_tick`` return events (see the module doc)."""

    def __init__(self, config: ArbiterConfig | None = None, recovery: Recovery | None = None) -> None:
        cfg = self.config = config or ArbiterConfig()
        self.recovery = recovery
        self.mode = FeedMode(cfg.mode)
        self.live_feeds: tuple[Feed, ...] = self.mode.feeds
        self.feed_mask = (1 << Feed.RETRANSMIT) | int(self.mode)  # bit f: packets of feed f are processed
        self.pinned_session = None if cfg.session is None else moldudp64.encode_session(cfg.session)
        self.counter_array = np.zeros(C_COUNT, dtype=np.int64)
        self.counters = Counters(self.counter_array)
        # the statistics layout of logbuf.feed.stats (the same as the C engine's)
        self.feed_stats = np.zeros((len(Feed), FS_COUNT), dtype=np.int64)
        self.delay_stats = new_delay_stats()
        size = 1 << cfg.delay_window_bits
        self.ring_mask = size - 1
        self.ring_seq = np.zeros(size, dtype=np.uint64)
        self.ring_arrival = np.zeros(size, dtype=np.int64)
        self.ring_feed = np.full(size, RING_NO_FEED, dtype=np.uint8)

        self.session: bytes | None = None
        self.expected: int | None = None  # next sequence to deliver (last accepted + 1)
        self.highest = 0  # highest sequence known to exist (queued data, heartbeat/end-of-session marker)
        self.last_session_arrival_ns = 0  # last packet of the current session on any feed
        self._retired: set[bytes] = set()
        self._queue: list[tuple[int, int, _Queued]] = []  # heap by (first, arrival order)
        self.queued_bytes = 0  # datagram bytes in the queue
        self._requested: list[tuple[int, int, int]] = []  # re-requested inclusive ranges and when, oldest first
        self._jump_at: int | None = None  # a confirmed jump to here is provisional until the stream reaches it
        self._jump_floor = 0  # first sequence past everything known before that jump
        # a small jump (within max_jump) two datagrams confirmed: (position, floor, mask of the feeds that carried
        # it); provisional until the stream reaches it, since a forger may send the same packet on both feeds
        self._small_jump: tuple[int, int, int] | None = None
        self._order = itertools.count()
        self._coverage = Coverage()
        self._wait_started_ns: int | None = None  # the wait for the first undeclared hole began
        self._wait_hole = 0  # first sequence of that hole
        self._ahead = [0] * len(Feed)  # packets per feed past that hole since the wait began
        self._gaps: deque[OpenGap] = deque()  # declared gaps the stream has not passed yet (recovery on)
        self._declared_upto = 0  # every hole up to here has been declared (recovery on)
        self._pending_eos: int | None = None
        self._eos_emitted = False
        self._progress = False
        self._shedding = False  # the queue is full and packets past it are being shed (recovery on)
        # packets held back for announcing an unconfirmed jump, the newest per feed
        self._held: list[_Held] = []
        # per live feed, one past the furthest sequence its packets taken (not held) announced; 0: none yet
        self._feed_end = [0] * len(Feed)
        # first datagrams of sessions not adopted yet, until a second one confirms them: arrival order, at most
        # CANDIDATES_PER_FEED per live feed (of distinct sessions)
        self._candidates: list[_Candidate] = []
        # when each live feed last sent a valid datagram, and when the first came (None: not yet): a feed's own
        # next datagram confirms a session only while the other feed is silent
        self._feed_seen_ns: list[int | None] = [None] * len(Feed)
        self._first_seen_ns: int | None = None
        # per live feed, an END_OF_SESSION marker not confirmed yet: (next sequence, arrival)
        self._end_candidates: list[tuple[int, int] | None] = [None] * len(Feed)

    # -- public API -------------------------------------------------------------------------------------------

    def on_packet(self, feed: Feed | int, packet: bytes | bytearray | memoryview | moldudp64.Packet,
                  arrival_ns: int, truncated: bool = False) -> list[Event]:
        """Process one datagram of ``feed`` received at ``arrival_ns``; returns the events it caused, in order.

        ``packet`` is the UDP payload (or a decoded moldudp64 tuple); ``truncated`` says the receive buffer was
        too small for it (a decode error). Message bytes are copied out: the buffer may be reused afterwards.
        """
        feed = Feed(feed)
        if isinstance(packet, moldudp64.DownstreamPacket | moldudp64.Heartbeat | moldudp64.EndOfSession):
            packet = moldudp64.encode(packet)
        out: list[Event] = []
        self._packet(feed, memoryview(packet).cast("B"), arrival_ns, truncated, out)
        self._settle(arrival_ns, out)
        return out

    def on_tick(self, now_ns: int) -> list[Event]:
        """Let time pass: the wait criterion, recovery rounds and give-ups. Call at least every few ms while
        :meth:`next_deadline_ns` is not None (or exactly then)."""
        out: list[Event] = []
        self._settle(now_ns, out)
        return out

    def next_deadline_ns(self) -> int | None:
        """When :meth:`on_tick` next has something to do (None: nothing until the next packet)."""
        deadlines = []
        if self._wait_started_ns is not None:
            deadlines.append(self._wait_started_ns + self.config.lost_packet_wait_time_ns)
        if self.recovery is not None and self.recovery.active:
            d = self.recovery.next_deadline_ns()
            if d is not None:
                deadlines.append(d)
        quiet = self._end_quiet_deadline_ns()
        if quiet is not None:
            deadlines.append(quiet)
        return min(deadlines) if deadlines else None

    @property
    def queued_packets(self) -> int:
        return len(self._queue)

    # -- invariants: the stream is joined (expected and session set) and recovery is on where these are used ----

    @property
    def _next(self) -> int:
        """``expected``, where only a joined stream gets (a packet or marker joins it first)."""
        assert self.expected is not None, "the stream is not joined yet"
        return self.expected

    @property
    def _current_session(self) -> bytes:
        assert self.session is not None, "no session accepted yet"
        return self.session

    @property
    def _recovery(self) -> Recovery:
        assert self.recovery is not None, "recovery is off"
        return self.recovery

    @property
    def recovering(self) -> bool:
        return self.recovery is not None and self.recovery.active

    def holes(self, limit: int = 1 << 30) -> list[Hole]:
        """Missing ranges of ``[expected, highest]`` (what recovery asks for), lowest first."""
        if self.expected is None or self.highest < self.expected:
            return []
        return self._coverage.holes(self.expected, self.highest, limit)

    def stats(self, feed: Feed | int) -> FeedStats:
        return FeedStats(self.feed_stats[int(feed)])

    def counter_values(self) -> dict[str, int]:
        """Every counter by name (``A.packets``, ..., ``gaps_detected``, ``ab_delay_count``, ...) for the
        socket layer to copy into cnc.dat counters."""
        return counter_values(self.feed_stats, self.counter_array, self.delay_stats, len(self._queue))

    # -- packet intake (the canonical order of checks; native/feed_engine.c follows it) -----------------------

    def _packet(self, feed: Feed, buf: memoryview, arrival_ns: int, truncated: bool, out: list[Event]) -> None:
        st = self.feed_stats[feed]
        n = len(buf)
        st[FS_PACKETS] += 1
        st[FS_BYTES] += n
        if not self.feed_mask & (1 << feed):
            st[FS_IGNORED] += 1
            return
        if truncated or n < HEADER_LENGTH:
            st[FS_DECODE_ERRORS] += 1
            return
        session, first, count = _HEADER.unpack_from(buf, 0)
        marker = count in (HEARTBEAT_COUNT, END_OF_SESSION_COUNT)
        # the whole datagram is validated before it may choose (or switch) the session: a garbage datagram
        # must never be joined. Sequence 0 is not a message (nor a next sequence); first + count must stay a
        # representable next sequence (u64).
        if marker:
            valid = n == HEADER_LENGTH and 1 <= first <= MAX_SEQUENCE
        else:
            valid = 1 <= first <= MAX_SEQUENCE - count and parse_blocks(buf, count) is not None
        if not valid:
            st[FS_DECODE_ERRORS] += 1
            return
        if feed != Feed.RETRANSMIT:
            seen = self._feed_seen_ns[feed]
            self._feed_seen_ns[feed] = arrival_ns if seen is None else max(seen, arrival_ns)
            if self._first_seen_ns is None:
                self._first_seen_ns = arrival_ns
        self._session_candidate_revealed(feed, session)
        if session != self.session and not self._accept_session(feed, buf, session, first, count, marker,
                                                                arrival_ns, out):
            st[FS_FOREIGN_SESSION] += 1
            return
        if arrival_ns > self.last_session_arrival_ns:
            self.last_session_arrival_ns = arrival_ns
        if not marker:
            st[FS_MESSAGES] += count
        if feed == Feed.RETRANSMIT:
            # an answer counts only where a request started, and only for the sequences it asked for; anything else
            # is never published: starting inside a request in flight, it is at most a hint for the pacing
            accepted = 0 if marker else self._requested_count(first, count, arrival_ns)
            if accepted == 0:
                st[FS_IGNORED] += 1
                if not marker and self.recovery is not None:
                    self.recovery.on_hint(first, count, arrival_ns)
                return
            count = accepted
        else:
            self._forged_jump_revealed(feed, first, count, marker)
        if self._unconfirmed_jump(feed, buf, first, count, marker, arrival_ns, out):
            return
        self._take(feed, buf, first, count, marker, arrival_ns, out)

    def note_requests(self, requests: list[tuple[int, int]], now_ns: int) -> None:
        """Re-requests ``(seq, count)`` that went out at ``now_ns``: answers are accepted only when they start where
        one of these starts, for its range only, and arrive after it went out."""
        for seq, count in requests:
            if any(r[0] == seq and r[1] == seq + count - 1 for r in self._requested):  # a retry: already there
                continue
            if len(self._requested) >= MAX_REQUESTED_RANGES:
                del self._requested[0]
            self._requested.append((seq, seq + count - 1, now_ns))

    def _requested_count(self, first: int, count: int, arrival_ns: int) -> int:
        """The messages of an answer ``[first, first + count)`` that were asked for (0: not an answer to a request):
        only a request starting at ``first`` is answered by it (one starting inside or before a request carries
        sequences nobody asked of it there), cut at the furthest end of the requests starting there (an older,
        shorter request must not cut the answer to a newer one short). A packet that arrived before a request went
        out is no answer to it (a handler reading its socket late may find the server's packets to earlier requests
        there, and a forged one may start where a later request does). Answered, they are no longer outstanding (a
        retry asks again); ranges the stream has passed are forgotten on the way."""
        expected = self._next if self.expected is not None else 0
        room = max((r[1] - first + 1 for r in self._requested if r[0] == first and r[1] >= expected
                    and r[2] <= arrival_ns), default=0)
        # answered: no longer outstanding (a retry asks again); ranges the stream has passed are forgotten
        self._requested = [r for r in self._requested
                           if r[1] >= expected and not (room and r[0] == first and r[2] <= arrival_ns)]
        return min(count, room)

    def _forged_jump_revealed(self, feed: Feed, first: int, count: int, marker: bool) -> bool:
        """Live traffic continuing below a jump reveals it as forged: a held jump of the same feed is dropped
        (a small one by its feed's new traffic below it — a packet reaching past its feed's end, a marker at or past
        it; one past ``max_jump`` by traffic more than ``max_jump`` below it); a
        confirmed jump the stream has not reached yet is undone (nothing from its range is published)."""
        bound = self.config.max_jump
        if bound is None or self.expected is None:
            return False
        position = first - 1 if marker else first
        # new traffic of its feed (not a late duplicate of what it sent before) below a small jump reveals it
        end = self._feed_end[feed]
        current = first >= end if marker else first + count > end
        revealed = False
        for h in self._held:
            if h.feed == feed and (current and position < h.position if h.small else h.position - position > bound):
                self._held.remove(h)
                self.counters.jumps_forged += 1
                revealed = True
                break
        last = position if marker else first + count - 1
        small = self._small_jump
        if small is not None:
            if self._next >= small[0]:
                self._small_jump = None  # the stream reached it: it stands
            elif small[2] & (1 << feed) and last < small[0] and (first >= small[1] if marker
                                                                 else first + count > small[1]):
                # a feed that carried the jump went back below it with traffic new since before the jump (even
                # if the other feed delivered it first): a feed's true sequences only grow, so what it carried
                # above was forged. A packet reaching the jump from below is no such sign: it carries the jump's
                # sequences itself (a feed's own reordering looks like that), and its copy of them comes first
                self._undo_jump(small[0], small[1], feed)
                revealed = True
        jump = self._jump_at
        if jump is not None:
            if self._next >= jump:
                self._jump_at = None  # the stream reached the jump: it stands
            elif position < jump and last >= self._next and jump - position > bound:
                self._undo_jump(jump, self._jump_floor)
                revealed = True
        return revealed

    def _provisional_small(self, position: int, base: int, mask: int) -> None:
        """A confirmed small jump past ``base`` (everything known) by the feeds in ``mask``: provisional until
        the stream reaches it (the lowest one counts; later ones past what was known before it add their feeds,
        even where another feed's copy made them known since: each feed that jumped there may reveal it, and a
        lower one moves it down)."""
        small = self._small_jump
        if small is not None:
            if position > small[1]:
                self._small_jump = (min(position, small[0]), small[1], small[2] | mask)
        elif position > base:
            self._small_jump = (position, base, mask)

    def _undo_jump(self, jump: int, floor: int, feed: Feed | None = None) -> None:
        """Forget what a forged jump brought from its position on: its queued packets, holes and markers. A jump
        past ``max_jump`` (``feed`` None): everything from there on. A small one, revealed by ``feed`` going back
        below it: every packet queued from the jump on, whichever feed's copy the queue kept (a forger may send the
        same datagram on both feeds, and the second copy is a duplicate the queue never kept, so which feed
        vouched for a packet is not known); the jump stays provisional for the other feeds that carried it (their
        going back below it drops what came since). A feed's own reordering across a jump looks the same: what is
        dropped then is the true stream's, fetched again from the server."""
        if feed is None:
            self.counters.jumps_forged += 1
            if self._jump_at is not None and self._jump_at >= jump:
                self._jump_at = None
            if self._small_jump is not None and self._small_jump[0] >= jump:
                self._small_jump = None
            self._held.clear()
            self._queue = [q for q in self._queue if q[0] < jump]
        else:
            small = self._small_jump
            assert small is not None and small[0] == jump
            if not small[2] & _REVEALED:  # counted once, by the first feed that reveals it
                self.counters.jumps_forged += 1
            mask = small[2] & ~(1 << feed) | _REVEALED
            self._small_jump = (small[0], small[1], mask) if mask & LIVE_FEEDS_MASK else None
            self._held = [h for h in self._held if h.feed != feed]
            self._queue = [q for q in self._queue if q[0] < jump]
            self._feed_end[feed] = min(self._feed_end[feed], jump)
        heapq.heapify(self._queue)
        self.queued_bytes = sum(len(q[2].data) for q in self._queue)
        self._coverage = Coverage()
        for q in self._queue:
            self._coverage.add(q[2].first, q[2].first + q[2].count - 1)
        self._coverage.trim_below(self._next)
        highest = max(self._next - 1, floor - 1, self._coverage.ends[-1] if self._coverage else 0)
        self.highest = highest
        self._feed_end = [min(end, highest + 1) for end in self._feed_end]  # what the forged range moved
        # declared gaps stay open: they close as usual once the true stream passes them (it brings those
        # sequences, or they are given up). What is declared ends at what is left (a small jump's: before it):
        # past that, a hole is declared again once detection finds it (only what no open gap covers gets a
        # GapDetected), so every hole recovery works on or gives up lies in an open gap
        self._declared_upto = min(self._declared_upto, highest if feed is None else min(highest, jump - 1))
        if self._pending_eos is not None and self._pending_eos - 1 > highest:
            self._pending_eos = None

    def _intake(self, feed: Feed, buf: memoryview | bytes, first: int, count: int, marker: bool, arrival_ns: int,
                out: list[Event]) -> None:
        if marker:
            self._marker(feed, first, count == END_OF_SESSION_COUNT, arrival_ns, out)
            return
        if feed == Feed.RETRANSMIT and self.recovery is not None:
            self.recovery.on_answer(first, arrival_ns, count)
        self._data(feed, memoryview(buf), first, count, arrival_ns, out)

    def _unconfirmed_jump(self, feed: Feed, buf: memoryview, first: int, count: int, marker: bool,
                          arrival_ns: int, out: list[Event]) -> bool:
        """Hold back a packet (or marker) announcing an unconfirmed jump; take the held ones it confirms. True when
        the packet was dealt with here (held back, or taken with the held ones it confirms; False: the caller
        takes it).

        A *small* jump: a live packet past the end of its feed's last packet (the feed skipped sequences) that
        announces something not delivered yet; confirmed by the same feed continuing after it or by the other feed announcing
        everything it carries (see :meth:`_confirm_small`), revealed as forged by the same feed continuing below it
        (:meth:`_forged_jump_revealed`). A jump more than ``max_jump`` past everything known: confirmed by the
        other feed's copy (within ``max_jump``) or the same feed continuing after it, and provisional until the
        stream reaches it. One stray datagram must never declare a gap, nor publish its messages."""
        bound = self.config.max_jump
        if bound is None or self.expected is None:
            return False
        position = first - 1 if marker else first  # the first sequence it says exists
        last = position if marker else first + count - 1  # the last one
        # a held packet the stream has passed announces nothing new
        self._held = [h for h in self._held if h.end > self._next]
        if feed == Feed.RETRANSMIT:
            return self._large_jump_past(feed, buf, position, first, count, marker, arrival_ns, out)
        base = max(self._next, self.highest + 1)
        confirmed, after = self._confirm_small(feed, first, last, marker, base, out)
        if not self._large_jump_past(feed, buf, position, first, count, marker, arrival_ns, out):
            known = self._feed_end[feed]
            if not confirmed and known != 0 and position > known and last >= self._next:
                self._hold(feed, buf, position, first, count, marker, arrival_ns, True)
            else:
                if confirmed:  # the other feed's held jump announced all of it (that feed's own jump is its own)
                    self._provisional_small(position, base, 1 << feed)
                self._take(feed, buf, first, count, marker, arrival_ns, out)
        for h in after:  # held copies this packet covers: its own copies first
            self._intake(h.feed, h.data, h.first, h.count, h.marker, h.arrival_ns, out)
        return True

    def _take(self, feed: Feed, buf: memoryview, first: int, count: int, marker: bool, arrival_ns: int,
              out: list[Event]) -> None:
        """Act upon a packet: its feed's end moves to it, and it joins the stream."""
        if feed != Feed.RETRANSMIT:
            self._feed_end[feed] = max(self._feed_end[feed], first if marker else first + count)
        self._intake(feed, buf, first, count, marker, arrival_ns, out)

    def _large_jump_past(self, feed: Feed, buf: memoryview, position: int, first: int, count: int, marker: bool,
                         arrival_ns: int, out: list[Event]) -> bool:
        """True when the packet announces more than ``max_jump`` past everything known and was held back; when it
        confirms such a held jump, the held ones and then the packet are taken (True as well)."""
        bound = self.config.max_jump
        assert bound is not None
        base = max(self._next, self.highest + 1)
        if position <= base + bound:
            return False
        if not self._large_jump(feed, buf, position, first, count, marker, arrival_ns, base, out):
            self._take(feed, buf, first, count, marker, arrival_ns, out)
        return True

    def _confirm_small(self, feed: Feed, first: int, last: int, marker: bool, base: int,
                       out: list[Event]) -> tuple[bool, list[_Held]]:
        """Take the held small jumps a live packet of ``feed`` (its header's ``first``, announcing up to
        ``last``) confirms. The same feed continuing after a held one (a packet from its end on, or a marker
        repeating or passing its next sequence) confirms it whole. The other feed announcing everything a held one
        carries confirms it too, but the other feed's copies win: a held data packet starting before this one is
        taken only up to where this packet's messages begin, one starting at or after it only after it (returned,
        for the caller to take after the packet). Also returns whether this packet is itself confirmed: the other
        feed's held jump announces all of it. A confirmed one past ``base`` (everything known before this packet)
        stays provisional (:meth:`_provisional_small`)."""
        taken: list[tuple[_Held, int]] = []  # (held, messages of it taken)
        after: list[_Held] = []
        kept: list[_Held] = []
        confirmed = False
        for h in self._held:
            if not h.small:
                kept.append(h)
            elif h.feed == feed:
                if first >= h.end:  # the same feed continues after it
                    self.counters.jumps_confirmed += 1
                    self._feed_end[h.feed] = max(self._feed_end[h.feed], h.end)
                    self._provisional_small(h.position, base, 1 << feed)
                    taken.append((h, h.count))
                else:
                    kept.append(h)
            else:
                if h.end - 1 >= last:
                    confirmed = True
                if last >= h.end - 1:  # the other feed announced all of it
                    self.counters.jumps_confirmed += 1
                    self._feed_end[h.feed] = max(self._feed_end[h.feed], h.end)
                    self._provisional_small(h.position, base, LIVE_FEEDS_MASK)
                    if h.marker or marker:
                        taken.append((h, h.count))
                    elif first > h.first:  # cut where this packet's messages begin
                        taken.append((h, min(h.count, first - h.first)))
                    else:
                        after.append(h)
                else:
                    kept.append(h)
        self._held = kept
        for h, count in sorted(taken, key=lambda t: t[0].position):
            self._intake(h.feed, h.data, h.first, count, h.marker, h.arrival_ns, out)
        return confirmed, sorted(after, key=lambda h: h.position)

    def _hold(self, feed: Feed, buf: memoryview, position: int, first: int, count: int, marker: bool,
              arrival_ns: int, small: bool) -> None:
        """Keep the newest candidate per feed; an older one of the same feed is dropped."""
        self._held = [h for h in self._held if h.feed != feed]
        self._held.append(_Held(feed, bytes(buf), position, first, count, marker, arrival_ns, small))
        self.counters.jumps_held += 1

    def _large_jump(self, feed: Feed, buf: memoryview, position: int, first: int, count: int, marker: bool,
                    arrival_ns: int, base: int, out: list[Event]) -> bool:
        """A packet more than ``max_jump`` past everything known: held until a second one (the other feed's copy
        within ``max_jump``, or the same feed continuing after it) confirms the jump, which then stays
        provisional until the stream reaches it. True when the packet was held back."""
        bound = self.config.max_jump
        assert bound is not None
        confirmed = [h for h in self._held if not h.small
                     and (h.position <= position if h.feed == feed else abs(h.position - position) <= bound)
                     and position - h.position <= bound]
        if not confirmed:
            self._hold(feed, buf, position, first, count, marker, arrival_ns, False)
            return True
        self._held = [h for h in self._held if h not in confirmed]
        self.counters.jumps_confirmed += 1
        # acted upon, but provisional: live traffic continuing below it before the stream reaches it undoes it
        self._jump_floor = base
        self._jump_at = min([position] + [h.position for h in confirmed])
        for h in sorted(confirmed, key=lambda h: h.position):
            if h.feed != Feed.RETRANSMIT:
                self._feed_end[h.feed] = max(self._feed_end[h.feed], h.end)
            self._intake(h.feed, h.data, h.first, h.count, h.marker, h.arrival_ns, out)
        return False

    def _session_candidate_revealed(self, feed: Feed, session: bytes) -> None:
        """The current session continuing on a feed reveals that feed's held candidates of other sessions as
        forged."""
        if session == self.session and self._candidates:
            kept = [c for c in self._candidates if c.feed != feed]
            self.counters.sessions_forged += len(self._candidates) - len(kept)
            self._candidates = kept

    def _session_confirmed(self, feed: Feed, buf: memoryview, session: bytes, first: int, count: int,
                           marker: bool, arrival_ns: int) -> list[_Candidate] | None:
        """Hold the first datagram of a session until a second one confirms it: the other feed's (its position
        within ``max_jump``) or the same feed's next one continuing it (at or past its end) — with both feeds
        arbitrated, the latter only once the other feed has been silent for ``end_of_session_quiet_ns``: two
        datagrams of one feed are one source. What its feed sends on meanwhile is held behind it (up to
        ``HELD_PER_SESSION``; a repeat of what it held is dropped). Returns the held datagrams it confirms (the
        confirming ones and their feeds' continuations, lowest position first), or None when this one is held
        instead. A feed holds datagrams of ``CANDIDATES_PER_FEED`` sessions at most; confirming one session drops
        every other candidate (``sessions_forged``)."""
        start = first  # a marker's next sequence, a data packet's first
        end = first if marker else first + count
        bound = self.config.max_jump
        candidates = self._candidates
        alone = True  # the other live feed is silent (or not arbitrated)
        if self.feed_mask & LIVE_FEEDS_MASK == LIVE_FEEDS_MASK:
            other = self._feed_seen_ns[Feed.B if feed == Feed.A else Feed.A]
            since = other if other is not None else self._first_seen_ns
            alone = since is not None and arrival_ns - since >= self.config.end_of_session_quiet_ns
        same = [c.session == session for c in candidates]
        confirming = [s and (alone and c.end <= start if c.feed == feed
                             else bound is None or abs(c.start - start) <= bound) for s, c in zip(same, candidates, strict=True)]
        run = [c for s, c in zip(same, candidates, strict=True) if s and c.feed == feed]  # this feed's run of that session
        if not any(confirming):
            if run and start >= run[0].start:
                # its feed goes on (held behind the first, waiting for the other feed or its silence), reordered
                # or not, or repeats what it held (nothing new)
                if len(run) < HELD_PER_SESSION and not any(c.start == start and c.end == end for c in run):
                    candidates.append(_Candidate(session, feed, bytes(buf), start, end, arrival_ns))
                return None
            # the same feed went back (or elsewhere) in that session: what it held of it is dropped; or it holds
            # too many sessions: the oldest one's are dropped
            mine = [i for i, c in enumerate(candidates) if c.feed == feed]
            drop = {i for i in mine if same[i]}
            if not drop:
                sessions: list[bytes] = []
                for i in mine:
                    if candidates[i].session not in sessions:
                        sessions.append(candidates[i].session)
                oldest = set(sessions[: max(0, len(sessions) - CANDIDATES_PER_FEED + 1)])
                drop = {i for i in mine if candidates[i].session in oldest}
            self.counters.sessions_forged += len(drop)
            self._candidates = [c for i, c in enumerate(candidates) if i not in drop]
            self._candidates.append(_Candidate(session, feed, bytes(buf), start, end, arrival_ns))
            return None
        # confirmed: the confirming ones and what their feeds held behind them (their continuations)
        floor: dict[Feed, int] = {}
        for c, yes in zip(candidates, confirming, strict=True):
            if yes:
                floor[c.feed] = min(floor.get(c.feed, c.start), c.start)
        taken = [c for i, c in enumerate(candidates)
                 if confirming[i] or (same[i] and c.feed in floor and c.start >= floor[c.feed])]
        self.counters.sessions_forged += len(candidates) - len(taken)
        self._candidates = []
        # each feed's in the order it sent them (what a feed sent below a jump of its own must reveal that jump,
        # as it would have unheld), the feeds merged by the position each is at (the lowest first datagram first:
        # a stream joined where it is starts at the lowest)
        runs = [[c for c in taken if c.feed == f] for f in (Feed.A, Feed.B)]
        merged: list[_Candidate] = []
        heads = [0, 0]
        while len(merged) < len(taken):
            ready = [f for f in (0, 1) if heads[f] < len(runs[f])]
            f = min(ready, key=lambda f: runs[f][heads[f]].start)  # (a tie: A first)
            merged.append(runs[f][heads[f]])
            heads[f] += 1
        return merged

    def _accept_session(self, feed: Feed, buf: memoryview, session: bytes, first: int, count: int, marker: bool,
                        arrival_ns: int, out: list[Event]) -> bool:
        """A datagram of a session other than the current one: True when it starts (or switches to) its session
        now, confirmed by a second datagram (the held first one is processed before it)."""
        if session in self._retired or (self.pinned_session is not None and session != self.pinned_session):
            return False
        if feed == Feed.RETRANSMIT:  # answers are for the current session's requests: they never choose one
            return False
        # an END_OF_SESSION of this feed not confirmed yet: the feed moving to a new session (confirmed below)
        # confirms it
        ended = self._end_candidates[feed] if self._pending_eos is None else None
        if self.session is not None:
            # switch once the current session has ended and nothing of it is missing any more (a hole is
            # resolved within lost_packet_wait_time + give_up at most), or once it has gone silent
            complete = (self._pending_eos is not None or ended is not None) and not self.holes(1)
            if not complete and arrival_ns - self.last_session_arrival_ns < self.config.session_change_idle_ns:
                return False
        held = self._session_confirmed(feed, buf, session, first, count, marker, arrival_ns) \
            if self.config.confirm else []
        if held is None:
            return False
        if self.session is None:
            self.session = session
            self.counters.session_changes += 1
            resume = self.config.resume
            if resume is not None and self.config.resume_session_field() == session:
                self._join(resume[1], out)  # a restart: after what the previous run published
            elif self.config.start_sequence is not None:
                self._join(self.config.start_sequence, out)
            # else the first datagram processed (the held one) fixes expected: joining wherever the stream is
        else:
            if ended is not None:
                self._pending_eos = ended[0]
            self._switch_session(session, arrival_ns, out)
        for c in held:  # counted once already (as a foreign datagram while it was held)
            st = self.feed_stats[c.feed]
            st[FS_PACKETS] -= 1
            st[FS_BYTES] -= len(c.data)
            st[FS_FOREIGN_SESSION] -= 1
            self._packet(c.feed, memoryview(c.data), c.arrival_ns, False, out)
        return True

    def _join(self, next_sequence: int, out: list[Event]) -> None:
        self.expected = next_sequence
        self.highest = next_sequence - 1
        out.append(SessionChanged(None, self._current_session, next_sequence))

    def _switch_session(self, session: bytes, now_ns: int, out: list[Event]) -> None:
        old = self._current_session
        while self.holes(1):
            self._abandon(1, GapReason.SESSION_CHANGE, now_ns, out)
        self._close_gaps(out)
        self._emit_end_of_session(now_ns, out)
        self._progress = False
        self._retired.add(old)
        if self.recovery is not None:
            self.recovery.stop()
        self._queue.clear()
        self.queued_bytes = 0
        self._requested.clear()
        self._jump_at = None
        self._small_jump = None
        self._held.clear()
        self._feed_end = [0] * len(Feed)
        self._coverage = Coverage()
        self._gaps.clear()
        self._declared_upto = 0
        self._wait_started_ns = None
        self._pending_eos = None
        self._eos_emitted = False
        self._candidates = []
        self._end_candidates = [None] * len(Feed)
        self._shedding = False
        self.ring_feed.fill(RING_NO_FEED)  # sequences restart: old slots must not pair with new messages
        self.session = session
        self.expected = 1  # a MoldUDP64 session numbers its messages from 1
        self.highest = 0
        self.counters.session_changes += 1
        out.append(SessionChanged(old, session, 1))

    def _marker(self, feed: Feed, next_sequence: int, end: bool, arrival_ns: int, out: list[Event]) -> None:
        self.feed_stats[feed, FS_END_OF_SESSION if end else FS_HEARTBEATS] += 1
        if self.expected is None:
            self._join(next_sequence, out)
        self._end_revealed(feed, next_sequence)
        if end and self._pending_eos is None:
            if self.config.confirm:
                self._end_candidate(feed, next_sequence, arrival_ns)
            else:
                self._pending_eos = next_sequence
        if next_sequence - 1 >= self._next:  # messages up to next_sequence - 1 exist and are not here
            self.highest = max(self.highest, next_sequence - 1)
            self._note_ahead(feed, next_sequence, arrival_ns)

    def _data(self, feed: Feed, buf: memoryview, first: int, count: int, arrival_ns: int, out: list[Event]) -> None:
        if self.expected is None:
            self._join(first, out)
        self._end_revealed(feed, first + count)
        if first > self._next:
            self.feed_stats[feed, FS_OUT_OF_ORDER] += 1
            self._enqueue(feed, first, count, bytes(buf), arrival_ns, out)
            return
        self._walk(feed, buf, first, count, arrival_ns, out)
        self._drain(out)

    # -- delivery ---------------------------------------------------------------------------------------------

    def _walk(self, feed: Feed, packet: bytes | memoryview, first: int, count: int, arrival_ns: int,
              out: list[Event]) -> None:
        before = self._next
        self._walk_python(feed, packet, first, count, arrival_ns, out)
        if self._next > before:
            self._progress = True

    def _walk_python(self, feed: Feed, packet: bytes | memoryview, first: int, count: int, arrival_ns: int,
                     out: list[Event]) -> None:
        """The per-message walk (``eng_walk`` in native/feed_engine.c)."""
        expected = self._next
        st = self.feed_stats[feed]
        live = feed != Feed.RETRANSMIT
        mask = self.ring_mask
        ring_seq, ring_arrival, ring_feed = self.ring_seq, self.ring_arrival, self.ring_feed
        delivered = duplicates = 0
        for i, (offset, length) in enumerate(_blocks(packet, count)):
            seq = first + i
            slot = seq & mask
            if seq < expected:
                duplicates += 1
                if live and ring_seq[slot] == seq and ring_feed[slot] != RING_NO_FEED and ring_feed[slot] != feed:
                    self._pair(int(ring_arrival[slot]), arrival_ns, feed)
                    ring_feed[slot] = RING_NO_FEED
                continue
            delivered += 1
            ring_seq[slot] = seq
            ring_arrival[slot] = arrival_ns
            ring_feed[slot] = feed if live else RING_NO_FEED
            out.append(Deliver(seq, bytes(packet[offset : offset + length]), feed, arrival_ns))
        st[FS_DELIVERED] += delivered
        st[FS_DUPLICATES] += duplicates
        if first + count > expected:
            self.expected = first + count

    def _pair(self, winner_arrival_ns: int, arrival_ns: int, feed: Feed) -> None:
        # the winner came from the other live feed; record arrival(A) - arrival(B)
        delay = arrival_ns - winner_arrival_ns if feed == Feed.B else winner_arrival_ns - arrival_ns  # B - A
        d = self.delay_stats
        d[DELAY_COUNT] += 1
        d[DELAY_SUM_NS] += delay
        if delay < d[DELAY_MIN_NS]:
            d[DELAY_MIN_NS] = delay
        if delay > d[DELAY_MAX_NS]:
            d[DELAY_MAX_NS] = delay

    def _drain(self, out: list[Event]) -> None:
        queue = self._queue
        while queue and queue[0][0] <= self._next:
            _, _, entry = heapq.heappop(queue)
            self.queued_bytes -= len(entry.data)
            self._walk(entry.feed, entry.data, entry.first, entry.count, entry.arrival_ns, out)
        self._coverage.trim_below(self._next)

    # -- the out-of-order queue and gaps ----------------------------------------------------------------------

    def _enqueue(self, feed: Feed, first: int, count: int, data: bytes, arrival_ns: int, out: list[Event]) -> None:
        last = first + count - 1
        self.highest = max(self.highest, last)
        if self._coverage.covers(first, last):  # every message already queued: a duplicate, keep nothing
            self.feed_stats[feed, FS_DUPLICATES] += count
        else:
            capacity = self.config.max_queue_packets
            max_bytes = self.config.max_queue_bytes
            if len(self._queue) >= capacity or self.queued_bytes + len(data) > max_bytes:
                if self.recovery is not None:
                    # shed, never abandon: the packet is not queued, its range stays a hole and is fetched again
                    # (declared like any hole, or already inside a declared one); only the server's refusal or
                    # give-up loses messages
                    self.counters.shed_packets += 1
                    if not self._shedding:  # one overflow per episode of a full queue
                        self._shedding = True
                        self.counters.queue_overflows += 1
                        out.append(QueueOverflow(self._current_session, len(self._queue), capacity))
                    self._note_ahead(feed, first, arrival_ns)
                    return
                # recovery off: nothing can be fetched again; the oldest holes are given up
                self.counters.queue_overflows += 1
                out.append(QueueOverflow(self._current_session, len(self._queue), capacity))
                while (len(self._queue) > capacity // 2 or self.queued_bytes > max_bytes // 2) and self.holes(1):
                    self._abandon(1, GapReason.QUEUE_OVERFLOW, arrival_ns, out)
                if first <= self._next:  # giving up moved the stream up to (or past) this packet
                    self._walk(feed, data, first, count, arrival_ns, out)
                    self._drain(out)
                    return
            self._shedding = False
            heapq.heappush(self._queue, (first, next(self._order), _Queued(first, count, feed, arrival_ns, data)))
            self.queued_bytes += len(data)
            self._coverage.add(first, last)
        self._note_ahead(feed, first, arrival_ns)

    def _first_undeclared_hole(self) -> int | None:
        """First missing sequence past everything already declared (the hole the criteria are watching)."""
        if self.expected is None:
            return None
        start = max(self.expected, self._declared_upto + 1)
        if self.highest < start:
            return None
        holes = self._coverage.holes(start, self.highest, 1)
        return holes[0][0] if holes else None

    def _update_wait(self, now_ns: int, hole: int | None) -> None:
        if hole is None:
            self._wait_started_ns = None
        elif self._wait_started_ns is None or hole != self._wait_hole:
            # a new hole, or the watched one was partly filled from the front: the wait (re)starts
            self._wait_started_ns = now_ns
            self._wait_hole = hole
            self._ahead = [0] * len(Feed)

    def _note_ahead(self, feed: Feed, position: int, arrival_ns: int) -> None:
        """A packet landed past ``expected`` (``position``: its first sequence, or a marker's next sequence)."""
        hole = self._first_undeclared_hole()
        self._update_wait(arrival_ns, hole)
        if hole is not None and position > hole and feed != Feed.RETRANSMIT:
            self._ahead[feed] += 1

    def _check_detection(self, now_ns: int, out: list[Event]) -> None:
        if self._wait_started_ns is None:
            return
        interval = self.config.out_of_order_max_interval
        if all(self._ahead[f] >= interval for f in self.live_feeds):
            self._declare(GapReason.SEQUENCE_THRESHOLD, now_ns, out)
        elif now_ns - self._wait_started_ns >= self.config.lost_packet_wait_time_ns:
            self._declare(GapReason.WAIT_TIMEOUT, now_ns, out)

    def _declare(self, reason: GapReason, now_ns: int, out: list[Event]) -> None:
        self._wait_started_ns = None
        if self.recovery is None:  # recovery off: [expected, head of the most recent run - 1], lost at once
            first = self._next
            head = self._coverage.last_start() if self._coverage else self.highest + 1
            self._open(first, head - 1, reason, out, lost=True)
            self._unrecoverable(first, head - 1, GapReason.RECOVERY_OFF, out)
            queue = self._queue
            while queue and queue[0][0] < head:  # older queued packets are dropped
                _, _, dropped = heapq.heappop(queue)
                self.queued_bytes -= len(dropped.data)
                self.counters.dropped_packets += 1
            self._coverage.trim_below(head)
            self.expected = head
            self._progress = True
            self._drain(out)
            self._close_gaps(out)
            return
        # recovery: every hole not declared yet, up to the highest sequence seen, is declared and re-requested
        start = max(self._next, self._declared_upto + 1)
        for first, last in self._coverage.holes(start, self.highest, 1 << 62):
            self._open_uncovered(first, last, reason, out)
        self._declared_upto = self.highest
        self.recovery.start(now_ns)

    def _open(self, first: int, last: int, reason: GapReason, out: list[Event], lost: bool = False,
              at: int | None = None) -> None:
        """Declare ``[first, last]``: a GapDetected, and an open gap (last, or at index ``at``)."""
        self.counters.gaps_detected += 1
        out.append(GapDetected(self._current_session, first, last, reason))
        gap = OpenGap(first, last)
        gap.lost = lost
        if at is None:
            self._gaps.append(gap)
        else:
            self._gaps.insert(at, gap)

    def _open_uncovered(self, first: int, last: int, reason: GapReason, out: list[Event], lost: bool = False
                        ) -> None:
        """Declare the parts of ``[first, last]`` no open gap covers, each a gap of its own in sequence order.
        Open gaps lie past what is declared only after a jump was undone (they stay open, see :meth:`_undo_jump`);
        otherwise every open gap ends before ``first`` and this is one :meth:`_open`."""
        gaps = self._gaps
        if not gaps or gaps[-1].last < first:
            self._open(first, last, reason, out, lost)
            return
        i = 0
        while first <= last:
            while i < len(gaps) and gaps[i].last < first:
                i += 1
            if i < len(gaps) and gaps[i].first <= first:  # covered up to that gap's end
                if gaps[i].last >= last:
                    return
                first = gaps[i].last + 1
                continue
            end = last if i == len(gaps) else min(last, gaps[i].first - 1)
            self._open(first, end, reason, out, lost, at=i)
            i += 1
            first = end + 1

    def _unrecoverable(self, first: int, last: int, reason: GapReason, out: list[Event]) -> None:
        self.counters.gaps_unrecoverable += 1
        # saturates: a confirmed jump may name nearly 2**64 sequences, the counter is an int64
        self.counters.messages_unrecoverable = min(I64_MAX, self.counters.messages_unrecoverable + last - first + 1)
        out.append(GapUnrecoverable(self._current_session, first, last, reason))

    def _declared_holes(self, limit: int) -> list[Hole]:
        """The holes recovery works on: those inside declared gaps."""
        if self.expected is None or self._declared_upto < self.expected:
            return []
        return self._coverage.holes(self.expected, min(self.highest, self._declared_upto), limit)

    def _abandon(self, n: int, reason: GapReason, now_ns: int, out: list[Event], upto: int = _U64) -> None:
        """Give up the first ``n`` holes, no further than sequence ``upto`` (a hole reaching past it is given up up
        to it and stays a hole after it): each becomes a GapUnrecoverable (declared first if it was not) and the
        stream moves past it, delivering everything queued in between."""
        for first, last in self.holes(n):
            if first > upto:
                break
            last = min(last, upto)
            self._close_gaps(out)
            for gap in self._gaps:
                if gap.first > last:
                    break
                gap.lost = True
            if last > self._declared_upto:
                self._open_uncovered(max(first, self._declared_upto + 1), last, reason, out, lost=True)
                self._declared_upto = last
            self._unrecoverable(first, last, reason, out)
            self.expected = last + 1
            self._progress = True
            self._drain(out)
        self._close_gaps(out)

    def _close_gaps(self, out: list[Event]) -> None:
        gaps = self._gaps
        while gaps and gaps[0].last < self._next:
            gap = gaps.popleft()
            if not gap.lost:
                self.counters.gaps_recovered += 1
                out.append(GapRecovered(self._current_session, gap.first, gap.last))

    def _settle(self, now_ns: int, out: list[Event]) -> None:
        """After any input: close passed gaps, watch the first undeclared hole, detect, drive recovery, end of
        session. Loops only after progress past a hole, so at most once per hole."""
        while True:
            if self._progress:
                self._progress = False
                self._close_gaps(out)
            if self.expected is None or self.highest < self.expected:
                self._wait_started_ns = None
                break
            self._update_wait(now_ns, self._first_undeclared_hole())
            self._check_detection(now_ns, out)
            if self._progress:
                continue
            if self.recovering:
                recovery = self._recovery
                limit = recovery.config.max_outstanding
                holes = self._declared_holes(limit)
                upto = recovery.expired(holes, now_ns)
                if upto:  # what was asked and not answered, up to ``upto``: never a hole the pacing has not reached
                    self._abandon(len(holes), GapReason.GIVE_UP, now_ns, out, upto)
                    continue
                requests = recovery.poll(self._declared_holes(limit), now_ns)
                self.note_requests(requests, now_ns)
                self.counters.recovery_requests += len(requests)
                out.extend(RecoveryRequest(self._current_session, seq, count) for seq, count in requests)
            break
        if self.recovering:
            if self.expected is None or self.highest < self.expected:
                self._recovery.stop()  # caught up
            else:
                self._recovery.forget_below(self._next)
        self._emit_end_of_session(now_ns, out)

    def _end_candidate(self, feed: Feed, next_sequence: int, arrival_ns: int) -> None:
        """An END_OF_SESSION marker acts only once (:meth:`_emit_end_of_session`) ``end_of_session_quiet_ns``
        passed without traffic past it on either live feed: the other feed's copy confirms nothing (a forger may
        send both), while a true end is followed by no data. Until then it is held here, one per feed."""
        candidates = self._end_candidates
        held = candidates[feed]
        if held is not None and held[0] == next_sequence:
            return  # repeated: the quiet counts from the first
        if held is not None:  # the same feed announced another end: the older one was forged
            self.counters.ends_forged += 1
        candidates[feed] = (next_sequence, arrival_ns)

    def _end_revealed(self, feed: Feed, past: int) -> None:
        """Traffic on a live feed announcing sequences past a held END_OF_SESSION of either feed (``past``: a
        data packet's end, a marker's next sequence) reveals that marker as forged: it is dropped and the stream
        goes on."""
        if feed == Feed.RETRANSMIT:
            return
        for f, candidate in enumerate(self._end_candidates):
            if candidate is not None and past > candidate[0]:
                self._end_candidates[f] = None
                self.counters.ends_forged += 1

    def _end_quiet_deadline_ns(self) -> int | None:
        """When the oldest held END_OF_SESSION marker has been quiet long enough to act (None: none held)."""
        held = [c[1] for c in self._end_candidates if c is not None]
        return min(held) + self.config.end_of_session_quiet_ns if held else None

    def _emit_end_of_session(self, now_ns: int, out: list[Event]) -> None:
        if self._pending_eos is None:
            for candidate in self._end_candidates:  # lowest feed first (the C engine's order)
                if candidate is not None and now_ns - candidate[1] >= self.config.end_of_session_quiet_ns:
                    self._pending_eos = candidate[0]
                    self._end_candidates = [None] * len(Feed)
                    break
        eos = self._pending_eos
        if eos is not None and not self._eos_emitted and self.expected is not None and self.expected >= eos:
            self._eos_emitted = True
            out.append(EndOfSession(self._current_session, eos))


def _blocks(packet: bytes | memoryview, count: int) -> list[tuple[int, int]]:
    """The blocks of a packet validated before it was accepted (a malformed one never reaches the walk)."""
    view = memoryview(packet)
    blocks = parse_blocks(view, int.from_bytes(view[18:20], "big"))  # an answer's count may be clipped
    assert blocks is not None and count <= len(blocks), "a malformed packet reached the walk"
    return blocks[:count]
