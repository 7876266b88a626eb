"""POSIX message queues through ``posix_ipc.MessageQueue`` (kernel queues, ``mq_send`` / ``mq_receive``).

The kernel caps an unprivileged queue's depth at ``/proc/sys/fs/mqueue/msg_max`` and a message at
``msgsize_max``; the queue is created with exactly those limits (depth ``msg_max``), so a case whose payload
exceeds ``msgsize_max`` is skipped.
"""

from __future__ import annotations

import os
from typing import Any

from bench.peers.base import Channel, Peer, SimpleChannel, stamp_at
from bench.peers.calls import CallReceiver, CallSender

_LIMITS = "/proc/sys/fs/mqueue"


def kernel_limit(name: str, default: int) -> int:
    try:
        with open(os.path.join(_LIMITS, name)) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return default


class PosixReceiver(CallReceiver):
    """``receive()`` returns ``(message, priority)``: its own loop, so no wrapper call per message."""

    def __init__(self, mq: Any, size: int, wait: str) -> None:
        import posix_ipc

        self._mq = mq
        super().__init__(lambda: mq.receive()[0], size, wait, lambda: mq.receive(0)[0], posix_ipc.BusyError,
                         mq.close)

    def receive(self, n: int) -> int:
        receive, unpack, offset = self._mq.receive, stamp_at, self._offset
        total = 0
        for _ in range(n):
            total += unpack(receive()[0], offset)[0]
        return total


class PosixMessageQueue(Peer):
    key = "posix-mq"
    label = "posix_ipc.MessageQueue"
    modules = ("posix_ipc",)

    @property
    def usage(self) -> str:  # type: ignore[override]
        return (f"`send(bytes)` / `receive()`, depth {kernel_limit('msg_max', 10)} "
                f"(fs.mqueue.msg_max), messages ≤ {kernel_limit('msgsize_max', 8192)} B (fs.mqueue.msgsize_max)")

    def skip_reason(self, size: int, producers: int = 1) -> str | None:
        reason = super().skip_reason(size, producers)
        if reason is None and size > kernel_limit("msgsize_max", 8192):
            reason = (f"{size} B exceeds the kernel's POSIX message size limit "
                      f"(/proc/sys/fs/mqueue/msgsize_max = {kernel_limit('msgsize_max', 8192)})")
        return reason

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        import posix_ipc

        name = f"/bench-mq-{os.getpid()}-{os.urandom(4).hex()}"
        mq = posix_ipc.MessageQueue(name, posix_ipc.O_CREX, max_messages=kernel_limit("msg_max", 10),
                                    max_message_size=size)

        def close() -> None:
            mq.close()
            mq.unlink()

        return SimpleChannel(name, close)

    def sender(self, spec: Any, producer: int, size: int) -> CallSender:
        import posix_ipc

        mq = posix_ipc.MessageQueue(spec)
        return CallSender.of_bytes(mq.send, producer, size, mq.close)

    def receiver(self, spec: Any, size: int, wait: str) -> PosixReceiver:
        import posix_ipc

        return PosixReceiver(posix_ipc.MessageQueue(spec), size, wait)
