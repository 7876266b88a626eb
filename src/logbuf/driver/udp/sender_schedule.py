"""When a sender sends SETUP and heartbeats (Aeron's NetworkPublication timing).

- SETUP: at once, then every ``setup_interval_ns`` (100 ms) until the first status message arrives; after
  that only when a status message asks for one (flag 0x80), at most once per interval.
- Heartbeat: when nothing (data, SETUP or heartbeat) went out for ``heartbeat_interval_ns`` (100 ms) - a
  DATA header of length 0 at the sender position, so receivers see the sender alive and where it is (which
  also reveals tail loss).
"""

from __future__ import annotations

DEFAULT_SETUP_INTERVAL_NS = 100_000_000
DEFAULT_HEARTBEAT_INTERVAL_NS = 100_000_000


class SenderSchedule:
    __slots__ = (
        "setup_interval_ns",
        "heartbeat_interval_ns",
        "has_status_message",
        "setup_elicited",
        "_last_setup_ns",
        "_last_send_ns",
    )

    def __init__(
        self,
        now_ns: int,
        *,
        setup_interval_ns: int = DEFAULT_SETUP_INTERVAL_NS,
        heartbeat_interval_ns: int = DEFAULT_HEARTBEAT_INTERVAL_NS,
    ) -> None:
        if setup_interval_ns <= 0 or heartbeat_interval_ns <= 0:
            raise ValueError("setup and heartbeat intervals must be positive")
        self.setup_interval_ns = setup_interval_ns
        self.heartbeat_interval_ns = heartbeat_interval_ns
        self.has_status_message = False
        self.setup_elicited = False
        self._last_setup_ns: int | None = None
        self._last_send_ns = now_ns

    def on_status_message(self, now_ns: int, *, setup_requested: bool) -> None:
        if setup_requested:
            self.setup_elicited = True
        else:
            self.has_status_message = True

    def setup_due(self, now_ns: int) -> bool:
        if self.has_status_message and not self.setup_elicited:
            return False
        return self._last_setup_ns is None or now_ns - self._last_setup_ns >= self.setup_interval_ns

    def on_setup_sent(self, now_ns: int) -> None:
        self._last_setup_ns = now_ns
        self._last_send_ns = now_ns
        self.setup_elicited = False

    def on_data_sent(self, now_ns: int) -> None:
        self._last_send_ns = now_ns

    def heartbeat_due(self, now_ns: int) -> bool:
        return now_ns - self._last_send_ns >= self.heartbeat_interval_ns

    def on_heartbeat_sent(self, now_ns: int) -> None:
        self._last_send_ns = now_ns

    def next_deadline_ns(self) -> int:
        """The earliest time a SETUP or heartbeat may become due (for an IO loop that sleeps)."""
        heartbeat = self._last_send_ns + self.heartbeat_interval_ns
        if self.has_status_message and not self.setup_elicited:
            return heartbeat
        if self._last_setup_ns is None:
            return self._last_send_ns
        return min(heartbeat, self._last_setup_ns + self.setup_interval_ns)
