"""The NAK (type 0x02): a receiver asks the sender to resend ``length`` bytes of a term from ``term_offset``.

::

      0                   1                   2                   3
      0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
     +---------------------------------------------------------------+
   0 |                      Frame Length (28)                        |
     +---------------+---------------+-------------------------------+
   4 |    Version    |     Flags     |          Type (0x02)          |
     +---------------+---------------+-------------------------------+
   8 |                          Session ID                           |
     +---------------------------------------------------------------+
  12 |                          Stream ID                            |
     +---------------------------------------------------------------+
  16 |                           Term ID                             |
     +---------------------------------------------------------------+
  20 |                         Term Offset                           |
     +---------------------------------------------------------------+
  24 |                           Length                              |
     +---------------------------------------------------------------+

A gap starts on a frame boundary (term offset a multiple of 32) and has a positive length; anything else is
malformed.  Whether the range is inside the sender's term and retained window is the sender's check
(:class:`logbuf.driver.udp.RetransmitHandler`), since only the sender knows its term length and position.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from logbuf.logbuffer.frame import FRAME_ALIGNMENT
from logbuf.protocol.header import (
    CURRENT_VERSION,
    FrameType,
    MalformedFrameError,
    check_frame_length,
    check_i32,
    check_u8,
    read_frame_word,
)

NAK_LENGTH = 28
SESSION_ID_FIELD_OFFSET = 8
STREAM_ID_FIELD_OFFSET = 12
TERM_ID_FIELD_OFFSET = 16
TERM_OFFSET_FIELD_OFFSET = 20
LENGTH_FIELD_OFFSET = 24

_STRUCT = struct.Struct("<iBBHiiiii")
assert _STRUCT.size == NAK_LENGTH


class Nak(NamedTuple):
    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int
    flags: int = 0

    def encode(self) -> bytes:
        buffer = bytearray(NAK_LENGTH)
        self.encode_into(buffer)
        return bytes(buffer)

    def encode_into(self, buffer: Any, offset: int = 0) -> int:
        check_u8("flags", self.flags)
        for name in self._fields[:5]:
            check_i32(name, getattr(self, name))
        problem = _problem(self)
        if problem:
            raise ValueError(problem)
        _STRUCT.pack_into(buffer, offset, NAK_LENGTH, CURRENT_VERSION, self.flags, FrameType.NAK, self.session_id,
                          self.stream_id, self.term_id, self.term_offset, self.length)
        return NAK_LENGTH

    @classmethod
    def decode(cls, buffer: Any, offset: int = 0, length: int | None = None) -> Nak:
        frame_length, _, flags, frame_type = read_frame_word(buffer, offset, length)
        if frame_type != FrameType.NAK:
            raise MalformedFrameError(f"frame type {frame_type:#x} is not NAK", offset)
        available = (len(buffer) if length is None else length) - offset
        check_frame_length("NAK", frame_length, NAK_LENGTH, available, offset, exact=True)
        _, _, _, _, session_id, stream_id, term_id, term_offset, nak_length = _STRUCT.unpack_from(buffer, offset)
        nak = cls(session_id, stream_id, term_id, term_offset, nak_length, flags)
        problem = _problem(nak)
        if problem:
            raise MalformedFrameError(f"NAK: {problem}", offset)
        return nak


def _problem(nak: Nak) -> str | None:
    if nak.term_offset < 0 or nak.term_offset % FRAME_ALIGNMENT:
        return f"term offset {nak.term_offset} is not a frame boundary"
    if nak.length <= 0:
        return f"length {nak.length} must be positive"
    return None
