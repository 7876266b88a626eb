"""The replay's socket loop: a :class:`~logbuf.exchange.replay.core.ReplayCore`'s packets sent on UDP at their
due times, and what went (:class:`ReplaySummary`).

The loop wakes when a packet is due (then at least ``batch_ns`` later: never early, at most that much late plus
the wake-up latency) and sends every due packet of a feed at once, from a wire buffer where each packet was
built once for A and B: runs of equal-sized packets as one segmented send (UDP GSO; the kernel cuts the
datagrams), the rest with ``sendmmsg`` (the native ``lbn_send_from``), or ``send()`` per packet without the
native module."""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import errno
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from logbuf.exchange.replay.config import NANOS_PER_MILLI, NANOS_PER_SECOND, ReplayError
from logbuf.exchange.replay.core import ReplayCore
from logbuf.exchange.replay.schedule import FeedSendStats
from logbuf.exchange.replay.wire import FeedBatch, SendBatch

_LATE_NS = NANOS_PER_MILLI  # a packet sent later than this after its due time counts as late
_PROGRESS_MESSAGES = 65_536  # report progress in steps this large (a call per packet costs more than a send)
# A wake-up sends everything due, then sleeps at least this long: a packet goes at most this much (plus the
# kernel's wake-up latency) after its time, and sendmmsg calls carry several packets at high rates.
DEFAULT_BATCH_NS = 100_000
_PREFETCH_NS = 20 * NANOS_PER_MILLI  # build packets this far ahead of their due time
# UDP generic segmentation offload: one send of up to 64 equal segments within one maximal UDP payload
_UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)  # linux/udp.h
_MAX_SEGMENTS = 64
_MAX_SEGMENTED_BYTES = 65_507 - 40  # IPv4's largest UDP payload, less IPv6's longer header
_MIN_SEGMENTED_RUN = 4  # shorter runs go with sendmmsg (a segmented send costs about three packets)


@dataclass
class ReplaySummary:
    seconds: float
    packets: int
    messages: int
    bytes: int
    skipped_messages: int
    first_sequence: int | None
    next_sequence: int
    feeds: dict[str, FeedSendStats]
    late_packets: int = 0  # sent more than 1 ms after their due time
    max_late_ms: float = 0.0
    refused: int = 0  # sends that met "port unreachable" (nobody listening) and were sent again
    cpu_seconds: float = 0.0  # this process's CPU time during run() (building packets too, unless prebuilt)

    def as_dict(self) -> dict:
        return {
            "seconds": self.seconds, "packets": self.packets, "messages": self.messages, "bytes": self.bytes,
            "packets_per_second": self.packets / self.seconds if self.seconds else 0.0,
            "messages_per_second": self.messages / self.seconds if self.seconds else 0.0,
            "skipped_messages": self.skipped_messages, "first_sequence": self.first_sequence,
            "next_sequence": self.next_sequence, "late_packets": self.late_packets,
            "max_late_ms": self.max_late_ms, "refused": self.refused, "cpu_seconds": self.cpu_seconds,
            "feeds": {name: vars(stats).copy() for name, stats in self.feeds.items()},
        }


class _Queued:
    """A feed's part of a batch while it is being sent: Python lists for the loop, native pointers for sendmmsg."""

    __slots__ = ("times", "wire", "view", "offsets", "lengths", "counts", "bytes", "data", "reached", "sent", "native",
                 "run_end")

    def __init__(self, wire: np.ndarray, feed: FeedBatch, native: Any, segmenting: bool) -> None:
        self.times: list[int] = feed.times.tolist()
        self.wire = wire
        self.view = wire.data
        self.offsets: list[int] = feed.offsets.tolist()
        self.lengths: list[int] = feed.lengths.tolist()
        # prefix sums: the messages and bytes of packets [lo, hi) without a loop
        self.counts: list[int] = [0, *np.cumsum(feed.counts).tolist()]
        self.bytes: list[int] = [0, *np.cumsum(feed.lengths, dtype=np.int64).tolist()]
        # and of the data packets (heartbeats and end-of-session packets carry no message); the highest
        # sequence reached by packets [0, hi): what an interrupted run reports
        self.data: list[int] = [0, *np.cumsum(feed.counts > 0).tolist()]
        self.reached: list[int] = [0, *np.maximum.accumulate(feed.ends).tolist()] if feed.ends.size else [0]
        self.sent = 0  # packets [0, sent) went
        # run_end[i]: where the run of equal-sized packets lying back to back in the wire from packet i ends
        self.run_end: list[int] | None = None
        if segmenting and feed.offsets.size:
            offsets, lengths = feed.offsets.astype(np.int64), feed.lengths.astype(np.int64)
            starts = np.flatnonzero((offsets[1:] != offsets[:-1] + lengths[:-1]) | (lengths[1:] != lengths[:-1])) + 1
            ends = np.append(starts, offsets.size)
            self.run_end = ends[np.searchsorted(ends, np.arange(offsets.size), side="right")].tolist()
        self.native = None
        if native is not None:
            ffi = native.ffi
            offsets = np.ascontiguousarray(feed.offsets, dtype=np.int32)
            lengths = np.ascontiguousarray(feed.lengths, dtype=np.int32)
            # the cdata keep their numpy arrays (and the wire) alive
            self.native = (ffi.from_buffer("uint8_t[]", wire), ffi.from_buffer("int32_t[]", offsets),
                           ffi.from_buffer("int32_t[]", lengths))


def _native_net() -> Any:
    """``logbuf.native`` when the native modules are built (sendmmsg), else None (one send() per packet)."""
    try:
        from logbuf import native
    except ImportError:
        return None
    return native


def _went(planned: FeedSendStats, data: int, other: int, messages: int, nbytes: int) -> FeedSendStats:
    """A stopped run's feed statistics: the packets, messages and bytes that went.  Heartbeats come before
    the end-of-session packets, so the first ``other`` packets without messages were heartbeats.  The fault
    counts stay those decided (a few ms of packets are decided ahead of their time)."""
    heartbeats = min(planned.heartbeats, other)
    return dataclasses.replace(planned, packets=data, messages=messages, bytes=nbytes, heartbeats=heartbeats,
                               end_of_session=other - heartbeats)


class ReplayServer:
    """Sends a ReplayCore's packets on UDP sockets at their due times, each feed's due packets in batches.

    ``batch_ns``: after a wake-up the loop sleeps at least this long, so a packet goes at most that much after its
    time (never before) and a system call carries several packets at high rates (0: wake for every due time).
    ``segment``: send runs of equal-sized packets as UDP GSO sends where the kernel takes them (Linux).
    ``publish(sequence, frames)`` receives the retransmission ring's messages before any packet carrying them.
    :meth:`prebuild` first, and the run only sends (for a load profile next to the system under test).
    """

    def __init__(self, core: ReplayCore, destinations: list[tuple[str, int]], *,
                 clock: Callable[[], int] = time.monotonic_ns, sleep: Callable[[float], None] = time.sleep,
                 publish: Callable[[int, np.ndarray], None] | None = None,
                 stop: threading.Event | None = None, progress: Callable[[int], None] | None = None,
                 batch_ns: int = DEFAULT_BATCH_NS, segment: bool = True) -> None:
        if len(destinations) != len(core.feeds):
            raise ReplayError("one destination per feed")
        if batch_ns < 0:
            raise ReplayError("batch_ns must be >= 0")
        self.batch_ns = batch_ns
        self._built: list[SendBatch] | None = None
        self.core = core
        self.destinations = destinations
        self.clock = clock
        self.sleep = sleep
        self.publish = publish
        self.stop = stop or threading.Event()
        self.progress = progress
        self.refused = 0  # sends that met an ICMP port unreachable (nobody listening) and were sent again
        self.late_packets = 0  # sent more than 1 ms after their due time (the sender could not keep up)
        self.max_late_ns = 0
        self.send_calls = 0  # system calls that sent packets (sendmmsg, or send() without the native module)
        self._native = _native_net()
        # UDP GSO (Linux): runs of equal-sized packets handed to the kernel in one send each, cut there
        self._segmenting = [segment and sys.platform == "linux"] * len(destinations)
        self._sockets: list[socket.socket] = []
        try:
            for destination in destinations:
                sock = socket.socket(socket.AF_INET6 if ":" in destination[0] else socket.AF_INET,
                                     socket.SOCK_DGRAM)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                sock.connect(destination)  # no address to pass (or parse) per packet
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()

    def _wait_until(self, due: int) -> bool:
        """Sleeps until ``due`` (clock ns); False when stopped meanwhile. Never spins: the 2 cores are shared
        with the feed handler, and the kernel's wake-up slack (~50 us) is what batches the sends."""
        while True:
            remaining = due - self.clock()
            if remaining <= 0:
                return True
            if self.stop.is_set():
                return False
            self.sleep(min(remaining, 100 * NANOS_PER_MILLI) / NANOS_PER_SECOND)  # notices a stop within 100 ms

    def _send_range(self, feed: int, queued: _Queued, lo: int, hi: int) -> None:
        """Sends packets ``[lo, hi)`` of ``queued`` on ``feed``, each whole, in order: runs of equal-sized
        packets lying back to back as segmented sends (UDP GSO) when the kernel takes them, the rest with
        sendmmsg."""
        run_end = queued.run_end
        if run_end is None or not self._segmenting[feed]:
            self._send_each(feed, queued, lo, hi)
            return
        i = each_from = lo
        while i < hi:
            j = min(run_end[i], hi)
            if j - i >= _MIN_SEGMENTED_RUN:
                if each_from < i:
                    self._send_each(feed, queued, each_from, i)
                self._send_segmented(feed, queued, i, j)
                each_from = j
            i = j
        if each_from < hi:
            self._send_each(feed, queued, each_from, hi)

    def _send_segmented(self, feed: int, queued: _Queued, lo: int, hi: int) -> None:
        """Packets ``[lo, hi)`` (equal sizes, back to back in the wire): the kernel cuts each send into them."""
        sock = self._sockets[feed]
        size = queued.lengths[lo]
        per_send = min(_MAX_SEGMENTS, _MAX_SEGMENTED_BYTES // size)
        if per_send < 2:
            self._send_each(feed, queued, lo, hi)
            return
        segment = [(socket.SOL_UDP, _UDP_SEGMENT, size.to_bytes(2, sys.byteorder))]
        while lo < hi:
            n = min(hi - lo, per_send)
            offset = queued.offsets[lo]
            data = queued.view[offset : offset + n * size]
            self.send_calls += 1
            try:
                sock.sendmsg((data,), segment)
            except ConnectionRefusedError:
                self.refused += 1  # as in _send_one: an earlier packet's ICMP error; this send did not go
                with contextlib.suppress(ConnectionRefusedError):
                    sock.sendmsg((data,), segment)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EIO):
                    raise
                self._segmenting[feed] = False  # this kernel or route does not segment: one datagram per packet
                self._send_each(feed, queued, lo, hi)
                return
            lo += n

    def _send_each(self, feed: int, queued: _Queued, lo: int, hi: int) -> None:
        """Packets ``[lo, hi)`` one datagram each: sendmmsg, or send() without the native module."""
        sock = self._sockets[feed]
        native = self._native
        if native is None:
            for i in range(lo, hi):
                offset = queued.offsets[i]
                self._send_one(sock, queued.view[offset : offset + queued.lengths[i]])
            return
        lib, null = native.lib, native.ffi.NULL
        assert queued.native is not None
        wire, offsets, lengths = queued.native
        fd = sock.fileno()
        while lo < hi:
            n = lib.lbn_send_from(fd, wire, offsets + lo, lengths + lo, min(hi - lo, lib.LBN_MAX_BATCH), null, 0)
            self.send_calls += 1
            if n > 0:
                lo += n
            elif n in (-errno.EAGAIN, -errno.ENOBUFS):  # the socket buffer is full: wait until it drains
                select.select((), (fd,), (), 0.01)
            elif n == -errno.ECONNREFUSED:
                # an ICMP "port unreachable" for an earlier packet (nobody listens yet) is reported on this send,
                # which then did not go: count it and send that packet again, once
                self.refused += 1
                offset = queued.offsets[lo]
                self._send_one(sock, queued.view[offset : offset + queued.lengths[lo]], refused=True)
                lo += 1
            else:
                raise OSError(-n, f"replay: sending on feed {self.core.feeds[feed].config.name}: {os.strerror(-n)}")

    def _send_one(self, sock: socket.socket, data: memoryview, refused: bool = False) -> None:
        self.send_calls += 1
        try:
            sock.send(data)
        except ConnectionRefusedError:
            if refused:
                return
            self.refused += 1
            with contextlib.suppress(ConnectionRefusedError):
                sock.send(data)

    def prebuild(self) -> None:
        """Builds every packet now (memory: about the size of the replayed part of the file), so that
        :meth:`run` only sends: its CPU time is then the system calls' and the wake-ups'."""
        self._built = list(self.core.batches())

    def run(self) -> ReplaySummary:
        """Sends everything (or until :attr:`stop` is set); what went, how late, per feed."""
        clock = self.clock
        start = clock()
        publish = self.publish
        progress = self.progress
        stop = self.stop
        native = self._native
        batches = self.core.batches() if self._built is None else iter(self._built)
        self._built = None
        cpu = time.process_time()
        queues: list[collections.deque[_Queued]] = [collections.deque() for _ in self.destinations]
        horizon = 0  # every packet due by then is queued
        more = True
        packets = messages = nbytes = 0
        unreported = 0
        # per feed what went: data packets, other packets (heartbeats, end of session), messages, bytes
        went = [[0, 0, 0, 0] for _ in self.destinations]
        reached = 0  # the highest "next sequence" a packet sent so far announced
        while True:
            now = clock() - start
            while more and now + _PREFETCH_NS >= horizon:  # keep a few ms of packets built ahead
                batch = next(batches, None)
                if batch is None:
                    more = False
                    break
                if publish is not None:
                    for sequence, frames in batch.publish:
                        publish(sequence, frames)
                for feed, part in enumerate(batch.feeds):
                    if part.times.size:
                        queues[feed].append(_Queued(batch.wire, part, native, self._segmenting[feed]))
                horizon = batch.horizon
            if stop.is_set():
                break
            wake = horizon - _PREFETCH_NS if more else None
            for feed, queue in enumerate(queues):
                while queue:
                    queued = queue[0]
                    times = queued.times
                    lo = queued.sent
                    hi = bisect.bisect_right(times, now, lo)
                    if hi > lo:
                        # lateness (a packet due at 0 -- max speed -- is never late)
                        first = bisect.bisect_right(times, 0, lo, hi)
                        if first < hi:
                            late = now - times[first]
                            if late > _LATE_NS:
                                self.late_packets += bisect.bisect_left(times, now - _LATE_NS, first, hi) - first
                                self.max_late_ns = max(self.max_late_ns, late)
                        self._send_range(feed, queued, lo, hi)
                        queued.sent = hi
                        packets += hi - lo
                        sent_messages = queued.counts[hi] - queued.counts[lo]
                        messages += sent_messages
                        unreported += sent_messages
                        sent_bytes = queued.bytes[hi] - queued.bytes[lo]
                        nbytes += sent_bytes
                        tally = went[feed]
                        data = queued.data[hi] - queued.data[lo]
                        tally[0] += data
                        tally[1] += hi - lo - data
                        tally[2] += sent_messages
                        tally[3] += sent_bytes
                        reached = max(reached, queued.reached[hi])
                    if hi < len(times):
                        wake = times[hi] if wake is None else min(wake, times[hi])
                        break
                    queue.popleft()
            if progress is not None and unreported >= _PROGRESS_MESSAGES:
                progress(unreported)
                unreported = 0
            if wake is None:
                break  # everything went
            # what falls due within batch_ns waits for the next wake-up: one sendmmsg per feed instead of a few
            if not self._wait_until(start + max(wake, now + self.batch_ns)):
                break
        if progress is not None and unreported:
            progress(unreported)
        seconds = (self.clock() - start) / NANOS_PER_SECOND
        feeds = {feed.config.name: feed.stats for feed in self.core.feeds}
        next_sequence = self.core.next_sequence
        if more or any(queues):  # stopped early: what went, not what was planned a few ms ahead
            feeds = {name: _went(stats, *tally) for (name, stats), tally in zip(feeds.items(), went, strict=True)}
            next_sequence = max(reached, self.core.first_sequence or 1)
        return ReplaySummary(
            seconds, packets, messages, nbytes, self.core.skipped, self.core.first_sequence,
            next_sequence, feeds, self.late_packets, self.max_late_ns / NANOS_PER_MILLI, self.refused,
            time.process_time() - cpu,
        )
