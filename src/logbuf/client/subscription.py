"""``Subscription``: the images of one channel + stream, polled fairly (round-robin start).

Waiting without spinning: :meth:`Subscription.wait` sleeps on the stream's named POSIX semaphore (created
by a logbuf driver, futex-backed).  The waiter first declares itself in each image's log metadata (an
atomic increment), re-checks for data, then sleeps; a publisher posts the semaphore after an append only
when that count is non-zero, so with nobody waiting an append pays one fence and one load, not a system call.

The semaphore is an extension of Aeron's protocol: under a driver that does not create it (Aeron's own
``aeronmd``), ``wait`` idles with a back-off strategy instead (spin, yield, then sleeps of at most 1 ms).

Closing is safe from any thread: :meth:`Subscription.close` wakes every thread of this process blocked in
``wait`` (which then returns False, or raises the client's error when the driver was lost), and the
semaphore handle is closed only when the last of them has left ``wait``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import posix_ipc

from logbuf.client.image import ControlledPollAction, FragmentBatch, FragmentHandler, Image
from logbuf.errors import ClosedError, LogbufError
from logbuf.idle import BackoffIdleStrategy
from logbuf.logbuffer.header import Header
from logbuf.units import NANOS_PER_MILLI

_log = logging.getLogger(__name__)

# A sleeping waiter wakes at least this often to look at its subscription: a post meant for it may have been
# taken by a waiter of another process on the same stream semaphore.  Data wake-ups are not delayed by it.
WAIT_SLICE_S = 0.1
# Without a semaphore, how long before looking for it again (a driver could create it later).
SEMAPHORE_RETRY_S = 1.0
# Back-off while waiting without a semaphore: bounded sleeps, so a timeout or a close is seen within 1 ms.
_NO_SEMAPHORE_MAX_PARK_NS = NANOS_PER_MILLI


class Subscription:
    """The images of one channel and stream (made by :meth:`logbuf.Client.add_subscription`).

    Poll it (:meth:`poll`, :meth:`controlled_poll`) from one thread; :meth:`wait` sleeps until data may be
    there.  Use it as a context manager, or call :meth:`close`; a closed subscription polls nothing and
    its :meth:`wait` raises :class:`~logbuf.errors.ClosedError`.
    """

    def __init__(
        self,
        channel: str,
        stream_id: int,
        *,
        registration_id: int = -1,
        on_available_image: Callable[[Image], Any] | None = None,
        on_unavailable_image: Callable[[Image], Any] | None = None,
        on_close: Callable[[Subscription, tuple[Image, ...]], Any] | None = None,
        wake_semaphore: str | None = None,
        check_client: Callable[[], None] | None = None,
        destinations: Callable[[str, bool], None] | None = None,
    ) -> None:
        """``destinations(channel, add)``: the client's ADD/REMOVE_RCV_DESTINATION for this subscription."""
        self.channel = channel
        self.stream_id = stream_id
        self.registration_id = registration_id
        self.on_available_image = on_available_image
        self.on_unavailable_image = on_unavailable_image
        self._on_close = on_close
        self._wake_name = wake_semaphore
        self._check_client = check_client
        self._destinations = destinations
        # guards _closed, _images, entering _waiters and _semaphore; never held while calling out
        self._lock = threading.Lock()
        self._semaphore: posix_ipc.Semaphore | None = None
        self._semaphore_retry_at = 0.0
        # one entry per thread of this process inside wait(): close() wakes them, the last one out closes the
        # semaphore.  A list because append/pop are atomic: leaving wait() (the wake-up path) takes no lock.
        self._waiters: list[int] = []
        self._images: tuple[Image, ...] = ()
        self._round_robin = 0
        self._closed = False

    # -- destinations (multi-destination subscriptions) -------------------------------------------------

    def add_destination(self, channel: str) -> None:
        """Adds a receive destination (``aeron:udp?endpoint=host:port``) to a subscription on
        ``aeron:udp?control-mode=manual``: its datagrams feed this subscription's images.  Raises
        RegistrationError when the driver refuses (another channel: INVALID_CHANNEL)."""
        self._destination(channel, True)

    def remove_destination(self, channel: str) -> None:
        """Removes a receive destination added with :meth:`add_destination` (its socket closes)."""
        self._destination(channel, False)

    def _destination(self, channel: str, add: bool) -> None:
        if self._closed:
            raise ClosedError(f"subscription {self.registration_id} ({self.channel}, {self.stream_id}) is closed")
        if self._destinations is None:
            raise ClosedError(f"subscription {self.registration_id} has no client to change its destinations")
        self._destinations(channel, add)

    # -- images ----------------------------------------------------------------------------------------

    @property
    def images(self) -> tuple[Image, ...]:
        """The images connected now (a snapshot; empty once closed)."""
        return self._images

    def image_by_session_id(self, session_id: int) -> Image | None:
        """The image of publisher session ``session_id``, if connected."""
        for image in self._images:
            if image.session_id == session_id:
                return image
        return None

    def image_by_correlation_id(self, correlation_id: int) -> Image | None:
        """The image the driver announced with ``correlation_id``, if connected."""
        for image in self._images:
            if image.correlation_id == correlation_id:
                return image
        return None

    def _add_image(self, image: Image) -> bool:
        """Adds an image the driver made available (client conductor); False when already closed."""
        with self._lock:
            if self._closed:
                added = False
            else:
                self._images = (*self._images, image)
                added = True
        if not added:
            image.close()
            return False
        if self.on_available_image is not None:
            self.on_available_image(image)
        self.wake()  # a waiter learns about the new image at once
        return True

    def _remove_image(self, correlation_id: int) -> Image | None:
        """Removes and closes an image the driver made unavailable (client conductor)."""
        with self._lock:
            image = next((i for i in self._images if i.correlation_id == correlation_id), None)
            if image is None:
                return None
            self._images = tuple(i for i in self._images if i is not image)
        image.close()
        if self.on_unavailable_image is not None:
            self.on_unavailable_image(image)
        return image

    @property
    def is_connected(self) -> bool:
        """True when at least one image is connected."""
        return bool(self._images) and not self._closed

    # -- polling ---------------------------------------------------------------------------------------

    def poll(self, handler: FragmentHandler, fragment_limit: int = 10) -> int:
        """Polls the images in turn (starting one further each call) up to ``fragment_limit`` in total.

        ``handler(buffer, header)`` gets each fragment; both are valid only during the call.  Returns the
        number of fragments delivered (0 once closed).  If the handler raises, the position has already
        moved past that fragment (as in Aeron): the exception propagates and the fragment is not delivered
        again (use :meth:`controlled_poll` and ``ABORT`` to see a fragment again).
        """
        images = self._images
        if len(images) == 1:  # the common case, without the round's set-up
            return images[0].poll(handler, fragment_limit)
        return self._poll_in_turn(False, handler, fragment_limit)

    def controlled_poll(
        self, handler: Callable[[memoryview, Header], ControlledPollAction], fragment_limit: int = 10
    ) -> int:
        """As :meth:`poll`, with the handler returning a :class:`~logbuf.ControlledPollAction`."""
        return self._poll_in_turn(True, handler, fragment_limit)

    def _poll_in_turn(self, controlled: bool, handler: Callable[..., Any], fragment_limit: int) -> int:
        # each image in turn, starting one further each call, until fragment_limit fragments in total
        images = self._images
        n = len(images)
        if n == 0:
            if self._closed:
                self._raise_if_client_failed()  # the client lost its driver: say so (not a silent 0)
            return 0
        start = self._round_robin = (self._round_robin + 1) % n
        fragments = 0
        for i in range(n):
            image = images[(start + i) % n]
            poll = image.controlled_poll if controlled else image.poll
            fragments += poll(handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments

    def batch_poll(self, fragment_limit: int | None = None) -> FragmentBatch:
        """The fragments of one image as numpy arrays (:meth:`Image.batch_poll`): the next image in turn
        (starting one further each call) that has any, else an empty batch.

        The image's position moves when the batch is committed: ``with sub.batch_poll() as batch: ...``.
        """
        images = self._images
        n = len(images)
        if n == 0:
            return _NoFragments()
        start = self._round_robin = (self._round_robin + 1) % n
        for i in range(n):
            batch = images[(start + i) % n].batch_poll(fragment_limit)
            if batch.count:
                return batch
            batch.commit()  # no fragment, but it may step over padding: the next poll starts past it
        return _NoFragments()

    # -- waiting for data without spinning ------------------------------------------------------------

    def is_data_available(self) -> bool:
        """True when an image has a committed frame at its position (a cheap peek)."""
        return any(image.is_data_available() for image in self._images)

    def _semaphore_locked(self) -> posix_ipc.Semaphore | None:
        """The stream's wake-up semaphore, opened on first use; None when the driver made none."""
        if self._semaphore is None and self._wake_name is not None:
            now = time.monotonic()
            if now >= self._semaphore_retry_at:
                try:
                    self._semaphore = posix_ipc.Semaphore(self._wake_name)
                except posix_ipc.Error as exc:
                    # an Aeron driver (or a logbuf one without wake-ups): wait() idles with back-off instead
                    self._semaphore_retry_at = now + SEMAPHORE_RETRY_S
                    _log.debug("no wake-up semaphore %s (%s): waiting with back-off", self._wake_name, exc)
        return self._semaphore

    def _raise_if_client_failed(self) -> None:
        if self._check_client is not None:
            self._check_client()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until an image has a frame to poll, up to ``timeout`` seconds (None: no limit).

        Returns True when data is (probably) there, False on timeout or when the subscription is closed
        meanwhile (from any thread, or by the client).  Wake-ups can be spurious: poll, and wait again if
        nothing came.  Raises :class:`~logbuf.errors.ClosedError` when called on a closed subscription and
        :class:`~logbuf.errors.DriverTimeout` (or ``ClientTimeoutError``) when the client lost its driver,
        also while waiting.
        """
        if self._check_client is not None:
            self._check_client()
        if self._closed:
            raise ClosedError(f"subscription {self.registration_id} ({self.channel}, {self.stream_id}) is closed")
        for image in self._images:
            if image.is_data_available():
                return True
        return self._wait(timeout)

    def _wait(self, timeout: float | None) -> bool:
        with self._lock:
            closed = self._closed
            if not closed:
                semaphore = self._semaphore if self._semaphore is not None else self._semaphore_locked()
                images = self._images
                self._waiters.append(1)
        if closed:  # closed between two slices of wait_async, or since wait() looked
            if self._check_client is not None:
                self._check_client()  # the client lost its driver: say so rather than just False
            return False
        declared = 0
        try:
            if semaphore is None:
                return self._idle_until_data(None if timeout is None else time.monotonic() + max(0.0, timeout))
            for image in images:
                image._declare_waiting()
                declared += 1
            # declared, then re-checked: a publisher that appended before our declaration is seen here, one
            # that appends after it sees the declaration and posts (the C side fences between the two)
            for image in images:
                if image.is_data_available():
                    return True
            # sleep in slices (no clock reads: each timed-out slice slept at least its length)
            remaining = WAIT_SLICE_S if timeout is None else timeout
            while True:
                slice_s = remaining if remaining < WAIT_SLICE_S else WAIT_SLICE_S
                if slice_s <= 0:
                    return self.is_data_available()
                try:
                    semaphore.acquire(slice_s)
                except posix_ipc.BusyError:
                    if timeout is not None:
                        remaining -= slice_s  # this slice ran out: look again
                except posix_ipc.SignalError:  # a signal handler ran (Ctrl-C, SIGTERM): the caller re-checks
                    return self.is_data_available()
                else:
                    return not self._closed  # a post: data, a new image, or close()
                if self._closed:
                    return False
                if self._images is not images or self.is_data_available():
                    return True  # new images are declared on the caller's next wait
                self._raise_if_client_failed()
        finally:
            for i in range(declared):
                try:  # noqa: SIM105 - the wake-up path: no context manager object per image
                    images[i]._undeclare_waiting()
                except LogbufError:
                    pass  # closed meanwhile: its count no longer matters
            self._waiters.pop()
            if self._closed:  # set under the lock, before close() looks at the waiters: take it to decide
                with self._lock:
                    if not self._waiters:
                        self._close_semaphore_locked()
            if self._check_client is not None:
                self._check_client()

    def _idle_until_data(self, deadline: float | None) -> bool:
        idle = BackoffIdleStrategy(max_park_ns=_NO_SEMAPHORE_MAX_PARK_NS)
        while True:
            if self._closed:
                return False
            if self.is_data_available():
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._raise_if_client_failed()
            idle.idle(0)

    async def wait_async(self, timeout: float | None = None, slice_s: float = 0.05) -> bool:
        """:meth:`wait` for asyncio: sleeps in a worker thread, in slices so cancellation is prompt.

        Same results and errors as :meth:`wait`.
        """
        self._raise_if_client_failed()
        if self._closed:
            raise ClosedError(f"subscription {self.registration_id} ({self.channel}, {self.stream_id}) is closed")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.is_data_available():
                return True
            remaining = slice_s if deadline is None else min(slice_s, deadline - time.monotonic())
            if remaining <= 0:
                return False
            if await loop.run_in_executor(None, self._wait, remaining):
                return True
            if self._closed:
                self._raise_if_client_failed()
                return False

    def wake(self) -> None:
        """Wakes the threads of this process blocked in :meth:`wait` (they return True: poll, then wait)."""
        with self._lock:
            if self._waiters and self._semaphore is not None and not self._closed:
                for _ in range(len(self._waiters)):
                    self._semaphore.release()

    def _close_semaphore_locked(self) -> None:
        semaphore, self._semaphore = self._semaphore, None
        if semaphore is not None:
            semaphore.close()

    # -- lifetime --------------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """True once closed (by the application, or by the client when it closed or lost its driver)."""
        return self._closed

    def close(self) -> None:
        """Closes the subscription and its images (safe from any thread; idempotent).

        Threads blocked in :meth:`wait` wake up; the driver is told to remove the subscription.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            images, self._images = self._images, ()
            if not self._waiters:
                self._close_semaphore_locked()
            elif self._semaphore is not None:
                # one post per waiter of ours; should another process's waiter take one, ours sees the
                # close within WAIT_SLICE_S.  The last waiter to leave closes the semaphore.
                for _ in range(len(self._waiters)):
                    self._semaphore.release()
        for image in images:
            image.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close(self, images)  # the client releases the logs and tells the driver

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"images={len(self._images)}"
        return f"Subscription(channel={self.channel!r}, stream_id={self.stream_id}, {state})"


_NO_ARRAYS = (np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int64),
              np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint8))


class _NoFragments(FragmentBatch):
    """The empty batch of a subscription whose images had nothing (committing it moves nothing)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None, _NO_ARRAYS[4], 0, 0, _NO_ARRAYS)  # type: ignore[arg-type]

    def commit(self) -> None:
        pass
