"""``CommandError``: a client command the driver refuses, answered with ON_ERROR(code, message)."""

from __future__ import annotations

from logbuf.cnc.messages import ErrorCode
from logbuf.errors import LogbufError


class CommandError(LogbufError):
    """A command refused with Aeron's error ``code``; ``str(error)`` is the message the client gets."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
