"""``Header``: a flyweight over the frame header of the fragment a handler is being given.

One instance per image is re-pointed at each fragment (nothing is allocated per message); fields are read
from shared memory only when asked for.  Valid only inside the handler call.
"""

from __future__ import annotations

import struct

from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U16 = struct.Struct("<H")


class Header:
    __slots__ = ("buffer", "offset", "initial_term_id", "position_bits")

    def __init__(self, initial_term_id: int, position_bits: int) -> None:
        self.buffer: memoryview | None = None  # the term the fragment is in
        self.offset = 0  # frame offset inside that term
        self.initial_term_id = initial_term_id
        self.position_bits = position_bits

    def _i32(self, field: int) -> int:
        return _I32.unpack_from(self.buffer, self.offset + field)[0]

    @property
    def frame_length(self) -> int:
        return self._i32(f.FRAME_LENGTH_OFFSET)

    @property
    def flags(self) -> int:
        return self.buffer[self.offset + f.FLAGS_OFFSET]

    @property
    def type(self) -> int:
        return _U16.unpack_from(self.buffer, self.offset + f.TYPE_OFFSET)[0]

    @property
    def term_offset(self) -> int:
        return self.offset

    @property
    def session_id(self) -> int:
        return self._i32(f.SESSION_ID_OFFSET)

    @property
    def stream_id(self) -> int:
        return self._i32(f.STREAM_ID_OFFSET)

    @property
    def term_id(self) -> int:
        return self._i32(f.TERM_ID_OFFSET)

    @property
    def reserved_value(self) -> int:
        return _I64.unpack_from(self.buffer, self.offset + f.RESERVED_VALUE_OFFSET)[0]

    @property
    def position(self) -> int:
        """The stream position just after this fragment."""
        return d.compute_position(
            self.term_id, self.offset + f.align(self.frame_length), self.position_bits, self.initial_term_id
        )

    def __repr__(self) -> str:
        if self.buffer is None:
            return "Header(<unbound>)"
        return (
            f"Header(position={self.position}, session_id={self.session_id}, stream_id={self.stream_id}, "
            f"term_id={self.term_id}, term_offset={self.offset}, flags=0x{self.flags:02x}, "
            f"reserved_value={self.reserved_value})"
        )
