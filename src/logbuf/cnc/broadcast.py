"""The to-clients buffer: Aeron's (Agrona's) broadcast transmitter and receivers.

One transmitter (the driver) writes records into a ring that it never waits on; any number of receivers
(clients) follow it and detect when they have been lapped.  ``capacity`` bytes (a power of two) are
followed by a 128-byte trailer::

  capacity +0   +------------------------------------------+
               | tail intent counter   i64  where the tail will be once the record in flight is done |
          +8   | tail counter          i64  end of the last complete record                          |
         +16   | latest counter        i64  start of the last complete record (lapped receivers go here) |
         +24   | (padding to 128)                         |
        +128   +------------------------------------------+

A record (8-byte aligned; ``length`` counts the header, not the alignment padding)::

    0               4               8
    +---------------+---------------+-----------------------------+
    | length   i32  | type id  i32  | body (length - 8 bytes) ... |
    +---------------+---------------+-----------------------------+

A record that would run past the end is preceded by a padding record (type -1) filling the rest of the
buffer, and written at index 0.  The transmitter release-stores the tail intent *before* touching the
buffer and the tail *after*; a receiver whose cursor is more than ``capacity`` behind the tail intent
(``tail_intent - capacity > cursor``, i.e. not ``cursor + capacity > tail_intent``) may be reading
overwritten bytes: it is lapped and jumps to ``latest``.  ``CopyBroadcastReceiver`` copies a record out
and re-checks the tail intent afterwards, so it never hands out a record torn by the transmitter.

Memory ordering: the release/acquire accessors plus x86-64's store and load ordering give the
store-store fence after the tail intent and the load-load fence before a re-validation that Agrona
spells out (Python's copy and the C accessor call are not reordered by the compiler either).  A port
to a weakly ordered CPU needs explicit fences there.
"""

from __future__ import annotations

from collections.abc import Callable

from logbuf.cnc.errors import BroadcastCorruptedError, BroadcastLappedError, CncFileError
from logbuf.cnc.layout import TO_CLIENTS_TRAILER_LENGTH, align, check_capacity
from logbuf.native import AtomicBuffer

# Trailer offsets (from ``capacity``).
TAIL_INTENT_COUNTER_OFFSET = 0
TAIL_COUNTER_OFFSET = 8
LATEST_COUNTER_OFFSET = 16
TRAILER_LENGTH = TO_CLIENTS_TRAILER_LENGTH  # 128

# Record header (shared with the other buffer of cnc.dat).
from logbuf.cnc.record_descriptor import (  # noqa: E402
    HEADER_LENGTH,
    LENGTH_OFFSET,
    PADDING_MSG_TYPE_ID,
    RECORD_ALIGNMENT,
    TYPE_OFFSET,
)

MessageHandler = Callable[[int, bytes], None]
"""``handler(msg_type_id, body)`` for CopyBroadcastReceiver: ``body`` is a private, validated copy."""


def _capacity_of(buffer: AtomicBuffer) -> int:
    capacity = buffer.capacity - TRAILER_LENGTH
    try:
        check_capacity(capacity, "to-clients broadcast buffer")
    except CncFileError as exc:
        raise CncFileError(f"{exc} (buffer of {buffer.capacity} bytes incl. the 128-byte trailer)") from None
    return capacity


class BroadcastTransmitter:
    """The single writer of a broadcast buffer; ``transmit`` never blocks (slow receivers get lapped)."""

    __slots__ = ("_buffer", "capacity", "max_msg_length", "_mask", "_tail_intent", "_tail", "_latest")

    def __init__(self, buffer: AtomicBuffer) -> None:
        self._buffer = buffer
        self.capacity = _capacity_of(buffer)
        self.max_msg_length = self.capacity // 8
        self._mask = self.capacity - 1
        self._tail_intent = self.capacity + TAIL_INTENT_COUNTER_OFFSET
        self._tail = self.capacity + TAIL_COUNTER_OFFSET
        self._latest = self.capacity + LATEST_COUNTER_OFFSET

    def transmit(self, msg_type_id: int, data: bytes | bytearray | memoryview) -> None:
        if msg_type_id < 1:
            raise ValueError(f"message type id must be >= 1, got {msg_type_id}")
        length = len(data)
        if length > self.max_msg_length:
            raise ValueError(f"message of {length} bytes exceeds the maximum of {self.max_msg_length}")
        buffer = self._buffer
        current_tail = buffer.get_i64(self._tail)  # only this transmitter writes it
        record_offset = current_tail & self._mask
        record_length = HEADER_LENGTH + length
        aligned_length = align(record_length, RECORD_ALIGNMENT)
        new_tail = current_tail + aligned_length
        to_end = self.capacity - record_offset
        if to_end < aligned_length:
            # Announce both the padding and the record before overwriting anything.
            buffer.put_i64_release(self._tail_intent, new_tail + to_end)
            buffer.put_i32(record_offset + LENGTH_OFFSET, to_end)
            buffer.put_i32(record_offset + TYPE_OFFSET, PADDING_MSG_TYPE_ID)
            current_tail += to_end
            record_offset = 0
        else:
            buffer.put_i64_release(self._tail_intent, new_tail)
        buffer.put_i32(record_offset + LENGTH_OFFSET, record_length)
        buffer.put_i32(record_offset + TYPE_OFFSET, msg_type_id)
        buffer.put_bytes(record_offset + HEADER_LENGTH, bytes(data))
        buffer.put_i64(self._latest, current_tail)
        buffer.put_i64_release(self._tail, current_tail + aligned_length)  # publishes all of the above


class BroadcastReceiver:
    """Follows a broadcast buffer from its latest record (Agrona's ``BroadcastReceiver``).

    Zero-copy and therefore unsafe on its own: after reading ``message()`` call ``validate()``; use
    CopyBroadcastReceiver unless you know why not.
    """

    __slots__ = (
        "_buffer",
        "capacity",
        "_mask",
        "_tail_intent",
        "_tail",
        "_latest",
        "_cursor",
        "_next_record",
        "_record_offset",
        "lapped_count",
    )

    def __init__(self, buffer: AtomicBuffer) -> None:
        self._buffer = buffer
        self.capacity = _capacity_of(buffer)
        self._mask = self.capacity - 1
        self._tail_intent = self.capacity + TAIL_INTENT_COUNTER_OFFSET
        self._tail = self.capacity + TAIL_COUNTER_OFFSET
        self._latest = self.capacity + LATEST_COUNTER_OFFSET
        # A new receiver starts at the latest record (as Aeron's does): history may be overwritten already.
        self._cursor = buffer.get_i64_acquire(self._latest)
        self._next_record = self._cursor
        self._record_offset = self._cursor & self._mask
        self.lapped_count = 0

    def receive_next(self) -> bool:
        """Moves to the next record if one is available; True if so (then read type_id/message())."""
        buffer = self._buffer
        tail = buffer.get_i64_acquire(self._tail)
        cursor = self._next_record
        if tail <= cursor:
            return False
        if not self._valid(cursor):
            # Lapped: what is at our cursor may be overwritten already; skip to the latest record.
            self.lapped_count += 1
            cursor = buffer.get_i64_acquire(self._latest)
        record_offset = cursor & self._mask
        self._cursor = cursor
        self._next_record = cursor + self._aligned_length_at(record_offset)
        if buffer.get_i32(record_offset + TYPE_OFFSET) == PADDING_MSG_TYPE_ID:
            record_offset = 0
            self._cursor = self._next_record
            self._next_record += self._aligned_length_at(0)
        self._record_offset = record_offset
        return True

    def _aligned_length_at(self, record_offset: int) -> int:
        length = self._buffer.get_i32(record_offset + LENGTH_OFFSET)
        if length < HEADER_LENGTH or record_offset + length > self.capacity:
            # Either the transmitter overwrote it under us (then validate() fails later and the caller
            # drops it) or the buffer is corrupt; step one header so we never index outside the buffer.
            if self._valid(self._cursor):
                raise BroadcastCorruptedError(
                    f"broadcast record at {record_offset} has impossible length {length}"
                )
            return HEADER_LENGTH
        return align(length, RECORD_ALIGNMENT)

    def _valid(self, cursor: int) -> bool:
        return cursor + self.capacity > self._buffer.get_i64_acquire(self._tail_intent)

    def resync(self) -> None:
        """Counts a lap and continues from the transmitter's latest record (after a failed validate():
        the length used to find the next record may have been torn, so it cannot be trusted)."""
        self.lapped_count += 1
        self._cursor = self._next_record = self._buffer.get_i64_acquire(self._latest)
        self._record_offset = self._cursor & self._mask

    def validate(self) -> bool:
        """True if the current record has not been overwritten (yet): check after reading it."""
        return self._valid(self._cursor)

    @property
    def type_id(self) -> int:
        return self._buffer.get_i32(self._record_offset + TYPE_OFFSET)

    @property
    def offset(self) -> int:
        """Index of the current record's body in the buffer."""
        return self._record_offset + HEADER_LENGTH

    @property
    def length(self) -> int:
        """Body length of the current record (clamped to the buffer: it may be torn; validate())."""
        length = self._buffer.get_i32(self._record_offset + LENGTH_OFFSET) - HEADER_LENGTH
        return max(0, min(length, self.capacity - self._record_offset - HEADER_LENGTH))

    def message(self) -> bytes:
        """A copy of the current record's body; call validate() afterwards before trusting it."""
        return self._buffer.get_bytes(self.offset, self.length)

    @property
    def buffer(self) -> AtomicBuffer:
        return self._buffer


class CopyBroadcastReceiver:
    """Copies each record out of the broadcast buffer and hands the copy on only if it was not
    overwritten meanwhile (Agrona's ``CopyBroadcastReceiver``).

    Aeron raises "unable to keep up with broadcast" when lapped; here ``strict=True`` does that
    (BroadcastLappedError).  Otherwise a lap is counted in ``lapped_count``, a record torn during the copy
    is dropped, and receiving resumes from the transmitter's latest record (which is delivered).
    """

    __slots__ = ("receiver", "strict")

    def __init__(self, receiver: BroadcastReceiver | AtomicBuffer, strict: bool = False) -> None:
        self.receiver = receiver if isinstance(receiver, BroadcastReceiver) else BroadcastReceiver(receiver)
        self.strict = strict

    @property
    def lapped_count(self) -> int:
        return self.receiver.lapped_count

    def _copy(self) -> tuple[int, bytes]:
        receiver = self.receiver
        return receiver.type_id, receiver.message()

    def receive(self, handler: MessageHandler) -> int:
        """Delivers at most one record to ``handler``; returns 1 if it did, else 0."""
        receiver = self.receiver
        lapped_before = receiver.lapped_count
        if not receiver.receive_next():
            return 0
        if receiver.lapped_count != lapped_before and self.strict:
            raise BroadcastLappedError(
                "unable to keep up with broadcast: the transmitter lapped this receiver"
            )
        msg_type_id, body = self._copy()
        if not receiver.validate():
            # Overwritten while we copied: the copy (and the length we stepped by) may be torn.
            receiver.resync()
            if self.strict:
                raise BroadcastLappedError("unable to keep up with broadcast: record overwritten during copy")
            return 0
        handler(msg_type_id, body)
        return 1
