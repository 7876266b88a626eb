"""Typed wrappers over ``native/feed.c``: a recvmmsg receive ring and the C fast path of the arbiter.

:class:`RecvRing` is a preallocated ring of receive slots (numpy arrays the C code writes into)::

    slab:     | slot 0 (slot_size bytes) | slot 1 | ... | slot capacity-1 |
    lengths:  int32  bytes of the datagram in each slot
    arrivals: int64  CLOCK_MONOTONIC arrival (SO_TIMESTAMPNS kernel stamp moved to that clock when enabled)
    feeds:    uint8  Feed of each slot
    flags:    uint8  RX_TRUNCATED (datagram larger than the slot), RX_KERNEL_TIMESTAMP

:class:`NativeArbiter` runs an :class:`~logbuf.feed.arbiter.Arbiter`'s common case in C: while the arbiter has
nothing pending (no hole, nothing queued), in-order packets are walked message by message in C and come back as
one :class:`~logbuf.feed.events.DeliverBatch` of (sequence, offset, length) arrays; while a hole is pending, C
still takes the packets that change nothing but counters (the lagging feed's duplicates, malformed datagrams)
up to the arbiter's next deadline. The first packet C must not decide (out of order, filling a hole, heartbeat,
another session, ...) goes to ``Arbiter.on_packet`` and C resumes after it. The wrapper also installs itself as
the arbiter's packet backend, so what Python does handle is validated and walked in C too (a packet drained
from the out-of-order queue becomes one ``DeliverBatch`` over its own copy of the datagram).
Both paths share the arbiter's statistics arrays, so results are identical to feeding the pure-Python arbiter
(tests/feed/test_feed_native*.py check that with hypothesis). Typical loop::

    ring = RecvRing()
    fast = NativeArbiter(arbiter, ring)
    n = ring.receive(sock_a, Feed.A)                 # recvmmsg, non-blocking
    n += ring.receive(sock_b, Feed.B, start=n)
    for event in fast.process(0, n) + arbiter.on_tick(monotonic_ns()):
        ...                                          # DeliverBatch views are valid until the next receive
"""

from __future__ import annotations

import socket
import weakref
from typing import Any

import numpy as np

from logbuf.feed.arbiter import FS_COUNT, Arbiter
from logbuf.feed.events import DeliverBatch, Event, Feed
from logbuf.feed.moldudp64 import HEADER_LENGTH, MAX_MESSAGE_COUNT

try:
    from logbuf._native import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on how the package was installed
    raise ImportError("logbuf's native shim (logbuf._native) is not built; see logbuf.native") from exc

_NO_DEADLINE = 2**63 - 1
_MAX_DATAGRAM_MESSAGES = (65_535 - HEADER_LENGTH) // 2  # zero-length messages in the largest datagram
RX_TRUNCATED = lib.LBF_RX_TRUNCATED
RX_KERNEL_TIMESTAMP = lib.LBF_RX_KERNEL_TIMESTAMP
DEFAULT_SLOTS = 64
DEFAULT_SLOT_SIZE = 65_536  # any UDP datagram fits: nothing is ever truncated
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux value; the socket module lacks it on 3.11
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # Linux value: the kernel's drop count with each datagram

if (FS_COUNT, len(Feed)) != (lib.LBF_FS_COUNT, lib.LBF_FEEDS):
    raise ImportError("native/feed.h and logbuf.feed.arbiter disagree on the statistics layout: rebuild the shim")


def monotonic_ns() -> int:
    """CLOCK_MONOTONIC, the clock of receive timestamps (the same as ``time.monotonic_ns`` on Linux)."""
    return lib.lbf_monotonic_ns()


def enable_kernel_timestamps(sock: socket.socket | int) -> None:
    """Ask the kernel to stamp each datagram when it is received (SO_TIMESTAMPNS)."""
    fd = sock if isinstance(sock, int) else sock.fileno()
    with socket.socket(fileno=socket.dup(fd)) as s:
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def enable_drop_counts(sock: socket.socket | int) -> None:
    """Ask the kernel to report, with each datagram, how many it dropped on this socket for a full receive
    buffer (SO_RXQ_OVFL); :attr:`RecvRing.kernel_drops` keeps the latest count per feed."""
    fd = sock if isinstance(sock, int) else sock.fileno()
    with socket.socket(fileno=socket.dup(fd)) as s:
        s.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)


def _ptr(ctype: str, array: np.ndarray) -> Any:
    """A typed pointer into ``array``; the caller must keep ``array`` alive as long as C may use it."""
    return ffi.cast(ctype, ffi.from_buffer(array, require_writable=True))


class RecvRing:
    """``capacity`` receive slots of ``slot_size`` bytes filled by batched ``recvmmsg`` (see the module doc)."""

    def __init__(self, capacity: int = DEFAULT_SLOTS, slot_size: int = DEFAULT_SLOT_SIZE) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1 slot")
        if not HEADER_LENGTH <= slot_size <= 1 << 20:
            raise ValueError(f"slot_size must be within {HEADER_LENGTH}..{1 << 20} bytes")
        self.capacity = capacity
        self.slot_size = slot_size
        self.slab = np.zeros(capacity * slot_size, dtype=np.uint8)
        self.lengths = np.zeros(capacity, dtype=np.int32)
        self.arrivals = np.zeros(capacity, dtype=np.int64)
        self.feeds = np.zeros(capacity, dtype=np.uint8)
        self.flags = np.zeros(capacity, dtype=np.uint8)
        self.kernel_drops = np.zeros(len(Feed), dtype=np.int64)  # per feed: the socket's SO_RXQ_OVFL count
        c = self._c = ffi.new("lbf_rx_t *")
        c.slab = _ptr("uint8_t *", self.slab)
        c.length = _ptr("int32_t *", self.lengths)
        c.arrival_ns = _ptr("int64_t *", self.arrivals)
        c.feed = _ptr("uint8_t *", self.feeds)
        c.flags = _ptr("uint8_t *", self.flags)
        c.kernel_drops = _ptr("int64_t *", self.kernel_drops)
        c.capacity = capacity
        c.slot_size = slot_size
        rc = lib.lbf_rx_init(c)
        if rc < 0:
            raise OSError(-rc, "lbf_rx_init failed")
        self._finalizer = weakref.finalize(self, lib.lbf_rx_destroy, c)

    @property
    def c(self) -> Any:
        """The ``lbf_rx_t *`` (for native callers)."""
        return self._c

    def close(self) -> None:
        self._finalizer()

    def receive(self, sock: socket.socket | int, feed: Feed | int, start: int = 0, max_packets: int | None = None,
                wait: bool = False) -> int:
        """Receive up to ``max_packets`` datagrams (default: to the end of the ring) into slots ``start..`` with
        one ``recvmmsg``; returns how many (0: nothing waiting). ``wait`` blocks until at least one arrives
        (only on a blocking socket). The GIL is released during the call."""
        feed = Feed(feed)
        if not 0 <= start <= self.capacity:
            raise ValueError(f"start {start} is outside 0..{self.capacity}")
        room = self.capacity - start
        count = room if max_packets is None else min(max_packets, room)
        if count < 0:
            raise ValueError("max_packets must be >= 0")
        fd = sock if isinstance(sock, int) else sock.fileno()
        mode = lib.LBF_RECV_WAIT_FOR_ONE if wait else lib.LBF_RECV_NONBLOCK
        n = lib.lbf_rx_recv(self._c, fd, int(feed), start, count, mode)
        if n < 0:
            raise OSError(-n, f"recvmmsg failed on fd {fd}")
        return n

    def load(self, slot: int, data: bytes, feed: Feed | int, arrival_ns: int) -> None:
        """Put a datagram in ``slot`` as if it had been received (tests, benchmarks, replaying captures);
        longer than a slot: truncated, as the kernel would."""
        if not 0 <= slot < self.capacity:
            raise IndexError(f"slot {slot} is outside 0..{self.capacity - 1}")
        n = min(len(data), self.slot_size)
        base = slot * self.slot_size
        self.slab[base : base + n] = np.frombuffer(data, dtype=np.uint8, count=n)
        self.lengths[slot] = n
        self.arrivals[slot] = arrival_ns
        self.feeds[slot] = int(Feed(feed))
        self.flags[slot] = RX_TRUNCATED if len(data) > self.slot_size else 0

    def packet(self, slot: int) -> memoryview:
        """The datagram in ``slot`` (a view into the ring)."""
        length = min(max(int(self.lengths[slot]), 0), self.slot_size)
        base = slot * self.slot_size
        return memoryview(self.slab[base : base + length])

    def truncated(self, slot: int) -> bool:
        length = int(self.lengths[slot])
        return bool(self.flags[slot] & RX_TRUNCATED) or not 0 <= length <= self.slot_size


class NativeArbiter:
    """The C fast path in front of an :class:`Arbiter` (see the module doc). The arbiter stays the owner of the
    state; use it directly for ticks, configuration and statistics."""

    def __init__(self, arbiter: Arbiter, ring: RecvRing, out_capacity: int = 1 << 16) -> None:
        per_packet = min(MAX_MESSAGE_COUNT, (ring.slot_size - HEADER_LENGTH) // 2)  # most messages a slot holds
        if out_capacity < per_packet:
            raise ValueError(f"out_capacity must hold one full packet: >= {per_packet} messages")
        self.arbiter = arbiter
        self.ring = ring
        self.out_seq = np.zeros(out_capacity, dtype=np.uint64)
        self.out_offset = np.zeros(out_capacity, dtype=np.int64)
        self.out_length = np.zeros(out_capacity, dtype=np.int32)
        self.out_slot = np.zeros(out_capacity, dtype=np.int32)
        out = self._out = ffi.new("lbf_out_t *")
        out.seq = _ptr("uint64_t *", self.out_seq)
        out.offset = _ptr("int64_t *", self.out_offset)
        out.length = _ptr("int32_t *", self.out_length)
        out.slot = _ptr("int32_t *", self.out_slot)
        out.capacity = out_capacity
        c = self._c = ffi.new("lbf_arb_t *")
        c.feed_stats = _ptr("int64_t *", arbiter.feed_stats)
        c.delay_stats = _ptr("int64_t *", arbiter.delay_stats)
        c.ring_seq = _ptr("uint64_t *", arbiter.ring_seq)
        c.ring_arrival = _ptr("int64_t *", arbiter.ring_arrival)
        c.ring_feed = _ptr("uint8_t *", arbiter.ring_feed)
        c.ring_mask = arbiter.ring_mask
        c.feed_mask = arbiter.feed_mask
        self._status = ffi.new("int32_t *")
        self._session: bytes | None = None
        self.fast_packets = 0  # handled entirely in C (for tests and tuning)
        self.slow_packets = 0  # handed to the Python arbiter
        # the walk of packets Python handles: one packet at a time, every UDP datagram's messages fit
        self.walk_seq = np.zeros(_MAX_DATAGRAM_MESSAGES, dtype=np.uint64)
        self.walk_offset = np.zeros(_MAX_DATAGRAM_MESSAGES, dtype=np.int64)
        self.walk_length = np.zeros(_MAX_DATAGRAM_MESSAGES, dtype=np.int32)
        self._walk_slot = np.zeros(_MAX_DATAGRAM_MESSAGES, dtype=np.int32)
        self._walk_slot.flags.writeable = False
        wout = self._wout = ffi.new("lbf_out_t *")
        wout.seq = _ptr("uint64_t *", self.walk_seq)
        wout.offset = _ptr("int64_t *", self.walk_offset)
        wout.length = _ptr("int32_t *", self.walk_length)
        self._walk_slot_out = np.zeros(_MAX_DATAGRAM_MESSAGES, dtype=np.int32)  # written by C, not read
        wout.slot = _ptr("int32_t *", self._walk_slot_out)
        wout.capacity = _MAX_DATAGRAM_MESSAGES
        arbiter.install_backend(self)

    def process(self, start: int, end: int) -> list[Event]:
        """Arbitrate ring slots ``start..end-1`` in order; returns the events (``DeliverBatch`` for runs handled
        in C, the arbiter's own events for the rest), in stream order."""
        ring, arb, c, out = self.ring, self.arbiter, self._c, self._out
        if not 0 <= start <= end <= ring.capacity:
            raise ValueError(f"slots {start}..{end} are outside the ring of {ring.capacity}")
        events: list[Event] = []
        out.count = 0
        i = start
        while i < end:
            if self._sync_in():
                before = out.count
                j = lib.lbf_arb_process(c, ring.c, i, end, out, self._status)
                arb.expected = c.expected
                arb.last_session_arrival_ns = c.last_arrival_ns
                self.fast_packets += j - i
                if out.count > before:
                    events.append(self._batch(before, out.count))
                i = j
                if i >= end:
                    break
                if self._status[0] == lib.LBF_OUT_FULL:
                    self._detach(events)
                    out.count = 0
                    continue
            self.slow_packets += 1
            events.extend(arb.on_packet(int(ring.feeds[i]), ring.packet(i), int(ring.arrivals[i]),
                                        truncated=ring.truncated(i)))
            i += 1
        return events

    # -- the arbiter's packet backend (logbuf.feed.arbiter.PacketBackend) --------------------------------------

    def valid(self, packet: memoryview, count: int) -> bool:
        return bool(lib.lbf_mold_valid(ffi.from_buffer("uint8_t[]", packet), len(packet), count))

    def walk(self, arbiter: Arbiter, feed: Feed, packet: bytes | memoryview, first: int, count: int,
             arrival_ns: int, out: list[Event]) -> None:
        data = packet if isinstance(packet, bytes) else bytes(packet)  # the batch owns its bytes
        c, wout = self._c, self._wout
        c.expected = arbiter.expected
        wout.count = 0
        r = lib.lbf_arb_walk(c, ffi.from_buffer("uint8_t[]", data), len(data), int(feed), arrival_ns, 0, 0, wout)
        if r == lib.LBF_OUT_FULL:  # more messages than any UDP datagram carries: let Python walk it
            arbiter._walk_python(feed, data, first, count, arrival_ns, out)
            return
        if r != lib.LBF_DONE:
            raise RuntimeError(f"lbf_arb_walk refused a packet the arbiter had accepted ({r})")
        arbiter.expected = c.expected
        n = wout.count
        if n:
            out.append(DeliverBatch(self.walk_seq[:n].copy(), self.walk_offset[:n].copy(),
                                    self.walk_length[:n].copy(), self._walk_slot[:n], np.frombuffer(data, np.uint8),
                                    np.array([feed], dtype=np.uint8), np.array([arrival_ns], dtype=np.int64)))

    # -- internals --------------------------------------------------------------------------------------------

    def _sync_in(self) -> bool:
        """Hand the arbiter's state to C; False when C can decide nothing (no session joined yet)."""
        arb, c = self.arbiter, self._c
        if arb.session is None or arb.expected is None:
            return False
        if arb.session != self._session:
            ffi.memmove(c.session, arb.session, 10)
            self._session = arb.session
        c.expected = arb.expected
        c.last_arrival_ns = arb.last_session_arrival_ns
        if arb.fast_path_ready:
            c.fast = lib.LBF_FAST_IN_ORDER
        else:
            deadline = arb.next_deadline_ns()
            c.fast = lib.LBF_FAST_DUPLICATES
            c.deadline_ns = _NO_DEADLINE if deadline is None else min(deadline, _NO_DEADLINE)
        return True

    def _batch(self, begin: int, end: int) -> DeliverBatch:
        ring = self.ring
        return DeliverBatch(self.out_seq[begin:end], self.out_offset[begin:end], self.out_length[begin:end],
                            self.out_slot[begin:end], ring.slab, ring.feeds, ring.arrivals)

    def _detach(self, events: list[Event]) -> None:
        """The output arrays are about to be reused: give the batches already returned their own copies."""
        for k, event in enumerate(events):
            if isinstance(event, DeliverBatch) and np.shares_memory(event.seqs, self.out_seq):
                events[k] = DeliverBatch(event.seqs.copy(), event.offsets.copy(), event.lengths.copy(),
                                         event.slots.copy(), event.buffer, event.ring_feeds, event.ring_arrivals)
