"""``classify``: what a received datagram is, checked frame by frame before anything acts on it.

A datagram is one of:

- data: one or more whole frames back to back, each at ``align(frame length, 32)`` after the previous one,
  all of the same session / stream / term and at consecutive term offsets (the last frame may omit its
  alignment bytes).  The frames are DATA frames, and PAD frames as Aeron's sender scans a term: a PAD ends the
  scan when it covers more than its header, so such a PAD is the last frame and only its 32-byte header
  travels (its frame length still says how much term it covers; its padding bytes are zeros the receiver
  already has).  At a term end this puts DATA frames and a PAD header in one datagram;
- a PAD frame alone: its 32-byte header (or the whole frame) - it covers ``align(frame length, 32)`` bytes of
  term (any length: an aborted claim leaves a PAD of the claimed length plus its header);
- a heartbeat: a lone 32-byte DATA header with frame length 0 (flags 0xE0 when it ends the stream);
- control: one or more SETUP / SM / NAK / RTTM / ERR frames back to back.

Retransmits take the same shapes (the sender rescans the term from the NAKed offset).

Anything else - short, a length that runs past the datagram, a wrong version, a frame type we do not handle,
inconsistent ids or offsets, a frame after a PAD header, data and control mixed - raises
:class:`MalformedFrameError`; the caller counts it as an invalid packet and drops it.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from logbuf.logbuffer.frame import FRAME_ALIGNMENT, HEADER_LENGTH, HEADER_STRUCT
from logbuf.protocol.data import DataHeader
from logbuf.protocol.error_frame import ErrorFrame
from logbuf.protocol.header import CURRENT_VERSION, INT32_MAX, FrameType, MalformedFrameError, read_frame_word
from logbuf.protocol.nak import Nak
from logbuf.protocol.rttm import RttMeasurement
from logbuf.protocol.setup import SetupFrame
from logbuf.protocol.status_message import StatusMessage

ControlFrame = SetupFrame | StatusMessage | Nak | RttMeasurement | ErrorFrame

_CONTROL_DECODERS: dict[int, Any] = {
    FrameType.SETUP: SetupFrame.decode,
    FrameType.SM: StatusMessage.decode,
    FrameType.NAK: Nak.decode,
    FrameType.RTTM: RttMeasurement.decode,
    FrameType.ERR: ErrorFrame.decode,
}


class PacketKind(enum.IntEnum):
    DATA = 1
    PAD = 2
    HEARTBEAT = 3
    CONTROL = 4


class DataPacket(NamedTuple):
    """A datagram of the data plane (DATA frames, a PAD, or a heartbeat) for one session's term."""

    kind: PacketKind
    header: DataHeader  # the first frame's header
    frame_count: int
    length: int  # bytes of the datagram that go into the term
    term_span: int  # bytes of term covered: ``align(length)`` for DATA, the PAD's frame length, 0 for a heartbeat

    @property
    def session_id(self) -> int:
        return self.header.session_id

    @property
    def stream_id(self) -> int:
        return self.header.stream_id

    @property
    def term_id(self) -> int:
        return self.header.term_id

    @property
    def term_offset(self) -> int:
        return self.header.term_offset


class ControlPacket(NamedTuple):
    """A datagram of control frames (usually exactly one)."""

    frames: tuple[ControlFrame, ...]

    @property
    def kind(self) -> PacketKind:
        return PacketKind.CONTROL


Packet = DataPacket | ControlPacket


_DATA = int(FrameType.DATA)
_PAD = int(FrameType.PAD)
_KIND_DATA, _KIND_PAD, _KIND_HEARTBEAT = PacketKind.DATA, PacketKind.PAD, PacketKind.HEARTBEAT
_unpack_header = HEADER_STRUCT.unpack_from
_ALIGN_MASK = -FRAME_ALIGNMENT


def classify(datagram: Any, length: int | None = None) -> Packet:
    """Decodes and checks every frame of ``datagram`` (bytes-like; ``length`` valid bytes, default all)."""
    n = len(datagram) if length is None else length
    if n > len(datagram):
        raise ValueError(f"length {n} exceeds the {len(datagram)}-byte buffer")
    if n >= HEADER_LENGTH:
        # the data plane is the hot path: one unpack of the first header decides and checks it
        fields = _unpack_header(datagram, 0)
        frame_type = fields[3]
        if frame_type in (_DATA, _PAD):
            return _classify_data(datagram, n, fields)
    elif n <= 0:
        raise MalformedFrameError("empty datagram")
    frame_type = read_frame_word(datagram, 0, n)[3]
    if frame_type in (_DATA, _PAD):
        DataHeader.decode(datagram, 0, n)  # shorter than a data header: raises with the reason
    return ControlPacket(_walk_control(datagram, n))


def _classify_data(datagram: Any, n: int, fields: tuple) -> DataPacket:
    frame_length, version, flags, frame_type, term_offset, session_id, stream_id, term_id, reserved = fields
    if version != CURRENT_VERSION:
        raise MalformedFrameError(f"frame version {version} at offset 0, expected {CURRENT_VERSION}")
    if term_offset < 0 or term_offset & (FRAME_ALIGNMENT - 1):
        raise MalformedFrameError(f"term offset {term_offset} is not a frame boundary")
    header = DataHeader(frame_length, term_offset, session_id, stream_id, term_id, flags, frame_type, reserved)
    if frame_type == _DATA and frame_length == 0:
        if n != HEADER_LENGTH:
            raise MalformedFrameError(f"a heartbeat is {HEADER_LENGTH} bytes, not {n}")
        return DataPacket(_KIND_HEARTBEAT, header, 1, n, 0)
    if frame_type == _DATA:
        if frame_length < HEADER_LENGTH:
            raise MalformedFrameError(f"data frame length {frame_length} < {HEADER_LENGTH}")
        aligned = (frame_length + FRAME_ALIGNMENT - 1) & _ALIGN_MASK
        if aligned >= n:  # the common single-frame datagram: nothing to walk
            if frame_length > n or (aligned > n and frame_length != n):
                raise MalformedFrameError(f"frame of {frame_length} bytes runs past the {n}-byte datagram")
            return DataPacket(_KIND_DATA, header, 1, n, aligned)
    count, span = _walk_frames(datagram, n, (session_id, stream_id, term_id), term_offset)
    kind = _KIND_PAD if count == 1 and frame_type == _PAD else _KIND_DATA
    return DataPacket(kind, header, count, n, span)


def _walk_frames(datagram: Any, n: int, ids: tuple[int, int, int], base: int) -> tuple[int, int]:
    """Checks every frame of a data datagram; returns ``(frames, term bytes covered)``."""
    count = 0
    offset = 0
    unpack = _unpack_header
    while offset < n:
        remaining = n - offset
        if remaining < HEADER_LENGTH:
            raise MalformedFrameError(f"{remaining} trailing bytes after the last frame", offset)
        frame_length, version, _, frame_type, term_offset, session_id, stream_id, term_id, _ = unpack(datagram, offset)
        if version != CURRENT_VERSION:
            raise MalformedFrameError(f"frame version {version}", offset)
        if frame_type != _DATA and frame_type != _PAD:
            raise MalformedFrameError(f"frame type {frame_type:#x} after a data frame", offset)
        if (session_id, stream_id, term_id) != ids:
            raise MalformedFrameError("frames of different sessions, streams or terms in one datagram", offset)
        if term_offset != base + offset:
            raise MalformedFrameError(f"frame term offset {term_offset}, expected {base + offset}", offset)
        count += 1
        if frame_type == _PAD:
            # any length from a header up: an aborted claim pads what it claimed (a claim of 100 bytes
            # leaves a PAD of 132), so the frame covers its length aligned, as every frame does
            if frame_length < HEADER_LENGTH:
                raise MalformedFrameError(f"PAD frame length {frame_length} is shorter than its header", offset)
            aligned = (frame_length + FRAME_ALIGNMENT - 1) & _ALIGN_MASK
            if remaining == HEADER_LENGTH:  # the PAD's header alone: it ends the datagram, its frame the span
                span = offset + aligned
                if span > INT32_MAX:
                    raise MalformedFrameError(f"PAD of {frame_length} bytes runs past any term", offset)
                return count, span
            if remaining < aligned and frame_length != remaining:
                raise MalformedFrameError(f"a PAD in a datagram is its header or the whole frame, not "
                                          f"{remaining} bytes", offset)
            offset += aligned
            continue
        if frame_length < HEADER_LENGTH:
            raise MalformedFrameError(f"data frame length {frame_length} inside a data datagram", offset)
        aligned = (frame_length + FRAME_ALIGNMENT - 1) & _ALIGN_MASK
        if aligned > remaining and frame_length != remaining:
            raise MalformedFrameError(f"frame of {frame_length} bytes runs past the {n}-byte datagram", offset)
        offset += aligned
    return count, offset


def _walk_control(datagram: Any, n: int) -> tuple[ControlFrame, ...]:
    frames: list[ControlFrame] = []
    offset = 0
    while offset < n:
        frame_length, _, _, frame_type = read_frame_word(datagram, offset, n)
        decode = _CONTROL_DECODERS.get(frame_type)
        if decode is None:
            kind = FrameType(frame_type).name if frame_type in FrameType._value2member_map_ else "unknown"
            raise MalformedFrameError(f"frame type {frame_type:#x} ({kind}) is not handled here", offset)
        frames.append(decode(datagram, offset, n))
        offset += frame_length  # > 0: every decoder checked frame_length >= its fixed part
    return tuple(frames)


__all__ = ["ControlFrame", "ControlPacket", "DataPacket", "Packet", "PacketKind", "classify"]
