"""``TermScanner``: finds a run of whole committed frames up to a byte limit (what a sender puts in one
datagram).  A PAD frame is only taken as the first frame; then only its header is sent and its body is
reported as padding to skip."""

from __future__ import annotations

from typing import Any, NamedTuple

from logbuf.errors import LogCorruptedError
from logbuf.native import lib


class ScanResult(NamedTuple):
    available: int  # bytes of whole frames to send
    padding: int  # bytes to skip after them (body of a leading PAD frame)


def scan_for_availability(term: Any, term_length: int, term_offset: int, max_length: int) -> ScanResult:
    if not 0 <= term_offset <= term_length or term_offset % 32:
        raise ValueError(f"term offset {term_offset} is not a frame boundary inside a term of {term_length}")
    if max_length < 0:
        raise ValueError("max_length must be >= 0")
    result = lib.lb_term_scan(term, term_length, term_offset, max_length)
    if result == lib.LB_CORRUPT_FRAME:
        raise LogCorruptedError(f"corrupted frame header at term offset {term_offset}", term_offset)
    return ScanResult(result & 0xFFFFFFFF, result >> 32)
