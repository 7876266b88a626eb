"""``PublicationImage``: a remote publication's session rebuilt by this driver's receiver, for local subscribers.

The driver entity around the sans-IO :class:`~logbuf.driver.udp.ImageReceiver`: the image log
(``<dir>/images/<correlationId>.logbuffer``), its rcv-hwm and rcv-pos counters, one sub-pos counter per
subscription reading it (the client sees an ordinary image: a log file and a sub-pos counter id), and the
stream's wake-up semaphore, posted after new frames land while a subscriber sleeps in ``wait()``.
"""

from __future__ import annotations

from logbuf.driver.ipc_publication import SubscriberLink
from logbuf.driver.udp import ImageReceiver
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

    def close(self) -> None:
        if self._handle.wake != ffi.NULL:
            sem, self._handle.wake = self._handle.wake, ffi.NULL
            self._handle.waiting = ffi.NULL
            lib.lb_wake_close(sem)


class ImageTail:
    """Keeps an image log's tail counter and active term count at the high-water mark, as a publication's
    are at its producer position: tools (``logbuf logdump``) read a rebuilt image like any log.  Subscribers
    never use them (they read frames from their sub-pos)."""

    def __init__(self, log: LogBuffers) -> None:
        self._meta = log.meta
        self._bits = log.position_bits
        self._mask = log.term_length - 1
        self._initial_term_id = log.initial_term_id
        self._term_count = -1

    def advance(self, position: int) -> None:
        term_count = position >> self._bits
        term_id = d.compute_term_id_from_position(position, self._bits, self._initial_term_id)
        if term_count > self._term_count >= 0:  # the term before is complete
            self._put(term_count - 1, term_id - 1, self._mask + 1)
        self._put(term_count, term_id, position & self._mask)
        if term_count != self._term_count:
            self._term_count = term_count
            self._meta.put_i32_release(d.LOG_ACTIVE_TERM_COUNT_OFFSET, term_count)

    def _put(self, term_count: int, term_id: int, term_offset: int) -> None:
        self._meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET + 8 * (term_count % d.PARTITION_COUNT),
                                   d.pack_tail(term_id, term_offset))


class PublicationImage:
    def __init__(
        self,
        *,
        correlation_id: int,
        channel: str,
        log: LogBuffers,
        receiver: ImageReceiver,
        source: bytes,
        source_identity: str,
        rcv_hwm: Position,
        rcv_pos: Position,
        waker: ImageWaker,
    ) -> None:
        self.correlation_id = correlation_id
        self.channel = channel
        self.log = log
        self.receiver = receiver
        self.session_id = receiver.session_id
        self.stream_id = receiver.stream_id
        self.join_position = receiver.join_position
        self.source = source
        self.source_identity = source_identity
        self.rcv_hwm = rcv_hwm
        self.rcv_pos = rcv_pos
        self.waker = waker
        self.subscribers: dict[int, SubscriberLink] = {}
        self._positions: tuple[Position, ...] = ()
        self._published_hwm = -1
        self._published_pos = -1
        self._tail = ImageTail(log)
        native = self._native = ffi.new("lbn_image_t *")
        native.terms = log.term_pointer(0)
        native.term_length = log.term_length
        native.position_bits = log.position_bits
        native.initial_term_id = log.initial_term_id
        native.session_id = self.session_id
        native.stream_id = self.stream_id
        self._tail_position = -1
        self.update_positions()
        self.update_tail()

    # -- subscribers -----------------------------------------------------------------------------------

    def add_subscriber(self, link: SubscriberLink) -> None:
        self.subscribers[link.subscription_id] = link
        self._positions = tuple(s.position for s in self.subscribers.values())

    def remove_subscriber(self, subscription_id: int) -> SubscriberLink | None:
        link = self.subscribers.pop(subscription_id, None)
        self._positions = tuple(s.position for s in self.subscribers.values())
        return link

    def consumption_position(self) -> int:
        """The slowest subscriber's position (what SMs report); the rebuild position with none."""
        positions = self._positions
        if not positions:
            return self.receiver.rebuild_position
        if len(positions) == 1:
            return positions[0].get()
        return min(p.get() for p in positions)

    def subscriber_join_position(self) -> int:
        """Where a subscription that arrives late starts: the rebuilt data's end (live data only)."""
        return self.receiver.rebuild_position

    # -- duty cycle ------------------------------------------------------------------------------------

    def rebuild_in_order(self, batch: tuple, first: int, count: int, now_ns: int) -> tuple[int, int]:
        """Natively takes the datagrams ``first..`` of a receive batch that are this image's next in-order
        DATA (the hot path); returns ``(index of the first not taken, bytes taken)``."""
        receiver = self.receiver
        limit = receiver.in_order_limit
        if limit is None:
            return first, 0
        native = self._native
        native.position = receiver.rebuild_position
        native.limit = limit
        slots, slot_length, lengths, kinds, spans = batch
        taken = lib.lbn_rebuild_in_order(native, slots, slot_length, lengths, kinds, spans, first, count)
        if taken > first:
            receiver.on_data_in_order(native.position, now_ns)
        return taken, native.bytes

    def update_positions(self) -> bool:
        """Publishes rcv-hwm and rcv-pos when they moved; True when one did."""
        receiver = self.receiver
        moved = False
        if receiver.hwm_position != self._published_hwm:
            self._published_hwm = receiver.hwm_position
            self.rcv_hwm.set(receiver.hwm_position)
            moved = True
        if receiver.rebuild_position != self._published_pos:
            self._published_pos = receiver.rebuild_position
            self.rcv_pos.set(receiver.rebuild_position)
            moved = True
        return moved

    def update_tail(self) -> None:
        """The log's tail to the high-water mark (for tools; off the per-datagram path)."""
        if self.receiver.hwm_position != self._tail_position:
            self._tail_position = self.receiver.hwm_position
            self._tail.advance(self._tail_position)

    def counter_ids(self) -> list[int]:
        return [self.rcv_hwm.counter_id, self.rcv_pos.counter_id]

    def close(self) -> None:
        self.waker.close()
        self.log.close()

    def __repr__(self) -> str:
        return (f"PublicationImage({self.correlation_id}, session {self.session_id}, stream {self.stream_id}, "
                f"from {self.source_identity}, rcv-pos {self.receiver.rebuild_position})")
