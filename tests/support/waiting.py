"""Waiting for a condition with a timeout: the one way tests synchronise with threads, processes and drivers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition a test waited for did not come true in time (an assertion failure, as pytest shows it)."""


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, *, what: str = "condition",
               interval: float = 0.001, max_interval: float = 0.01,
               poll: Callable[[], object] | None = None) -> T:
    """Returns ``predicate()``'s first true value, checking it until ``timeout`` seconds have passed.

    Between checks it sleeps ``interval`` seconds, doubling up to ``max_interval`` (a condition that comes
    true at once costs one check; a slow one costs few wake-ups and is noticed within ``max_interval``).
    ``poll``, when given, runs between checks instead of the sleep (to drive a subscription, say); when it
    reports no work the sleep happens as well.  On timeout: :class:`WaitTimeout` naming ``what``, the time
    waited and the predicate's last value.
    """
    start = time.monotonic()
    deadline = start + timeout
    pause = interval
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout(f"timed out after {now - start:.2f} s (limit {timeout} s) waiting for {what}; "
                              f"last value: {value!r}")
        if poll is not None and poll():
            pause = interval  # work was done: check again at once, back off from the start
            continue
        time.sleep(min(pause, max(deadline - now, 0.0)))
        pause = min(pause * 2, max_interval)
