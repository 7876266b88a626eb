"""faster-fifo: a circular buffer in shared memory behind a process-shared mutex, the drop-in
``multiprocessing.Queue`` replacement.  Messages here are raw bytes (``dumps=bytes, loads=bytes``, the
library's custom-serializer hook) rather than pickles; ``put_many`` / ``get_many`` — its batch API, one lock
per batch — is a separate row.  Blocking calls keep the library's default 10 s timeout, so a stuck run fails
instead of hanging."""

from __future__ import annotations

import queue
from typing import Any

from bench.peers.base import (
    BATCH,
    RING,
    RING_MASK,
    STAMP_LENGTH,
    Channel,
    Peer,
    SimpleChannel,
    messages,
    stamp_at,
)
from bench.peers.calls import CallReceiver, CallSender

QUEUE_BYTES = 16 * 1024 * 1024  # circular buffer size


class FasterFifo(Peer):
    key = "faster-fifo"
    label = "faster-fifo"
    modules = ("faster_fifo",)
    usage = "`put(bytes)` / `get()`, raw bytes (dumps=loads=bytes), 16 MiB buffer"

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        import faster_fifo
        import faster_fifo_reduction  # noqa: F401  (makes the queue picklable for spawned processes)

        q = faster_fifo.Queue(max_size_bytes=QUEUE_BYTES, loads=bytes, dumps=bytes)
        return SimpleChannel(q, q.close)

    def sender(self, spec: Any, producer: int, size: int) -> Any:
        return CallSender.of_bytes(spec.put, producer, size)

    def receiver(self, spec: Any, size: int, wait: str) -> Any:
        return CallReceiver(spec.get, size, wait, spec.get_nowait, queue.Empty)


class PutManySender:
    def __init__(self, q: Any, producer: int, size: int) -> None:
        self._put_many = q.put_many
        self._ring = messages(size, producer)
        self._next = 0

    def send(self, n: int) -> None:
        put_many, ring = self._put_many, self._ring
        i, end = self._next, self._next + n
        while i < end:
            k = i & RING_MASK
            c = min(BATCH, end - i, RING - k)
            put_many(ring[k : k + c])
            i += c
        self._next = end

    def send_one(self, index: int) -> None:
        raise NotImplementedError("batch rows are not ping-ponged")

    def close(self) -> None:
        return None


class GetManyReceiver:
    def __init__(self, q: Any, size: int) -> None:
        self._get_many = q.get_many
        self._offset = size - STAMP_LENGTH

    def receive(self, n: int) -> int:
        get_many, unpack, offset = self._get_many, stamp_at, self._offset
        total = got = 0
        while got < n:
            batch = get_many(max_messages_to_get=n - got)
            for message in batch:
                total += unpack(message, offset)[0]
            got += len(batch)
        return total

    def receive_one(self) -> int:
        raise NotImplementedError("batch rows are not ping-ponged")

    def close(self) -> None:
        return None


class FasterFifoBatch(FasterFifo):
    key = "faster-fifo-batch"
    label = "faster-fifo batch"
    batch = True
    rtt_waits = ()
    usage = f"`put_many(list)` ({BATCH} per call) / `get_many()`, raw bytes"

    def sender(self, spec: Any, producer: int, size: int) -> PutManySender:
        return PutManySender(spec, producer, size)

    def receiver(self, spec: Any, size: int, wait: str) -> GetManyReceiver:
        return GetManyReceiver(spec, size)
