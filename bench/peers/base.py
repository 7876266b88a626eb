"""What every peer rig implements, and the stamped messages they all carry.

A *peer* is one way of moving bytes from one process to another (logbuf's per-message API, pyzmq PUSH/PULL,
…).  The harness (:mod:`bench.runner`) is the same for all of them: the parent opens a :class:`Channel`
(files, queues, service names), spawned producer and consumer processes open a :class:`Sender` /
:class:`Receiver` on it, and the numbers come from those processes' clocks and rusage.

Every message carries a stamp in its last 8 bytes, so the consumer can prove it received exactly what was
sent — nobody wins by dropping, duplicating or truncating data::

     0                                        size-8          size
     +----------------------------------------+---------------+
     | filler: byte j = (k + j) & 0xFF        | stamp u64 LE  |
     +----------------------------------------+---------------+
     stamp = producer << 32 | k,   k = the message's index in its producer's stream mod RING

Producers send from a pre-built ring of RING such messages (no per-message Python work to build them, as a
real publisher would have its bytes ready); the consumer sums the stamps it receives and the harness checks
the count and the sum against :func:`expected_checksum`.  The stamp sits at the *end* so a short, long or
torn message moves the sum.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Protocol

import numpy as np

from logbuf.idle import BackoffIdleStrategy

RING = 1024  # distinct pre-built messages per producer (power of two)
RING_MASK = RING - 1
STAMP_LENGTH = 8
MIN_SIZE = STAMP_LENGTH
BATCH = 256  # messages per batch call, for the peers with a batch API

_STAMP = struct.Struct("<Q")
stamp_at = _STAMP.unpack_from  # stamp_at(buffer, size - 8) -> (stamp,)


class DataError(AssertionError):
    """A consumer saw something other than what the producers sent."""


def throughput_idle() -> BackoffIdleStrategy:
    """What a polling loop does when it found nothing: spin a little, yield, then park (up to 1 ms)."""
    return BackoffIdleStrategy()


class LatencyIdleStrategy:
    """Ping-pong waits: spin for up to ``spin_ns`` since the wait began, then yield, then park (doubling).

    The spin is bounded by time, not by a count: a non-blocking receive costs 0.1 µs for a shared-memory
    poll but 2-4 µs for faster-fifo's ``get_nowait`` or pyzmq's ``recv(NOBLOCK)``, and a count-bounded spin
    would starve their I/O threads for tens of milliseconds on two cores.  Parking costs a ~30 µs wake-up
    here, so the spin covers a whole sub-50 µs round trip.
    """

    __slots__ = ("spin_ns", "max_yields", "min_park_ns", "max_park_ns", "_start", "_yields", "_park_ns")

    def __init__(self, spin_ns: int = 50_000, max_yields: int = 100, min_park_ns: int = 1_000,
                 max_park_ns: int = 1_000_000) -> None:
        if spin_ns < 0 or max_yields < 0 or not 0 < min_park_ns <= max_park_ns:
            raise ValueError("need spin_ns >= 0, max_yields >= 0 and 0 < min_park_ns <= max_park_ns")
        self.spin_ns = spin_ns
        self.max_yields = max_yields
        self.min_park_ns = min_park_ns
        self.max_park_ns = max_park_ns
        self.reset()

    def reset(self) -> None:
        self._start = 0
        self._yields = 0
        self._park_ns = self.min_park_ns

    def idle(self, work_count: int = 0) -> None:
        if work_count > 0:
            self.reset()
            return
        now = time.perf_counter_ns()
        if self._start == 0:
            self._start = now
        if now - self._start < self.spin_ns:
            return
        if self._yields < self.max_yields:
            self._yields += 1
            os.sched_yield()
            return
        time.sleep(self._park_ns / 1e9)
        self._park_ns = min(self._park_ns * 2, self.max_park_ns)


def latency_idle() -> LatencyIdleStrategy:
    return LatencyIdleStrategy()


def stamp(producer: int, index: int) -> int:
    return (producer << 32) | (index & RING_MASK)


def message_block(size: int, producer: int) -> np.ndarray:
    """The RING messages of one producer back to back (``RING * size`` bytes)."""
    if size < MIN_SIZE:
        raise ValueError(f"messages carry an {STAMP_LENGTH}-byte stamp: size must be >= {MIN_SIZE}, got {size}")
    if not 0 <= producer < 256:
        raise ValueError(f"producer index {producer} outside 0..255")
    k = np.arange(RING, dtype=np.int64)[:, None]
    j = np.arange(size - STAMP_LENGTH, dtype=np.int64)[None, :]
    block = np.empty((RING, size), dtype=np.uint8)
    block[:, : size - STAMP_LENGTH] = (k + j) & 0xFF
    stamps = (np.uint64(producer) << np.uint64(32)) | np.arange(RING, dtype=np.uint64)
    block[:, size - STAMP_LENGTH :] = stamps.astype("<u8").view(np.uint8).reshape(RING, STAMP_LENGTH)
    return block.reshape(-1)


def messages(size: int, producer: int) -> list[bytes]:
    """The same RING messages as separate ``bytes`` objects (for per-message APIs)."""
    block = message_block(size, producer)
    return [block[k * size : (k + 1) * size].tobytes() for k in range(RING)]


def _sum_of_indexes(n: int) -> int:
    """sum(i % RING for i in range(n))"""
    laps, rest = divmod(n, RING)
    return laps * (RING * (RING - 1) // 2) + rest * (rest - 1) // 2


def expected_checksum(producers: int, start: int, stop: int) -> int:
    """The sum of the stamps of messages ``start..stop-1`` of each of ``producers`` producers."""
    per_producer_indexes = _sum_of_indexes(stop) - _sum_of_indexes(start)
    count = stop - start
    return sum((p << 32) * count + per_producer_indexes for p in range(producers))


# -- the rig interfaces --------------------------------------------------------------------------------


class Sender(Protocol):
    """One producer's end, in its own process."""

    def send(self, n: int) -> None:
        """Sends the next ``n`` messages of this producer's stream (stamps continue across calls)."""

    def send_one(self, index: int) -> None:
        """Sends ring message ``index`` (ping-pong: the echo carries the stamp it received)."""

    def close(self) -> None:
        """Returns once everything sent has been handed to the transport (flushes feeder threads etc.)."""


class Receiver(Protocol):
    """The consumer's end, in its own process."""

    def receive(self, n: int) -> int:
        """Receives exactly ``n`` messages (from all producers); returns the sum of their stamps."""

    def receive_one(self) -> int:
        """Waits for one message; returns its stamp."""

    def close(self) -> None: ...


class Channel:
    """Parent-side resources of one run.  ``spec`` (picklable) is what the child processes open."""

    spec: Any = None
    has_duty = False  # True when the parent must run a duty cycle (logbuf's conductor) during the run

    def duty(self) -> int:
        """One duty cycle in the parent; returns work done (0 = idle)."""
        return 0

    def cpu_seconds(self) -> float | None:
        """CPU used by an out-of-process helper (a media driver) so far, or None when there is none."""
        return None

    def close(self) -> None:
        return None


class SimpleChannel(Channel):
    """A channel that is just a picklable spec and, optionally, how to release it."""

    def __init__(self, spec: Any, close: Callable[[], Any] | None = None) -> None:
        self.spec = spec
        self._close = close

    def close(self) -> None:
        if self._close is not None:
            self._close()


class Peer:
    """One transport used one way.  Subclasses set the class attributes and implement the factories.

    The parent calls :meth:`channel`; the spawned processes look the peer up by :attr:`key` and call
    :meth:`sender` / :meth:`receiver` (peer objects themselves never cross a process boundary).
    """

    key: ClassVar[str]  # stable id used in JSON and on the command line
    label: ClassVar[str]  # what the tables show
    modules: ClassVar[tuple[str, ...]] = ()  # importable modules it needs (else skipped with a note)
    batch: ClassVar[bool] = False  # uses a batch API (a separate row from the per-message one)
    multi_producer: ClassVar[bool] = True  # several producer processes may share one channel
    # how a consumer waits: "blocking" (in the kernel) or "backoff" (non-blocking polls, spin -> yield -> park)
    wait: ClassVar[str] = "blocking"
    rtt_waits: ClassVar[tuple[str, ...]] = ("blocking", "backoff")  # receive modes measured in ping-pong
    usage: ClassVar[str] = ""  # how the API is used, for the notes under the table

    def skip_reason(self, size: int, producers: int = 1) -> str | None:
        """Why this peer cannot run this case (None when it can)."""
        for name in self.modules:
            if importlib.util.find_spec(name) is None:
                return f"{name} is not installed (pip install -e '.[bench]')"
        if producers > 1 and not self.multi_producer:
            return f"{self.label} is single-producer: no shared channel for {producers} producer processes"
        return None

    @contextmanager
    def channel(self, size: int, producers: int, *, multi: bool = False) -> Iterator[Channel]:
        """``multi``: the run belongs to the multi-producer series (use the multi-producer path even for one
        producer, so the 1/2/4 columns compare like with like)."""
        ch = self.open_channel(size, producers, multi)
        try:
            yield ch
        finally:
            ch.close()

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        raise NotImplementedError

    def sender(self, spec: Any, producer: int, size: int) -> Sender:
        raise NotImplementedError

    def receiver(self, spec: Any, size: int, wait: str) -> Receiver:
        """``wait`` is :attr:`wait` for throughput runs, one of :attr:`rtt_waits` for ping-pong."""
        raise NotImplementedError
