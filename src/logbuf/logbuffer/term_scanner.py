"""``TermScanner``: finds a run of whole committed frames up to a byte limit (what a sender puts in one
datagram).  A PAD frame is only taken as the first frame; then only its header is sent and its body is
reported as padding to skip."""

from __future__ import annotations

from typing import Any, NamedTuple

from logbuf.errors import LogCorruptedError
from logbuf.logbuffer.frame import FRAME_ALIGNMENT
from logbuf.native import lib

_LOW_32 = 0xFFFFFFFF  # the native result packs (padding << 32) | available


class ScanResult(NamedTuple):
    """What a sender may send now: ``available`` bytes of whole frames, then ``padding`` to skip."""
    available: int  # bytes of whole frames to send
    padding: int  # bytes to skip after them (body of a leading PAD frame)


def scan_for_availability(term: Any, term_length: int, term_offset: int, max_length: int) -> ScanResult:
    """The run of whole committed frames from ``term_offset``, at most ``max_length`` bytes."""
    if not 0 <= term_offset <= term_length or term_offset % FRAME_ALIGNMENT:
        raise ValueError(f"term offset {term_offset} is not a frame boundary inside a term of {term_length}")
    if max_length < 0:
        raise ValueError("max_length must be >= 0")
    result = lib.lb_term_scan(term, term_length, term_offset, max_length)
    if result == lib.LB_CORRUPT_FRAME:
        raise LogCorruptedError(f"corrupted frame header at term offset {term_offset}", term_offset)
    return ScanResult(result & _LOW_32, result >> 32)
