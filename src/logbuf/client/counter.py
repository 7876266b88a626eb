"""``Counter``: a counter a client allocated in cnc.dat (``Client.add_counter``), visible in ``logbuf stat``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logbuf.errors import ClosedError
from logbuf.position import Position


class Counter:
    """A client-owned counter: :meth:`set` stores with release; readers see it in ``logbuf stat``.

    The driver frees it on :meth:`close` or when its client closes; using it afterwards raises
    :class:`~logbuf.errors.ClosedError`.
    """

    __slots__ = ("registration_id", "counter_id", "_position", "_closed", "_on_close", "_client", "__weakref__")

    def __init__(
        self,
        registration_id: int,
        counter_id: int,
        position: Position,
        on_close: Callable[[Counter], Any] | None = None,
    ) -> None:
        self.registration_id = registration_id
        self.counter_id = counter_id
        self._position = position
        self._on_close = on_close
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"counter {self.counter_id} is closed")

    def get(self) -> int:
        """The counter's value (an acquire load)."""
        self._check_open()
        return self._position.get()

    def set(self, value: int) -> None:
        """Stores ``value`` (a release store)."""
        self._check_open()
        self._position.set(value)

    @property
    def is_closed(self) -> bool:
        """True once the counter (or its client) was closed."""
        return self._closed

    def close(self) -> None:
        """Asks the driver to free the counter; idempotent."""
        if self._closed:
            return
        self._closed = True
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close(self)

    def _mark_closed(self) -> None:
        """The client closed: the driver frees the counter with it, so no command is sent."""
        self._closed = True
        self._on_close = None

    def __repr__(self) -> str:
        value = "closed" if self._closed else f"value={self._position.get()}"
        return f"Counter(id={self.counter_id}, {value})"
