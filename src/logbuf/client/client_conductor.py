"""The client conductor: everything a client does with its driver, behind :class:`logbuf.Client`.

It sends commands into the to-driver ring buffer and follows the to-clients broadcast for the answers;
keeps the client alive (it stores the time into the client-heartbeat counter every 500 ms) and watches the
driver's heartbeat; turns ON_AVAILABLE_IMAGE / ON_UNAVAILABLE_IMAGE into images on subscriptions (the image
callbacks run here); and maps the log files publications and images use, once per file.

Lifetimes.  The client never unmaps memory a Python object may still use: a publication, image, position
or counter keeps (a buffer export of) the mapping it points into, and the client only drops its own
references — a log goes when its last publication or image goes, cnc.dat when the client and everything
made from it go.  So a poll still running on another thread, or a publication used after
``client.close()``, reads valid memory; closed objects answer CLOSED / 0 or raise
:class:`~logbuf.errors.ClosedError`.  (Aeron's C client needs a linger timer for this; references do it here.)

On close: publications, subscriptions (with their images) and counters are closed first, then the driver
is told (CLIENT_CLOSE), then the references are dropped.  When the driver's heartbeat goes stale (it died)
or NULL (it shut down), the same happens without the command, and every later call raises
:class:`~logbuf.errors.DriverTimeout`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, overload

import posix_ipc

from logbuf.client.counter import Counter
from logbuf.client.image import Image
from logbuf.client.publication import ConcurrentPublication, ExclusivePublication, Publication
from logbuf.client.subscription import Subscription
from logbuf.cnc import counters as c
from logbuf.cnc.broadcast import CopyBroadcastReceiver
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.counters import CountersReader
from logbuf.cnc.errors import CncMissingError, CncNotReadyError
from logbuf.cnc.messages import (
    AvailableImage,
    ClientTimeout,
    ControlCommand,
    ControlResponse,
    CorrelatedMessage,
    CounterMessage,
    DestinationMessage,
    ErrorCode,
    ErrorResponse,
    PublicationMessage,
    PublicationReady,
    RejectImageMessage,
    RemoveMessage,
    SubscriptionMessage,
    UnavailableImage,
    decode_response,
)
from logbuf.cnc.ring_buffer import ManyToOneRingBuffer
from logbuf.directory import cnc_path, wake_semaphore_name
from logbuf.errors import (
    ClientTimeoutError,
    ClosedError,
    DriverTimeout,
    InvalidLogBufferError,
    LogbufError,
    RegistrationError,
)
from logbuf.idle import BackoffIdleStrategy
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.units import epoch_ms

DEFAULT_DRIVER_TIMEOUT_MS = 10_000
KEEPALIVE_INTERVAL_MS = 500
CONNECT_POLL_S = 0.01  # how often connect() looks for a cnc.dat that is not there (or not ready) yet
RING_FULL_PAUSE_S = 0.001  # the to-driver ring is full: the driver is behind

ErrorHandler = Callable[[BaseException], Any]


def log_error(error: BaseException) -> None:
    """The default error handler: logs through ``logging`` (logger ``logbuf.client``)."""
    logging.getLogger("logbuf.client").error("logbuf client: %s", error, exc_info=not isinstance(error, LogbufError))


def semaphore_exists(name: str) -> bool:
    """True when the named wake-up semaphore exists (a logbuf driver made it; Aeron's does not)."""
    try:
        posix_ipc.Semaphore(name).close()
    except posix_ipc.Error:
        return False
    return True


_conductors: weakref.WeakSet[ClientConductor] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Only the forking thread survives in the child: a lock another thread held stays held forever, and the
    # inherited registrations are the parent's.  Mark every inherited client foreign; its close is local.
    for conductor in list(_conductors):
        conductor._lock = threading.RLock()
        conductor._forked_from = conductor._pid


os.register_at_fork(after_in_child=_after_fork_in_child)


class _MappedLog:
    __slots__ = ("log", "refs")

    def __init__(self, log: LogBuffers) -> None:
        self.log = log
        self.refs = 0


class ClientConductor:
    """A client's connection to the driver of ``directory`` (see the module docstring).

    Thread-safe: one re-entrant lock guards its state; it is never held while waiting on another lock
    that a callback holds.  :meth:`do_work` is one duty cycle (the client's conductor thread calls it).
    """

    def __init__(
        self,
        directory: Path,
        *,
        connect_timeout: float,
        driver_timeout_ms: int,
        error_handler: ErrorHandler,
    ) -> None:
        self.directory = directory
        self.driver_timeout_ms = driver_timeout_ms
        self.error_handler = error_handler
        cnc = self._open_cnc(connect_timeout)
        self._cnc: CncFile | None = cnc
        self.driver_pid = cnc.layout.pid
        self._ring: ManyToOneRingBuffer | None = cnc.to_driver
        self._receiver: CopyBroadcastReceiver | None = cnc.copy_broadcast_receiver()
        # a new receiver starts at the latest record, which answered someone else: skip what is there
        while self._receiver.receive(lambda msg_type_id, body: None):
            pass
        self._counters: CountersReader | None = cnc.counters_reader()
        self.client_id = cnc.to_driver.next_correlation_id()
        self._lock = threading.RLock()
        self._pending: set[int] = set()
        self._responses: dict[int, tuple[int, Any]] = {}
        # weak: a publication, subscription or counter holds its Client (so the client outlives them), and the
        # conductor thread holds this conductor; strong references here would keep every client alive forever
        self._subscriptions: weakref.WeakValueDictionary[int, Subscription] = weakref.WeakValueDictionary()
        self._publications: weakref.WeakValueDictionary[int, Publication] = weakref.WeakValueDictionary()
        self._counter_objects: weakref.WeakValueDictionary[int, Counter] = weakref.WeakValueDictionary()
        # the client's own strong hold on what it made (Client._owned), reached weakly: let go of at close
        self.holdings: weakref.ref[dict[int, object]] | None = None
        self._logs: dict[str, _MappedLog] = {}
        # the log file each publication (by registration id) and image (by subscription registration id and
        # correlation id: an IPC image's correlation id is its publication's registration id) maps
        self._publication_logs: dict[int, str] = {}
        # each publication's publisher-limit counter and the registration id the driver gave it there: the
        # driver frees that counter when it lets go of the publication
        self._publication_limits: dict[int, tuple[int, int]] = {}
        self._image_logs: dict[tuple[int, int], str] = {}
        self._heartbeat_counter_id: int | None = None
        self._last_keepalive_ms = 0
        self._error: LogbufError | None = None
        self._closed = False
        self._pid = os.getpid()
        self._forked_from: int | None = None  # the parent's pid once this client was inherited across fork()
        _conductors.add(self)
        self._check_driver_alive()
        self.raise_if_failed()
        # the first command registers this client with the driver (it allocates our heartbeat counter)
        self._send(ControlCommand.CLIENT_KEEPALIVE, CorrelatedMessage(self.client_id, self._next_id()))

    # -- connecting ------------------------------------------------------------------------------------

    def _open_cnc(self, timeout: float) -> CncFile:
        path = cnc_path(self.directory)
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                cnc = CncFile.open(path)
            except CncNotReadyError as exc:
                # the driver is still creating it (empty, short, or version 0): wait within the timeout
                if time.monotonic() >= deadline:
                    raise CncNotReadyError(
                        f"{exc} (waited {timeout:g} s for the driver in {self.directory} to finish it)"
                    ) from None
            except CncMissingError as exc:  # (not "exists now?": a starting driver may create it meanwhile)
                if time.monotonic() >= deadline:
                    raise DriverTimeout(
                        f"no media driver in {self.directory} (no cnc.dat after {timeout:g} s): "
                        f"start one with `logbuf driver` or MediaDriver.launch()"
                    ) from exc
            else:
                heartbeat = cnc.to_driver.consumer_heartbeat_time
                if heartbeat and epoch_ms() - heartbeat <= self.driver_timeout_ms:
                    return cnc
                cnc.close()
                if time.monotonic() >= deadline:
                    raise DriverTimeout(
                        f"the media driver in {self.directory} is not alive (heartbeat "
                        f"{'NULL: it shut down' if not heartbeat else f'{epoch_ms() - heartbeat} ms old'})"
                    )
            time.sleep(CONNECT_POLL_S)

    # -- state -----------------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """True once closed by the application."""
        return self._closed

    @property
    def is_failed(self) -> bool:
        """True once the driver was lost (died, shut down, or timed this client out)."""
        return self._error is not None

    def raise_if_failed(self) -> None:
        """Raises why the driver was lost (DriverTimeout, ClientTimeoutError), if it was."""
        if self._error is not None:
            raise self._error

    @property
    def is_foreign(self) -> bool:
        """True in a child process that inherited this client across ``fork()`` (it is the parent's)."""
        return self._forked_from is not None

    def ensure_open(self) -> None:
        """Raises ClosedError after close(), in a forked child, or the driver's loss; returns when usable."""
        if self._forked_from is not None:
            raise ClosedError(
                f"this client belongs to process {self._forked_from} and was inherited across fork(): it cannot "
                f"be used in process {os.getpid()}; connect() again here (closing it here leaves the parent's "
                f"client untouched)"
            )
        if self._closed:
            raise ClosedError("client is closed")
        self.raise_if_failed()

    @property
    def counters(self) -> CountersReader:
        """A reader of cnc.dat's counters (still readable after the driver was lost, not after close())."""
        counters = self._counters
        if counters is None:
            raise ClosedError("client is closed")
        return counters

    def _check_driver_alive(self) -> None:
        assert self._ring is not None
        heartbeat = self._ring.consumer_heartbeat_time
        if heartbeat == 0:
            self.fail(DriverTimeout(f"the media driver in {self.directory} shut down"))
        else:
            age = epoch_ms() - heartbeat
            if age > self.driver_timeout_ms:
                self.fail(
                    DriverTimeout(
                        f"the media driver in {self.directory} has been inactive for {age} ms "
                        f"(> {self.driver_timeout_ms} ms): it died or is wedged"
                    )
                )

    def fail(self, error: LogbufError) -> None:
        """The driver is lost: close every publication and subscription, remember why, tell the handler."""
        with self._lock:
            if self._error is not None or self._closed:
                return
            self._error = error
            publications, subscriptions = list(self._publications.values()), list(self._subscriptions.values())
        self._close_resources(publications, subscriptions)
        with contextlib.suppress(Exception):
            self.error_handler(error)

    @staticmethod
    def _close_resources(publications: list[Publication], subscriptions: list[Subscription]) -> None:
        # the close callbacks see the client failed/closed and send nothing
        for publication in publications:
            with contextlib.suppress(LogbufError):
                publication.close()
        for subscription in subscriptions:
            with contextlib.suppress(LogbufError):
                subscription.close()

    # -- the duty cycle --------------------------------------------------------------------------------

    def do_work(self) -> int:
        """One cycle: responses and image events, keepalive and the driver check; the work done."""
        with self._lock:
            if self._error is not None or self._closed or self._forked_from is not None:
                return 0
            work = self._receive()
            now_ms = epoch_ms()
            if now_ms - self._last_keepalive_ms >= KEEPALIVE_INTERVAL_MS:
                self._keepalive(now_ms)
                self._check_driver_alive()
                self._check_logs()
                work += 1
            return work

    def _check_logs(self) -> None:
        """Closes the publications and images of a log whose file was truncated under its mapping (before
        they touch a page past its end, or after the SIGBUS guard recovered one), with one error each."""
        damaged = {name: why for name, entry in self._logs.items() if (why := entry.log.check_truncated())}
        # the driver closed a publication whose log shrank and may have deleted the file before this check saw
        # it shrink (this thread starved meanwhile): then the freed publisher-limit counter tells
        released = self._released_publications()
        if released:
            for name in {self._publication_logs[r] for r in released} - damaged.keys():
                damaged[name] = f"log buffer {name} was closed by the driver (its publisher-limit counter was freed)"
        if not damaged:
            return
        publications = [p for r, name in self._publication_logs.items()
                        if name in damaged and (p := self._publications.get(r)) is not None]
        images = [(self._subscriptions.get(s), c) for (s, c), name in self._image_logs.items() if name in damaged]
        for publication in publications:
            with contextlib.suppress(LogbufError):
                publication.close()
        for subscription, correlation_id in images:
            if subscription is not None:
                with contextlib.suppress(Exception):
                    subscription._remove_image(correlation_id)
                self._release_log_of(self._image_logs, (subscription.registration_id, correlation_id))
        for why in damaged.values():
            with contextlib.suppress(Exception):
                self.error_handler(InvalidLogBufferError(f"{why}: its stream is closed in this client"))

    def _released_publications(self) -> list[int]:
        """The open publications (registration ids) whose publisher-limit counter the driver has freed or given
        to another stream: the driver let go of them."""
        assert self._counters is not None
        released = []
        for registration_id, (counter_id, driver_registration_id) in self._publication_limits.items():
            try:
                alive = (self._counters.counter_state(counter_id) == c.RECORD_ALLOCATED
                         and self._counters.counter_registration_id(counter_id) == driver_registration_id)
            except c.CounterStateError:
                continue  # not a counter of this file: no evidence either way
            if not alive:
                released.append(registration_id)
        return released

    def _keepalive(self, now_ms: int) -> None:
        assert self._counters is not None
        self._last_keepalive_ms = now_ms
        if self._heartbeat_counter_id is None:
            self._heartbeat_counter_id = self._find_heartbeat_counter()
            if self._heartbeat_counter_id is not None:
                # as Aeron's clients do, finish the counter's label: " name=<client name> version=..."
                with contextlib.suppress(c.CounterStateError):  # freed meanwhile (we timed out)
                    self._counters.append_to_label(self._heartbeat_counter_id, c.client_heartbeat_label_suffix())
        if self._heartbeat_counter_id is not None:
            # Aeron clients store the time into their heartbeat counter: no command, no ring traffic
            self._counters.values_buffer.put_i64_release(
                self._counters.counter_offset(self._heartbeat_counter_id) + c.VALUE_OFFSET, now_ms
            )
        else:
            self._send(ControlCommand.CLIENT_KEEPALIVE, CorrelatedMessage(self.client_id, self._next_id()))

    def _find_heartbeat_counter(self) -> int | None:
        assert self._counters is not None
        for info in self._counters:
            if info.type_id == c.CLIENT_HEARTBEAT_TYPE_ID and info.registration_id == self.client_id:
                return info.counter_id
        return None

    def _receive(self) -> int:
        assert self._receiver is not None
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
                self.fail(ClientTimeoutError(f"the driver timed out client {self.client_id} (no keepalive)"))
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
        assert self._counters is not None
        try:
            log = self._map_log(msg.log_file_name)
        except (LogbufError, OSError) as exc:
            with contextlib.suppress(Exception):
                self.error_handler(exc)
            return
        try:
            image = Image(
                log,
                self._counters.position(msg.subscriber_position_id),
                correlation_id=msg.correlation_id,
                subscription_registration_id=msg.subscription_registration_id,
                source_identity=msg.source_identity,
            )
            image.rejecter = self.reject_image
        except Exception as exc:  # a log we cannot read: this image is lost, the client goes on
            self._release_log(msg.log_file_name)
            with contextlib.suppress(Exception):
                self.error_handler(exc)
            return
        self._image_logs[msg.subscription_registration_id, msg.correlation_id] = msg.log_file_name
        try:
            if not subscription._add_image(image):
                self._release_log_of(self._image_logs, (msg.subscription_registration_id, msg.correlation_id))
        except Exception as exc:  # the application's callback: its error goes to the error handler
            with contextlib.suppress(Exception):
                self.error_handler(exc)

    def _on_unavailable_image(self, msg: UnavailableImage) -> None:
        subscription = self._subscriptions.get(msg.subscription_registration_id)
        if subscription is None:
            return
        try:
            subscription._remove_image(msg.correlation_id)
        except Exception as exc:  # the application's callback
            with contextlib.suppress(Exception):
                self.error_handler(exc)
        finally:
            self._release_log_of(self._image_logs, (msg.subscription_registration_id, msg.correlation_id))

    # -- logs ------------------------------------------------------------------------------------------

    def _map_log(self, file_name: str) -> LogBuffers:
        entry = self._logs.get(file_name)
        if entry is None:
            entry = _MappedLog(LogBuffers.open(file_name))
            self._logs[file_name] = entry
        entry.refs += 1
        return entry.log

    def _release_log(self, file_name: str) -> None:
        entry = self._logs.get(file_name)
        if entry is None:
            return
        entry.refs -= 1
        if entry.refs <= 0:
            # only our reference goes: the mapping stays while a publication or image (or a poll running on
            # another thread) still holds it, and goes with the last of them
            del self._logs[file_name]

    def _release_log_of(self, table: dict[Any, str], key: object) -> None:
        file_name = table.pop(key, None)
        if file_name is not None:
            self._release_log(file_name)

    # -- commands --------------------------------------------------------------------------------------

    def _next_id(self) -> int:
        with self._lock:
            self.ensure_open()
            assert self._ring is not None
            return self._ring.next_correlation_id()

    def _send(self, command: ControlCommand, message: Any) -> None:
        assert self._ring is not None
        data = message.encode()
        deadline = time.monotonic() + self.driver_timeout_ms / 1000
        while not self._ring.write(int(command), data):
            if time.monotonic() >= deadline:
                raise DriverTimeout(f"could not send {command.name}: the to-driver ring stayed full")
            time.sleep(RING_FULL_PAUSE_S)

    def _request(self, command: ControlCommand, message: Any, what: str) -> tuple[int, Any]:
        """Sends a command and waits for its answer, following the broadcast meanwhile."""
        correlation_id = message.correlation_id
        with self._lock:
            self.ensure_open()
            self._pending.add(correlation_id)
            try:
                self._send(command, message)
            except BaseException:
                self._pending.discard(correlation_id)
                raise
        deadline = time.monotonic() + self.driver_timeout_ms / 1000
        idle = BackoffIdleStrategy()
        try:
            while True:
                with self._lock:
                    self.ensure_open()
                    self._receive()
                    answer = self._responses.pop(correlation_id, None)
                    if answer is None:
                        # a driver slow to answer (creating a large log on a loaded machine) must not time
                        # this client out meanwhile: the wait keeps the keepalive going
                        now_ms = epoch_ms()
                        if now_ms - self._last_keepalive_ms >= KEEPALIVE_INTERVAL_MS:
                            self._keepalive(now_ms)
                        self._check_driver_alive()
                        self.raise_if_failed()
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
                idle.idle(0)
        finally:
            with self._lock:
                self._pending.discard(correlation_id)
                self._responses.pop(correlation_id, None)

    def _remove(self, command: ControlCommand, registration_id: int, what: str) -> None:
        """Asks the driver to remove a registration (best effort: a lost driver removes everything)."""
        with self._lock:
            if self._error is not None or self._closed or self._forked_from is not None:
                return  # (a forked child never removes the parent's registrations)
        with contextlib.suppress(LogbufError):
            self._request(command, RemoveMessage(self.client_id, self._next_id(), registration_id), what)

    # -- publications ----------------------------------------------------------------------------------

    @overload
    def add_publication(self, channel: str, stream_id: int, *, exclusive: Literal[False]) -> ConcurrentPublication: ...
    @overload
    def add_publication(self, channel: str, stream_id: int, *, exclusive: Literal[True]) -> ExclusivePublication: ...

    def add_publication(self, channel: str, stream_id: int, *, exclusive: bool) -> Publication:
        """Registers a publication with the driver, then maps its log."""
        command = ControlCommand.ADD_EXCLUSIVE_PUBLICATION if exclusive else ControlCommand.ADD_PUBLICATION
        what = f"add_{'exclusive_' if exclusive else ''}publication({channel!r}, {stream_id})"
        correlation_id = self._next_id()
        _, ready = self._request(command, PublicationMessage(self.client_id, correlation_id, stream_id, channel), what)
        assert isinstance(ready, PublicationReady)
        try:
            return self._new_publication(ready, channel, stream_id, correlation_id, exclusive)
        except BaseException:
            # the driver made it but we cannot use it: release it there, or it stays until we close
            self._remove(ControlCommand.REMOVE_PUBLICATION, correlation_id, f"remove failed {what}")
            raise

    def _new_publication(
        self, ready: PublicationReady, channel: str, stream_id: int, registration_id: int, exclusive: bool
    ) -> Publication:
        semaphore = wake_semaphore_name(self.directory, stream_id)
        # wake-ups are logbuf's extension: an Aeron driver makes no semaphore, and publications just append
        wake = semaphore if semaphore_exists(semaphore) else None
        cls: type[Publication] = ExclusivePublication if exclusive else ConcurrentPublication
        with self._lock:
            self.ensure_open()
            assert self._counters is not None
            log = self._map_log(ready.log_file_name)
            try:
                position_limit = self._counters.position(ready.position_limit_counter_id)
                kwargs: dict[str, Any] = {
                    "channel": channel,
                    "registration_id": registration_id,
                    "on_close": self._on_publication_close,
                    # destinations name the driver's publication (its original registration id), as Aeron's do
                    "on_destination": lambda add, destination, _id=ready.registration_id: self._destination(
                        _id, add, destination),
                }
                try:
                    publication = cls(log, position_limit, wake_semaphore=wake, **kwargs)
                except (OSError, LogbufError):
                    if wake is None or semaphore_exists(semaphore):
                        raise
                    publication = cls(log, position_limit, wake_semaphore=None, **kwargs)  # it just went
            except BaseException:
                self._release_log(ready.log_file_name)
                raise
            self._publications[registration_id] = publication
            self._publication_logs[registration_id] = ready.log_file_name
            self._publication_limits[registration_id] = (ready.position_limit_counter_id, ready.registration_id)
        return publication

    def _destination(self, registration_id: int, add: bool, channel: str) -> None:
        """ADD_DESTINATION / REMOVE_DESTINATION for a manual multi-destination-cast publication; waits for the
        driver's answer (RegistrationError with its code when refused)."""
        command = ControlCommand.ADD_DESTINATION if add else ControlCommand.REMOVE_DESTINATION
        what = f"{'add' if add else 'remove'}_destination({channel!r})"
        self._request(command, DestinationMessage(self.client_id, self._next_id(), registration_id, channel), what)

    def _let_go(self, item: object) -> None:
        holdings = self.holdings() if self.holdings is not None else None
        if holdings is not None:
            holdings.pop(id(item), None)

    def _on_publication_close(self, publication: Publication) -> None:
        self._let_go(publication)
        registration_id = publication.registration_id
        with self._lock:
            if self._publications.pop(registration_id, None) is None:
                return
            self._release_log_of(self._publication_logs, registration_id)
            self._publication_limits.pop(registration_id, None)
        self._remove(ControlCommand.REMOVE_PUBLICATION, registration_id, f"remove publication {registration_id}")

    # -- subscriptions ---------------------------------------------------------------------------------

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], Any] | None,
        on_unavailable_image: Callable[[Image], Any] | None,
    ) -> Subscription:
        """Registers a subscription; its images arrive through :meth:`do_work`."""
        correlation_id = self._next_id()
        subscription = Subscription(
            channel,
            stream_id,
            registration_id=correlation_id,
            on_available_image=on_available_image,
            on_unavailable_image=on_unavailable_image,
            on_close=self._on_subscription_close,
            wake_semaphore=wake_semaphore_name(self.directory, stream_id),
            check_client=self.raise_if_failed,
            destinations=lambda destination, add: self.receive_destination(correlation_id, destination, add),
        )
        with self._lock:
            self.ensure_open()
            self._subscriptions[correlation_id] = subscription  # images may arrive before the answer
        what = f"add_subscription({channel!r}, {stream_id})"
        try:
            self._request(
                ControlCommand.ADD_SUBSCRIPTION,
                SubscriptionMessage(self.client_id, correlation_id, -1, stream_id, channel),
                what,
            )
        except RegistrationError:
            self._discard_subscription(subscription)
            raise
        except BaseException:
            # interrupted or timed out: the driver may still make it, so ask for its removal too
            self._discard_subscription(subscription)
            self._remove(ControlCommand.REMOVE_SUBSCRIPTION, correlation_id, f"remove failed {what}")
            raise
        return subscription

    def receive_destination(self, registration_id: int, channel: str, add: bool) -> None:
        """ADD_RCV_DESTINATION / REMOVE_RCV_DESTINATION of subscription ``registration_id``."""
        command = ControlCommand.ADD_RCV_DESTINATION if add else ControlCommand.REMOVE_RCV_DESTINATION
        what = f"{'add' if add else 'remove'}_destination({channel!r}) of subscription {registration_id}"
        self._request(command, DestinationMessage(self.client_id, self._next_id(), registration_id, channel), what)

    def reject_image(self, image_correlation_id: int, position: int, reason: str) -> None:
        """REJECT_IMAGE: the driver rejects the image (see :meth:`Image.reject`)."""
        self._request(ControlCommand.REJECT_IMAGE,
                      RejectImageMessage(self.client_id, self._next_id(), image_correlation_id, position, reason),
                      f"reject image {image_correlation_id}")

    def _discard_subscription(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscriptions.pop(subscription.registration_id, None)
            for image in subscription.images:
                self._release_log_of(self._image_logs, (subscription.registration_id, image.correlation_id))
        subscription._on_close = None
        subscription.close()

    def _on_subscription_close(self, subscription: Subscription, images: tuple[Image, ...]) -> None:
        self._let_go(subscription)
        registration_id = subscription.registration_id
        with self._lock:
            if self._subscriptions.pop(registration_id, None) is None:
                return
            for image in images:
                self._release_log_of(self._image_logs, (subscription.registration_id, image.correlation_id))
        self._remove(ControlCommand.REMOVE_SUBSCRIPTION, registration_id, f"remove subscription {registration_id}")

    # -- counters --------------------------------------------------------------------------------------

    def add_counter(self, type_id: int, label: str, key: bytes) -> Counter:
        """Allocates a counter of this client's in cnc.dat."""
        correlation_id = self._next_id()
        _, ready = self._request(
            ControlCommand.ADD_COUNTER,
            CounterMessage(self.client_id, correlation_id, type_id, key, label),
            f"add_counter({type_id}, {label!r})",
        )
        with self._lock:
            self.ensure_open()
            assert self._counters is not None
            counter = Counter(
                correlation_id, ready.counter_id, self._counters.position(ready.counter_id), self._on_counter_close
            )
            self._counter_objects[correlation_id] = counter
        return counter

    def _on_counter_close(self, counter: Counter) -> None:
        self._let_go(counter)
        with self._lock:
            if self._counter_objects.pop(counter.registration_id, None) is None:
                return
        self._remove(ControlCommand.REMOVE_COUNTER, counter.registration_id, f"remove counter {counter.counter_id}")

    # -- closing ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes publications, subscriptions and counters, tells the driver (CLIENT_CLOSE), then drops
        the client's references to the logs and cnc.dat (see the module docstring); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # from here on the close callbacks send nothing
            # a forked child's copy is the parent's client: nothing of it is the child's to tell the driver
            alive = self._error is None and self._forked_from is None
            publications, subscriptions = list(self._publications.values()), list(self._subscriptions.values())
            counters = list(self._counter_objects.values())
        self._close_resources(publications, subscriptions)
        for counter in counters:
            counter._mark_closed()
        with self._lock:
            if alive:
                assert self._ring is not None
                # a driver that is gone drains nothing: do not wait on its full ring (a finalizer at exit)
                heartbeat = self._ring.consumer_heartbeat_time
                alive = heartbeat != 0 and epoch_ms() - heartbeat <= self.driver_timeout_ms
            if alive:
                assert self._ring is not None
                with contextlib.suppress(LogbufError):
                    close = CorrelatedMessage(self.client_id, self._ring.next_correlation_id())
                    self._send(ControlCommand.CLIENT_CLOSE, close)
            self._publications.clear()
            self._subscriptions.clear()
            self._counter_objects.clear()
            self._logs.clear()
            self._publication_logs.clear()
            self._publication_limits.clear()
            self._image_logs.clear()
            self._responses.clear()
            # no munmap here: positions and counters handed out point into cnc.dat and keep it mapped
            self._counters = None
            self._receiver = None
            self._ring = None
            self._cnc = None
