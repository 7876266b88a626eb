"""The shared-memory structures of ``cnc.dat`` (Aeron's command-and-control file), one module per concept:

``layout`` (header, section offsets), ``ring_buffer`` (to-driver commands), ``broadcast`` (to-clients
responses), ``counters`` (values + metadata), ``error_log`` (distinct errors), ``messages`` (command and
response bodies) and ``cnc_file`` (creating/opening the file).
"""

from logbuf.cnc.broadcast import BroadcastReceiver, BroadcastTransmitter, CopyBroadcastReceiver
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.counters import CounterInfo, CountersManager, CountersReader
from logbuf.cnc.error_log import DistinctErrorLog, ErrorLogReader, ErrorObservation
from logbuf.cnc.errors import (
    BroadcastCorruptedError,
    BroadcastLappedError,
    CncFileError,
    CncMissingError,
    CncNotReadyError,
    CncVersionError,
    CountersFullError,
    CounterStateError,
    MalformedCommandError,
    RingBufferCorruptedError,
    UnknownCommandTypeError,
)
from logbuf.cnc.layout import CNC_VERSION, CncLayout
from logbuf.cnc.messages import ControlCommand, ControlResponse, ErrorCode, decode_command, decode_response
from logbuf.cnc.ring_buffer import ManyToOneRingBuffer

__all__ = [
    "CNC_VERSION",
    "BroadcastCorruptedError",
    "BroadcastLappedError",
    "BroadcastReceiver",
    "BroadcastTransmitter",
    "CncFile",
    "CncFileError",
    "CncLayout",
    "CncMissingError",
    "CncNotReadyError",
    "CncVersionError",
    "ControlCommand",
    "ControlResponse",
    "CopyBroadcastReceiver",
    "CounterInfo",
    "CounterStateError",
    "CountersFullError",
    "CountersManager",
    "CountersReader",
    "DistinctErrorLog",
    "ErrorCode",
    "ErrorLogReader",
    "ErrorObservation",
    "MalformedCommandError",
    "ManyToOneRingBuffer",
    "RingBufferCorruptedError",
    "UnknownCommandTypeError",
    "decode_command",
    "decode_response",
]
