"""When a receiver sends a status message for an image, and the window it offers.

An SM goes out when the consumption position (the slowest subscriber) has moved more than a quarter of the
receiver window since the last SM, at least every ``sm_timeout_ns`` (200 ms), and at once when forced (a new
image announcing itself to the sender).  The window is ``min(128 KiB, T/2)`` unless configured (its rule:
:func:`logbuf.driver.windows.receiver_window_length`).
"""

from __future__ import annotations

from logbuf.driver.windows import DEFAULT_INITIAL_WINDOW_LENGTH, receiver_window_length

# the receiver window's rule lives in windows.py; its names stay importable from here
__all__ = [
    "DEFAULT_INITIAL_WINDOW_LENGTH", "DEFAULT_SM_TIMEOUT_NS", "StatusMessageSchedule", "receiver_window_length",
]

DEFAULT_SM_TIMEOUT_NS = 200_000_000


class StatusMessageSchedule:
    __slots__ = ("window_length", "threshold", "sm_timeout_ns", "last_sm_position", "last_sm_ns", "_forced")

    def __init__(self, window_length: int, position: int, *, sm_timeout_ns: int = DEFAULT_SM_TIMEOUT_NS) -> None:
        if window_length <= 0 or sm_timeout_ns <= 0:
            raise ValueError("window and SM timeout must be positive")
        self.window_length = window_length
        self.threshold = window_length // 4
        self.sm_timeout_ns = sm_timeout_ns
        self.last_sm_position = position
        self.last_sm_ns: int | None = None
        self._forced = True  # the first SM goes out at once

    def force(self) -> None:
        """Send at the next poll (e.g. a SETUP arrived for an image the sender may not know is there)."""
        self._forced = True

    def due(self, now_ns: int, consumption_position: int) -> bool:
        return (
            self._forced
            or consumption_position - self.last_sm_position > self.threshold
            or self.last_sm_ns is None
            or now_ns - self.last_sm_ns >= self.sm_timeout_ns
        )

    def on_sent(self, now_ns: int, consumption_position: int) -> None:
        self._forced = False
        self.last_sm_ns = now_ns
        self.last_sm_position = max(self.last_sm_position, consumption_position)

    def next_deadline_ns(self) -> int:
        """When the next SM falls due by time alone (0: due now)."""
        return 0 if self._forced or self.last_sm_ns is None else self.last_sm_ns + self.sm_timeout_ns
