"""A 64-bit position counter in shared memory (pub-pos, pub-lmt, sub-pos, snd-pos, …).

Positions live in counter value records (cnc.dat when a driver runs); one process writes a position, any
may read it.  Reads are acquire, writes are release, so whatever was written before a position moved is
visible to whoever sees the new position.
"""

from __future__ import annotations

import contextlib
from typing import Any

from logbuf.errors import ClosedError
from logbuf.native import AtomicBuffer, lib


class Position:
    """A position at ``offset`` (8-aligned) of ``buffer``; ``counter_id`` names it in a counters file."""

    __slots__ = ("_buffer", "offset", "counter_id", "_ptr")

    def __init__(self, buffer: AtomicBuffer, offset: int, counter_id: int = -1) -> None:
        if offset % 8:
            raise ValueError(f"a position must be 8-byte aligned, got offset {offset}")
        self._buffer = buffer
        self.offset = offset
        self.counter_id = counter_id
        self._ptr = buffer.pointer(offset)
        buffer.get_i64_acquire(offset)  # bounds check now, not on the hot path

    @classmethod
    def standalone(cls, value: int = 0) -> Position:
        """A private position (not shared between processes), for single-process use and tests."""
        position = cls(AtomicBuffer(bytearray(8)), 0)
        position.set(value)
        return position

    @property
    def pointer(self) -> Any:
        """``int64_t *`` for the native shim (valid while the counters buffer is not released)."""
        self._check_open()
        return self._ptr

    @property
    def slot(self) -> tuple[Any, int]:
        """``(buffer object, byte offset)`` of the counter, for native objects that hold their own export."""
        return self._buffer.obj, self._buffer.base_offset + self.offset

    def _check_open(self) -> None:
        if self._buffer._cdata is None:
            raise ClosedError(f"position counter {self.counter_id}: its counters buffer was released")

    def get(self) -> int:
        """The position (acquire load); ClosedError once the counters buffer is released."""
        if self._buffer._cdata is None:
            self._check_open()
        return lib.lb_get_i64_acquire(self._ptr)

    def set(self, value: int) -> None:
        """Stores the position (release store); ClosedError once the counters buffer is released."""
        if self._buffer._cdata is None:
            self._check_open()
        lib.lb_put_i64_release(self._ptr, value)

    def propose_max(self, value: int) -> bool:
        """Moves the position forward to ``value`` if that is ahead (single writer); True if it moved."""
        if value > self.get():
            self.set(value)
            return True
        return False

    def __repr__(self) -> str:
        if self._buffer._cdata is None:
            return f"Position(counter_id={self.counter_id}, closed)"
        return f"Position(counter_id={self.counter_id}, value={self.get()})"


COUNTER_VALUE_RECORD_LENGTH = 128  # one position per cache-line pair, as counter value records in cnc.dat


class SharedPositions:
    """A small file of positions for running publishers and subscribers without a driver (tests, demos).

    Slot ``i`` is a counter value record (128 bytes) at ``i * 128``; with a driver, positions live in
    cnc.dat instead.
    """

    def __init__(self, path: str, slots: int = 8, *, create: bool = False) -> None:
        import mmap
        import os

        from logbuf.native import new_mmap

        length = slots * COUNTER_VALUE_RECORD_LENGTH
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, length)
            elif os.fstat(fd).st_size != length:
                raise ValueError(f"{path} holds {os.fstat(fd).st_size} bytes, expected {length}")
            self._mmap: mmap.mmap = new_mmap(fd, length)
        finally:
            os.close(fd)
        self.path = path
        self.slots = slots
        self.buffer = AtomicBuffer(self._mmap)

    def position(self, slot: int) -> Position:
        """The position in ``slot``."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside 0..{self.slots - 1}")
        return Position(self.buffer, slot * COUNTER_VALUE_RECORD_LENGTH, counter_id=slot)

    def close(self) -> None:
        """Releases the buffer; the file is unmapped once no native object holds a position in it."""
        self.buffer.release()
        with contextlib.suppress(BufferError):
            self._mmap.close()
