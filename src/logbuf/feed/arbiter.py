"""Per-message A/B arbitration and gap detection for MoldUDP64 feeds: the sans-IO façade over the C engine.

:class:`Arbiter` is fed datagrams (one at a time with :meth:`~Arbiter.on_packet`, or a whole receive ring with
:meth:`~Arbiter.process`) and clock ticks, and returns :mod:`~logbuf.feed.events` in stream order. No sockets,
no clock, no threads. The rules are those of :mod:`logbuf.feed.spec` and :mod:`logbuf.feed.recovery` (the
executable specifications, in pure Python); the state machine runs in C (``native/feed_engine.c``,
``native/feed_recovery.c``), which owns every piece of stream state: the session, the expected sequence, the
out-of-order queue, the holes and declared gaps, the waits, the held jumps and the re-request pacing (randomised
back-off, answer-sized requests in flight, the rate limit, retries, give-up). The engine takes packets, answers
and time and returns one array of events (delivery runs, gap and session events, the requests to send,
:class:`~logbuf.feed.events.RecoveryRequest`); nothing calls back into Python. A packet costs the same whether or
not a hole is pending.

Deliveries come as :class:`~logbuf.feed.events.DeliverBatch` runs: views into the receive ring's slab for
messages of ring packets (valid until the next receive), copies for messages of queued or copied packets.

The feed handler drives the same engine through a native round (``lbf_round``: receive, arbitrate, append the
runs, all in C); the round stops only for :meth:`Arbiter.round_events` (records for the events stream, and the
requests the handler sends).
"""

from __future__ import annotations

import errno
import weakref
from typing import Any

import numpy as np

from logbuf.feed.config import DEFAULT_MAX_JUMP, ArbiterConfig, RecoveryConfig, resume_session
from logbuf.feed.coverage import Hole
from logbuf.feed.events import (
    DeliverBatch,
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
from logbuf.feed.feed_native import RecvRing
from logbuf.feed.stats import (
    C_COUNT,
    DELAY_STAT_COUNT,
    FS_COUNT,
    RING_NO_FEED,
    Counters,
    FeedStats,
    counter_values,
    new_delay_stats,
)
from logbuf.marketdata import moldudp64

try:
    from logbuf._native import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on how the package was installed
    raise ImportError("logbuf's native shim (logbuf._native) is not built; see logbuf.native") from exc

__all__ = ["DEFAULT_MAX_JUMP", "Arbiter", "ArbiterConfig", "FeedStats"]

if (FS_COUNT, C_COUNT, DELAY_STAT_COUNT, RING_NO_FEED, len(Feed)) != (
        lib.LBF_FS_COUNT, lib.LBF_C_COUNT, 4, lib.LBF_RING_NO_FEED, lib.LBF_FEEDS):
    raise ImportError("native/feed.h and logbuf.feed.stats disagree on the statistics layout: rebuild the shim")

_NO_DEADLINE = 2**63 - 1
_SESSION_LENGTH = moldudp64.SESSION_LENGTH
_HOLE_BUFFER = 1 << 12  # holes fetched from C per call at most


def _ptr(ctype: str, array: np.ndarray) -> Any:
    return ffi.cast(ctype, ffi.from_buffer(array, require_writable=True))


class DeliverRun(Event):
    """A run of deliveries still inside the engine (``Arbiter.process(..., runs=True)``): publish it with
    :meth:`Arbiter.offer_run` (C appends straight into the log) or turn it into a :class:`DeliverBatch` with
    :meth:`batch`. Valid until the arbiter's next call."""

    __slots__ = ("_arbiter", "_call", "index", "count", "from_ring")

    def __init__(self, arbiter: Arbiter, index: int, count: int, from_ring: bool) -> None:
        self._arbiter = arbiter
        self._call = arbiter._call  # the arbiter call that made it: valid only until the next one
        self.index = index  # the engine's event index
        self.count = count
        self.from_ring = from_ring

    def __len__(self) -> int:
        return self.count

    def first_arrival_ns(self) -> int:
        self._arbiter._check_run(self)
        e = self._arbiter._c
        return int(e.out_arrival[int(e.events[self.index].a)])

    def batch(self) -> DeliverBatch:
        self._arbiter._check_run(self)
        ev = self._arbiter._c.events[self.index]
        return self._arbiter._batch(int(ev.a), int(ev.b), self.from_ring)


class Arbiter:
    """The arbitration engine with its re-request pacing (both in C): see the module doc. ``recovery``: the
    pacing's settings (None: recovery off, holes are lost at once); ``seed``: its back-off jitter's generator
    (:class:`~logbuf.feed.recovery.Jitter` draws the same)."""

    def __init__(self, config: ArbiterConfig | None = None, recovery: RecoveryConfig | None = None,
                 seed: int = 0) -> None:
        cfg = self.config = config or ArbiterConfig()
        self.recovery = recovery
        self.mode = FeedMode(cfg.mode)
        self.live_feeds: tuple[Feed, ...] = self.mode.feeds
        self.feed_mask = (1 << Feed.RETRANSMIT) | int(self.mode)
        self.feed_stats = np.zeros((len(Feed), FS_COUNT), dtype=np.int64)
        self.counter_array = np.zeros(C_COUNT, dtype=np.int64)
        self.counters = Counters(self.counter_array)
        self.delay_stats = new_delay_stats()
        size = 1 << cfg.delay_window_bits
        self.ring_seq = np.zeros(size, dtype=np.uint64)
        self.ring_arrival = np.zeros(size, dtype=np.int64)
        self.ring_feed = np.full(size, RING_NO_FEED, dtype=np.uint8)
        e = self._c = ffi.new("lbf_eng_t *")
        c = e.config
        c.feed_mask = self.feed_mask
        c.live_mask = int(self.mode)
        c.out_of_order_max_interval = cfg.out_of_order_max_interval
        c.lost_packet_wait_ns = cfg.lost_packet_wait_time_ns
        c.start_sequence = cfg.start_sequence or 0
        if cfg.session is not None:
            c.pinned = 1
            ffi.memmove(c.session, moldudp64.encode_session(cfg.session), _SESSION_LENGTH)
        c.max_queue_packets = cfg.max_queue_packets
        c.max_queue_bytes = cfg.max_queue_bytes
        if cfg.resume is not None:
            c.has_resume = 1
            ffi.memmove(c.resume_session, resume_session(cfg.resume[0]), _SESSION_LENGTH)
            c.resume_sequence = cfg.resume[1]
        c.session_change_idle_ns = cfg.session_change_idle_ns
        c.end_of_session_quiet_ns = cfg.end_of_session_quiet_ns
        c.confirm = 1 if cfg.confirm else 0
        c.max_jump = cfg.max_jump or 0
        c.recovery = 1 if recovery is not None else 0
        if recovery is not None:
            c.initial_backoff_ns = recovery.initial_backoff_ns
            c.jitter_low, c.jitter_high = recovery.backoff_jitter
            c.retry_interval_ns = recovery.retry_interval_ns
            c.give_up_ns = recovery.give_up_ns
            c.max_request_count = recovery.max_request_count
            c.max_outstanding = recovery.max_outstanding
            c.rate_units = recovery.rate_units
            c.request_burst = recovery.request_burst
        c.seed = seed & ((1 << 64) - 1)
        e.feed_stats = _ptr("int64_t *", self.feed_stats)
        e.delay_stats = _ptr("int64_t *", self.delay_stats)
        e.counters = _ptr("int64_t *", self.counter_array)
        e.ring_seq = _ptr("uint64_t *", self.ring_seq)
        e.ring_arrival = _ptr("int64_t *", self.ring_arrival)
        e.ring_feed = _ptr("uint8_t *", self.ring_feed)
        e.ring_mask = size - 1
        rc = lib.lbf_eng_init(e)
        if rc == -errno.EINVAL:
            raise ValueError("the engine refused the recovery settings (out of its limits)")
        if rc < 0:
            raise MemoryError("lbf_eng_init failed")
        self._finalizer = weakref.finalize(self, lib.lbf_eng_destroy, e)
        self._hole_first = np.zeros(_HOLE_BUFFER, dtype=np.uint64)
        self._hole_last = np.zeros(_HOLE_BUFFER, dtype=np.uint64)
        self._consumed = 0
        self._ring: RecvRing | None = None
        self._runs = False
        self._appended = ffi.new("int32_t *")
        self._sessions: dict[bytes, bytes] = {}

    # -- inputs -----------------------------------------------------------------------------------------------

    def on_packet(self, feed: Feed | int, packet: bytes | bytearray | memoryview | moldudp64.Packet,
                  arrival_ns: int, truncated: bool = False) -> list[Event]:
        """Process one datagram of ``feed`` received at ``arrival_ns``; returns the events it caused, in order.
        ``truncated`` says the receive buffer was too small for it (a decode error). The datagram is copied."""
        feed = Feed(feed)
        if isinstance(packet, moldudp64.DownstreamPacket | moldudp64.Heartbeat | moldudp64.EndOfSession):
            packet = moldudp64.encode(packet)
        data = bytes(packet)
        self._begin()
        self._runs = False
        r = lib.lbf_eng_packet(self._c, ffi.from_buffer("uint8_t[]", data), len(data), int(feed),
                               1 if truncated else 0, arrival_ns, -1, 0)
        return self._finish(r)

    def process(self, ring: RecvRing, start: int, end: int, runs: bool = False) -> list[Event]:
        """Arbitrate receive-ring slots ``start..end-1`` in order (the whole batch in one C call); returns the
        events in stream order. ``runs``: deliveries come as :class:`DeliverRun` (nothing copied; publish with
        :meth:`offer_run`) instead of ``DeliverBatch``."""
        if not 0 <= start <= end <= ring.capacity:
            raise ValueError(f"slots {start}..{end} are outside the ring of {ring.capacity}")
        self._begin()
        self._ring = ring
        self._runs = runs
        return self._finish(lib.lbf_eng_process(self._c, ring.c, start, end))

    def offer_run(self, run: DeliverRun, skip: int, publication: Any) -> tuple[int, int]:
        """Append the messages of ``run`` from its ``skip``-th on to ``publication`` (a logbuf publication) in
        one native call, the sequence as each frame's reserved value; returns (appended, result) like
        ``Publication.offer_batch`` (call again with ``skip + appended`` for the rest)."""
        self._check_run(run)
        ring = self._ring
        slab = ring.slab if ring is not None else np.zeros(0, np.uint8)
        result = lib.lbf_eng_offer(self._c, run.index, skip, ffi.cast("uint8_t *", slab.ctypes.data), slab.size,
                                   publication.native_struct(), publication._exclusive, self._appended)
        if result == -errno.EINVAL:
            raise ValueError(f"run {run.index} (skip {skip}) is not a delivery run of the last call")
        return int(self._appended[0]), int(result)

    def on_tick(self, now_ns: int) -> list[Event]:
        """Let time pass: the wait criterion, recovery rounds and give-ups. Call at least every few ms while
        :meth:`next_deadline_ns` is not None (or exactly then)."""
        self._begin()
        self._runs = False
        return self._finish(lib.lbf_eng_settle(self._c, now_ns))

    def next_deadline_ns(self) -> int | None:
        """When :meth:`on_tick` next has something to do (None: nothing until the next packet)."""
        deadline = int(lib.lbf_eng_deadline(self._c))
        return None if deadline == _NO_DEADLINE else deadline

    # -- a native round (logbuf.feed.feed_native.NativeRound) ----------------------------------------------

    @property
    def c(self) -> Any:
        """The ``lbf_eng_t *`` (for native callers)."""
        return self._c

    def round_events(self, first: int, end: int) -> list[tuple[Event, int]]:
        """Engine events ``first..end-1`` of the current round (none a delivery: the round appends those
        itself) as events (records, and :class:`RecoveryRequest` to send), each with the next sequence on the
        messages stream right after it (its record's reserved value); for a native round suspended with
        ``LBF_ROUND_EVENTS``."""
        e = self._c
        if not 0 <= first <= end <= e.event_count:
            raise ValueError(f"events {first}..{end} are outside the engine's {e.event_count}")
        out: list[tuple[Event, int]] = []
        for k in range(first, end):
            ev = e.events[k]
            if ev.kind == lib.LBF_EV_DELIVER:
                raise ValueError(f"event {k} is a delivery (the round appends it)")
            record = self._record(ev)
            if record is not None:
                out.append((record, int(ev.next)))
        return out

    # -- state ------------------------------------------------------------------------------------------------

    @property
    def session(self) -> bytes | None:
        return self._session_bytes(self._c.session) if self._c.has_session else None

    @property
    def expected(self) -> int | None:
        """The next sequence to deliver (None before a session was joined)."""
        return int(self._c.expected) if self._c.has_expected else None

    @property
    def highest(self) -> int:
        return int(self._c.highest)

    @property
    def last_session_arrival_ns(self) -> int:
        return int(self._c.last_session_arrival_ns)

    @property
    def queued_packets(self) -> int:
        return int(self._c.queued_packets)

    @property
    def queued_bytes(self) -> int:
        """Datagram bytes in the out-of-order queue."""
        return int(self._c.queued_bytes)

    @property
    def recovering(self) -> bool:
        """The pacing is active: holes were declared and the stream has not caught up yet."""
        return bool(self._c.recovering)

    @property
    def requests_sent(self) -> int:
        """Re-requests the pacing emitted."""
        return int(self._c.requests_sent)

    @property
    def requests_answered(self) -> int:
        """Answers that matched a request in flight."""
        return int(self._c.requests_answered)

    @property
    def requests_paced(self) -> int:
        """Times the pacing held requests back to stay under ``request_rate``."""
        return int(self._c.requests_paced)

    @property
    def request_chunk(self) -> int | None:
        """Messages one answer carries, as learned from the answers (None: not known yet)."""
        chunk = int(self._c.request_chunk)
        return chunk or None

    def holes(self, limit: int = _HOLE_BUFFER) -> list[Hole]:
        """Missing ranges of ``[expected, highest]`` (at most ``limit``, and at most 4096), lowest first."""
        return self._holes(0, limit)

    def stats(self, feed: Feed | int) -> FeedStats:
        return FeedStats(self.feed_stats[int(feed)])

    def counter_values(self) -> dict[str, int]:
        """Every counter by name (``A.packets``, ..., ``gaps_detected``, ``ab_delay_count``, ...)."""
        return counter_values(self.feed_stats, self.counter_array, self.delay_stats, self.queued_packets)

    def close(self) -> None:
        self._finalizer()

    # -- internals --------------------------------------------------------------------------------------------

    def _holes(self, declared: int, limit: int) -> list[Hole]:
        limit = max(0, min(limit, _HOLE_BUFFER))
        n = lib.lbf_eng_holes(self._c, declared, ffi.cast("uint64_t *", self._hole_first.ctypes.data),
                              ffi.cast("uint64_t *", self._hole_last.ctypes.data), limit)
        return list(zip(self._hole_first[:n].tolist(), self._hole_last[:n].tolist(), strict=True))

    def _begin(self) -> None:
        lib.lbf_eng_clear_output(self._c)
        self._consumed = 0

    @property
    def _call(self) -> int:
        """Counts the resets of the engine's output (a native round resets it too)."""
        return int(self._c.output_generation)

    def _check_run(self, run: DeliverRun) -> None:
        if run._call != self._call:
            raise ValueError("a DeliverRun is valid only until the arbiter's next call (publish it first)")

    def _finish(self, r: int) -> list[Event]:
        if r < 0:
            raise MemoryError(f"the arbitration engine failed ({r})")
        out: list[Event] = []
        self._collect(out)
        return out

    def _session_bytes(self, cdata: Any) -> bytes:
        raw = bytes(ffi.buffer(cdata, _SESSION_LENGTH))
        return self._sessions.setdefault(raw, raw)

    def _collect(self, out: list[Event]) -> None:
        e = self._c
        n = e.event_count
        for k in range(self._consumed, n):
            ev = e.events[k]
            kind = ev.kind
            if kind == lib.LBF_EV_DELIVER:
                if self._runs:
                    out.append(DeliverRun(self, k, int(ev.b) - int(ev.a), bool(ev.reason)))
                else:
                    out.append(self._batch(int(ev.a), int(ev.b), bool(ev.reason)))
            else:
                record = self._record(ev)
                if record is not None:
                    out.append(record)
        self._consumed = n
        e.event_sealed = n  # C must not extend a delivery run Python has already turned into a batch

    def _record(self, ev: Any) -> Event | None:
        """The event of engine event ``ev`` (not a delivery)."""
        kind = ev.kind
        if kind == lib.LBF_EV_REQUEST:
            return RecoveryRequest(self._session_bytes(ev.session), int(ev.a), int(ev.b))
        if kind == lib.LBF_EV_GAP_DETECTED:
            return GapDetected(self._session_bytes(ev.session), int(ev.a), int(ev.b), GapReason(ev.reason))
        if kind == lib.LBF_EV_GAP_RECOVERED:
            return GapRecovered(self._session_bytes(ev.session), int(ev.a), int(ev.b))
        if kind == lib.LBF_EV_GAP_UNRECOVERABLE:
            return GapUnrecoverable(self._session_bytes(ev.session), int(ev.a), int(ev.b), GapReason(ev.reason))
        if kind == lib.LBF_EV_SESSION_CHANGED:
            previous = self._session_bytes(ev.previous) if ev.reason else None
            return SessionChanged(previous, self._session_bytes(ev.session), int(ev.a))
        if kind == lib.LBF_EV_END_OF_SESSION:
            return EndOfSession(self._session_bytes(ev.session), int(ev.a))
        if kind == lib.LBF_EV_QUEUE_OVERFLOW:
            return QueueOverflow(self._session_bytes(ev.session), int(ev.a), int(ev.b))
        return None

    def _batch(self, a: int, b: int, from_ring: bool) -> DeliverBatch:
        e = self._c
        n = b - a
        seqs = np.frombuffer(ffi.buffer(e.out_seq + a, 8 * n), np.uint64).copy()
        offsets = np.frombuffer(ffi.buffer(e.out_offset + a, 8 * n), np.int64).copy()
        lengths = np.frombuffer(ffi.buffer(e.out_length + a, 4 * n), np.int32).copy()
        feeds = np.frombuffer(ffi.buffer(e.out_feed + a, n), np.uint8).copy()
        arrivals = np.frombuffer(ffi.buffer(e.out_arrival + a, 8 * n), np.int64).copy()
        if from_ring:
            assert self._ring is not None
            buffer = self._ring.slab
        else:
            begin = int(offsets[0])
            end = int(offsets[-1]) + int(lengths[-1])
            buffer = np.frombuffer(ffi.buffer(e.out_bytes + begin, end - begin), np.uint8).copy()
            offsets -= begin
        return DeliverBatch(seqs, offsets, lengths, np.arange(n, dtype=np.int32), buffer, feeds, arrivals)
