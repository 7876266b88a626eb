"""``FragmentAssembler``: rebuilds messages that ``offer`` split into BEGIN .. END fragments.

Wrap a handler with it and pass the assembler to ``poll``: unfragmented messages go straight through
(zero-copy); fragmented ones are collected per session and delivered whole once their END fragment arrives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logbuf.logbuffer.frame import BEGIN_FLAG, END_FLAG, UNFRAGMENTED
from logbuf.logbuffer.header import Header


class FragmentAssembler:
    __slots__ = ("_handler", "_builders")

    def __init__(self, handler: Callable[[memoryview, Header], Any]) -> None:
        self._handler = handler
        self._builders: dict[int, bytearray] = {}

    def __call__(self, buffer: memoryview, header: Header) -> Any:
        flags = header.flags
        if flags & UNFRAGMENTED == UNFRAGMENTED:
            return self._handler(buffer, header)
        session_id = header.session_id
        if flags & BEGIN_FLAG:
            self._builders[session_id] = bytearray(buffer)
            return None
        builder = self._builders.get(session_id)
        if builder is None:
            return None  # joined mid-message: drop until the next BEGIN
        builder += buffer
        if flags & END_FLAG:
            del self._builders[session_id]
            return self._handler(memoryview(builder), header)
        return None

    def free_session(self, session_id: int) -> None:
        """Forgets a partial message (its image went away)."""
        self._builders.pop(session_id, None)
