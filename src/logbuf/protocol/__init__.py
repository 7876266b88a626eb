"""Aeron's UDP wire protocol: codecs for every frame, and ``classify`` for received datagrams.

Encode with ``Frame(...).encode()`` / ``encode_into(buffer, offset)``; decode with ``Frame.decode(buffer)``,
which checks lengths and fields and raises :class:`MalformedFrameError` for anything short or inconsistent.
``classify(datagram)`` walks every frame of a datagram and says what it is.  Layouts are drawn in each module.
"""

from logbuf.native import check_control_layout
from logbuf.protocol import error_frame, nak, rttm, setup, status_message
from logbuf.protocol.data import DATA_HEADER_LENGTH, HEARTBEAT_LENGTH, DataHeader, encode_data_frame
from logbuf.protocol.datagram import ControlFrame, ControlPacket, DataPacket, Packet, PacketKind, classify
from logbuf.protocol.error_frame import ERROR_HEADER_LENGTH, ErrorFrame
from logbuf.protocol.header import CURRENT_VERSION, FRAME_HEADER_LENGTH, FrameType, MalformedFrameError
from logbuf.protocol.nak import NAK_LENGTH, Nak
from logbuf.protocol.rttm import REPLY_FLAG, RTTM_LENGTH, RttMeasurement
from logbuf.protocol.setup import SETUP_LENGTH, SetupFrame
from logbuf.protocol.status_message import (
    END_OF_STREAM_FLAG,
    SEND_SETUP_FLAG,
    STATUS_MESSAGE_LENGTH,
    StatusMessage,
)

# the driver's C reads and writes these frames with its own copy of their layouts (native/include/lb_control.h):
# refuse to run with a build that disagrees with the codecs here
check_control_layout(
    {"status_message": status_message, "nak": nak, "setup": setup, "rttm": rttm, "error_frame": error_frame}
)

__all__ = [
    "CURRENT_VERSION",
    "DATA_HEADER_LENGTH",
    "END_OF_STREAM_FLAG",
    "ERROR_HEADER_LENGTH",
    "FRAME_HEADER_LENGTH",
    "HEARTBEAT_LENGTH",
    "NAK_LENGTH",
    "REPLY_FLAG",
    "RTTM_LENGTH",
    "SEND_SETUP_FLAG",
    "SETUP_LENGTH",
    "STATUS_MESSAGE_LENGTH",
    "ControlFrame",
    "ControlPacket",
    "DataHeader",
    "DataPacket",
    "ErrorFrame",
    "FrameType",
    "MalformedFrameError",
    "Nak",
    "Packet",
    "PacketKind",
    "RttMeasurement",
    "SetupFrame",
    "StatusMessage",
    "classify",
    "encode_data_frame",
]
