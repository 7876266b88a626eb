"""The data frame header (Aeron's ``DataHeaderFlyweight``): 32 bytes, little-endian, 32-byte aligned frames.

::

      0                   1                   2                   3
      0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
     +---------------------------------------------------------------+
   0 |R|                       Frame Length                          |   < 0 while written, > 0 committed
     +---------------+-+-+-+---------+-------------------------------+
   4 |   Version     |B|E|S| Flags   |             Type              |   B=BEGIN E=END S=EOS
     +---------------+-+-+-+---------+-------------------------------+
   8 |                         Term Offset                           |
     +---------------------------------------------------------------+
  12 |                         Session ID                            |
     +---------------------------------------------------------------+
  16 |                         Stream ID                             |
     +---------------------------------------------------------------+
  20 |                          Term ID                              |
     +---------------------------------------------------------------+
  24 |                       Reserved Value                          |
     |                          (64 bits)                            |
     +---------------------------------------------------------------+
  32 |                           Payload ...                         |
"""

from __future__ import annotations

import struct

HEADER_LENGTH = 32
FRAME_ALIGNMENT = 32

FRAME_LENGTH_OFFSET = 0
VERSION_OFFSET = 4
FLAGS_OFFSET = 5
TYPE_OFFSET = 6
TERM_OFFSET_OFFSET = 8
SESSION_ID_OFFSET = 12
STREAM_ID_OFFSET = 16
TERM_ID_OFFSET = 20
RESERVED_VALUE_OFFSET = 24

CURRENT_VERSION = 0

BEGIN_FLAG = 0x80
END_FLAG = 0x40
EOS_FLAG = 0x20
UNFRAGMENTED = BEGIN_FLAG | END_FLAG

HDR_TYPE_PAD = 0x00
HDR_TYPE_DATA = 0x01
HDR_TYPE_NAK = 0x02
HDR_TYPE_SM = 0x03
HDR_TYPE_ERR = 0x04
HDR_TYPE_SETUP = 0x05
HDR_TYPE_RTTM = 0x06
HDR_TYPE_RES = 0x07
HDR_TYPE_RSP_SETUP = 0x0B
HDR_TYPE_EXT = 0xFFFF

#: the whole header as one struct: length, version, flags, type, term offset, session, stream, term id, reserved
HEADER_STRUCT = struct.Struct("<iBBHiiiiq")
assert HEADER_STRUCT.size == HEADER_LENGTH


def align(value: int, alignment: int = FRAME_ALIGNMENT) -> int:
    """``value`` rounded up to a multiple of ``alignment`` (a power of two)."""
    return (value + alignment - 1) & ~(alignment - 1)
