"""The RTT measurement frame (RTTM, type 0x06): a receiver stamps a request; the sender echoes it back with
the time it held the request, so the receiver can compute the round trip.

::

      0                   1                   2                   3
      0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
     +---------------------------------------------------------------+
   0 |                      Frame Length (40)                        |
     +---------------+-+-------------+-------------------------------+
   4 |    Version    |R|   Flags     |          Type (0x06)          |   R=0x80 reply
     +---------------+-+-------------+-------------------------------+
   8 |                          Session ID                           |
     +---------------------------------------------------------------+
  12 |                          Stream ID                            |
     +---------------------------------------------------------------+
  16 |                     Echo Timestamp (ns)                       |
     |                          (64 bits)                            |
     +---------------------------------------------------------------+
  24 |                     Reception Delta (ns)                      |
     |                          (64 bits)                            |
     +---------------------------------------------------------------+
  32 |                         Receiver ID                           |
     |                          (64 bits)                            |
     +---------------------------------------------------------------+
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

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

RTTM_LENGTH = 40
SESSION_ID_FIELD_OFFSET = 8
STREAM_ID_FIELD_OFFSET = 12
ECHO_TIMESTAMP_FIELD_OFFSET = 16
RECEPTION_DELTA_FIELD_OFFSET = 24
RECEIVER_ID_FIELD_OFFSET = 32

REPLY_FLAG = 0x80

_STRUCT = struct.Struct("<iBBHiiqqq")
assert _STRUCT.size == RTTM_LENGTH


class RttMeasurement(NamedTuple):
    session_id: int
    stream_id: int
    echo_timestamp_ns: int
    reception_delta_ns: int
    receiver_id: int
    flags: int = 0

    @property
    def is_reply(self) -> bool:
        return bool(self.flags & REPLY_FLAG)

    def encode(self) -> bytes:
        buffer = bytearray(RTTM_LENGTH)
        self.encode_into(buffer)
        return bytes(buffer)

    def encode_into(self, buffer: Any, offset: int = 0) -> int:
        check_u8("flags", self.flags)
        check_i32("session_id", self.session_id)
        check_i32("stream_id", self.stream_id)
        for name in ("echo_timestamp_ns", "reception_delta_ns", "receiver_id"):
            check_i64(name, getattr(self, name))
        _STRUCT.pack_into(buffer, offset, RTTM_LENGTH, CURRENT_VERSION, self.flags, FrameType.RTTM, self.session_id,
                          self.stream_id, self.echo_timestamp_ns, self.reception_delta_ns, self.receiver_id)
        return RTTM_LENGTH

    @classmethod
    def decode(cls, buffer: Any, offset: int = 0, length: int | None = None) -> RttMeasurement:
        frame_length, _, flags, frame_type = read_frame_word(buffer, offset, length)
        if frame_type != FrameType.RTTM:
            raise MalformedFrameError(f"frame type {frame_type:#x} is not RTTM", offset)
        available = (len(buffer) if length is None else length) - offset
        check_frame_length("RTTM", frame_length, RTTM_LENGTH, available, offset, exact=True)
        _, _, _, _, session_id, stream_id, echo_timestamp_ns, reception_delta_ns, receiver_id = (
            _STRUCT.unpack_from(buffer, offset))
        return cls(session_id, stream_id, echo_timestamp_ns, reception_delta_ns, receiver_id, flags)
