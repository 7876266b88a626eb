"""Sender flow control: what the sender limit (snd-lmt) becomes on a status message and when idle.

- :class:`UnicastFlowControl` - one receiver: ``snd-lmt = max(snd-lmt, smPosition + receiverWindow)``.
- :class:`MinMulticastFlowControl` (``fc=min``) - every receiver, tracked by its receiver id, holds the sender
  back: ``snd-lmt = min over receivers of (position + window)``; a receiver silent for the receiver timeout
  (5 s) is dropped and stops holding the sender back.

Both track receivers so the publication can tell whether it is connected (``receiver_count``).  Status
messages asking for a SETUP (flag 0x80) are not flow-control input; the sender handles those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from logbuf.protocol.status_message import StatusMessage

DEFAULT_RECEIVER_TIMEOUT_NS = 5_000_000_000


class FlowControl(Protocol):
    def on_status_message(
        self, sm: StatusMessage, snd_lmt: int, position_bits: int, initial_term_id: int, now_ns: int
    ) -> int:
        """Returns the new sender limit."""
        ...

    def on_idle(self, now_ns: int, snd_lmt: int, snd_pos: int) -> int:
        """Times receivers out; returns the new sender limit."""
        ...

    @property
    def receiver_count(self) -> int: ...

    @property
    def receivers_at_end_of_stream(self) -> bool:
        """Every tracked receiver reported end of stream (an SM with the EOS flag); False with none."""
        ...


@dataclass(slots=True)
class ReceiverState:
    receiver_id: int
    position: int  # highest consumption position reported
    position_plus_window: int  # the limit this receiver allows
    last_sm_ns: int
    end_of_stream: bool = False


class UnicastFlowControl:
    """One receiver; the limit only ever moves forward (a stale, reordered SM cannot pull it back)."""

    def __init__(self, receiver_timeout_ns: int = DEFAULT_RECEIVER_TIMEOUT_NS) -> None:
        self.receiver_timeout_ns = receiver_timeout_ns
        self.receiver: ReceiverState | None = None

    def on_status_message(
        self, sm: StatusMessage, snd_lmt: int, position_bits: int, initial_term_id: int, now_ns: int
    ) -> int:
        position = sm.position(position_bits, initial_term_id)
        r = self.receiver
        if r is None or r.receiver_id != sm.receiver_id:
            r = self.receiver = ReceiverState(sm.receiver_id, position, position + sm.receiver_window, now_ns)
        r.position = max(r.position, position)
        r.position_plus_window = max(r.position_plus_window, position + sm.receiver_window)
        r.last_sm_ns = now_ns
        r.end_of_stream = sm.is_end_of_stream
        return max(snd_lmt, position + sm.receiver_window)

    def on_idle(self, now_ns: int, snd_lmt: int, snd_pos: int) -> int:
        if self.receiver is not None and now_ns - self.receiver.last_sm_ns > self.receiver_timeout_ns:
            self.receiver = None
        return snd_lmt

    @property
    def receiver_count(self) -> int:
        return 0 if self.receiver is None else 1

    @property
    def receivers_at_end_of_stream(self) -> bool:
        return self.receiver is not None and self.receiver.end_of_stream


class MinMulticastFlowControl:
    """``fc=min``: the slowest live receiver sets the limit."""

    def __init__(self, receiver_timeout_ns: int = DEFAULT_RECEIVER_TIMEOUT_NS) -> None:
        self.receiver_timeout_ns = receiver_timeout_ns
        self.receivers: dict[int, ReceiverState] = {}

    def on_status_message(
        self, sm: StatusMessage, snd_lmt: int, position_bits: int, initial_term_id: int, now_ns: int
    ) -> int:
        position = sm.position(position_bits, initial_term_id)
        r = self.receivers.get(sm.receiver_id)
        if r is None:
            r = self.receivers[sm.receiver_id] = ReceiverState(
                sm.receiver_id, position, position + sm.receiver_window, now_ns
            )
        r.position = max(r.position, position)
        r.position_plus_window = max(r.position_plus_window, position + sm.receiver_window)
        r.last_sm_ns = now_ns
        r.end_of_stream = sm.is_end_of_stream
        return self._min_limit()

    def on_idle(self, now_ns: int, snd_lmt: int, snd_pos: int) -> int:
        timeout = self.receiver_timeout_ns
        silent = [rid for rid, r in self.receivers.items() if now_ns - r.last_sm_ns > timeout]
        for rid in silent:
            del self.receivers[rid]
        return self._min_limit() if self.receivers else snd_lmt

    def _min_limit(self) -> int:
        return min(r.position_plus_window for r in self.receivers.values())

    @property
    def receiver_count(self) -> int:
        return len(self.receivers)

    @property
    def receivers_at_end_of_stream(self) -> bool:
        return bool(self.receivers) and all(r.end_of_stream for r in self.receivers.values())
