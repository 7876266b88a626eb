"""Idle strategies: what a loop does when a duty cycle found no work.

There are only 2 cores here, so every waiting loop in logbuf takes one of these instead of spinning bare.
``BackoffIdleStrategy`` (the default) spins a little, then yields, then parks with a doubling period up to
a cap, and resets the moment work appears — low latency when busy, near-zero CPU when idle.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

from logbuf.units import NANOS_PER_MICRO, NANOS_PER_MILLI, NANOS_PER_SECOND


class IdleStrategy(Protocol):
    """What a polling loop does when a duty cycle found no work."""

    def idle(self, work_count: int = 0) -> None:
        """Idles according to the strategy when ``work_count`` is 0; resets it otherwise."""

    def reset(self) -> None:
        """Back to the first (cheapest) idling step."""


class BusySpinIdleStrategy:
    """Never gives the core away; for a pinned core only."""

    name = "spin"

    def idle(self, work_count: int = 0) -> None:
        """Spins (a CPU pause hint) when there was no work."""
        return None

    def reset(self) -> None:
        """Nothing to reset."""
        return None


class YieldingIdleStrategy:
    """``sched_yield`` when there was no work."""

    name = "yield"

    def idle(self, work_count: int = 0) -> None:
        """Yields the CPU when there was no work."""
        if work_count <= 0:
            os.sched_yield()

    def reset(self) -> None:
        """Nothing to reset."""
        return None


class SleepingIdleStrategy:
    """Sleeps a fixed period when there was no work."""

    name = "sleep"

    def __init__(self, period_ns: int = NANOS_PER_MILLI) -> None:
        if period_ns <= 0:
            raise ValueError("period_ns must be positive")
        self._period_s = period_ns / NANOS_PER_SECOND

    def idle(self, work_count: int = 0) -> None:
        """Sleeps one period when there was no work."""
        if work_count <= 0:
            time.sleep(self._period_s)

    def reset(self) -> None:
        """Nothing to reset."""
        return None


class BackoffIdleStrategy:
    """Spins ``max_spins`` times, yields ``max_yields`` times, then parks from ``min_park_ns`` doubling to
    ``max_park_ns``; any work resets it to spinning."""

    name = "backoff"
    __slots__ = ("max_spins", "max_yields", "min_park_ns", "max_park_ns", "_spins", "_yields", "_park_ns")

    def __init__(
        self, max_spins: int = 10, max_yields: int = 20, min_park_ns: int = NANOS_PER_MICRO, max_park_ns: int = NANOS_PER_MILLI
    ) -> None:
        if max_spins < 0 or max_yields < 0 or min_park_ns <= 0 or max_park_ns < min_park_ns:
            raise ValueError("need max_spins >= 0, max_yields >= 0 and 0 < min_park_ns <= max_park_ns")
        self.max_spins = max_spins
        self.max_yields = max_yields
        self.min_park_ns = min_park_ns
        self.max_park_ns = max_park_ns
        self.reset()

    def reset(self) -> None:
        """Back to spinning."""
        self._spins = 0
        self._yields = 0
        self._park_ns = self.min_park_ns

    def idle(self, work_count: int = 0) -> None:
        """Spins, then yields, then parks for doubling periods while there is no work."""
        if work_count > 0:
            self.reset()
            return
        if self._spins < self.max_spins:
            self._spins += 1
        elif self._yields < self.max_yields:
            self._yields += 1
            os.sched_yield()
        else:
            time.sleep(self._park_ns / NANOS_PER_SECOND)
            self._park_ns = min(self._park_ns * 2, self.max_park_ns)

    @property
    def state(self) -> str:
        """``spinning``, ``yielding`` or ``parking`` (what the next idle() does)."""
        if self._spins < self.max_spins:
            return "spinning"
        if self._yields < self.max_yields:
            return "yielding"
        return "parking"


def idle_strategy(name: str) -> IdleStrategy:
    """An idle strategy by name: ``spin``, ``yield``, ``sleep[:ns]`` or ``backoff[:max_park_ns]``."""
    kind, _, arg = name.partition(":")
    if kind == "spin":
        return BusySpinIdleStrategy()
    if kind == "yield":
        return YieldingIdleStrategy()
    if kind == "sleep":
        if arg and not arg.isdigit():
            raise ValueError(f"sleep:{arg}: the period must be a number of ns")
        return SleepingIdleStrategy(int(arg) if arg else NANOS_PER_MILLI)
    if kind == "backoff":
        if not arg:
            return BackoffIdleStrategy()
        if not arg.isdigit() or int(arg) < 1_000:
            raise ValueError(f"backoff:{arg}: the max park must be a number of ns >= 1000")
        return BackoffIdleStrategy(max_park_ns=int(arg))
    raise ValueError(f"unknown idle strategy {name!r}: use spin, yield, sleep[:ns] or backoff[:max_park_ns]")
