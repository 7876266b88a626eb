"""``Subscription``: the images of one channel + stream, polled fairly (round-robin start).

Waiting without spinning: :meth:`Subscription.wait` sleeps on the stream's named POSIX semaphore (created
by the driver, futex-backed).  The waiter first declares itself in each image's log metadata (an atomic
increment), re-checks for data, then sleeps; a publisher posts the semaphore after an append only when
that count is non-zero, so with nobody waiting an append pays one fence and one load, not a system call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import posix_ipc

from logbuf.client.image import ControlledPollAction, FragmentHandler, Image
from logbuf.logbuffer.header import Header


class Subscription:
    def __init__(
        self,
        channel: str,
        stream_id: int,
        *,
        registration_id: int = -1,
        on_available_image: Callable[[Image], Any] | None = None,
        on_unavailable_image: Callable[[Image], Any] | None = None,
        on_close: Callable[[Subscription], Any] | None = None,
        wake_semaphore: str | None = None,
        check_client: Callable[[], None] | None = None,
    ) -> None:
        self._on_close = on_close
        self._wake_name = wake_semaphore
        self._semaphore: posix_ipc.Semaphore | None = None
        self._check_client = check_client
        self._threads_waiting = 0  # threads of this process inside wait(): wake() posts only for them
        self.channel = channel
        self.stream_id = stream_id
        self.registration_id = registration_id
        self.on_available_image = on_available_image
        self.on_unavailable_image = on_unavailable_image
        self._images: tuple[Image, ...] = ()
        self._round_robin = 0
        self._closed = False

    @property
    def images(self) -> tuple[Image, ...]:
        return self._images

    def image_by_session_id(self, session_id: int) -> Image | None:
        for image in self._images:
            if image.session_id == session_id:
                return image
        return None

    def image_by_correlation_id(self, correlation_id: int) -> Image | None:
        for image in self._images:
            if image.correlation_id == correlation_id:
                return image
        return None

    def add_image(self, image: Image) -> None:
        self._images = (*self._images, image)
        if self.on_available_image is not None:
            self.on_available_image(image)

    def remove_image(self, correlation_id: int) -> Image | None:
        for image in self._images:
            if image.correlation_id == correlation_id:
                self._images = tuple(i for i in self._images if i is not image)
                image.close()
                if self.on_unavailable_image is not None:
                    self.on_unavailable_image(image)
                return image
        return None

    @property
    def is_connected(self) -> bool:
        return bool(self._images) and not self._closed

    def poll(self, handler: FragmentHandler, fragment_limit: int = 10) -> int:
        """Polls the images in turn (starting one further each call) up to ``fragment_limit`` in total."""
        images = self._images
        n = len(images)
        if n == 0:
            return 0
        if n == 1:
            return images[0].poll(handler, fragment_limit)
        start = self._round_robin = (self._round_robin + 1) % n
        fragments = 0
        for i in range(n):
            fragments += images[(start + i) % n].poll(handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments

    def controlled_poll(
        self, handler: Callable[[memoryview, Header], ControlledPollAction], fragment_limit: int = 10
    ) -> int:
        images = self._images
        n = len(images)
        if n == 0:
            return 0
        start = self._round_robin = (self._round_robin + 1) % n
        fragments = 0
        for i in range(n):
            fragments += images[(start + i) % n].controlled_poll(handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments

    # -- waiting for data without spinning ------------------------------------------------------------

    def is_data_available(self) -> bool:
        return any(image.is_data_available() for image in self._images)

    def _open_semaphore(self) -> posix_ipc.Semaphore:
        if self._semaphore is None:
            if self._wake_name is None:
                raise RuntimeError("this subscription has no wake-up semaphore (it was not made by a Client)")
            self._semaphore = posix_ipc.Semaphore(self._wake_name)
        return self._semaphore

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until an image has a frame to poll, up to ``timeout`` seconds (None: forever).

        Returns True when data is (probably) there, False on timeout.  Wake-ups can be spurious (a post
        meant for an earlier wait): poll, and wait again if nothing came.  Raises DriverTimeout when the
        client lost its driver.
        """
        if self._check_client is not None:
            self._check_client()
        if self._closed:
            return False
        if self.is_data_available():
            return True
        semaphore = self._open_semaphore()
        images = self._images
        self._threads_waiting += 1
        for image in images:
            image._declare_waiting()
        try:
            if any(image.is_data_available() for image in images):
                return True
            try:
                semaphore.acquire(timeout)
            except posix_ipc.BusyError:
                return self.is_data_available()
            except posix_ipc.SignalError:  # a signal handler ran (Ctrl-C, SIGTERM): the caller re-checks
                return self.is_data_available()
            return True
        finally:
            self._threads_waiting -= 1
            for image in images:
                image._undeclare_waiting()
            if self._check_client is not None:
                self._check_client()

    async def wait_async(self, timeout: float | None = None, slice_s: float = 0.05) -> bool:
        """``wait`` for asyncio: sleeps in a worker thread, in slices so cancellation is prompt."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = slice_s if deadline is None else min(slice_s, deadline - time.monotonic())
            if remaining <= 0:
                return self.is_data_available()
            if await loop.run_in_executor(None, self.wait, remaining):
                return True

    def wake(self) -> None:
        """Wakes a thread blocked in :meth:`wait` (new image, close)."""
        if self._wake_name is None or self._threads_waiting <= 0:
            return
        with contextlib.suppress(posix_ipc.ExistentialError, RuntimeError):
            self._open_semaphore().release()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._on_close is not None:
            self._on_close(self)
        for image in self._images:
            image.close()
        self._images = ()
        if self._semaphore is not None:
            self._semaphore.close()
            self._semaphore = None

    def __repr__(self) -> str:
        return f"Subscription(channel={self.channel!r}, stream_id={self.stream_id}, images={len(self._images)})"
