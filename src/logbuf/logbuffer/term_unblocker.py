"""``LogBufferUnblocker``: turns a claim left uncommitted (by a dead or stuck publisher) into a PAD frame.

Run by the driver conductor on concurrent publications whose consumers have not moved for the unblock
timeout while the producer is ahead.  At the blocked offset:

* a negative length (claimed, never committed) becomes a PAD of that length;
* a zero length followed later by committed frames becomes a PAD up to the next frame, after re-checking
  the span is still all zero (a slow writer may just be starting);
* a zero span to the end of the term becomes a PAD to the end, and the log is rotated.
"""

from __future__ import annotations

from logbuf.logbuffer.frame import FRAME_ALIGNMENT
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import lib


def unblock(log: LogBuffers, blocked_position: int) -> bool:
    """True when something was unblocked at ``blocked_position`` (a frame boundary)."""
    if blocked_position < 0 or blocked_position % FRAME_ALIGNMENT:
        raise ValueError(f"blocked position {blocked_position} is not a frame boundary")
    status = lib.lb_unblock(log.term_pointer(0), log.meta.pointer(0), log.term_length, blocked_position)
    return status != lib.LB_NO_ACTION
