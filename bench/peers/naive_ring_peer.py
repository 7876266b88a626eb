"""The floor: a naive single-producer single-consumer ring in pure Python over ``multiprocessing.shared_memory``.

What a Python engineer writes in ten minutes when a queue is too slow: fixed slots of the message size, two
64-bit indices read and written through a memoryview cast, no atomics, no frames, no flow-control protocol
(the producer simply waits while the ring is full).  It relies on x86 keeping aligned 8-byte stores whole and
in order, and it moves only fixed-size messages from one process to one process.  Every per-message API of
logbuf must beat it: anything slower would make logbuf's machinery a cost rather than a gain.

Layout: the producer's index (tail) at byte 0, the consumer's (head) at byte 64 (its own cache line), then
SLOTS slots of ``size`` bytes from byte 128.
"""

from __future__ import annotations

from multiprocessing import shared_memory
from typing import Any

from bench.peers.base import (
    RING_MASK,
    STAMP_LENGTH,
    Channel,
    Peer,
    SimpleChannel,
    latency_idle,
    messages,
    stamp_at,
)
from bench.peers.base import throughput_idle as _throughput_idle

SLOTS = 4096  # a power of two
SLOT_MASK = SLOTS - 1
TAIL, HEAD = 0, 8  # int64 word indices of the producer's and consumer's counters
DATA = 128


def _attach(name: str) -> tuple[shared_memory.SharedMemory, memoryview, memoryview]:
    # spawned children share the parent's resource tracker, and the parent unlinks the segment at the end
    shm = shared_memory.SharedMemory(name=name)
    buf = shm.buf
    return shm, buf, buf[:DATA].cast("q")


class RingSender:
    """Writes a message into the next slot, then publishes the tail."""

    def __init__(self, name: str, producer: int, size: int) -> None:
        self._shm, self._buf, self._index = _attach(name)
        self._size = size
        self._messages = messages(size, producer)
        self._next = 0
        self._idle = _throughput_idle()

    def send(self, n: int) -> None:
        buf, index, msgs, size, idle = self._buf, self._index, self._messages, self._size, self._idle
        tail = index[TAIL]
        for i in range(self._next, self._next + n):
            while tail - index[HEAD] >= SLOTS:
                idle.idle(0)
            at = DATA + (tail & SLOT_MASK) * size
            buf[at : at + size] = msgs[i & RING_MASK]
            tail += 1
            index[TAIL] = tail
        self._next += n

    def send_one(self, index_: int) -> None:
        buf, index, size = self._buf, self._index, self._size
        tail = index[TAIL]
        idle = latency_idle()
        while tail - index[HEAD] >= SLOTS:
            idle.idle(0)
        at = DATA + (tail & SLOT_MASK) * size
        buf[at : at + size] = self._messages[index_ & RING_MASK]
        index[TAIL] = tail + 1

    def close(self) -> None:
        self._index.release()
        self._buf = None
        self._shm.close()


class RingReceiver:
    """Reads the stamp of each slot the tail has passed, then publishes the head."""

    def __init__(self, name: str, size: int) -> None:
        self._shm, self._buf, self._index = _attach(name)
        self._size = size
        self._stamp_offset = DATA + size - STAMP_LENGTH
        self._idle = _throughput_idle()
        self._one_idle = latency_idle()

    def receive(self, n: int) -> int:
        buf, index, size, offset, idle, unpack = (self._buf, self._index, self._size, self._stamp_offset,
                                                  self._idle, stamp_at)
        head = index[HEAD]
        end = head + n
        total = 0
        while head < end:
            tail = index[TAIL]
            if tail == head:
                idle.idle(0)
                continue
            idle.reset()
            stop = min(tail, end)
            while head < stop:
                total += unpack(buf, offset + (head & SLOT_MASK) * size)[0]
                head += 1
                index[HEAD] = head
        return total

    def receive_one(self) -> int:
        index = self._index
        head = index[HEAD]
        if index[TAIL] == head:
            while index[TAIL] == head:
                self._one_idle.idle(0)
            self._one_idle.reset()
        value = stamp_at(self._buf, self._stamp_offset + (head & SLOT_MASK) * self._size)[0]
        index[HEAD] = head + 1
        return value

    def close(self) -> None:
        self._index.release()
        self._buf = None
        self._shm.close()


class NaiveRing(Peer):
    key = "naive-ring"
    label = "naive SPSC ring (pure Python)"
    multi_producer = False
    wait = "backoff"
    rtt_waits = ("backoff",)
    usage = ("fixed slots in `multiprocessing.shared_memory`, head/tail through a memoryview cast, no atomics: "
             "the floor every per-message API must beat")

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        shm = shared_memory.SharedMemory(create=True, size=DATA + SLOTS * size)

        def close() -> None:
            shm.close()
            shm.unlink()

        return SimpleChannel(shm.name, close)

    def sender(self, spec: Any, producer: int, size: int) -> RingSender:
        return RingSender(spec, producer, size)

    def receiver(self, spec: Any, size: int, wait: str) -> RingReceiver:
        return RingReceiver(spec, size)
