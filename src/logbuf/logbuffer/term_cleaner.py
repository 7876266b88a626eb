"""``LogCleaner``: zeroes terms behind the slowest reader so they can be written again.

Each call zeroes at most to the end of the term it is in (small, frequent cleans rather than a whole term at
once): ``[offset+8, end)`` first, then the first 8 bytes with a release store, so a reader never sees a frame
word over stale bytes.
"""

from __future__ import annotations

from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import lib


class LogCleaner:
    """Zeroes the space behind the slowest reader, a term at most per call (the driver's duty)."""
    __slots__ = ("_log", "_terms", "clean_position")

    def __init__(self, log: LogBuffers, clean_position: int = 0) -> None:
        self._log = log
        self._terms = log.term_pointer(0)
        self.clean_position = clean_position

    def clean_to(self, target_position: int) -> int:
        """Zeroes from the clean position towards ``target_position``; returns bytes zeroed this call."""
        if target_position - self.clean_position > d.PARTITION_COUNT * self._log.term_length:
            raise ValueError("cannot clean more than the whole log in one step: cleaner fell behind")
        before = self.clean_position
        self.clean_position = lib.lb_clean(self._terms, self._log.term_length, before, target_position)
        return self.clean_position - before
