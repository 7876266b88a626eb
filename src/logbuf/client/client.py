"""``Client`` (``logbuf.connect()``): a process's connection to a media driver through cnc.dat.

Commands go into the to-driver ring buffer; the driver answers on the to-clients broadcast, which the
client conductor (:mod:`logbuf.client.client_conductor`) reads.  Publications and images map the log files
the driver created and read their limits and positions straight from the counters in cnc.dat: after
set-up, no message passes through the driver.

The client conductor runs on a daemon thread by default, or in :meth:`Client.do_work` called by the
application with ``conductor_thread=False``.  If the driver's heartbeat goes stale (it died) or turns NULL
(it shut down), the client closes its publications (they answer CLOSED) and subscriptions (waiters wake),
and every later client call raises :class:`~logbuf.errors.DriverTimeout`.  After :meth:`Client.close`,
every call raises :class:`~logbuf.errors.ClosedError`.

Any Aeron-compatible driver will do: the stream wake-up semaphores behind ``Subscription.wait`` are a
logbuf extension, and without them publications publish and ``wait`` idles with back-off.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from logbuf.client.client_conductor import (
    DEFAULT_DRIVER_TIMEOUT_MS,
    ClientConductor,
    ErrorHandler,
    log_error,
)
from logbuf.client.counter import Counter
from logbuf.client.image import Image
from logbuf.client.publication import ConcurrentPublication, ExclusivePublication
from logbuf.client.subscription import Subscription
from logbuf.cnc.counters import CountersReader
from logbuf.directory import resolve_directory
from logbuf.errors import LogbufError

__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "DEFAULT_DRIVER_TIMEOUT_MS", "Client", "Counter", "connect"]

DEFAULT_CONNECT_TIMEOUT_S = 5.0
CONDUCTOR_TICK_S = 0.01  # the conductor thread's duty-cycle period
CONDUCTOR_JOIN_TIMEOUT_S = 5.0

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


class Client:
    """A connection to the media driver of ``directory``; use as a context manager (or call :meth:`close`).

    Make one with :func:`connect`; the keyword options are documented there.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        driver_timeout_ms: int = DEFAULT_DRIVER_TIMEOUT_MS,
        conductor_thread: bool = True,
        error_handler: ErrorHandler | None = None,
    ) -> None:
        self.directory = resolve_directory(directory)
        self.driver_timeout_ms = driver_timeout_ms
        self.error_handler = error_handler or log_error
        self._conductor = ClientConductor(
            self.directory,
            connect_timeout=connect_timeout,
            driver_timeout_ms=driver_timeout_ms,
            error_handler=self.error_handler,
        )
        self.client_id = self._conductor.client_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if conductor_thread:
            # the thread holds the conductor and a weak reference to this client, never the client itself: a
            # client the application drops is collected, and its finalizer closes it (the driver frees its
            # registrations at once instead of after the client liveness timeout)
            self._thread = threading.Thread(
                target=_run_conductor,
                args=(weakref.ref(self), self._conductor, self._stop, self.error_handler),
                name="logbuf-client-conductor",
                daemon=True,
            )
            self._thread.start()
        self._finalizer = weakref.finalize(self, _finalize, self._conductor, self._stop, self._thread)

    def do_work(self) -> int:
        """One client-conductor cycle (call it yourself with ``conductor_thread=False``); the work done."""
        self._conductor.ensure_open()
        return self._conductor.do_work()

    def _fail(self, error: LogbufError) -> None:
        """The driver is lost (the conductor's verdict; tests simulate a crash with it)."""
        self._conductor.fail(error)

    # -- the API ---------------------------------------------------------------------------------------

    def add_publication(self, channel: str, stream_id: int) -> ConcurrentPublication:
        """A publication on ``channel``/``stream_id``; all concurrent publications of a stream share one log.

        Raises :class:`~logbuf.errors.RegistrationError` when the driver refuses (bad channel, …).
        """
        _check_channel(channel)
        _check_stream_id(stream_id)
        self._conductor.ensure_open()
        return _owned(self._conductor.add_publication(channel, stream_id, exclusive=False), self)

    def add_exclusive_publication(self, channel: str, stream_id: int) -> ExclusivePublication:
        """A publication with its own log and session, for one writer thread."""
        _check_channel(channel)
        _check_stream_id(stream_id)
        self._conductor.ensure_open()
        return _owned(self._conductor.add_publication(channel, stream_id, exclusive=True), self)

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], Any] | None = None,
        on_unavailable_image: Callable[[Image], Any] | None = None,
    ) -> Subscription:
        """A subscription; images of matching publications arrive (and go) through the callbacks, which run
        on the client conductor.  Subscribers join at the publication's current position."""
        _check_channel(channel)
        _check_stream_id(stream_id)
        for name, callback in (("on_available_image", on_available_image), ("on_unavailable_image",
                                                                            on_unavailable_image)):
            if callback is not None and not callable(callback):
                raise TypeError(f"{name} must be callable or None, got {type(callback).__name__}")
        self._conductor.ensure_open()
        return _owned(
            self._conductor.add_subscription(channel, stream_id, on_available_image, on_unavailable_image), self
        )

    def add_counter(self, type_id: int, label: str, key: bytes = b"") -> Counter:
        """A counter of this client's in cnc.dat (visible in ``logbuf stat``), freed when the client goes."""
        if not isinstance(type_id, int) or isinstance(type_id, bool) or not 0 <= type_id <= _INT32_MAX:
            raise ValueError(f"counter type id must be an int in 0..{_INT32_MAX}, got {type_id!r}")
        if not isinstance(label, str):
            raise TypeError(f"counter label must be a str, got {type(label).__name__}")
        self._conductor.ensure_open()
        return _owned(self._conductor.add_counter(type_id, label, bytes(key)), self)

    @property
    def counters(self) -> CountersReader:
        """A reader of every counter in cnc.dat (what ``logbuf stat`` shows)."""
        return self._conductor.counters

    @property
    def is_closed(self) -> bool:
        """True after :meth:`close`, once the driver was lost, or in a child that inherited it across fork()."""
        conductor = self._conductor
        return conductor.is_closed or conductor.is_failed or conductor.is_foreign

    @property
    def driver_pid(self) -> int:
        """The driver's process id, as written in cnc.dat."""
        return self._conductor.driver_pid

    def close(self) -> None:
        """Closes publications, subscriptions (waking their waiters) and counters, tells the driver; idempotent.

        Later calls raise :class:`~logbuf.errors.ClosedError`; publications answer CLOSED.
        """
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and not self._conductor.is_foreign:
            thread.join(timeout=CONDUCTOR_JOIN_TIMEOUT_S)  # (a forked child has no conductor thread to join)
        self._conductor.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._conductor.is_closed else "failed" if self._conductor.is_failed else "connected"
        return f"Client(client_id={self.client_id}, directory={str(self.directory)!r}, {state})"


_T = TypeVar("_T")


def _owned(item: _T, client: Client) -> _T:
    # a publication, subscription or counter keeps its client alive: the client is collected (and closed by
    # its finalizer) only once the application holds none of them either
    item._client = client  # type: ignore[attr-defined]
    return item


def _run_conductor(
    client: weakref.ref[Client], conductor: ClientConductor, stop: threading.Event, error_handler: ErrorHandler
) -> None:
    """The conductor thread: duty cycles until the client closes or is collected."""
    while not stop.wait(CONDUCTOR_TICK_S) and client() is not None:
        try:
            conductor.do_work()
        except LogbufError:
            pass  # recorded by the conductor; the application sees it on its next call
        except Exception as exc:  # never let the conductor thread die silently
            with contextlib.suppress(Exception):
                error_handler(exc)
    if client() is None:
        with contextlib.suppress(Exception):
            conductor.close()  # collected: its finalizer left the close to this thread (see _finalize)


def _finalize(conductor: ClientConductor, stop: threading.Event, thread: threading.Thread | None) -> None:
    """Closes a client the application dropped without closing (or still held at interpreter exit)."""
    stop.set()
    if thread is not None and thread is threading.current_thread():
        return  # collected on the conductor thread, mid-cycle: the thread closes it when the cycle ends
    with contextlib.suppress(Exception):
        conductor.close()


def _check_channel(channel: object) -> None:
    if not isinstance(channel, str):
        raise TypeError(f"channel must be a str such as 'aeron:ipc', got {type(channel).__name__}: {channel!r}")
    if not channel:
        raise ValueError("channel must not be empty (e.g. 'aeron:ipc' or 'aeron:udp?endpoint=host:port')")


def _check_stream_id(stream_id: object) -> None:
    if not isinstance(stream_id, int) or isinstance(stream_id, bool):
        raise TypeError(f"stream id must be an int, got {type(stream_id).__name__}: {stream_id!r}")
    if not _INT32_MIN <= stream_id <= _INT32_MAX:
        raise ValueError(f"stream id must be a 32-bit signed int ({_INT32_MIN}..{_INT32_MAX}), got {stream_id}")


def connect(
    directory: str | os.PathLike[str] | None = None,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    driver_timeout_ms: int = DEFAULT_DRIVER_TIMEOUT_MS,
    conductor_thread: bool = True,
    error_handler: ErrorHandler | None = None,
) -> Client:
    """Connects to the media driver of ``directory`` (default ``$LOGBUF_DIR`` or ``/dev/shm/logbuf-<user>``).

    Keyword options:

    - ``connect_timeout`` (seconds, default 5.0): how long to wait for the driver's cnc.dat to appear and be
      ready (a starting driver is still writing it); :class:`~logbuf.errors.DriverTimeout` after that when
      there is none, :class:`~logbuf.cnc.CncNotReadyError` when it never became ready.
    - ``driver_timeout_ms`` (default 10000): a driver whose heartbeat is older than this is dead, and a
      command unanswered for this long fails with DriverTimeout.
    - ``conductor_thread`` (default True): run the client conductor (keepalive, images, driver checks) on a
      daemon thread; with False, call :meth:`Client.do_work` regularly yourself.
    - ``error_handler`` (default: log through ``logging`` as ``logbuf.client``): called with errors the
      conductor meets outside any call of yours (the driver died, a log that cannot be mapped).

    Use it as a context manager::

        with logbuf.connect() as client:
            pub = client.add_publication("aeron:ipc", 1001)
    """
    return Client(
        directory,
        connect_timeout=connect_timeout,
        driver_timeout_ms=driver_timeout_ms,
        conductor_thread=conductor_thread,
        error_handler=error_handler,
    )
