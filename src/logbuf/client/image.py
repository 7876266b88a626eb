"""Images: one subscriber's view of one publisher session's log, and its position (sub-pos).

``poll`` hands each committed DATA fragment to a handler as a zero-copy memoryview plus a :class:`Header`
flyweight; ``controlled_poll`` lets the handler ABORT / BREAK / COMMIT / CONTINUE; ``batch_poll`` returns
numpy arrays over the term for vectorised consumers.  The C reader finds the frames; Python only loops over
what it found.  The subscriber position is stored with release semantics after each poll, which is what lets
the publisher (through the driver) reuse the space.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import numpy as np

from logbuf.errors import LogCorruptedError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.frame import FRAME_ALIGNMENT, HEADER_LENGTH
from logbuf.logbuffer.header import Header
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.logbuffer.term_reader import TermReader
from logbuf.native import ffi, lib
from logbuf.position import Position

FragmentHandler = Callable[[memoryview, Header], Any]

_ALIGN_MASK = ~(FRAME_ALIGNMENT - 1)


class ControlledPollAction(enum.IntEnum):
    ABORT = 1  # stop, and deliver this fragment again next time
    BREAK = 2  # stop after this fragment
    COMMIT = 3  # publish the position now, then continue
    CONTINUE = 4  # go on


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
        return self._end_position

    def commit(self) -> None:
        """Moves the image's position past this batch (the views must not be used afterwards)."""
        if not self._committed:
            self._committed = True
            self._image._commit_position(self._end_position)

    def __enter__(self) -> FragmentBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.commit()


class Image:
    """Reads one log from the subscriber's position and publishes that position after every poll."""

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
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self._bits = log.position_bits
        self._mask = log.term_length - 1
        self._position = subscriber_position.get()
        self.join_position = self._position
        self._hold = False
        self._terms = [log.term_pointer(i) for i in range(d.PARTITION_COUNT)]
        view = log.terms.view
        T = log.term_length
        self._term_views = [view[i * T : (i + 1) * T] for i in range(d.PARTITION_COUNT)]
        self._np_terms = [np.frombuffer(v, dtype=np.uint8) for v in self._term_views]
        # int32 words of each term: a cheap, non-atomic peek at the next frame length so an empty poll costs
        # no native call.  Only a hint: the C reader re-reads the length with acquire before using a frame.
        self._term_words = [v.cast("i") for v in self._term_views]
        self._reader = TermReader(log.term_pointer(0), log.term_length, fragment_capacity)
        self._header = Header(log.initial_term_id, self._bits)
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
            for t, a in zip(("int32_t[]", "int32_t[]", "int64_t[]", "int64_t[]", "uint8_t[]"), self._batch_arrays, strict=False)
        )
        self._batch_next_offset = ffi.new("int32_t *")
        self._closed = False

    # -- polling -------------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        return self._position

    def _corrupt(self, position: int) -> LogCorruptedError:
        return LogCorruptedError(
            f"corrupted frame in stream {self.stream_id} session {self.session_id} at position {position}",
            position,
        )

    def poll(self, handler: FragmentHandler, fragment_limit: int = 10) -> int:
        """Delivers up to ``fragment_limit`` committed fragments to ``handler(buffer, header)``.

        ``buffer`` is a zero-copy memoryview of the payload, valid only during the call.  Returns how many
        fragments were delivered.  If the handler raises, the position still moves past that fragment (as
        in Aeron) and the exception propagates.
        """
        if self._closed:
            return 0
        position = self._position
        term_offset = position & self._mask
        index = (position >> self._bits) % 3
        if self._term_words[index][term_offset >> 2] <= 0:
            return 0  # nothing committed at our position yet
        result = self._reader.read(index, term_offset, fragment_limit)
        if result < 0:
            raise self._corrupt(position)
        count = result & 0xFFFFFFFF
        if count == 0:
            if result >> 32 != term_offset:  # only padding was read
                self._commit_position(position + (result >> 32) - term_offset)
            return 0
        it = iter(self._reader.pairs(count))
        term = self._term_views[index]
        header = self._header
        header.buffer = term
        done = term_offset
        try:
            for offset, length in zip(it, it, strict=False):
                done = offset + ((length + 31) & _ALIGN_MASK)
                header.offset = offset
                handler(term[offset + HEADER_LENGTH : offset + length], header)
            done = result >> 32
        finally:
            self._commit_position(position + done - term_offset)
        return count

    def controlled_poll(
        self, handler: Callable[[memoryview, Header], ControlledPollAction], fragment_limit: int = 10
    ) -> int:
        """As :meth:`poll`, with the handler returning a :class:`ControlledPollAction`."""
        if self._closed:
            return 0
        position = self._position
        term_offset = position & self._mask
        index = (position >> self._bits) % 3
        if self._term_words[index][term_offset >> 2] <= 0:
            return 0  # nothing committed at our position yet
        result = self._reader.read(index, term_offset, fragment_limit)
        if result < 0:
            raise self._corrupt(position)
        count = result & 0xFFFFFFFF
        if count == 0:
            if result >> 32 != term_offset:
                self._commit_position(position + (result >> 32) - term_offset)
            return 0
        it = iter(self._reader.pairs(count))
        term = self._term_views[index]
        header = self._header
        header.buffer = term
        base = position - term_offset
        resume = term_offset  # offset up to which fragments are consumed
        delivered = 0
        completed_all = True
        try:
            for offset, length in zip(it, it, strict=False):
                header.offset = offset
                action = handler(term[offset + HEADER_LENGTH : offset + length], header)
                if action == ControlledPollAction.ABORT:
                    completed_all = False
                    break
                delivered += 1
                resume = offset + ((length + 31) & _ALIGN_MASK)
                if action == ControlledPollAction.BREAK:
                    completed_all = False
                    break
                if action == ControlledPollAction.COMMIT:
                    self._commit_position(base + resume)
            if completed_all:
                resume = result >> 32
        finally:
            self._commit_position(base + resume)
        return delivered

    def batch_poll(self, fragment_limit: int | None = None) -> FragmentBatch:
        """Finds up to ``fragment_limit`` fragments (one term at most) and returns them as numpy arrays.

        The position moves only when the batch is committed (``with image.batch_poll() as b: ...``).
        """
        position = self._position
        term_offset = position & self._mask
        index = (position >> self._bits) % 3
        limit = self._batch_capacity if fragment_limit is None else min(fragment_limit, self._batch_capacity)
        next_offset = self._batch_next_offset
        if self._closed:
            return FragmentBatch(self, self._np_terms[index], 0, position, self._batch_arrays)
        count = lib.lb_term_read_batch(
            self._terms[index], self.term_length, term_offset, position - term_offset, limit, *self._batch_ptrs,
            next_offset,
        )
        if count == lib.LB_CORRUPT_FRAME:
            raise self._corrupt(position)
        end = position + next_offset[0] - term_offset
        return FragmentBatch(self, self._np_terms[index], count, end, self._batch_arrays)

    def is_data_available(self) -> bool:
        """True when a committed frame sits at this image's position (a cheap peek, no native call)."""
        if self._closed:
            return False
        position = self._position
        return self._term_words[(position >> self._bits) % 3][(position & self._mask) >> 2] > 0

    def _declare_waiting(self) -> None:
        # a full barrier (lock xadd): the data check that follows cannot be reordered before it
        self.log.meta.get_and_add_i32(d.LOG_WAITING_SUBSCRIBERS_OFFSET, 1)

    def _undeclare_waiting(self) -> None:
        # a publisher may have cleared the count (and posted for us) already: never go below zero
        meta = self.log.meta
        while True:
            waiting = meta.get_i32_acquire(d.LOG_WAITING_SUBSCRIBERS_OFFSET)
            if waiting <= 0 or meta.cas_i32(d.LOG_WAITING_SUBSCRIBERS_OFFSET, waiting, waiting - 1):
                return

    def _commit_position(self, new_position: int) -> None:
        if new_position > self._position:
            self._position = new_position
            if not self._hold:
                self.subscriber_position.set(new_position)

    # -- holding the subscriber position (durable consumers) --------------------------------------------

    def hold_position(self) -> None:
        """From now on polls move only the read cursor; the shared sub-pos (which flow control and cleaning
        follow) moves only by :meth:`release_to`.  A consumer that must not lose data it has read but not yet
        made durable (a recorder) holds the publisher back this way, and can resume from the released
        position after a crash (``resume-position`` channel parameter) while the driver still retains it."""
        self._hold = True

    def release_to(self, position: int) -> None:
        """Publishes ``position`` (at most the read cursor) as this image's sub-pos."""
        if position > self._position:
            raise ValueError(f"cannot release to {position}: only read up to {self._position}")
        if position > self.subscriber_position.get():
            self.subscriber_position.set(position)

    @property
    def released_position(self) -> int:
        return self.subscriber_position.get()

    # -- state ---------------------------------------------------------------------------------------

    def is_end_of_stream(self) -> bool:
        return self._position >= self.log.end_of_stream_position

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"Image(session_id={self.session_id}, stream_id={self.stream_id}, position={self._position})"
