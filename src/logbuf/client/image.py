"""Images: one subscriber's view of one publisher session's log, and its position (sub-pos).

``poll`` hands each committed DATA fragment to a handler as a zero-copy memoryview plus a :class:`Header`
flyweight; ``controlled_poll`` lets the handler ABORT / BREAK / COMMIT / CONTINUE; ``batch_poll`` returns
numpy arrays over the term for vectorised consumers.  The dispatch loop runs in C (``logbuf._client``) and
calls the handler from there.  The memoryview and the header are valid only inside the handler call: the
header is re-pointed at the next fragment (reading it afterwards raises UnboundHeaderError) and a
memoryview the handler kept is released after the call.  The subscriber position is stored with release
semantics after each poll, which is what lets the publisher (through the driver) reuse the space.

A frame that cannot be a frame (length past the term, unknown type) or a DATA frame whose session, stream or
term id is not this image's ends a poll before it; at the image's position it raises LogCorruptedError.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import numpy as np

from logbuf.errors import ClosedError, LogCorruptedError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.header import Header
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import check_codes, client, ffi, lib
from logbuf.position import Position

#: ``handler(buffer, header)``: ``buffer`` (a memoryview of the payload) and ``header`` (a flyweight) are valid
#: only inside the call; copy what must outlive it (``bytes(buffer)``, ``header.position``).
FragmentHandler = Callable[[memoryview, Header], Any]


class ControlledPollAction(enum.IntEnum):
    """What a controlled_poll handler tells the image to do next."""

    ABORT = 1  # stop, and deliver this fragment again next time
    BREAK = 2  # stop after this fragment
    COMMIT = 3  # publish the position now, then continue
    CONTINUE = 4  # go on


check_codes("POLL_ACTIONS", {a.name: a.value for a in ControlledPollAction})  # the values the native poll acts on


class FragmentBatch:
    """Fragments found by :meth:`Image.batch_poll`: numpy arrays over the term buffer.

    ``buffer`` is the term (``np.uint8``); fragment ``i`` is ``buffer[payload_offsets[i]:][:lengths[i]]``.
    The views stay valid until the batch is committed (on context exit or :meth:`commit`), which is when the
    image's position moves past them and the space may be cleaned and reused.
    """

    __slots__ = (
        "buffer",
        "payload_offsets",
        "lengths",
        "positions",
        "reserved_values",
        "flags",
        "count",
        "_image",
        "_end_position",
        "_committed",
    )

    def __init__(self, image: Image, buffer: np.ndarray, count: int, end_position: int, arrays: tuple) -> None:
        self._image = image
        self.buffer = buffer
        self.count = count
        offsets, lengths, positions, reserved, flags = arrays
        self.payload_offsets = offsets[:count]
        self.lengths = lengths[:count]
        self.positions = positions[:count]
        self.reserved_values = reserved[:count]
        self.flags = flags[:count]
        self._end_position = end_position
        self._committed = False

    def __len__(self) -> int:
        return self.count

    def payload(self, i: int) -> np.ndarray:
        """The payload of fragment ``i`` (a numpy view over the term)."""
        start = int(self.payload_offsets[i])
        return self.buffer[start : start + int(self.lengths[i])]

    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies every payload back to back into one new array (one C loop); returns (data, offsets)."""
        total = int(self.lengths.sum())
        out = np.empty(total, dtype=np.uint8)
        written = lib.lb_gather(
            ffi.from_buffer("uint8_t[]", self.buffer),
            len(self.buffer),
            ffi.from_buffer("int32_t[]", self.payload_offsets),
            ffi.from_buffer("int32_t[]", self.lengths),
            self.count,
            ffi.from_buffer("uint8_t[]", out),
            total,
        )
        if written != total:
            raise LogCorruptedError("batch payloads run outside the term", int(self._end_position))
        starts = np.zeros(self.count, dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=starts[1:])
        return out, starts

    @property
    def end_position(self) -> int:
        """The image position after this batch (where commit moves it)."""
        return self._end_position

    def commit(self) -> None:
        """Moves the image's position past this batch (the views must not be used afterwards)."""
        if not self._committed:
            self._committed = True
            if not self._image.is_closed:
                self._image._commit_position(self._end_position)

    def __enter__(self) -> FragmentBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.commit()


class Image(client.Image):
    """Reads one log from the subscriber's position and publishes that position after every poll.

    ``poll``, ``controlled_poll``, ``is_data_available``, ``position``, ``released_position``,
    ``hold_position`` and ``release_to`` are methods of the native base (``logbuf._client.Image``): one native
    call per poll runs the whole dispatch loop and calls the handler from C.  Once the image or its log is
    closed, polls deliver nothing (0) and ``released_position`` raises :class:`~logbuf.errors.ClosedError`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        client.specialize(cls)

    def __init__(
        self,
        log: LogBuffers,
        subscriber_position: Position,
        *,
        correlation_id: int = -1,
        subscription_registration_id: int = -1,
        source_identity: str = "",
        fragment_capacity: int = 4096,
    ) -> None:
        self.log = log
        self.subscriber_position = subscriber_position
        self.correlation_id = correlation_id
        self.subscription_registration_id = subscription_registration_id
        self.source_identity = source_identity
        # set by the client that made it: sends REJECT_IMAGE (image correlation id, position, reason)
        self.rejecter: Callable[[int, int, str], None] | None = None
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self._bits = log.position_bits
        self._mask = log.term_length - 1
        self._closed = False
        native = log.native
        sub_buffer, sub_offset = subscriber_position.slot
        self._attach(native, sub_buffer, sub_offset, log.session_id, log.stream_id, log.initial_term_id)
        self.join_position = self.position
        # batch_poll's numpy views share the native mapping's export: they keep the log mapped while in use
        T = log.term_length
        view = memoryview(native)
        self._np_terms = [np.frombuffer(view[i * T : (i + 1) * T], dtype=np.uint8) for i in range(d.PARTITION_COUNT)]
        self._terms = [ffi.from_buffer("uint8_t[]", t) for t in self._np_terms]
        self._batch_capacity = fragment_capacity
        self._batch_arrays = (
            np.empty(fragment_capacity, dtype=np.int32),
            np.empty(fragment_capacity, dtype=np.int32),
            np.empty(fragment_capacity, dtype=np.int64),
            np.empty(fragment_capacity, dtype=np.int64),
            np.empty(fragment_capacity, dtype=np.uint8),
        )
        self._batch_ptrs = tuple(
            ffi.from_buffer(t, a)
            for t, a in zip(("int32_t[]", "int32_t[]", "int64_t[]", "int64_t[]", "uint8_t[]"), self._batch_arrays, strict=True)
        )
        self._batch_next_offset = ffi.new("int32_t *")

    def _corrupt(self, position: int) -> LogCorruptedError:
        return LogCorruptedError(
            f"corrupted frame in stream {self.stream_id} session {self.session_id} at position {position}",
            position,
        )

    def batch_poll(self, fragment_limit: int | None = None) -> FragmentBatch:
        """Finds up to ``fragment_limit`` fragments (one term at most) and returns them as numpy arrays.

        The position moves only when the batch is committed (``with image.batch_poll() as b: ...``).
        """
        position = self.position
        term_offset = position & self._mask
        index = d.index_by_position(position, self._bits)
        limit = self._batch_capacity if fragment_limit is None else min(fragment_limit, self._batch_capacity)
        next_offset = self._batch_next_offset
        if self.is_closed:
            return FragmentBatch(self, self._np_terms[index], 0, position, self._batch_arrays)
        count = lib.lb_term_read_batch(
            self._terms[index], self.term_length, term_offset, position - term_offset, limit, *self._batch_ptrs,
            next_offset,
        )
        if count == lib.LB_CORRUPT_FRAME:
            raise self._corrupt(position)
        end = position + next_offset[0] - term_offset
        return FragmentBatch(self, self._np_terms[index], count, end, self._batch_arrays)

    def _declare_waiting(self) -> None:
        """Counts this subscriber as sleeping on the stream's semaphore (publishers post it after appends)."""
        # a full barrier (lock xadd): the data check that follows cannot be reordered before it
        self.log.meta.get_and_add_i32(d.LOG_WAITING_SUBSCRIBERS_OFFSET, 1)

    def _undeclare_waiting(self) -> None:
        """Undoes :meth:`_declare_waiting` (unless a publisher already cleared the count)."""
        # a publisher may have cleared the count (and posted for us) already: never go below zero
        meta = self.log.meta
        while True:
            waiting = meta.get_i32_acquire(d.LOG_WAITING_SUBSCRIBERS_OFFSET)
            if waiting <= 0 or meta.cas_i32(d.LOG_WAITING_SUBSCRIBERS_OFFSET, waiting, waiting - 1):
                return

    # -- state ---------------------------------------------------------------------------------------

    def is_end_of_stream(self) -> bool:
        """True once the read cursor reached the log's end-of-stream position."""
        return self.position >= self.log.end_of_stream_position

    def reject(self, reason: str) -> None:
        """Asks the driver to reject this image (Aeron's ``Image.reject``): a network image stops taking data
        and its sender is sent an error frame (IMAGE_REJECTED with ``reason``, at most 1023 bytes of UTF-8)
        until the image times out and goes.  Raises RegistrationError when the driver refuses."""
        if self.rejecter is None:
            raise ClosedError(f"image {self.correlation_id} has no client to reject it through")
        self.rejecter(self.correlation_id, self.position, reason)

    def close(self) -> None:
        """Closes the image: later polls deliver nothing; the log and sub-pos counter are let go of."""
        self._closed = True
        self._close_native()
        # batch_poll's views hold the mapping too: let it go (an empty term answers batch_poll from now on)
        empty = np.empty(0, dtype=np.uint8)
        self._np_terms = [empty] * d.PARTITION_COUNT
        self._terms = []

    def __repr__(self) -> str:
        state = "closed" if self.is_closed else f"position={self.position}"
        return f"Image(session_id={self.session_id}, stream_id={self.stream_id}, {state})"


client.specialize(Image)  # poll/controlled_poll: CPython's fast call path needs the exact class
