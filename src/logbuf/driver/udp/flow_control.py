"""Sender flow control: what the sender limit (snd-lmt) becomes on a status message and when idle.

- :class:`UnicastFlowControl` - one receiver: ``snd-lmt = max(snd-lmt, smPosition + receiverWindow)``.
- :class:`MinMulticastFlowControl` (``fc=min``) - every receiver, tracked by its receiver id, holds the sender
  back: ``snd-lmt = min over receivers of (position + window)``; a receiver silent for the receiver timeout
  (5 s), or at end of stream (EOS SMs: its subscription went), is dropped when idle and stops holding the
  sender back.
- :class:`TaggedFlowControl` (``fc=tagged,g:<tag>[/<min group size>]``, Aeron's tagged flow control) - only
  receivers whose status messages carry the group tag (the 8-byte extension after the receiver id, sent by
  subscriptions with ``gtag=<tag>``) hold the sender back, as ``min`` does; until the group has its minimum
  size the limit stays where it is and the publication is not connected.

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

    def on_error(self, receiver_id: int) -> None:
        """The receiver sent an ERR frame (it rejected the image): it leaves at once."""
        ...

    @property
    def receiver_count(self) -> int: ...

    @property
    def is_connected(self) -> bool:
        """Enough receivers are there for the publication to count as connected."""
        ...

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

    def on_error(self, receiver_id: int) -> None:
        # one receiver (a plain unicast channel); the driver keeps "max" on multicast and MDC, where it
        # tracks only the furthest of several
        if self.receiver is not None and self.receiver.receiver_id == receiver_id:
            self.receiver = None

    @property
    def receiver_count(self) -> int:
        return 0 if self.receiver is None else 1

    @property
    def is_connected(self) -> bool:
        return self.receiver is not None

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
        # at end of stream too: a receiver whose subscription went says so with EOS SMs (aeronmd's do)
        silent = [rid for rid, r in self.receivers.items() if now_ns - r.last_sm_ns > timeout or r.end_of_stream]
        for rid in silent:
            del self.receivers[rid]
        return self._min_limit() if self.receivers else snd_lmt

    def on_error(self, receiver_id: int) -> None:
        self.receivers.pop(receiver_id, None)

    def _min_limit(self) -> int:
        return min(r.position_plus_window for r in self.receivers.values())

    @property
    def receiver_count(self) -> int:
        return len(self.receivers)

    @property
    def is_connected(self) -> bool:
        return bool(self.receivers)

    @property
    def receivers_at_end_of_stream(self) -> bool:
        return bool(self.receivers) and all(r.end_of_stream for r in self.receivers.values())


GROUP_TAG_LENGTH = 8  # the SM extension that carries a receiver's group tag


def group_tag_of(sm: StatusMessage) -> int | None:
    """The group tag an SM carries (its feedback is exactly 8 bytes, little-endian), else None."""
    if len(sm.feedback) != GROUP_TAG_LENGTH:
        return None
    return int.from_bytes(sm.feedback, "little", signed=True)


class TaggedFlowControl:
    """``fc=tagged,g:<tag>[/<min group size>]``: the slowest receiver of the tagged group sets the limit.

    A receiver joins when its SM carries the group tag, is not at end of stream and is at most a window behind
    the slowest tracked one; its limit follows its latest SM.  Below ``group_min_size`` receivers the limit does
    not move (and the publication is not connected); with none tracked, any SM moves it forward as ``max``
    does.  Receivers silent for the timeout, or at end of stream, are dropped when idle.
    """

    def __init__(self, group_tag: int, group_min_size: int = 0,
                 receiver_timeout_ns: int = DEFAULT_RECEIVER_TIMEOUT_NS) -> None:
        if group_min_size < 0:
            raise ValueError("the minimum group size must be >= 0")
        self.group_tag = group_tag
        self.group_min_size = group_min_size
        self.receiver_timeout_ns = receiver_timeout_ns
        self.receivers: list[ReceiverState] = []  # in the order they joined
        self.last_sm_ns: int | None = None  # any SM, tagged or not: someone listens

    def on_status_message(
        self, sm: StatusMessage, snd_lmt: int, position_bits: int, initial_term_id: int, now_ns: int
    ) -> int:
        position = sm.position(position_bits, initial_term_id)
        limit = position + sm.receiver_window
        matches = group_tag_of(sm) == self.group_tag
        eos = sm.is_end_of_stream
        self.last_sm_ns = now_ns
        existing = False
        min_position: int | None = None
        for r in self.receivers:
            if matches and r.receiver_id == sm.receiver_id:
                r.end_of_stream = eos
                r.position = max(r.position, position)
                r.position_plus_window = limit
                r.last_sm_ns = now_ns
                existing = True
            min_position = r.position_plus_window if min_position is None else min(min_position,
                                                                                     r.position_plus_window)
        if (not existing and not eos and matches and len(self.receivers) < _MAX_RECEIVERS
                and (min_position is None or limit >= min_position - sm.receiver_window)):
            self.receivers.append(ReceiverState(sm.receiver_id, position, limit, now_ns))
            min_position = limit if min_position is None else min(min_position, limit)
        if len(self.receivers) < self.group_min_size:
            return snd_lmt
        if min_position is None:
            return max(snd_lmt, limit)
        return max(snd_lmt, min_position)

    def on_idle(self, now_ns: int, snd_lmt: int, snd_pos: int) -> int:
        timeout = self.receiver_timeout_ns
        self.receivers = [r for r in self.receivers
                          if now_ns - r.last_sm_ns <= timeout and not r.end_of_stream]
        if self.last_sm_ns is not None and now_ns - self.last_sm_ns > timeout:
            self.last_sm_ns = None
        if not self.receivers or len(self.receivers) < self.group_min_size:
            return snd_lmt
        return min(r.position_plus_window for r in self.receivers)

    def on_error(self, receiver_id: int) -> None:
        self.receivers = [r for r in self.receivers if r.receiver_id != receiver_id]

    @property
    def receiver_count(self) -> int:
        return len(self.receivers)

    @property
    def is_connected(self) -> bool:
        return self.last_sm_ns is not None and len(self.receivers) >= self.group_min_size

    @property
    def receivers_at_end_of_stream(self) -> bool:
        return bool(self.receivers) and all(r.end_of_stream for r in self.receivers)


_MAX_RECEIVERS = 256  # receivers tracked at most (the native agent's LBD_SND_MAX_RECEIVERS)
