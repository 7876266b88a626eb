"""logbuf: an Aeron-style shared-memory log-buffer transport for Python.

The public API is re-exported here; see README.md for the architecture.
"""

from logbuf.client.client import Client, connect
from logbuf.client.fragment_assembler import FragmentAssembler
from logbuf.client.image import ControlledPollAction, FragmentBatch, Image
from logbuf.client.publication import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    BatchResult,
    BufferClaim,
    ConcurrentPublication,
    ExclusivePublication,
    Publication,
    PublicationResult,
)
from logbuf.client.subscription import Subscription
from logbuf.driver.context import DriverContext
from logbuf.driver.media_driver import ActiveDriverError, DriverDirectoryError, MediaDriver
from logbuf.errors import (
    ClaimStateError,
    ClientTimeoutError,
    ClosedError,
    DriverTimeout,
    InvalidLogBufferError,
    LogbufError,
    LogCorruptedError,
    MessageTooLargeError,
    RegistrationError,
)
from logbuf.idle import (
    BackoffIdleStrategy,
    BusySpinIdleStrategy,
    SleepingIdleStrategy,
    YieldingIdleStrategy,
)
from logbuf.logbuffer.header import Header
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import AtomicBuffer
from logbuf.position import Position

__version__ = "0.1.0"

__all__ = [
    "ActiveDriverError",
    "Client",
    "ClientTimeoutError",
    "DriverContext",
    "DriverDirectoryError",
    "DriverTimeout",
    "MediaDriver",
    "RegistrationError",
    "connect",
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "AtomicBuffer",
    "BackoffIdleStrategy",
    "BatchResult",
    "BufferClaim",
    "BusySpinIdleStrategy",
    "ClaimStateError",
    "ClosedError",
    "ConcurrentPublication",
    "ControlledPollAction",
    "ExclusivePublication",
    "FragmentAssembler",
    "FragmentBatch",
    "Header",
    "Image",
    "InvalidLogBufferError",
    "LogBuffers",
    "LogCorruptedError",
    "LogbufError",
    "MessageTooLargeError",
    "Position",
    "Publication",
    "PublicationResult",
    "SleepingIdleStrategy",
    "Subscription",
    "YieldingIdleStrategy",
]
