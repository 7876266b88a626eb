"""``CommandError``: a client command the driver refuses, answered with ON_ERROR(code, message)."""

from __future__ import annotations

from logbuf.cnc.messages import ErrorCode


class CommandError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
