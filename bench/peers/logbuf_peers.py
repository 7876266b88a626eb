"""logbuf's rows: the per-message API (``offer`` / ``poll`` with a Python handler), the batch API
(``offer_batch`` / ``batch_poll`` with numpy arrays), and the same through the media driver.

The standalone rows run the conductor's IPC duty (pub-lmt, cleaning) in the parent process, as the driver
will; its CPU is counted as helper CPU.  One producer uses ``ExclusivePublication`` (single writer, Aeron's
choice for one thread); the multi-producer series uses ``ConcurrentPublication`` (one atomic get-and-add per
append) for every column.  Consumers poll with a back-off idle strategy (spin, yield, park up to 1 ms).
"""

from __future__ import annotations

import mmap
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.peers.base import (
    BATCH,
    RING,
    RING_MASK,
    STAMP_LENGTH,
    Channel,
    DataError,
    Peer,
    latency_idle,
    message_block,
    messages,
    stamp_at,
    throughput_idle,
)

TERM_LENGTH = 64 * 1024 * 1024  # as the driver row's channel: aeron:ipc?term-length=64m
# Aeron's default MTU (1408) would split a 4 KiB message into 3 fragments; IPC channels raise it
# (aeron:ipc?mtu=8k) so every message here is one frame
MTU = 8192
FRAGMENT_LIMIT = 256  # fragments per poll() on the per-message path
BATCH_POLL_LIMIT = 4096  # fragments per batch_poll() (the image's default capacity)

# slots in the positions file
PUB_LIMIT, SUB_POS, PUB_POS = 0, 1, 2
_SLOTS = 3


@dataclass(frozen=True)
class LogbufSpec:
    log_path: str
    positions_path: str
    concurrent: bool  # ConcurrentPublication (any number of producer processes) or ExclusivePublication


class LogbufChannel(Channel):
    """One log buffer and its positions in a private directory under /dev/shm, and the conductor duty."""

    has_duty = True

    def __init__(self, concurrent: bool, term_length: int = TERM_LENGTH, mtu: int = MTU) -> None:
        from logbuf.driver.ipc_publication import IpcPublicationDuty
        from logbuf.logbuffer.log_buffers import LogBuffers
        from logbuf.position import SharedPositions

        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.directory = tempfile.mkdtemp(prefix="bench-logbuf-", dir=base)
        self.log: Any = None
        self.positions: Any = None
        try:
            positions_path = os.path.join(self.directory, "positions")
            log_path = os.path.join(self.directory, "0.logbuffer")
            self.positions = SharedPositions(positions_path, slots=_SLOTS, create=True)
            self.log = LogBuffers.create(log_path, term_length=term_length, mtu=mtu, pre_touch=True)
            limit, sub_pos, pub_pos = (self.positions.position(s) for s in (PUB_LIMIT, SUB_POS, PUB_POS))
            subscribers = [sub_pos]
            self._duty = IpcPublicationDuty(self.log, pub_pos, limit, lambda: subscribers)
            self._duty.update()  # pub-lmt and isConnected before anyone offers
        except BaseException:
            self.close()
            raise
        self.spec = LogbufSpec(log_path, positions_path, concurrent)

    def duty(self) -> int:
        return self._duty.update()

    def close(self) -> None:
        if self.positions is not None:
            self.positions.close()
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14


def prefault(mapping: mmap.mmap) -> bool:
    """Maps every page of a log into this process now (as after its first lap), without writing to it.

    The parent pre-touched the file, but each process still takes a minor fault per 4 KiB page on first
    access; a long-running publisher or subscriber pays that once, so the benchmark measures steady state.
    Returns False where the kernel cannot (older than 5.14).
    """
    try:
        mapping.madvise(MADV_POPULATE_WRITE)
    except OSError:
        return False
    return True


def open_log(spec: LogbufSpec) -> tuple[Any, Any]:
    from logbuf.logbuffer.log_buffers import LogBuffers
    from logbuf.position import SharedPositions

    log = LogBuffers.open(spec.log_path)
    prefault(log.mapping)
    return log, SharedPositions(spec.positions_path, slots=_SLOTS)


def open_publication(spec: LogbufSpec) -> Any:
    from logbuf.client.publication import ConcurrentPublication, ExclusivePublication

    log, positions = open_log(spec)
    cls = ConcurrentPublication if spec.concurrent else ExclusivePublication
    return cls(log, positions.position(PUB_LIMIT))


def open_image(spec: LogbufSpec) -> Any:
    from logbuf.client.image import Image

    log, positions = open_log(spec)
    return Image(log, positions.position(SUB_POS))


# -- senders and receivers ------------------------------------------------------------------------------


class OfferSender:
    """``offer(bytes)`` per message; back-pressure and admin actions are retried with back-off."""

    def __init__(self, publication: Any, producer: int, size: int, owner: Any = None) -> None:
        self._owner = owner  # what must stay alive as long as the publication (a driver client)
        self._offer = publication.offer
        self._messages = messages(size, producer)
        self._next = 0
        self._idle = throughput_idle()

    def send(self, n: int) -> None:
        offer, msgs, idle = self._offer, self._messages, self._idle
        for i in range(self._next, self._next + n):
            m = msgs[i & RING_MASK]
            if offer(m) < 0:
                while offer(m) < 0:
                    idle.idle(0)
                idle.reset()
        self._next += n

    def send_one(self, index: int) -> None:
        m = self._messages[index & RING_MASK]
        if self._offer(m) < 0:
            idle = latency_idle()
            while self._offer(m) < 0:
                idle.idle(0)

    def close(self) -> None:
        return None


class OfferBatchSender:
    """``offer_batch(block, lengths)``: up to BATCH messages per native call, straight from the ring block."""

    def __init__(self, publication: Any, producer: int, size: int) -> None:
        self._offer_batch = publication.offer_batch
        self._block = message_block(size, producer)
        self._lengths = np.full(BATCH, size, dtype=np.int32)
        self._size = size
        self._next = 0
        self._idle = throughput_idle()

    def send(self, n: int) -> None:
        offer_batch, block, lengths, size, idle = self._offer_batch, self._block, self._lengths, self._size, self._idle
        i, end = self._next, self._next + n
        while i < end:
            k = i & RING_MASK
            c = min(BATCH, end - i, RING - k)
            appended = offer_batch(block[k * size : (k + c) * size], lengths[:c]).appended
            i += appended
            idle.idle(appended)
        self._next = end

    def send_one(self, index: int) -> None:
        raise NotImplementedError("batch rows are not ping-ponged")

    def close(self) -> None:
        return None


class PollReceiver:
    """``poll(handler, 256)``: the handler sums the stamps (one Python call per fragment)."""

    def __init__(self, image: Any, size: int) -> None:
        self._poll = image.poll
        self._offset = size - STAMP_LENGTH
        self._idle = throughput_idle()
        self._one_idle = latency_idle()
        last = [0]
        offset = self._offset

        def on_one(buffer: memoryview, header: Any) -> None:
            last[0] = stamp_at(buffer, offset)[0]

        self._on_one, self._last = on_one, last

    def receive(self, n: int) -> int:
        poll, idle, offset, unpack = self._poll, self._idle, self._offset, stamp_at
        total = 0

        def on_fragment(buffer: memoryview, header: Any) -> None:
            nonlocal total
            total += unpack(buffer, offset)[0]

        got = 0
        while got < n:
            c = poll(on_fragment, min(FRAGMENT_LIMIT, n - got))
            got += c
            idle.idle(c)
        return total

    def receive_one(self) -> int:
        if self._poll(self._on_one, 1) == 0:
            while self._poll(self._on_one, 1) == 0:
                self._one_idle.idle(0)
            self._one_idle.reset()
        return self._last[0]

    def close(self) -> None:
        return None


class BatchPollReceiver:
    """``batch_poll()``: stamps and lengths checked with numpy over the term, no per-message Python."""

    def __init__(self, image: Any, size: int) -> None:
        self._batch_poll = image.batch_poll
        self._size = size
        self._offset = size - STAMP_LENGTH
        self._idle = throughput_idle()

    def receive(self, n: int) -> int:
        batch_poll, size, offset, idle = self._batch_poll, self._size, self._offset, self._idle
        total = got = 0
        while got < n:
            with batch_poll(min(BATCH_POLL_LIMIT, n - got)) as fragments:
                c = fragments.count
                if c:
                    if (fragments.lengths != size).any():
                        raise DataError(f"a fragment is not {size} bytes: {fragments.lengths[:8]}")
                    words = fragments.buffer.view(np.uint64)
                    total += int(words[(fragments.payload_offsets + offset) >> 3].sum())
            got += c
            idle.idle(c)
        return total

    def receive_one(self) -> int:
        raise NotImplementedError("batch rows are not ping-ponged")

    def close(self) -> None:
        return None


# -- the peers ------------------------------------------------------------------------------------------


class LogbufPerMessage(Peer):
    key = "logbuf"
    label = "logbuf per-message"
    wait = "backoff"
    rtt_waits = ("backoff",)
    usage = ("`offer(bytes)` / `poll(handler, 256)`, the handler reads the stamp; ExclusivePublication for one "
             "producer, ConcurrentPublication in the multi-producer series; term 64 MiB, MTU 8 KiB, log pages "
             "pre-faulted in each process; conductor duty in the parent process")

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        return LogbufChannel(concurrent=multi or producers > 1)

    def sender(self, spec: Any, producer: int, size: int) -> OfferSender:
        return OfferSender(open_publication(spec), producer, size)

    def receiver(self, spec: Any, size: int, wait: str) -> PollReceiver:
        return PollReceiver(open_image(spec), size)


class LogbufBatch(LogbufPerMessage):
    key = "logbuf-batch"
    label = "logbuf batch"
    batch = True
    rtt_waits = ()
    usage = f"`offer_batch(block, lengths)` ({BATCH} per call) / `batch_poll()` checked with numpy"

    def sender(self, spec: Any, producer: int, size: int) -> OfferBatchSender:
        return OfferBatchSender(open_publication(spec), producer, size)

    def receiver(self, spec: Any, size: int, wait: str) -> BatchPollReceiver:
        return BatchPollReceiver(open_image(spec), size)



# -- through the media driver ---------------------------------------------------------------------------

DRIVER_CHANNEL = f"aeron:ipc?term-length={TERM_LENGTH >> 20}m|mtu={MTU >> 10}k"
STREAM_ID = 1001
DRIVER_START_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class DriverSpec:
    directory: str
    channel: str
    stream_id: int
    concurrent: bool  # add_publication (shared log) or add_exclusive_publication


def process_cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` in nanosecond resolution (/proc/PID/task/*/schedstat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return total / 1e9


class DriverChannel(Channel):
    """A ``logbuf driver`` process of its own (own directory, pre-touched logs) for the run.

    Its CPU is helper CPU, read from /proc; it is stopped by its PID (SIGTERM, then SIGKILL).
    """

    def __init__(self, concurrent: bool) -> None:
        import subprocess
        import sys

        import logbuf

        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self._parent = tempfile.mkdtemp(prefix="bench-driver-", dir=base)
        directory = os.path.join(self._parent, "driver")
        self.spec = DriverSpec(directory, DRIVER_CHANNEL, STREAM_ID, concurrent)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "logbuf.cli", "driver", "--dir", directory, "--pre-touch"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            # a client that connects proves the driver is up (cnc.dat written, heartbeat fresh)
            logbuf.connect(directory=directory, connect_timeout=DRIVER_START_TIMEOUT_S).close()
        except BaseException:
            self.close()
            raise

    def cpu_seconds(self) -> float | None:
        try:
            return process_cpu_seconds(self._process.pid)
        except OSError:
            return None

    def close(self) -> None:
        import subprocess

        if self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGTERM)  # clean shutdown: logs, cnc.dat, semaphores
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=5)
        if self._process.stderr is not None:
            self._process.stderr.close()
        shutil.rmtree(self._parent, ignore_errors=True)


def _client(spec: DriverSpec) -> Any:
    import logbuf

    return logbuf.connect(directory=spec.directory, connect_timeout=DRIVER_START_TIMEOUT_S)


class DriverPollReceiver(PollReceiver):
    """``Subscription.poll``; ping-pong may also block in ``Subscription.wait`` (the stream's semaphore)."""

    def __init__(self, client: Any, subscription: Any, size: int, wait: str) -> None:
        super().__init__(subscription, size)
        self._client = client  # keeps the client (and its conductor thread) alive
        self._subscription = subscription
        self._wait = wait

    def receive_one(self) -> int:
        if self._wait != "blocking":
            return super().receive_one()
        poll, on_one, wait = self._poll, self._on_one, self._subscription.wait
        while poll(on_one, 1) == 0:
            wait(1.0)
        return self._last[0]


class LogbufDriver(LogbufPerMessage):
    key = "logbuf-driver"
    label = "logbuf via driver"
    rtt_waits = ("backoff", "blocking")
    usage = (f"a `logbuf driver --pre-touch` process; `{DRIVER_CHANNEL}`, add_exclusive_publication for one "
             "producer, add_publication (shared log) in the multi-producer series; `Subscription.poll`; "
             "the driver's CPU counts as helper CPU; ping-pong also blocking in `Subscription.wait`")

    def skip_reason(self, size: int, producers: int = 1) -> str | None:
        import logbuf

        if not hasattr(logbuf, "connect") or not hasattr(logbuf, "MediaDriver"):
            return "the media driver client (logbuf.connect, logbuf.MediaDriver) is not in this tree yet"
        return super().skip_reason(size, producers)

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        return DriverChannel(concurrent=multi or producers > 1)

    def sender(self, spec: Any, producer: int, size: int) -> OfferSender:
        client = _client(spec)
        add = client.add_publication if spec.concurrent else client.add_exclusive_publication
        publication = add(spec.channel, spec.stream_id)
        prefault(publication.log.mapping)
        return OfferSender(publication, producer, size, owner=client)

    def receiver(self, spec: Any, size: int, wait: str) -> DriverPollReceiver:
        client = _client(spec)
        subscription = client.add_subscription(
            "aeron:ipc", spec.stream_id, on_available_image=lambda image: prefault(image.log.mapping))
        return DriverPollReceiver(client, subscription, size, wait)
