"""Head-end freezes (pure): a feed falls silent for ``freeze_ms`` (a random length in that range), holding at
most ``freeze_max_packets`` packets, then sends everything held back to back, re-packed into catch-up packets
of up to ``catch_up_budget`` bytes. A freeze starts at random (``freeze``, a chance per packet, drawn by the
scheduler) or on a schedule (``freeze_every_ms``: the first packet due at or after each multiple of the
period starts one)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from logbuf.exchange.replay.config import NANOS_PER_MILLI, FaultConfig
from logbuf.exchange.replay.plans import PacketPlan
from logbuf.marketdata import moldudp64
from logbuf.marketdata.moldudp64 import HEADER_LENGTH, MAX_MESSAGE_COUNT


class HeadEndFreeze:
    """One feed's freezes: the next scheduled one, the one in progress and the packets it holds."""

    def __init__(self, faults: FaultConfig, session: bytes, buffer_slice: Callable[[int, int], bytes]) -> None:
        self.faults = faults
        self._session = session
        self._slice = buffer_slice
        self.period = int(faults.freeze_every_ms * NANOS_PER_MILLI)
        self.next_at: int | None = self.period or None  # the next scheduled freeze (feed time), None: none
        self.until: int | None = None  # the end of the freeze in progress, None: none
        self.held: list[PacketPlan] = []

    def start(self, t: int, plan: PacketPlan, draw: float) -> None:
        """A freeze starts at ``t`` holding ``plan``; ``draw`` (uniform in [0, 1)) picks its length. A scheduled
        one moves the schedule past ``t``."""
        if self.next_at is not None and t >= self.next_at:
            self.next_at += ((t - self.next_at) // self.period + 1) * self.period
        low, high = self.faults.freeze_ms
        self.until = t + int((low + draw * (high - low)) * NANOS_PER_MILLI)
        self.held.append(plan)

    def release(self, last_time: int) -> tuple[int, list[tuple[PacketPlan, bytes]]]:
        """The freeze ends: when its packets go (not before ``last_time``, the feed's last send) and what goes,
        every held packet re-packed into as few catch-up packets as the budget allows."""
        assert self.until is not None
        t = max(self.until, last_time)
        self.until = None
        held, self.held = self.held, []
        out: list[tuple[PacketPlan, bytes]] = []
        room = self.faults.catch_up_budget - HEADER_LENGTH
        run: list[PacketPlan] = []
        for plan in [*held, None]:
            if run and (plan is None or plan.sequence != run[-1].sequence + run[-1].count
                        or plan.end - run[0].start > room
                        or plan.sequence + plan.count - run[0].sequence > MAX_MESSAGE_COUNT):
                first, last = run[0], run[-1]
                frames = np.concatenate([p.frames for p in run])
                count = last.sequence + last.count - first.sequence
                data = moldudp64.HEADER.pack(self._session, first.sequence, count) + self._slice(first.start, last.end)
                out.append((PacketPlan(first.sequence, count, first.start, last.end, first.timestamp, frames), data))
                run = []
            if plan is not None:
                run.append(plan)
        return t, out
