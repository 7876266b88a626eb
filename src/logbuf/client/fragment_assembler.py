"""``FragmentAssembler``: rebuilds messages that ``offer`` split into BEGIN .. END fragments.

Wrap a handler with it and pass the assembler to ``poll``: unfragmented messages go straight through
(zero-copy, no Python frame in between: the type is native, ``logbuf._client.FragmentAssembler``); fragmented
ones are collected per session and delivered whole, as ``handler(memoryview, header)``, once their END
fragment arrives.  A session joined mid-message is dropped until its next BEGIN; ``free_session(session_id)``
forgets a partial message (its image went away).
"""

from __future__ import annotations

from logbuf.native import client

__all__ = ["FragmentAssembler"]

FragmentAssembler = client.FragmentAssembler
