"""``Subscription``: the images of one channel + stream, polled fairly (round-robin start)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
    ) -> None:
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

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        for image in self._images:
            image.close()
        self._images = ()

    def __repr__(self) -> str:
        return f"Subscription(channel={self.channel!r}, stream_id={self.stream_id}, images={len(self._images)})"
