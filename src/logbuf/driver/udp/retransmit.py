"""``RetransmitHandler``: a sender's answer to NAKs (Aeron's RetransmitHandler).

A NAK is checked first: its term offset must lie inside a term, and the range must be data this publication
has sent and still retains - ``[snd-pos - retained window, snd-pos)``, where the retained window defaults to
Aeron's ``T/2 + max message length`` (:func:`logbuf.driver.windows.retained_window`: a receiver's window is at
most T/2, so an honest NAK is never further back; the conductor cleans one term behind snd-pos, so this is
always still intact).  The range is clipped to the term and to snd-pos.

Then, per range: resend at once (or after ``delay_ns``, for multicast senders that want to merge NAKs from many
receivers), then *linger* for ``linger_ns`` (10 ms) during which NAKs that start inside the range are ignored -
receivers re-NAK until the data arrives, and the data is already on its way.  With *group semantics*
(multicast and multi-destination-cast publications, as Aeron) at most ``max_actions`` ranges are in flight
(``max-resend``, default 16); a NAK that finds the pool full is dropped and counted (Retransmit Pool
Overflow); the receiver will NAK again.  A unicast publication has one action, which a NAK for another range
takes over (Aeron's unicast rule: one receiver, its latest gap).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from logbuf.driver import windows
from logbuf.driver.udp.counters import SenderCounters
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.frame import HEADER_LENGTH
from logbuf.protocol.nak import Nak

DEFAULT_LINGER_NS = 10_000_000
DEFAULT_MAX_ACTIONS = 16  # Aeron's max-resend default
MAX_RESEND_LIMIT = 256  # Aeron's largest max-resend


class Resend(NamedTuple):
    term_id: int
    term_offset: int
    length: int


class _State(enum.Enum):
    DELAYED = 1
    LINGERING = 2


@dataclass(slots=True, eq=False)
class _Action:
    resend: Resend
    state: _State
    expiry_ns: int


class RetransmitHandler:
    def __init__(
        self,
        term_length: int,
        initial_term_id: int,
        *,
        linger_ns: int = DEFAULT_LINGER_NS,
        delay_ns: int = 0,
        max_actions: int = DEFAULT_MAX_ACTIONS,
        retained_window: int | None = None,
        counters: SenderCounters | None = None,
        group_semantics: bool = True,
    ) -> None:
        d.check_term_length(term_length)
        if linger_ns < 0 or delay_ns < 0 or max_actions <= 0:
            raise ValueError("linger and delay must be >= 0 and max_actions > 0")
        self.term_length = term_length
        self.position_bits = d.position_bits_to_shift(term_length)
        self.initial_term_id = initial_term_id
        self.linger_ns = linger_ns
        self.delay_ns = delay_ns
        self.group_semantics = group_semantics
        self.max_actions = max_actions if group_semantics else 1
        self.retained_window = windows.retained_window(term_length) if retained_window is None else retained_window
        self.counters = SenderCounters() if counters is None else counters
        self.naks_out_of_window = 0
        self.naks_suppressed = 0
        self._actions: list[_Action] = []  # oldest first

    @property
    def active_count(self) -> int:
        return len(self._actions)

    def on_nak(self, nak: Nak, now_ns: int, snd_pos: int) -> list[Resend]:
        """Returns the ranges to resend now (empty when invalid, suppressed, delayed or the pool is full)."""
        if not 0 <= nak.term_offset <= self.term_length - HEADER_LENGTH:
            self.counters.invalid_packets += 1
            return []
        resend = self._clip(nak.term_id, nak.term_offset, nak.length, snd_pos)
        if resend is None:
            self.naks_out_of_window += 1
            return []
        for action in self._actions:
            r = action.resend
            if r.term_id == nak.term_id and r.term_offset <= nak.term_offset < r.term_offset + r.length:
                self.naks_suppressed += 1
                return []
        if not self.group_semantics:
            self._actions.clear()  # unicast: the one action goes to the new range
        elif len(self._actions) >= self.max_actions:
            self.counters.retransmit_pool_overflow += 1
            return []
        if self.delay_ns == 0:
            self._actions.append(_Action(resend, _State.LINGERING, now_ns + self.linger_ns))
            return [resend]
        self._actions.append(_Action(resend, _State.DELAYED, now_ns + self.delay_ns))
        return []

    def on_timer(self, now_ns: int, snd_pos: int) -> list[Resend]:
        """Fires delayed resends that are due (re-checked against snd-pos) and ends expired lingers."""
        due: list[Resend] = []
        for action in list(self._actions):
            if now_ns < action.expiry_ns:
                continue
            if action.state is _State.LINGERING:
                self._actions.remove(action)
                continue
            r = action.resend
            resend = self._clip(r.term_id, r.term_offset, r.length, snd_pos)
            if resend is None:
                self._actions.remove(action)
                continue
            due.append(resend)
            action.state = _State.LINGERING
            action.expiry_ns = now_ns + self.linger_ns
        return due

    def next_deadline_ns(self) -> int | None:
        return min((a.expiry_ns for a in self._actions), default=None)

    def _clip(self, term_id: int, term_offset: int, length: int, snd_pos: int) -> Resend | None:
        position = d.compute_position(term_id, term_offset, self.position_bits, self.initial_term_id)
        if not snd_pos - self.retained_window <= position < snd_pos:
            return None
        length = min(length, self.term_length - term_offset, snd_pos - position)
        return Resend(term_id, term_offset, length) if length > 0 else None
