"""The standard library's answers: ``multiprocessing.Queue`` (pickles, a feeder thread writes a pipe) and
``multiprocessing.Pipe`` (``send_bytes`` / ``recv_bytes``: raw bytes over an OS pipe, one writer)."""

from __future__ import annotations

import multiprocessing
import queue
from typing import Any

from bench.peers.base import Channel, Peer, SimpleChannel
from bench.peers.calls import CallReceiver, CallSender

CTX = multiprocessing.get_context("spawn")


class MpQueue(Peer):
    key = "mp-queue"
    label = "multiprocessing.Queue"
    usage = "`put(bytes)` / `get()`; pickled, written to a pipe by the producer's feeder thread"

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        q = CTX.Queue()
        return SimpleChannel(q, q.close)

    def sender(self, spec: Any, producer: int, size: int) -> CallSender:
        def flush() -> None:
            spec.close()
            spec.join_thread()  # the feeder thread has written everything

        return CallSender.of_bytes(spec.put, producer, size, flush)

    def receiver(self, spec: Any, size: int, wait: str) -> CallReceiver:
        return CallReceiver(spec.get, size, wait, spec.get_nowait, queue.Empty)


class MpPipe(Peer):
    key = "mp-pipe"
    label = "multiprocessing.Pipe"
    multi_producer = False
    usage = "`send_bytes` / `recv_bytes` on a one-way `Pipe(duplex=False)` (no pickling)"

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        reader, writer = CTX.Pipe(duplex=False)

        def close() -> None:
            reader.close()
            writer.close()

        return SimpleChannel((reader, writer), close)

    def sender(self, spec: Any, producer: int, size: int) -> CallSender:
        reader, writer = spec
        reader.close()
        return CallSender.of_bytes(writer.send_bytes, producer, size)

    def receiver(self, spec: Any, size: int, wait: str) -> CallReceiver:
        reader, writer = spec
        writer.close()

        class _Empty(Exception):
            pass

        def recv_nowait() -> bytes:
            if not reader.poll():
                raise _Empty
            return reader.recv_bytes()

        return CallReceiver(reader.recv_bytes, size, wait, recv_nowait, _Empty)
