"""The to-driver command buffer: Aeron's (Agrona's) ``ManyToOneRingBuffer``.

Many producers (every client, in any process) append records; one consumer (the driver conductor) reads
them.  The buffer is ``capacity`` bytes (a power of two) followed by a 768-byte trailer; each counter of the
trailer sits on its own pair of cache lines so producers and the consumer do not false-share::

  capacity +0   +------------------------------------------+
               | (padding)                                |
         +128  | tail position          i64  producers CAS it to claim space
         +256  | head cache position    i64  producers' stale copy of head (fewer reads of head's line)
         +384  | head position          i64  the consumer's, release-stored after zeroing what it read
         +512  | correlation counter    i64  clients take ids with get-and-add
         +640  | consumer heartbeat     i64  the driver's epoch ms; clients judge driver liveness on it
         +768  +------------------------------------------+

A record (8-byte aligned; ``length`` counts the header but not the alignment padding)::

    0               4               8
    +---------------+---------------+-----------------------------+
    | length   i32  | type id  i32  | body (length - 8 bytes) ... |
    +---------------+---------------+-----------------------------+

``length`` is stored negative (release) as soon as the space is claimed and positive (release) once the
body and type are written: the consumer stops at a length <= 0.  When a record would run past the end of
the buffer the producer claims the rest of the buffer too and writes a padding record there (type -1),
then writes its record at index 0.  Positions (head, tail) are 64-bit byte counts that never wrap; the
index is ``position & (capacity - 1)``.  A producer that dies between claiming and committing leaves the
consumer stuck at a record of length <= 0; ``unblock()`` turns that record into padding.
"""

from __future__ import annotations

from collections.abc import Callable

from logbuf.cnc.errors import CncFileError, RingBufferCorruptedError
from logbuf.cnc.layout import TO_DRIVER_TRAILER_LENGTH, align, check_capacity
from logbuf.native import AtomicBuffer

# Trailer offsets (from the end of the data, i.e. from ``capacity``).
TAIL_POSITION_OFFSET = 128
HEAD_CACHE_POSITION_OFFSET = 256
HEAD_POSITION_OFFSET = 384
CORRELATION_COUNTER_OFFSET = 512
CONSUMER_HEARTBEAT_OFFSET = 640
TRAILER_LENGTH = TO_DRIVER_TRAILER_LENGTH  # 768

# Record header (shared with the other buffer of cnc.dat).
from logbuf.cnc.record_descriptor import (  # noqa: E402
    HEADER_LENGTH,
    LENGTH_OFFSET,
    PADDING_MSG_TYPE_ID,
    RECORD_ALIGNMENT,
    TYPE_OFFSET,
)

ALIGNMENT = RECORD_ALIGNMENT

MessageHandler = Callable[[int, memoryview], None]
"""``handler(msg_type_id, body)``: ``body`` is a view into the ring, valid only during the call."""


class ManyToOneRingBuffer:
    """Aeron's many-to-one ring buffer over ``buffer`` (an AtomicBuffer of ``capacity + 768`` bytes)."""

    __slots__ = (
        "_buffer",
        "capacity",
        "max_msg_length",
        "_mask",
        "_tail_index",
        "_head_cache_index",
        "_head_index",
        "_correlation_index",
        "_heartbeat_index",
    )

    def __init__(self, buffer: AtomicBuffer) -> None:
        capacity = buffer.capacity - TRAILER_LENGTH
        try:
            check_capacity(capacity, "to-driver ring buffer")
        except CncFileError as exc:
            raise CncFileError(
                f"{exc} (buffer of {buffer.capacity} bytes incl. the 768-byte trailer)"
            ) from None
        self._buffer = buffer
        self.capacity = capacity
        self.max_msg_length = capacity // 8  # Aeron's limit, so one message never dominates the ring
        self._mask = capacity - 1
        self._tail_index = capacity + TAIL_POSITION_OFFSET
        self._head_cache_index = capacity + HEAD_CACHE_POSITION_OFFSET
        self._head_index = capacity + HEAD_POSITION_OFFSET
        self._correlation_index = capacity + CORRELATION_COUNTER_OFFSET
        self._heartbeat_index = capacity + CONSUMER_HEARTBEAT_OFFSET

    @property
    def buffer(self) -> AtomicBuffer:
        return self._buffer

    # -- producers -------------------------------------------------------------------------------------

    def write(self, msg_type_id: int, data: bytes | bytearray | memoryview) -> bool:
        """Appends one record; False when there is not enough free space (the caller retries later)."""
        if msg_type_id < 1:
            raise ValueError(f"message type id must be >= 1, got {msg_type_id}")
        length = len(data)
        if length > self.max_msg_length:
            raise ValueError(f"message of {length} bytes exceeds the maximum of {self.max_msg_length}")
        record_length = length + HEADER_LENGTH
        index = self._claim_capacity(record_length)
        if index < 0:
            return False
        buffer = self._buffer
        buffer.put_i32_release(index + LENGTH_OFFSET, -record_length)  # claimed, not yet readable
        buffer.put_bytes(index + HEADER_LENGTH, bytes(data))
        buffer.put_i32(index + TYPE_OFFSET, msg_type_id)
        buffer.put_i32_release(index + LENGTH_OFFSET, record_length)  # commit: body and type before this
        return True

    def _claim_capacity(self, record_length: int) -> int:
        """Claims aligned space by CAS on the tail; the record index, or -1 when full."""
        buffer = self._buffer
        capacity = self.capacity
        mask = self._mask
        aligned_length = align(record_length, ALIGNMENT)
        # One header more than the record: the tail never catches the head exactly, as in Aeron.
        required = aligned_length + HEADER_LENGTH
        head = buffer.get_i64_acquire(self._head_cache_index)
        while True:
            tail = buffer.get_i64_acquire(self._tail_index)
            if required > capacity - (tail - head):
                head = buffer.get_i64_acquire(self._head_index)
                if required > capacity - (tail - head):
                    return -1
                buffer.put_i64_release(self._head_cache_index, head)
            padding = 0
            tail_index = tail & mask
            to_end = capacity - tail_index
            if aligned_length > to_end:
                # The record would wrap: take the rest of the buffer as padding and start again at 0,
                # which needs the head to have moved past the record's length from index 0.
                head_index = head & mask
                if required > head_index:
                    head = buffer.get_i64_acquire(self._head_index)
                    head_index = head & mask
                    if required > head_index:
                        return -1
                    buffer.put_i64_release(self._head_cache_index, head)
                padding = to_end
            if buffer.cas_i64(self._tail_index, tail, tail + aligned_length + padding):
                break
        if padding:
            # Type first, then a positive length (release): the padding is committed in one go.
            buffer.put_i32(tail_index + TYPE_OFFSET, PADDING_MSG_TYPE_ID)
            buffer.put_i32_release(tail_index + LENGTH_OFFSET, padding)
            return 0
        return tail_index

    def next_correlation_id(self) -> int:
        """A unique id for this buffer's lifetime (clients' registration/correlation ids)."""
        return self._buffer.get_and_add_i64(self._correlation_index, 1)

    # -- the consumer ----------------------------------------------------------------------------------

    def read(self, handler: MessageHandler, limit: int = 2**31 - 1) -> int:
        """Hands up to ``limit`` committed records to ``handler`` (single consumer); returns how many.

        Reads only up to the end of the buffer (the next call continues at index 0), so a call that only
        skipped padding returns 0 although the head moved: poll again next duty cycle.  The space read is
        zeroed and the head moved even if the handler raises, so a poison record is consumed once.
        Raises RingBufferCorruptedError when a committed length cannot be a record.
        """
        buffer = self._buffer
        head = buffer.get_i64(self._head_index)  # only this consumer writes it
        head_index = head & self._mask
        contiguous = self.capacity - head_index
        messages = 0
        bytes_read = 0
        view = buffer.view
        try:
            while bytes_read < contiguous and messages < limit:
                index = head_index + bytes_read
                record_length = buffer.get_i32_acquire(index + LENGTH_OFFSET)
                if record_length <= 0:
                    break
                # Shared memory: a hostile or broken producer could have written anything.
                if record_length < HEADER_LENGTH or align(record_length, ALIGNMENT) > contiguous - bytes_read:
                    raise RingBufferCorruptedError(
                        f"to-driver record at index {index} has impossible length {record_length} "
                        f"({contiguous - bytes_read} bytes to the end of the buffer)",
                        index,
                    )
                bytes_read += align(record_length, ALIGNMENT)
                msg_type_id = buffer.get_i32(index + TYPE_OFFSET)
                if msg_type_id == PADDING_MSG_TYPE_ID:
                    continue
                messages += 1
                body = view[index + HEADER_LENGTH : index + record_length]
                try:
                    handler(msg_type_id, body)
                finally:
                    body.release()  # the space is zeroed right after: nobody may keep reading it
        finally:
            if bytes_read:
                buffer.set_memory(head_index, bytes_read, 0)
                buffer.put_i64_release(self._head_index, head + bytes_read)
        return messages

    def unblock(self) -> bool:
        """Turns a record a dead producer left uncommitted at the head into padding; True if it did.

        Call it only after the consumer has made no progress for a while (Aeron: the client liveness
        timeout) with records pending, since a live producer may just be slow.  Two cases:
        a negative length (claimed, never committed) becomes padding of that length; a zero length
        (the producer died between the tail CAS and writing anything) becomes padding up to the next
        non-zero header, after re-checking the gap is still all zero.
        """
        buffer = self._buffer
        head = buffer.get_i64_acquire(self._head_index)
        tail = buffer.get_i64_acquire(self._tail_index)
        if head == tail:
            return False
        mask = self._mask
        consumer_index = head & mask
        producer_index = tail & mask
        length = buffer.get_i32_acquire(consumer_index + LENGTH_OFFSET)
        if length < 0:
            if -length > self.capacity - consumer_index:
                raise RingBufferCorruptedError(
                    f"uncommitted to-driver record at index {consumer_index} has impossible length {-length}",
                    consumer_index,
                )
            buffer.put_i32(consumer_index + TYPE_OFFSET, PADDING_MSG_TYPE_ID)
            buffer.put_i32_release(consumer_index + LENGTH_OFFSET, -length)
            return True
        if length == 0:
            limit = producer_index if producer_index > consumer_index else self.capacity
            i = consumer_index + ALIGNMENT
            while i < limit:
                if buffer.get_i32_acquire(i) != 0:
                    if self._still_zeroed(i, consumer_index):
                        buffer.put_i32(consumer_index + TYPE_OFFSET, PADDING_MSG_TYPE_ID)
                        buffer.put_i32_release(consumer_index + LENGTH_OFFSET, i - consumer_index)
                        return True
                    return False
                i += ALIGNMENT
        return False

    def discard_pending(self) -> int:
        """Consumer-side recovery from a corrupted record: drops everything between head and tail.

        The records lost belong to clients whose commands then time out; the alternative (stopping the
        consumer) would wedge every client.  Returns the bytes discarded.
        """
        buffer = self._buffer
        head = buffer.get_i64(self._head_index)
        tail = buffer.get_i64_acquire(self._tail_index)
        if tail <= head:
            return 0
        length = min(tail - head, self.capacity)
        head_index = head & self._mask
        first = min(length, self.capacity - head_index)
        buffer.set_memory(head_index, first, 0)
        if length > first:
            buffer.set_memory(0, length - first, 0)
        buffer.put_i64_release(self._head_index, tail)
        return length

    def _still_zeroed(self, index: int, consumer_index: int) -> bool:
        # A producer may have written its header meanwhile: then it is alive and must not be overwritten.
        i = index - ALIGNMENT
        while i >= consumer_index:
            if self._buffer.get_i32_acquire(i) != 0:
                return False
            i -= ALIGNMENT
        return True

    # -- state -----------------------------------------------------------------------------------------

    def producer_position(self) -> int:
        return self._buffer.get_i64_acquire(self._tail_index)

    def consumer_position(self) -> int:
        return self._buffer.get_i64_acquire(self._head_index)

    def size(self) -> int:
        """Bytes claimed and not yet consumed (a consistent snapshot of head and tail)."""
        buffer = self._buffer
        after = buffer.get_i64_acquire(self._head_index)
        while True:
            before = after
            tail = buffer.get_i64_acquire(self._tail_index)
            after = buffer.get_i64_acquire(self._head_index)
            if after == before:
                return tail - after

    @property
    def consumer_heartbeat_time(self) -> int:
        """The consumer's (driver's) last heartbeat, epoch ms; 0 (NULL) when it shut down or never ran."""
        return self._buffer.get_i64_acquire(self._heartbeat_index)

    @consumer_heartbeat_time.setter
    def consumer_heartbeat_time(self, epoch_ms: int) -> None:
        self._buffer.put_i64_release(self._heartbeat_index, epoch_ms)
