"""logbuf's exceptions: one base class, specific subclasses for what a caller can act on; and the exit statuses
of the ``logbuf`` commands that end on one."""

from __future__ import annotations

#: a command failed (a ``LogbufError`` or ``OSError`` without an ``exit_code`` of its own)
ERROR_EXIT_STATUS = 1
#: bad arguments or input the user can fix: argparse's own status, and ``UsageError``'s
USAGE_EXIT_STATUS = 2
#: 128 + SIGINT, what shells report for Ctrl-C
INTERRUPTED_EXIT_STATUS = 130


class LogbufError(Exception):
    """Base class of every error logbuf raises on purpose."""


class UsageError(LogbufError):
    """The user's input cannot be used (a bad combination of options, a missing input file).

    ``logbuf`` prints ``logbuf <command>: error: <message>`` and exits with status 2
    (:data:`USAGE_EXIT_STATUS`), like argparse does for a malformed option.
    """

    exit_code = USAGE_EXIT_STATUS


class InvalidLogBufferError(LogbufError):
    """A log buffer file is not one logbuf (or Aeron) can use: wrong size, term length, page size or header."""


class LogCorruptedError(LogbufError):
    """A frame header in shared memory cannot be a frame (hostile or corrupted length/type)."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


class StorageSpaceError(LogbufError, OSError):
    """A file could not be backed by storage: its file system is full, or would fall below the configured free
    space reserve.  An OSError with errno ENOSPC, so callers that handle a full disk handle this too."""

    def __init__(self, message: str) -> None:
        super().__init__(28, message)  # ENOSPC

    def __str__(self) -> str:
        return str(self.strerror)


class MessageTooLargeError(LogbufError, ValueError):
    """A message is longer than the publication's maximum message (or, for try_claim, payload) length."""


class ClaimStateError(LogbufError):
    """A BufferClaim was used after it was committed or aborted, or before a successful try_claim."""


class ClosedError(LogbufError):
    """The object (log buffer, publication, image, subscription or client) was closed: nothing may use it now."""


class DriverTimeout(LogbufError):
    """The media driver is gone: no cnc.dat, a stale heartbeat (it died), or it shut down."""


class ClientTimeoutError(LogbufError):
    """The driver timed this client out (no keepalive within the client liveness timeout)."""


class RegistrationError(LogbufError):
    """The driver refused a command (ON_ERROR): ``code`` is Aeron's error code."""

    def __init__(self, message: str, code: int, correlation_id: int) -> None:
        super().__init__(message)
        self.code = code
        self.correlation_id = correlation_id


class UnboundHeaderError(LogbufError):
    """A fragment Header was read outside the handler call it was given to (it is a reused flyweight)."""


class ReentrantPollError(LogbufError, RuntimeError):
    """A handler polled the image that is calling it (poll is not reentrant on one image)."""


def bind_error(exc: OSError, address: tuple[str, int]) -> OSError:
    """``exc`` from ``socket.bind(address)`` as the same kind of ``OSError`` whose message names the address,
    e.g. ``cannot bind 127.0.0.1:31001: Address already in use`` (the bare error names nothing)."""
    host, port = address[0], address[1]
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    error = type(exc)(exc.errno, f"cannot bind {shown}: {exc.strerror or exc}")
    error.__cause__ = exc
    return error
