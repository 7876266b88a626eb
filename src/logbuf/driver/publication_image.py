"""``PublicationImage``: a remote publication's session rebuilt by this driver's receiver, for local subscribers.

The conductor's side of an image the native receiver agent rebuilds: the image log
(``<dir>/images/<correlationId>.logbuffer``), its rcv-hwm and rcv-pos counters, one sub-pos counter per
subscription reading it (the client sees an ordinary image: a log file and a sub-pos counter id), and the
stream's wake-up semaphore, posted after new frames land while a subscriber sleeps in ``wait()``.
"""

from __future__ import annotations

from collections.abc import Callable

from logbuf.driver.ipc_publication import SubscriberLink
from logbuf.driver.lifecycle import ImageLifecycle, PublicationImageEvent
from logbuf.driver.udp.loss_detector import Gap
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import ffi, lib
from logbuf.position import Position


class ImageWaker:
    """Posts a stream's wake-up semaphore once per subscriber declared waiting on an image log (cheap when
    nobody waits: a fence and a load, in C)."""

    def __init__(self, log: LogBuffers, semaphore_name: str | None) -> None:
        self._handle = ffi.new("lb_publication_t *")
        self._handle.waiting = ffi.NULL
        self._handle.wake = ffi.NULL
        if semaphore_name is not None:
            sem = lib.lb_wake_open(semaphore_name.encode())
            if sem != ffi.NULL:
                self._handle.waiting = ffi.cast("int32_t *", log.meta.pointer(d.LOG_WAITING_SUBSCRIBERS_OFFSET))
                self._handle.wake = sem

    def wake(self) -> int:
        return lib.lb_wake_waiting(self._handle)

    @property
    def semaphore(self) -> object:
        """The semaphore handle (``sem_t *``, NULL when none) the receiver agent posts."""
        return self._handle.wake

    def close(self) -> None:
        if self._handle.wake != ffi.NULL:
            sem, self._handle.wake = self._handle.wake, ffi.NULL
            self._handle.waiting = ffi.NULL
            lib.lb_wake_close(sem)


class PublicationImage(ImageLifecycle):
    """The conductor's record of an image: its log (kept mapped until the receiver agent lets go of it),
    its rcv-hwm / rcv-pos counters (the agent writes them), its subscribers' sub-pos links, the stream's
    wake-up semaphore the agent posts, and its life cycle (:mod:`logbuf.driver.lifecycle`: active, removing,
    closed)."""

    def __init__(
        self,
        *,
        correlation_id: int,
        channel: str,
        log: LogBuffers,
        session_id: int,
        stream_id: int,
        join_position: int,
        source: bytes,
        source_identity: str,
        rcv_hwm: Position,
        rcv_pos: Position,
        waker: ImageWaker,
        loss_observer: Callable[[Gap], None] | None = None,
    ) -> None:
        self.correlation_id = correlation_id
        self.channel = channel
        self.log = log
        self.session_id = session_id
        self.stream_id = stream_id
        self.join_position = join_position
        self.source = source
        self.source_identity = source_identity
        self.rcv_hwm = rcv_hwm
        self.rcv_pos = rcv_pos
        self.waker = waker
        self.loss_observer = loss_observer
        self.subscribers: dict[int, SubscriberLink] = {}
        rcv_hwm.set(join_position)
        rcv_pos.set(join_position)

    def add_subscriber(self, link: SubscriberLink) -> None:
        self.subscribers[link.subscription_id] = link

    def remove_subscriber(self, subscription_id: int) -> SubscriberLink | None:
        return self.subscribers.pop(subscription_id, None)

    def subscriber_join_position(self) -> int:
        """Where a subscription that arrives late starts: the rebuilt data's end (rcv-pos; live data only)."""
        return self.rcv_pos.get()

    def counter_ids(self) -> list[int]:
        return [self.rcv_hwm.counter_id, self.rcv_pos.counter_id]

    def close(self) -> None:
        """The agent let go of it (or the driver shuts down): its semaphore handle and log are closed."""
        self._transition(PublicationImageEvent.CLOSE)
        self.waker.close()
        self.log.close()

    def __repr__(self) -> str:
        return (f"PublicationImage({self.correlation_id}, session {self.session_id}, stream {self.stream_id}, "
                f"from {self.source_identity}, rcv-pos {self.rcv_pos.get()})")
