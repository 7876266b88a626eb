"""The SETUP frame (type 0x05): a sender announces a stream so a receiver can create its image.

Sent every 100 ms until the first status message arrives, then again whenever a status message asks for
it (SM flag 0x80, e.g. from a receiver that lost or never had the image).

::

      0                   1                   2                   3
      0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
     +---------------------------------------------------------------+
   0 |                      Frame Length (40)                        |
     +---------------+---------------+-------------------------------+
   4 |    Version    |     Flags     |          Type (0x05)          |
     +---------------+---------------+-------------------------------+
   8 |               Term Offset (of the sender position)            |
     +---------------------------------------------------------------+
  12 |                          Session ID                           |
     +---------------------------------------------------------------+
  16 |                          Stream ID                            |
     +---------------------------------------------------------------+
  20 |                       Initial Term ID                         |
     +---------------------------------------------------------------+
  24 |                  Active Term ID (of the sender position)      |
     +---------------------------------------------------------------+
  28 |                         Term Length                           |
     +---------------------------------------------------------------+
  32 |                             MTU                               |
     +---------------------------------------------------------------+
  36 |                             TTL                               |
     +---------------------------------------------------------------+
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.descriptor import MAX_MTU
from logbuf.logbuffer.frame import FRAME_ALIGNMENT, HEADER_LENGTH
from logbuf.protocol.header import (
    CURRENT_VERSION,
    FrameType,
    MalformedFrameError,
    check_frame_length,
    check_i32,
    check_u8,
    read_frame_word,
)

SETUP_LENGTH = 40
TERM_OFFSET_FIELD_OFFSET = 8
SESSION_ID_FIELD_OFFSET = 12
STREAM_ID_FIELD_OFFSET = 16
INITIAL_TERM_ID_FIELD_OFFSET = 20
ACTIVE_TERM_ID_FIELD_OFFSET = 24
TERM_LENGTH_FIELD_OFFSET = 28
MTU_FIELD_OFFSET = 32
TTL_FIELD_OFFSET = 36

_STRUCT = struct.Struct("<iBBHiiiiiiii")
assert _STRUCT.size == SETUP_LENGTH


class SetupFrame(NamedTuple):
    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu: int
    ttl: int = 0
    flags: int = 0

    def join_position(self) -> int:
        """The stream position the SETUP announces: where a new image starts."""
        return d.compute_position(self.active_term_id, self.term_offset, d.position_bits_to_shift(self.term_length),
                                  self.initial_term_id)

    def encode(self) -> bytes:
        buffer = bytearray(SETUP_LENGTH)
        self.encode_into(buffer)
        return bytes(buffer)

    def encode_into(self, buffer: Any, offset: int = 0) -> int:
        self._check()
        _STRUCT.pack_into(
            buffer, offset, SETUP_LENGTH, CURRENT_VERSION, self.flags, FrameType.SETUP, self.term_offset,
            self.session_id, self.stream_id, self.initial_term_id, self.active_term_id, self.term_length, self.mtu,
            self.ttl,
        )
        return SETUP_LENGTH

    def _check(self) -> None:
        check_u8("flags", self.flags)
        for name in self._fields[:-1]:
            check_i32(name, getattr(self, name))
        problem = _problem(self)
        if problem:
            raise ValueError(problem)

    @classmethod
    def decode(cls, buffer: Any, offset: int = 0, length: int | None = None) -> SetupFrame:
        frame_length, _, flags, frame_type = read_frame_word(buffer, offset, length)
        if frame_type != FrameType.SETUP:
            raise MalformedFrameError(f"frame type {frame_type:#x} is not SETUP", offset)
        available = (len(buffer) if length is None else length) - offset
        check_frame_length("SETUP", frame_length, SETUP_LENGTH, available, offset, exact=True)
        (_, _, _, _, term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu,
         ttl) = _STRUCT.unpack_from(buffer, offset)
        frame = cls(term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu, ttl,
                    flags)
        problem = _problem(frame)
        if problem:
            raise MalformedFrameError(f"SETUP: {problem}", offset)
        return frame


def _problem(frame: SetupFrame) -> str | None:
    try:
        d.check_term_length(frame.term_length)
    except ValueError as exc:
        return str(exc)
    if not HEADER_LENGTH < frame.mtu <= MAX_MTU or frame.mtu % FRAME_ALIGNMENT:
        return f"mtu {frame.mtu} must be a multiple of {FRAME_ALIGNMENT} in ({HEADER_LENGTH}, {MAX_MTU}]"
    if not 0 <= frame.term_offset < frame.term_length or frame.term_offset % FRAME_ALIGNMENT:
        return f"term offset {frame.term_offset} is not a frame boundary in a term of {frame.term_length}"
    if frame.ttl < 0:
        return f"ttl {frame.ttl} is negative"
    return None
