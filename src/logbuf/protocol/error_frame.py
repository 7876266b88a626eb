"""The error frame (ERR, type 0x04): a receiver tells a sender why it rejects its stream.

::

      0                   1                   2                   3
      0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
     +---------------------------------------------------------------+
   0 |                  Frame Length (40 + text)                     |
     +---------------+---------------+-------------------------------+
   4 |    Version    |     Flags     |          Type (0x04)          |
     +---------------+---------------+-------------------------------+
   8 |                          Session ID                           |
     +---------------------------------------------------------------+
  12 |                          Stream ID                            |
     +---------------------------------------------------------------+
  16 |                         Receiver ID                           |
     |                          (64 bits)                            |
     +---------------------------------------------------------------+
  24 |                          Group Tag                            |
     |                          (64 bits)                            |
     +---------------------------------------------------------------+
  32 |                          Error Code                           |
     +---------------------------------------------------------------+
  36 |                      Error Text Length                        |
     +---------------------------------------------------------------+
  40 |                     Error Text (UTF-8) ...                    |
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

ERROR_HEADER_LENGTH = 40
SESSION_ID_FIELD_OFFSET = 8
STREAM_ID_FIELD_OFFSET = 12
RECEIVER_ID_FIELD_OFFSET = 16
GROUP_TAG_FIELD_OFFSET = 24
ERROR_CODE_FIELD_OFFSET = 32
ERROR_LENGTH_FIELD_OFFSET = 36
ERROR_TEXT_OFFSET = 40
MAX_ERROR_TEXT_LENGTH = 1023

_STRUCT = struct.Struct("<iBBHiiqqii")
assert _STRUCT.size == ERROR_HEADER_LENGTH


class ErrorFrame(NamedTuple):
    session_id: int
    stream_id: int
    receiver_id: int
    group_tag: int
    error_code: int
    message: str
    flags: int = 0

    def _text(self) -> bytes:
        text = self.message.encode("utf-8")
        if len(text) > MAX_ERROR_TEXT_LENGTH:
            raise ValueError(f"error text of {len(text)} bytes > {MAX_ERROR_TEXT_LENGTH}")
        return text

    @property
    def frame_length(self) -> int:
        return ERROR_HEADER_LENGTH + len(self._text())

    def encode(self) -> bytes:
        buffer = bytearray(self.frame_length)
        self.encode_into(buffer)
        return bytes(buffer)

    def encode_into(self, buffer: Any, offset: int = 0) -> int:
        check_u8("flags", self.flags)
        for name in ("session_id", "stream_id", "error_code"):
            check_i32(name, getattr(self, name))
        check_i64("receiver_id", self.receiver_id)
        check_i64("group_tag", self.group_tag)
        text = self._text()
        _STRUCT.pack_into(buffer, offset, ERROR_HEADER_LENGTH + len(text), CURRENT_VERSION, self.flags, FrameType.ERR,
                          self.session_id, self.stream_id, self.receiver_id, self.group_tag, self.error_code,
                          len(text))
        start = offset + ERROR_TEXT_OFFSET
        buffer[start : start + len(text)] = text
        return ERROR_HEADER_LENGTH + len(text)

    @classmethod
    def decode(cls, buffer: Any, offset: int = 0, length: int | None = None) -> ErrorFrame:
        frame_length, _, flags, frame_type = read_frame_word(buffer, offset, length)
        if frame_type != FrameType.ERR:
            raise MalformedFrameError(f"frame type {frame_type:#x} is not ERR", offset)
        available = (len(buffer) if length is None else length) - offset
        check_frame_length("ERR", frame_length, ERROR_HEADER_LENGTH, available, offset)
        session_id, stream_id, receiver_id, group_tag, code, text_length = _STRUCT.unpack_from(buffer, offset)[4:]
        if not 0 <= text_length <= MAX_ERROR_TEXT_LENGTH or ERROR_HEADER_LENGTH + text_length != frame_length:
            raise MalformedFrameError(
                f"ERR text length {text_length} does not match frame length {frame_length}", offset
            )
        start = offset + ERROR_TEXT_OFFSET
        try:
            message = bytes(buffer[start : start + text_length]).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedFrameError("ERR text is not UTF-8", offset) from None
        return cls(session_id, stream_id, receiver_id, group_tag, code, message, flags)
