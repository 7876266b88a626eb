"""``TermRebuilder``: puts received DATA/PAD frames into an image's term at their term offset.

As the transport core publishes a frame, so does the rebuilder: everything after the first 4 bytes is copied
first, then the frame length is stored with release - a subscriber that sees the length sees the frame.
A frame already there (its length word is non-zero) is a duplicate and is not touched.

A datagram may hold several frames.  The rebuilder starts at the first frame that is not yet in the term
and copies from there to the end of the datagram in one go, releasing that frame's length last: frames after
it become visible together with it (a subscriber reads in order and cannot be past a frame that is missing),
and any of them already present are rewritten with the same bytes.  Only the receiver thread writes an image,
so plain reads of the length words are enough here.

Also writes the PAD frame that fills a gap given up on (``fill_gap``).
"""

from __future__ import annotations

from typing import Any

from logbuf.logbuffer.frame import FRAME_ALIGNMENT, HEADER_LENGTH, HEADER_STRUCT, UNFRAGMENTED
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import lib
from logbuf.protocol.header import FrameType


class TermRebuilder:
    __slots__ = ("term_length", "_view", "_words", "_base", "_session_id", "_stream_id")

    def __init__(self, log: LogBuffers) -> None:
        self.term_length = log.term_length
        self._view = log.terms.view
        self._words = self._view.cast("i")
        self._base = log.term_pointer(0)
        self._session_id = log.session_id
        self._stream_id = log.stream_id

    def is_present(self, index: int, term_offset: int) -> bool:
        return self._words[(index * self.term_length + term_offset) >> 2] != 0

    def insert(self, index: int, term_offset: int, datagram: Any, length: int) -> int:
        """Inserts ``length`` bytes of frames (already checked by ``classify``) at ``term_offset`` of term
        ``index``; returns the bytes written (0 for a duplicate)."""
        if not 0 <= term_offset <= self.term_length - length or term_offset % FRAME_ALIGNMENT:
            raise ValueError(f"{length} bytes at term offset {term_offset} do not fit a term of {self.term_length}")
        words = self._words
        base = index * self.term_length + term_offset
        start = 0
        while words[(base + start) >> 2] != 0:  # skip the frames we already have
            frame_length = int.from_bytes(datagram[start : start + 4], "little", signed=True)
            start += (max(frame_length, HEADER_LENGTH) + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            if start >= length:
                return 0
        frame_length = int.from_bytes(datagram[start : start + 4], "little", signed=True)
        at = base + start
        self._view[at + 4 : base + length] = datagram[start + 4 : length]
        lib.lb_put_i32_release(self._base + at, frame_length)
        return length - start

    def fill_gap(self, index: int, term_id: int, term_offset: int, length: int) -> None:
        """Writes a PAD frame over ``[term_offset, term_offset + length)`` (a gap nobody will resend)."""
        if length < HEADER_LENGTH or length % FRAME_ALIGNMENT or not 0 <= term_offset <= self.term_length - length:
            raise ValueError(f"gap of {length} at {term_offset} is not whole frames inside the term")
        at = index * self.term_length + term_offset
        header = HEADER_STRUCT.pack(length, 0, UNFRAGMENTED, FrameType.PAD, term_offset, self._session_id,
                                    self._stream_id, term_id, 0)
        self._view[at + 4 : at + HEADER_LENGTH] = header[4:]
        lib.lb_put_i32_release(self._base + at, length)
