"""Typed wrappers over ``native/feed_rx.c``'s receive side: a recvmmsg receive ring, socket options, and the
handler's whole round in C (:class:`NativeRound`).

:class:`RecvRing` is a preallocated ring of receive slots (numpy arrays the C code writes into)::

    slab:     | slot 0 (slot_size bytes) | slot 1 | ... | slot capacity-1 |
    lengths:  int32  bytes of the datagram in each slot
    arrivals: int64  CLOCK_MONOTONIC arrival (SO_TIMESTAMPNS kernel stamp moved to that clock when enabled)
    feeds:    uint8  Feed of each slot
    flags:    uint8  RX_TRUNCATED (datagram larger than the slot), RX_KERNEL_TIMESTAMP
    segments: int32  0, or on a socket with UDP_GRO (:func:`enable_gro`) the size of each datagram of a run the
                     kernel coalesced into this slot (all that long but the last; :meth:`RecvRing.datagrams`)
    kernel_drops: int64 per feed, the socket's SO_RXQ_OVFL count (when enabled)

:class:`~logbuf.feed.arbiter.Arbiter` arbitrates a filled ring in C (``Arbiter.process``). Typical loop::

    ring = RecvRing()
    n = ring.receive(sock_a, Feed.A)                 # recvmmsg, non-blocking
    n += ring.receive(sock_b, Feed.B, start=n)
    for event in arbiter.process(ring, 0, n) + arbiter.on_tick(monotonic_ns()):
        ...                                          # DeliverBatch views are valid until the next receive

The feed handler does all of that, and the appending, in one C call per round (:class:`NativeRound`); it
returns to Python only with a status saying what needs Python (see ``native/feed.h``, ``lbf_round``).
"""

from __future__ import annotations

import socket
import sys
import weakref
from typing import Any

import numpy as np

from logbuf.feed.events import Feed
from logbuf.marketdata.moldudp64 import HEADER_LENGTH

try:
    from logbuf._native import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on how the package was installed
    raise ImportError("logbuf's native shim (logbuf._native) is not built; see logbuf.native") from exc

RX_TRUNCATED = lib.LBF_RX_TRUNCATED
RX_KERNEL_TIMESTAMP = lib.LBF_RX_KERNEL_TIMESTAMP
DEFAULT_SLOTS = 64
DEFAULT_SLOT_SIZE = 65_536  # any UDP datagram fits: nothing is ever truncated
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux value; the socket module lacks it on 3.11
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # Linux value: the kernel's drop count with each datagram
UDP_GRO = getattr(socket, "UDP_GRO", 104)  # Linux value (linux/udp.h)
MAX_DATAGRAM = 65_535  # a coalesced run is one datagram for the kernel: at most this long



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


SO_MEMINFO = getattr(socket, "SO_MEMINFO", 55)  # Linux value: the socket's memory figures, its drop count last
_SK_MEMINFO_DROPS = 8
_SK_MEMINFO_VARS = 9


def socket_drops(sock: socket.socket) -> int | None:
    """Datagrams the kernel dropped on this socket so far (a full receive buffer; SO_MEMINFO's
    SK_MEMINFO_DROPS, the count SO_RXQ_OVFL would attach to each datagram), read on demand: no control message
    per datagram, and drops show at once, not with the next datagram. None where the kernel has no SO_MEMINFO."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * _SK_MEMINFO_VARS)
    except OSError:
        return None
    if len(raw) < 4 * (_SK_MEMINFO_DROPS + 1):
        return None
    return int.from_bytes(raw[4 * _SK_MEMINFO_DROPS : 4 * _SK_MEMINFO_DROPS + 4], sys.byteorder)


def enable_gro(sock: socket.socket | int) -> bool:
    """Let the kernel hand over a run of datagrams of one flow as one (UDP_GRO, Linux >= 5.0): a sender's
    segmented send (UDP_SEGMENT) stays one datagram on loopback, and a NIC's receive offload coalesces
    consecutive same-sized datagrams. The ring splits them again (:attr:`RecvRing.segments`), so every datagram
    is still arbitrated on its own; they share one arrival stamp, and the socket's drop count (SO_RXQ_OVFL)
    counts a dropped run once. The slots must hold :data:`MAX_DATAGRAM` bytes. False: the kernel refused
    (too old); datagrams then come one by one."""
    fd = sock if isinstance(sock, int) else sock.fileno()
    with socket.socket(fileno=socket.dup(fd)) as s:
        try:
            s.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
        except OSError:
            return False
    return True


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
        self.segments = np.zeros(capacity, dtype=np.int32)  # UDP_GRO: each coalesced datagram's size (0: one)
        self.kernel_drops = np.zeros(len(Feed), dtype=np.int64)  # per feed: the socket's SO_RXQ_OVFL count
        c = self._c = ffi.new("lbf_rx_t *")
        c.slab = _ptr("uint8_t *", self.slab)
        c.length = _ptr("int32_t *", self.lengths)
        c.arrival_ns = _ptr("int64_t *", self.arrivals)
        c.feed = _ptr("uint8_t *", self.feeds)
        c.flags = _ptr("uint8_t *", self.flags)
        c.kernel_drops = _ptr("int64_t *", self.kernel_drops)
        c.segment = _ptr("int32_t *", self.segments)
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
        self.segments[slot] = 0

    def packet(self, slot: int) -> memoryview:
        """The datagram in ``slot`` (a view into the ring); a coalesced run whole (see :meth:`datagrams`)."""
        length = min(max(int(self.lengths[slot]), 0), self.slot_size)
        base = slot * self.slot_size
        return self.slab[base : base + length].data

    def datagrams(self, slot: int) -> list[memoryview]:
        """The datagrams in ``slot``: one, or each of a run the kernel coalesced (UDP_GRO), in order."""
        whole = self.packet(slot)
        count = int(lib.lbf_rx_datagrams(self._c, slot))
        if count == 1:
            return [whole]
        size = int(self.segments[slot])
        return [whole[k * size : (k + 1) * size] for k in range(count)]

    def truncated(self, slot: int) -> bool:
        length = int(self.lengths[slot])
        return bool(self.flags[slot] & RX_TRUNCATED) or not 0 <= length <= self.slot_size


ROUND_DONE = lib.LBF_ROUND_DONE
ROUND_EVENTS = lib.LBF_ROUND_EVENTS
ROUND_BACK_PRESSURED = lib.LBF_ROUND_BACK_PRESSURED
ROUND_KIND_MASK = lib.LBF_ROUND_KIND_MASK
ROUND_COUNTERS = lib.LBF_ROUND_COUNTERS
ROUND_REFUSED = lib.LBF_ROUND_REFUSED
ROUND_FAILED = lib.LBF_ROUND_FAILED


class NativeRound:
    """One handler round in C (``lbf_round``, see native/feed.h): receive from every feed socket, arbitrate,
    append the deliveries to the messages publication, write capture rows; Python is entered only through the
    returned status (engine events: records and the requests to send; back-pressure). Counters live in :attr:`c`.

    The objects it points into (ring, engine, publications, sockets, ``latency_ns``) must outlive it; the
    caller keeps them.
    """

    def __init__(self, ring: RecvRing, engine: Any, messages: Any, capture: Any | None,
                 sockets: dict[Feed, int], slots: dict[Feed, int], latency_ns: np.ndarray, *,
                 max_block_ns: int, batch_wait_ns: int, epoch_offset_ns: int, counters_interval_ns: int,
                 checkpoint: Any | None = None) -> None:
        n = int(latency_ns.size)
        if latency_ns.dtype != np.int64 or n < 1 or n & (n - 1):
            raise ValueError("latency_ns must be an int64 array whose length is a power of two")
        self.ring = ring
        self.latency_ns = latency_ns
        c = self._c = ffi.new("lbf_round_t *")
        c.rx = ring.c
        c.eng = engine
        c.messages = messages
        c.capture = ffi.NULL if capture is None else capture
        for feed in Feed:
            c.fd[feed] = sockets.get(feed, -1)
            c.slots[feed] = slots.get(feed, 0)
        c.max_block_ns = max_block_ns
        c.batch_wait_ns = batch_wait_ns
        c.epoch_offset_ns = epoch_offset_ns
        c.counters_interval_ns = counters_interval_ns
        c.latency_ns = _ptr("int64_t *", latency_ns)
        c.latency_mask = n - 1
        self._checkpoint = checkpoint  # a writable buffer of LBF_CHECKPOINT_LENGTH bytes (kept alive here)
        if checkpoint is not None:
            c.checkpoint = ffi.cast("uint8_t *", ffi.from_buffer(checkpoint, require_writable=True))
        rc = lib.lbf_round_init(c)
        if rc < 0:
            raise OSError(-rc, "lbf_round_init failed")
        self._finalizer = weakref.finalize(self, lib.lbf_round_destroy, c)

    @property
    def c(self) -> Any:
        """The ``lbf_round_t *``: counters (published, unpublished, back_pressure_waits, latency_count, rounds)
        and the last round's outputs (received, drained, event_next/event_end, fail_*)."""
        return self._c

    def close(self) -> None:
        self._finalizer()
