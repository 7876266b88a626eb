"""Senders and receivers for APIs that move one message per call (queues, pipes, sockets).

The loops are written once here; each peer passes its bound methods.  ``receive`` uses the blocking call
(how these libraries are meant to be consumed); ``receive_one`` — ping-pong — uses the blocking call or,
with ``wait="backoff"``, the non-blocking one in a spin -> yield -> park loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bench.peers.base import RING_MASK, STAMP_LENGTH, latency_idle, messages, stamp_at


class CallSender:
    """``put(message)`` per message from the pre-built ring; ``flush`` runs on close."""

    def __init__(self, put: Callable[[Any], Any], ring: Sequence[Any], flush: Callable[[], Any] | None = None):
        self._put = put
        self._ring = ring
        self._flush = flush
        self._next = 0

    @classmethod
    def of_bytes(cls, put: Callable[[bytes], Any], producer: int, size: int,
                 flush: Callable[[], Any] | None = None) -> CallSender:
        return cls(put, messages(size, producer), flush)

    def send(self, n: int) -> None:
        put, ring = self._put, self._ring
        for i in range(self._next, self._next + n):
            put(ring[i & RING_MASK])
        self._next += n

    def send_one(self, index: int) -> None:
        self._put(self._ring[index & RING_MASK])

    def close(self) -> None:
        if self._flush is not None:
            self._flush()


class CallReceiver:
    """``get()`` returns one message (bytes-like); ``get_nowait()`` raises ``empty`` when there is none."""

    def __init__(self, get: Callable[[], Any], size: int, wait: str = "blocking",
                 get_nowait: Callable[[], Any] | None = None, empty: type[BaseException] = Exception,
                 close: Callable[[], Any] | None = None) -> None:
        if wait not in ("blocking", "backoff"):
            raise ValueError(f"wait must be 'blocking' or 'backoff', got {wait!r}")
        if wait == "backoff" and get_nowait is None:
            raise ValueError("backoff waiting needs a non-blocking get")
        self._get = get
        self._get_nowait = get_nowait
        self._empty = empty
        self._offset = size - STAMP_LENGTH
        self._wait = wait
        self._idle = latency_idle()
        self._close = close

    def receive(self, n: int) -> int:
        get, unpack, offset = self._get, stamp_at, self._offset
        total = 0
        for _ in range(n):
            total += unpack(get(), offset)[0]
        return total

    def receive_one(self) -> int:
        if self._wait == "blocking":
            return stamp_at(self._get(), self._offset)[0]
        get_nowait, empty, idle = self._get_nowait, self._empty, self._idle
        while True:
            try:
                message = get_nowait()
            except empty:
                idle.idle(0)
                continue
            idle.reset()
            return stamp_at(message, self._offset)[0]

    def close(self) -> None:
        if self._close is not None:
            self._close()
