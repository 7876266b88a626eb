"""The status message (SM, type 0x03): a receiver tells the sender how far its subscribers have consumed and
how much more it may send (flow control), and asks for a SETUP when it has no image.

::

      0                   1                   2                   3
      0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
     +---------------------------------------------------------------+
   0 |                   Frame Length (36 + feedback)                |
     +---------------+-+-+-----------+-------------------------------+
   4 |    Version    |S|E|  Flags    |          Type (0x03)          |   S=0x80 send SETUP, E=0x40 EOS
     +---------------+-+-+-----------+-------------------------------+
   8 |                          Session ID                           |
     +---------------------------------------------------------------+
  12 |                          Stream ID                            |
     +---------------------------------------------------------------+
  16 |                     Consumption Term ID                       |
     +---------------------------------------------------------------+
  20 |                   Consumption Term Offset                     |
     +---------------------------------------------------------------+
  24 |                       Receiver Window                         |
     +---------------------------------------------------------------+
  28 |                         Receiver ID                           |
     |                          (64 bits)                            |
     +---------------------------------------------------------------+
  36 |            Application-specific feedback (optional) ...       |
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from logbuf.logbuffer import descriptor as d
from logbuf.protocol.header import (
    CURRENT_VERSION,
    FrameType,
    MalformedFrameError,
    check_frame_length,
    check_i32,
    check_i64,
    check_u8,
    read_frame_word,
)

STATUS_MESSAGE_LENGTH = 36
SESSION_ID_FIELD_OFFSET = 8
STREAM_ID_FIELD_OFFSET = 12
CONSUMPTION_TERM_ID_FIELD_OFFSET = 16
CONSUMPTION_TERM_OFFSET_FIELD_OFFSET = 20
RECEIVER_WINDOW_FIELD_OFFSET = 24
RECEIVER_ID_FIELD_OFFSET = 28
FEEDBACK_OFFSET = 36

SEND_SETUP_FLAG = 0x80
END_OF_STREAM_FLAG = 0x40

_STRUCT = struct.Struct("<iBBHiiiiiq")
assert _STRUCT.size == STATUS_MESSAGE_LENGTH


class StatusMessage(NamedTuple):
    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    receiver_id: int
    flags: int = 0
    feedback: bytes = b""

    @classmethod
    def at_position(
        cls, session_id: int, stream_id: int, position: int, position_bits: int, initial_term_id: int,
        receiver_window: int, receiver_id: int, flags: int = 0,
    ) -> StatusMessage:
        term_id = d.compute_term_id_from_position(position, position_bits, initial_term_id)
        term_offset = d.compute_term_offset_from_position(position, position_bits)
        return cls(session_id, stream_id, term_id, term_offset, receiver_window, receiver_id, flags)

    @property
    def is_setup_requested(self) -> bool:
        return bool(self.flags & SEND_SETUP_FLAG)

    @property
    def is_end_of_stream(self) -> bool:
        return bool(self.flags & END_OF_STREAM_FLAG)

    def position(self, position_bits: int, initial_term_id: int) -> int:
        """The consumption position this SM reports, in the sender's position space."""
        return d.compute_position(self.consumption_term_id, self.consumption_term_offset, position_bits,
                                  initial_term_id)

    @property
    def frame_length(self) -> int:
        return STATUS_MESSAGE_LENGTH + len(self.feedback)

    def encode(self) -> bytes:
        buffer = bytearray(self.frame_length)
        self.encode_into(buffer)
        return bytes(buffer)

    def encode_into(self, buffer: Any, offset: int = 0) -> int:
        check_u8("flags", self.flags)
        for name in self._fields[:5]:
            check_i32(name, getattr(self, name))
        check_i64("receiver_id", self.receiver_id)
        if self.consumption_term_offset < 0 or self.receiver_window < 0:
            raise ValueError("consumption term offset and receiver window must be >= 0")
        _STRUCT.pack_into(
            buffer, offset, self.frame_length, CURRENT_VERSION, self.flags, FrameType.SM, self.session_id,
            self.stream_id, self.consumption_term_id, self.consumption_term_offset, self.receiver_window,
            self.receiver_id,
        )
        end = offset + STATUS_MESSAGE_LENGTH
        buffer[end : end + len(self.feedback)] = self.feedback
        return self.frame_length

    @classmethod
    def decode(cls, buffer: Any, offset: int = 0, length: int | None = None) -> StatusMessage:
        frame_length, _, flags, frame_type = read_frame_word(buffer, offset, length)
        if frame_type != FrameType.SM:
            raise MalformedFrameError(f"frame type {frame_type:#x} is not SM", offset)
        available = (len(buffer) if length is None else length) - offset
        check_frame_length("SM", frame_length, STATUS_MESSAGE_LENGTH, available, offset)
        (_, _, _, _, session_id, stream_id, consumption_term_id, consumption_term_offset, receiver_window,
         receiver_id) = _STRUCT.unpack_from(buffer, offset)
        feedback = bytes(buffer[offset + STATUS_MESSAGE_LENGTH : offset + frame_length])
        sm = cls(session_id, stream_id, consumption_term_id, consumption_term_offset, receiver_window,
                 receiver_id, flags, feedback)
        if sm.consumption_term_offset < 0:
            raise MalformedFrameError(f"SM consumption term offset {sm.consumption_term_offset} < 0", offset)
        if sm.receiver_window < 0:
            raise MalformedFrameError(f"SM receiver window {sm.receiver_window} < 0", offset)
        return sm
