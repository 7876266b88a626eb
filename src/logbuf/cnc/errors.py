"""Exceptions of the cnc.dat structures (all are ``LogbufError``s, so callers can catch logbuf's base)."""

from __future__ import annotations

from logbuf.errors import LogbufError


class CncFileError(LogbufError):
    """A cnc.dat file (or one of its sections) is not one logbuf can use: truncated, foreign, wrong version,
    lengths that do not add up, a capacity that is not a power of two, …"""


class CncMissingError(CncFileError):
    """There is no cnc.dat (yet): no driver, or one that has not created it; a connecting client waits."""


class CncNotReadyError(CncFileError):
    """The CnC version field is still 0: the driver is creating the file; retry after a short wait."""


class CncVersionError(CncFileError):
    """The CnC file was written with an incompatible major version."""


class RingBufferCorruptedError(CncFileError):
    """A record header in the to-driver ring cannot be a record (hostile or corrupted length)."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


class BroadcastCorruptedError(CncFileError):
    """A record header in the to-clients broadcast buffer cannot be a record, and the receiver was not lapped."""


class BroadcastLappedError(LogbufError):
    """A broadcast receiver was lapped by the transmitter (Aeron: "unable to keep up with broadcast")."""


class CountersFullError(LogbufError):
    """No counter id is free: the values/metadata buffers are full and no reclaimed id is past its deadline."""


class CounterStateError(LogbufError):
    """A counter id is out of range or not in the state the operation needs (e.g. free of a free counter)."""


class MalformedCommandError(LogbufError):
    """A command/response body does not fit its layout; the driver answers ON_ERROR MALFORMED_COMMAND (7)."""

    error_code = 7


class UnknownCommandTypeError(MalformedCommandError):
    """A record type id that is no known command/response; the driver answers UNKNOWN_COMMAND_TYPE_ID (6)."""

    error_code = 6
