"""``TermReader``: reads committed frames of a term into a reusable array (the loop runs in C).

Only a positive frame length is a complete frame; a length <= 0 ends the read.  PAD frames are skipped.
Every length read from shared memory is checked against the term, so a corrupted or hostile header makes the
read stop (:data:`CORRUPT`) instead of touching memory outside the term.

One native call per read: it returns ``(next_offset << 32) | count`` and leaves (frame offset, frame length)
pairs in :attr:`fragments`, so the Python side crosses into C once and unpacks once per poll.
"""

from __future__ import annotations

from typing import Any

from logbuf.native import ffi, lib

CORRUPT = lib.LB_CORRUPT_FRAME


class TermReader:
    """Reads committed frames of a term into a reusable array of (offset, length) pairs."""
    __slots__ = ("capacity", "_struct", "fragments", "_read")

    def __init__(self, terms: Any, term_length: int, capacity: int = 1024) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self.fragments = ffi.new("int32_t[]", 2 * capacity)
        r = ffi.new("lb_term_reader_t *")
        r.terms = terms
        r.term_length = term_length
        r.capacity = capacity
        r.fragments = self.fragments
        self._struct = r
        self._read = lib.lb_term_read

    def read(self, index: int, term_offset: int, fragment_limit: int) -> int:
        """``(next_offset << 32) | count`` or :data:`CORRUPT`."""
        return self._read(self._struct, index, term_offset, fragment_limit)

    def pairs(self, count: int) -> list[int]:
        """``[offset0, length0, offset1, length1, ...]`` of the last read."""
        return ffi.unpack(self.fragments, 2 * count)
