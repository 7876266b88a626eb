"""pyzmq PUSH/PULL over ``ipc://`` (a Unix domain socket; libzmq's I/O thread in each process does the
socket work and batches writes).  The consumer binds PULL, producers connect PUSH; default high-water marks
(1000 messages each way); ``send(bytes)`` / ``recv()`` with the default copying, which pyzmq recommends for
messages this small."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from bench.peers.base import Channel, Peer, SimpleChannel
from bench.peers.calls import CallReceiver, CallSender


class ZmqPushPull(Peer):
    key = "zmq"
    label = "pyzmq PUSH/PULL ipc://"
    modules = ("zmq",)
    usage = "PUSH `send(bytes)` → PULL `recv()` over ipc://, default HWM 1000"

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        directory = tempfile.mkdtemp(prefix="bench-zmq-")
        return SimpleChannel(f"ipc://{os.path.join(directory, 'sock')}",
                             lambda: shutil.rmtree(directory, ignore_errors=True))

    def sender(self, spec: Any, producer: int, size: int) -> CallSender:
        import zmq

        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.connect(spec)

        def flush() -> None:
            sock.close(linger=-1)  # linger: deliver what is queued
            ctx.term()

        return CallSender.of_bytes(sock.send, producer, size, flush)

    def receiver(self, spec: Any, size: int, wait: str) -> CallReceiver:
        import zmq

        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        sock.bind(spec)

        def recv_nowait() -> bytes:
            return sock.recv(zmq.NOBLOCK)

        def close() -> None:
            sock.close(linger=0)
            ctx.term()

        return CallReceiver(sock.recv, size, wait, recv_nowait, zmq.Again, close)
