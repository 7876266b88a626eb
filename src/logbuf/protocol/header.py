"""The 8-byte word every UDP frame starts with, the frame types, and the error for malformed frames.

::

      0                   1                   2                   3
      0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
     +---------------------------------------------------------------+
   0 |                         Frame Length                          |
     +---------------+---------------+-------------------------------+
   4 |    Version    |     Flags     |             Type              |
     +---------------+---------------+-------------------------------+
   8 |                  type-specific fields ...                     |

All integers are little-endian.  Ids (session, stream, term) are signed int32 as in Aeron.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

from logbuf.errors import LogbufError

FRAME_LENGTH_OFFSET = 0
VERSION_OFFSET = 4
FLAGS_OFFSET = 5
TYPE_OFFSET = 6
FRAME_HEADER_LENGTH = 8

CURRENT_VERSION = 0

#: length, version, flags, type
FRAME_WORD = struct.Struct("<iBBH")
assert FRAME_WORD.size == FRAME_HEADER_LENGTH

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class FrameType(enum.IntEnum):
    PAD = 0x00
    DATA = 0x01
    NAK = 0x02
    SM = 0x03
    ERR = 0x04
    SETUP = 0x05
    RTTM = 0x06
    RES = 0x07
    RSP_SETUP = 0x0B
    EXT = 0xFFFF


class MalformedFrameError(LogbufError, ValueError):
    """A datagram or frame that is short, inconsistent or not one of ours; ``offset`` is where in the
    datagram the problem was found."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset


def read_frame_word(buffer: Any, offset: int = 0, length: int | None = None) -> tuple[int, int, int, int]:
    """``(frame_length, version, flags, type)`` at ``offset``; checks that the 8 bytes are there and the
    version is ours.  ``length`` is the number of valid bytes in ``buffer`` (default: all of it)."""
    available = (len(buffer) if length is None else length) - offset
    if available < FRAME_HEADER_LENGTH:
        raise MalformedFrameError(f"{available} bytes left at offset {offset}: too short for a frame header", offset)
    frame_length, version, flags, frame_type = FRAME_WORD.unpack_from(buffer, offset)
    if version != CURRENT_VERSION:
        raise MalformedFrameError(f"frame version {version} at offset {offset}, expected {CURRENT_VERSION}", offset)
    return frame_length, version, flags, frame_type


def check_frame_length(
    name: str, frame_length: int, min_length: int, available: int, offset: int, *, exact: bool = False
) -> None:
    """The declared ``frame_length`` must be at least the fixed part and fit in the bytes that arrived."""
    if frame_length < min_length or (exact and frame_length != min_length):
        raise MalformedFrameError(f"{name} frame length {frame_length} < {min_length}", offset)
    if frame_length > available:
        raise MalformedFrameError(f"{name} frame length {frame_length} exceeds the {available} bytes received", offset)


def check_i32(name: str, value: int) -> None:
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"{name} {value} does not fit in an int32")


def check_i64(name: str, value: int) -> None:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{name} {value} does not fit in an int64")


def check_u8(name: str, value: int) -> None:
    if not 0 <= value <= 0xFF:
        raise ValueError(f"{name} {value} does not fit in a byte")
