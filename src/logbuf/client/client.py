"""``Client`` (``logbuf.connect()``): a process's connection to a media driver through cnc.dat.

Commands go into the to-driver ring buffer; the driver answers on the to-clients broadcast, which the
client's conductor reads.  Publications and images map the log files the driver created and read their
limits and positions straight from the counters in cnc.dat: after set-up, no message passes through the
driver.

The client conductor (a daemon thread by default, or :meth:`Client.do_work` called by the application
with ``conductor_thread=False``) keeps the client alive — it stores the time into the client-heartbeat
counter every 500 ms — watches the driver's heartbeat, turns ON_AVAILABLE_IMAGE / ON_UNAVAILABLE_IMAGE
into images on subscriptions (the image callbacks run on the conductor), and unmaps logs only after a
linger, so a poll that is still running on another thread never touches an unmapped page.

If the driver's heartbeat goes stale (it died) or turns NULL (it shut down), the client closes: every
publication answers CLOSED, and every client call raises :class:`DriverTimeout`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logbuf.client.image import Image
from logbuf.client.publication import ConcurrentPublication, ExclusivePublication, Publication
from logbuf.client.subscription import Subscription
from logbuf.cnc import counters as c
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.errors import CncFileError, CncNotReadyError
from logbuf.cnc.messages import (
    AvailableImage,
    ClientTimeout,
    ControlCommand,
    ControlResponse,
    CorrelatedMessage,
    CounterMessage,
    ErrorCode,
    ErrorResponse,
    PublicationMessage,
    PublicationReady,
    RemoveMessage,
    SubscriptionMessage,
    UnavailableImage,
    decode_response,
)
from logbuf.directory import cnc_path, resolve_directory, wake_semaphore_name
from logbuf.errors import ClientTimeoutError, DriverTimeout, LogbufError, RegistrationError
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.position import Position

MS = 1_000_000
DEFAULT_DRIVER_TIMEOUT_MS = 10_000
KEEPALIVE_INTERVAL_MS = 500
RESOURCE_LINGER_MS = 1_000
CONDUCTOR_TICK_S = 0.01

ErrorHandler = Callable[[BaseException], Any]


def _epoch_ms() -> int:
    return time.time_ns() // MS


def _default_error_handler(error: BaseException) -> None:
    import sys

    print(f"logbuf client: {error}", file=sys.stderr)


class Counter:
    """A client-owned counter: ``set``/``increment`` store with release; readers see it in ``logbuf stat``."""

    __slots__ = ("_client", "registration_id", "counter_id", "_position", "_closed")

    def __init__(self, client: Client, registration_id: int, counter_id: int, position: Position) -> None:
        self._client = client
        self.registration_id = registration_id
        self.counter_id = counter_id
        self._position = position
        self._closed = False

    def get(self) -> int:
        return self._position.get()

    def set(self, value: int) -> None:
        if not self._closed:
            self._position.set(value)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client._remove_counter(self)

    def __repr__(self) -> str:
        return f"Counter(id={self.counter_id}, value={self.get()})"


class _MappedLog:
    __slots__ = ("log", "refs")

    def __init__(self, log: LogBuffers) -> None:
        self.log = log
        self.refs = 0


class Client:
    """A connection to the media driver of ``directory``; use as a context manager (or call close())."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        connect_timeout: float = 5.0,
        driver_timeout_ms: int = DEFAULT_DRIVER_TIMEOUT_MS,
        conductor_thread: bool = True,
        error_handler: ErrorHandler | None = None,
    ) -> None:
        self.directory = resolve_directory(directory)
        self.driver_timeout_ms = driver_timeout_ms
        self.error_handler = error_handler or _default_error_handler
        self._cnc = self._open_cnc(connect_timeout)
        self._ring = self._cnc.to_driver
        self._receiver = self._cnc.copy_broadcast_receiver()
        # a new receiver starts at the latest record, which answered someone else: skip what is there
        while self._receiver.receive(lambda msg_type_id, body: None):
            pass
        self.counters = self._cnc.counters_reader()
        self.client_id = self._ring.next_correlation_id()
        self._lock = threading.RLock()
        self._pending: dict[int, Any] = {}
        self._responses: dict[int, tuple[int, Any]] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._publications: dict[int, Publication] = {}
        self._logs: dict[str, _MappedLog] = {}
        self._lingering: list[tuple[int, LogBuffers]] = []
        self._heartbeat_counter_id: int | None = None
        self._last_keepalive_ms = 0
        self._error: LogbufError | None = None
        self._closed = False
        self._check_driver_alive()
        # the first command registers this client with the driver (it allocates our heartbeat counter)
        self._send(ControlCommand.CLIENT_KEEPALIVE, CorrelatedMessage(self.client_id, self._ring.next_correlation_id()))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if conductor_thread:
            self._thread = threading.Thread(target=self._run_conductor, name="logbuf-client-conductor", daemon=True)
            self._thread.start()

    # -- connecting ------------------------------------------------------------------------------------

    def _open_cnc(self, timeout: float) -> CncFile:
        path = cnc_path(self.directory)
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                cnc = CncFile.open(path)
            except CncNotReadyError:
                pass  # the driver is still writing it
            except CncFileError as exc:
                if path.exists():
                    raise  # a file we cannot use (truncated, foreign, other version): say so at once
                if time.monotonic() >= deadline:
                    raise DriverTimeout(
                        f"no media driver in {self.directory} (no cnc.dat after {timeout:g} s): "
                        f"start one with `logbuf driver` or MediaDriver.launch()"
                    ) from exc
            else:
                heartbeat = cnc.to_driver.consumer_heartbeat_time
                if heartbeat and _epoch_ms() - heartbeat <= self.driver_timeout_ms:
                    return cnc
                cnc.close()
                if time.monotonic() >= deadline:
                    raise DriverTimeout(
                        f"the media driver in {self.directory} is not alive (heartbeat "
                        f"{'NULL: it shut down' if not heartbeat else f'{_epoch_ms() - heartbeat} ms old'})"
                    )
            time.sleep(0.01)

    def _check_driver_alive(self) -> None:
        heartbeat = self._ring.consumer_heartbeat_time
        if heartbeat == 0:
            self._fail(DriverTimeout(f"the media driver in {self.directory} shut down"))
        else:
            age = _epoch_ms() - heartbeat
            if age > self.driver_timeout_ms:
                self._fail(
                    DriverTimeout(
                        f"the media driver in {self.directory} has been inactive for {age} ms "
                        f"(> {self.driver_timeout_ms} ms): it died or is wedged"
                    )
                )

    def _fail(self, error: LogbufError) -> None:
        """The connection is lost: close everything, remember why, tell the error handler."""
        if self._error is not None:
            return
        self._error = error
        for publication in list(self._publications.values()):
            publication._on_close = None
            publication.close()
        for subscription in list(self._subscriptions.values()):
            subscription._on_close = None
            subscription.close()
        with contextlib.suppress(Exception):
            self.error_handler(error)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LogbufError("client is closed")

    # -- the client conductor --------------------------------------------------------------------------

    def _run_conductor(self) -> None:
        while not self._stop.wait(CONDUCTOR_TICK_S):
            try:
                self.do_work()
            except LogbufError:
                pass  # recorded by _fail; the application sees it on its next call
            except Exception as exc:  # never let the conductor thread die silently
                with contextlib.suppress(Exception):
                    self.error_handler(exc)

    def do_work(self) -> int:
        """One client-conductor cycle (call it yourself with ``conductor_thread=False``)."""
        with self._lock:
            if self._error is not None or self._closed:
                return 0
            work = self._receive()
            now_ms = _epoch_ms()
            if now_ms - self._last_keepalive_ms >= KEEPALIVE_INTERVAL_MS:
                self._keepalive(now_ms)
                self._check_driver_alive()
                work += 1
            if self._lingering:
                work += self._close_lingering(now_ms)
            return work

    def _keepalive(self, now_ms: int) -> None:
        self._last_keepalive_ms = now_ms
        if self._heartbeat_counter_id is None:
            self._heartbeat_counter_id = self._find_heartbeat_counter()
        if self._heartbeat_counter_id is not None:
            # Aeron clients store the time into their heartbeat counter: no command, no ring traffic
            self.counters.values_buffer.put_i64_release(
                self.counters.counter_offset(self._heartbeat_counter_id) + c.VALUE_OFFSET, now_ms
            )
        else:
            self._send(ControlCommand.CLIENT_KEEPALIVE, CorrelatedMessage(self.client_id, self._ring.next_correlation_id()))

    def _find_heartbeat_counter(self) -> int | None:
        for info in self.counters:
            if info.type_id == c.CLIENT_HEARTBEAT_TYPE_ID and info.registration_id == self.client_id:
                return info.counter_id
        return None

    def _receive(self) -> int:
        work = 0
        while self._receiver.receive(self._on_response):
            work += 1
        return work

    def _on_response(self, msg_type_id: int, body: bytes) -> None:
        try:
            response = ControlResponse(msg_type_id)
            msg = decode_response(msg_type_id, body)
        except (ValueError, LogbufError):
            return  # not for us to judge: other clients may understand newer responses
        if response == ControlResponse.ON_AVAILABLE_IMAGE:
            self._on_available_image(msg)
        elif response == ControlResponse.ON_UNAVAILABLE_IMAGE:
            self._on_unavailable_image(msg)
        elif response == ControlResponse.ON_CLIENT_TIMEOUT:
            assert isinstance(msg, ClientTimeout)
            if msg.client_id == self.client_id:
                self._fail(ClientTimeoutError(f"the driver timed out client {self.client_id} (no keepalive)"))
        elif response == ControlResponse.ON_ERROR:
            assert isinstance(msg, ErrorResponse)
            if msg.offending_correlation_id in self._pending:
                self._responses[msg.offending_correlation_id] = (msg_type_id, msg)
        else:
            correlation_id = getattr(msg, "correlation_id", None)
            if correlation_id in self._pending:
                self._responses[correlation_id] = (msg_type_id, msg)

    def _on_available_image(self, msg: AvailableImage) -> None:
        subscription = self._subscriptions.get(msg.subscription_registration_id)
        if subscription is None or subscription.image_by_correlation_id(msg.correlation_id) is not None:
            return
        try:
            log = self._map_log(msg.log_file_name)
        except LogbufError as exc:
            self.error_handler(exc)
            return
        image = Image(
            log,
            self.counters.position(msg.subscriber_position_id),
            correlation_id=msg.correlation_id,
            subscription_registration_id=msg.subscription_registration_id,
            source_identity=msg.source_identity,
        )
        subscription.add_image(image)
        subscription.wake()  # a waiter learns about the new image at once

    def _on_unavailable_image(self, msg: UnavailableImage) -> None:
        subscription = self._subscriptions.get(msg.subscription_registration_id)
        if subscription is None:
            return
        image = subscription.remove_image(msg.correlation_id)
        if image is not None:
            self._release_log(image.log)

    # -- logs ------------------------------------------------------------------------------------------

    def _map_log(self, file_name: str) -> LogBuffers:
        entry = self._logs.get(file_name)
        if entry is None:
            entry = _MappedLog(LogBuffers.open(file_name))
            self._logs[file_name] = entry
        entry.refs += 1
        return entry.log

    def _release_log(self, log: LogBuffers) -> None:
        key = str(log.path)
        entry = self._logs.get(key)
        if entry is None or entry.log is not log:
            return
        entry.refs -= 1
        if entry.refs <= 0:
            del self._logs[key]
            # unmap later: another thread may be in the middle of a poll or offer on it
            self._lingering.append((_epoch_ms() + RESOURCE_LINGER_MS, log))

    def _close_lingering(self, now_ms: int) -> int:
        due = [log for deadline, log in self._lingering if deadline <= now_ms]
        self._lingering = [(deadline, log) for deadline, log in self._lingering if deadline > now_ms]
        for log in due:
            log.close()
        return len(due)

    # -- commands --------------------------------------------------------------------------------------

    def _send(self, command: ControlCommand, message: Any) -> None:
        data = message.encode()
        deadline = time.monotonic() + self.driver_timeout_ms / 1000
        while not self._ring.write(int(command), data):
            # the ring is full: the driver is behind (or gone)
            if time.monotonic() >= deadline:
                raise DriverTimeout(f"could not send {command.name}: the to-driver ring stayed full")
            time.sleep(0.001)

    def _request(self, command: ControlCommand, message: Any, what: str) -> tuple[int, Any]:
        """Sends a command and waits for its answer (running the conductor meanwhile)."""
        with self._lock:
            self._raise_if_failed()
            correlation_id = message.correlation_id
            self._pending[correlation_id] = what
            self._send(command, message)
        deadline = time.monotonic() + self.driver_timeout_ms / 1000
        pause = 0.0
        try:
            while True:
                with self._lock:
                    self._receive()
                    answer = self._responses.pop(correlation_id, None)
                    if answer is None:
                        self._check_driver_alive()
                        self._raise_if_failed()
                if answer is not None:
                    msg_type_id, msg = answer
                    if msg_type_id == ControlResponse.ON_ERROR:
                        try:
                            name = ErrorCode(msg.error_code).name
                        except ValueError:
                            name = str(msg.error_code)
                        raise RegistrationError(f"{what}: {name}: {msg.message}", msg.error_code, correlation_id)
                    return msg_type_id, msg
                if time.monotonic() >= deadline:
                    raise DriverTimeout(f"{what}: no answer from the driver in {self.driver_timeout_ms} ms")
                pause = min(0.001, pause + 0.00005)
                time.sleep(pause)
        finally:
            with self._lock:
                self._pending.pop(correlation_id, None)
                self._responses.pop(correlation_id, None)

    def _next_id(self) -> int:
        return self._ring.next_correlation_id()

    # -- the API ---------------------------------------------------------------------------------------

    def add_publication(self, channel: str, stream_id: int) -> ConcurrentPublication:
        """A publication on ``channel``/``stream_id``; all concurrent publications of a stream share one log."""
        return self._add_publication(channel, stream_id, exclusive=False)  # type: ignore[return-value]

    def add_exclusive_publication(self, channel: str, stream_id: int) -> ExclusivePublication:
        """A publication with its own log and session, for one writer thread."""
        return self._add_publication(channel, stream_id, exclusive=True)  # type: ignore[return-value]

    def _add_publication(self, channel: str, stream_id: int, exclusive: bool) -> Publication:
        _check_stream_id(stream_id)
        command = ControlCommand.ADD_EXCLUSIVE_PUBLICATION if exclusive else ControlCommand.ADD_PUBLICATION
        correlation_id = self._next_id()
        _, ready = self._request(
            command,
            PublicationMessage(self.client_id, correlation_id, stream_id, channel),
            f"add_{'exclusive_' if exclusive else ''}publication({channel!r}, {stream_id})",
        )
        assert isinstance(ready, PublicationReady)
        with self._lock:
            log = self._map_log(ready.log_file_name)
            cls = ExclusivePublication if exclusive else ConcurrentPublication
            publication = cls(
                log,
                self.counters.position(ready.position_limit_counter_id),
                channel=channel,
                registration_id=correlation_id,
                on_close=self._on_publication_close,
                wake_semaphore=wake_semaphore_name(self.directory, stream_id),
            )
            self._publications[correlation_id] = publication
        return publication

    def _on_publication_close(self, publication: Publication) -> None:
        with self._lock:
            self._publications.pop(publication.registration_id, None)
            self._release_log(publication.log)
            if self._error is not None or self._closed:
                return
        with contextlib.suppress(LogbufError):
            self._request(
                ControlCommand.REMOVE_PUBLICATION,
                RemoveMessage(self.client_id, self._next_id(), publication.registration_id),
                f"remove publication {publication.registration_id}",
            )

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], Any] | None = None,
        on_unavailable_image: Callable[[Image], Any] | None = None,
    ) -> Subscription:
        """A subscription; images of matching publications arrive (and go) through the callbacks, which run
        on the client conductor.  Subscribers join at the publication's current position."""
        _check_stream_id(stream_id)
        correlation_id = self._next_id()
        subscription = Subscription(
            channel,
            stream_id,
            registration_id=correlation_id,
            on_available_image=on_available_image,
            on_unavailable_image=on_unavailable_image,
            on_close=self._on_subscription_close,
            wake_semaphore=wake_semaphore_name(self.directory, stream_id),
            check_client=self._raise_if_failed,
        )
        with self._lock:
            self._raise_if_failed()
            self._subscriptions[correlation_id] = subscription  # images may arrive before the answer
        try:
            self._request(
                ControlCommand.ADD_SUBSCRIPTION,
                SubscriptionMessage(self.client_id, correlation_id, -1, stream_id, channel),
                f"add_subscription({channel!r}, {stream_id})",
            )
        except BaseException:
            with self._lock:
                self._subscriptions.pop(correlation_id, None)
            raise
        return subscription

    def _on_subscription_close(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscriptions.pop(subscription.registration_id, None)
            for image in subscription.images:
                self._release_log(image.log)
            if self._error is not None or self._closed:
                return
        with contextlib.suppress(LogbufError):
            self._request(
                ControlCommand.REMOVE_SUBSCRIPTION,
                RemoveMessage(self.client_id, self._next_id(), subscription.registration_id),
                f"remove subscription {subscription.registration_id}",
            )

    def add_counter(self, type_id: int, label: str, key: bytes = b"") -> Counter:
        """A counter of this client's in cnc.dat (visible in ``logbuf stat``), freed when the client goes."""
        if not isinstance(type_id, int) or type_id < 0:
            raise ValueError(f"counter type id must be an int >= 0, got {type_id!r}")
        correlation_id = self._next_id()
        _, ready = self._request(
            ControlCommand.ADD_COUNTER,
            CounterMessage(self.client_id, correlation_id, type_id, bytes(key), label),
            f"add_counter({type_id}, {label!r})",
        )
        return Counter(self, correlation_id, ready.counter_id, self.counters.position(ready.counter_id))

    def _remove_counter(self, counter: Counter) -> None:
        if self._error is not None or self._closed:
            return
        with contextlib.suppress(LogbufError):
            self._request(
                ControlCommand.REMOVE_COUNTER,
                RemoveMessage(self.client_id, self._next_id(), counter.registration_id),
                f"remove counter {counter.counter_id}",
            )

    @property
    def is_closed(self) -> bool:
        return self._closed or self._error is not None

    @property
    def driver_pid(self) -> int:
        return self._cnc.layout.pid

    def close(self) -> None:
        """Closes publications and subscriptions, tells the driver (CLIENT_CLOSE), unmaps everything."""
        if self._closed:
            return
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
        with self._lock:
            alive = self._error is None
            for publication in list(self._publications.values()):
                publication._on_close = None
                publication.close()
            for subscription in list(self._subscriptions.values()):
                subscription._on_close = None
                subscription.close()
            if alive:
                with contextlib.suppress(LogbufError):
                    self._send(ControlCommand.CLIENT_CLOSE, CorrelatedMessage(self.client_id, self._next_id()))
            self._closed = True
            for entry in self._logs.values():
                entry.log.close()
            self._logs.clear()
            for _, log in self._lingering:
                log.close()
            self._lingering.clear()
        self._cnc.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.is_closed else "connected"
        return f"Client(client_id={self.client_id}, directory={str(self.directory)!r}, {state})"


def _check_stream_id(stream_id: int) -> None:
    if not isinstance(stream_id, int) or not -(2**31) <= stream_id < 2**31:
        raise ValueError(f"stream id must be an int32, got {stream_id!r}")


def connect(directory: str | os.PathLike[str] | Path | None = None, **options: Any) -> Client:
    """Connects to the media driver of ``directory`` (default ``$LOGBUF_DIR`` or ``/dev/shm/logbuf-<user>``).

    Use it as a context manager::

        with logbuf.connect() as client:
            pub = client.add_publication("aeron:ipc", 1001)
    """
    return Client(directory, **options)
