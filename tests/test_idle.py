from __future__ import annotations

import time

import pytest

from logbuf.idle import BackoffIdleStrategy, SleepingIdleStrategy, idle_strategy


def test_backoff_spins_then_yields_then_parks_doubling_to_cap() -> None:
    idle = BackoffIdleStrategy(max_spins=2, max_yields=3, min_park_ns=1_000, max_park_ns=8_000)
    states = []
    for _ in range(10):
        states.append(idle.state)
        idle.idle(0)
    assert states[:5] == ["spinning"] * 2 + ["yielding"] * 3
    assert states[5:] == ["parking"] * 5
    assert idle._park_ns == 8_000  # 1 -> 2 -> 4 -> 8 µs, then capped
    idle.idle(1)  # work resets it
    assert idle.state == "spinning"


def test_sleeping_strategy_sleeps_only_without_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # what it asks of the clock, not how long it took: a loaded machine may deschedule any call for longer
    sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    idle = SleepingIdleStrategy(period_ns=20_000_000)
    idle.idle(5)
    assert sleeps == []
    idle.idle(0)
    assert sleeps == [0.02]


def test_idle_strategy_by_name() -> None:
    assert idle_strategy("backoff").name == "backoff"
    assert idle_strategy("sleep:1000").name == "sleep"
    with pytest.raises(ValueError, match="unknown idle strategy"):
        idle_strategy("hot")
