"""DATA and PAD frames on the wire, and the heartbeat (Aeron's ``DataHeaderFlyweight``).

On the wire a DATA/PAD frame is byte for byte the frame in the term: the 32-byte header drawn in
:mod:`logbuf.logbuffer.frame` (one drawing of one layout), then the payload:

- The type is 0 for PAD, 1 for DATA.
- A datagram carries one or more whole DATA frames, each at ``align(frame length, 32)`` after the previous
  (the sender sends them as they lie in the term, alignment bytes included).
- A PAD frame is sent as its 32-byte header alone: its frame length says how much term it covers.
- A heartbeat is a lone 32-byte DATA header with frame length 0 at the sender's position (EOS flag set once
  the publication has ended there).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from logbuf.logbuffer.frame import (
    BEGIN_FLAG,
    EOS_FLAG,
    FRAME_ALIGNMENT,
    HEADER_LENGTH,
    HEADER_STRUCT,
    RESERVED_VALUE_OFFSET,
    SESSION_ID_OFFSET,
    STREAM_ID_OFFSET,
    TERM_ID_OFFSET,
    TERM_OFFSET_OFFSET,
    UNFRAGMENTED,
    align,
)
from logbuf.protocol.header import (
    CURRENT_VERSION,
    FrameType,
    MalformedFrameError,
    check_i32,
    check_i64,
    check_u8,
    read_frame_word,
)

DATA_HEADER_LENGTH = HEADER_LENGTH
HEARTBEAT_LENGTH = HEADER_LENGTH

__all__ = [
    "BEGIN_FLAG",
    "DATA_HEADER_LENGTH",
    "EOS_FLAG",
    "HEARTBEAT_LENGTH",
    "RESERVED_VALUE_OFFSET",
    "SESSION_ID_OFFSET",
    "STREAM_ID_OFFSET",
    "TERM_ID_OFFSET",
    "TERM_OFFSET_OFFSET",
    "UNFRAGMENTED",
    "DataHeader",
    "encode_data_frame",
]


class DataHeader(NamedTuple):
    """The 32-byte header of a DATA or PAD frame (or a heartbeat: DATA with ``frame_length == 0``)."""

    frame_length: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    flags: int = UNFRAGMENTED
    frame_type: int = FrameType.DATA
    reserved_value: int = 0

    @classmethod
    def heartbeat(
        cls, session_id: int, stream_id: int, term_id: int, term_offset: int, *, end_of_stream: bool = False
    ) -> DataHeader:
        flags = UNFRAGMENTED | (EOS_FLAG if end_of_stream else 0)
        return cls(0, term_offset, session_id, stream_id, term_id, flags, FrameType.DATA)

    @property
    def is_heartbeat(self) -> bool:
        return self.frame_length == 0 and self.frame_type == FrameType.DATA

    @property
    def is_padding(self) -> bool:
        return self.frame_type == FrameType.PAD

    @property
    def is_end_of_stream(self) -> bool:
        return bool(self.flags & EOS_FLAG)

    def encode(self) -> bytes:
        self._check()
        return HEADER_STRUCT.pack(
            self.frame_length, CURRENT_VERSION, self.flags, self.frame_type, self.term_offset, self.session_id,
            self.stream_id, self.term_id, self.reserved_value,
        )

    def encode_into(self, buffer: Any, offset: int = 0) -> int:
        self._check()
        HEADER_STRUCT.pack_into(
            buffer, offset, self.frame_length, CURRENT_VERSION, self.flags, self.frame_type, self.term_offset,
            self.session_id, self.stream_id, self.term_id, self.reserved_value,
        )
        return DATA_HEADER_LENGTH

    def _check(self) -> None:
        if self.frame_type not in (FrameType.DATA, FrameType.PAD):
            raise ValueError(f"a data header has type DATA or PAD, not {self.frame_type}")
        if self.frame_length != 0 and self.frame_length < DATA_HEADER_LENGTH:
            raise ValueError(f"frame length {self.frame_length}: 0 (heartbeat) or >= {DATA_HEADER_LENGTH}")
        if self.frame_type == FrameType.PAD and self.frame_length == 0:
            raise ValueError("a PAD frame covers at least its header: length 0")
        if self.term_offset < 0 or self.term_offset % FRAME_ALIGNMENT:
            raise ValueError(f"term offset {self.term_offset} must be >= 0 and a multiple of {FRAME_ALIGNMENT}")
        check_u8("flags", self.flags)
        for name in ("frame_length", "session_id", "stream_id", "term_id"):
            check_i32(name, getattr(self, name))
        check_i64("reserved_value", self.reserved_value)

    @classmethod
    def decode(cls, buffer: Any, offset: int = 0, length: int | None = None) -> DataHeader:
        """Decodes and checks one header (not the frames after it: see :func:`logbuf.protocol.classify`)."""
        frame_length, _, flags, frame_type = read_frame_word(buffer, offset, length)
        available = (len(buffer) if length is None else length) - offset
        if frame_type not in (FrameType.DATA, FrameType.PAD):
            raise MalformedFrameError(f"frame type {frame_type:#x} is not DATA or PAD", offset)
        if available < DATA_HEADER_LENGTH:
            raise MalformedFrameError(f"{available} bytes: too short for a {DATA_HEADER_LENGTH}-byte data header", offset)
        _, _, _, _, term_offset, session_id, stream_id, term_id, reserved = HEADER_STRUCT.unpack_from(buffer, offset)
        header = cls(frame_length, term_offset, session_id, stream_id, term_id, flags, frame_type, reserved)
        if frame_length == 0:
            if frame_type != FrameType.DATA:
                raise MalformedFrameError("a PAD frame of length 0", offset)
        elif frame_length < DATA_HEADER_LENGTH:
            raise MalformedFrameError(f"data frame length {frame_length} < {DATA_HEADER_LENGTH}", offset)
        if term_offset < 0 or term_offset % FRAME_ALIGNMENT:
            raise MalformedFrameError(f"term offset {term_offset} is not a frame boundary", offset)
        return header


def encode_data_frame(
    payload: bytes,
    *,
    term_offset: int,
    session_id: int,
    stream_id: int,
    term_id: int,
    flags: int = UNFRAGMENTED,
    reserved_value: int = 0,
    aligned: bool = True,
) -> bytes:
    """One DATA frame (header + payload), zero-filled to the 32-byte alignment unless ``aligned=False``."""
    frame_length = DATA_HEADER_LENGTH + len(payload)
    header = DataHeader(frame_length, term_offset, session_id, stream_id, term_id, flags, FrameType.DATA,
                        reserved_value).encode()
    frame = header + bytes(payload)
    if aligned:
        frame += bytes(align(frame_length) - frame_length)
    return frame
