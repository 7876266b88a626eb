"""Status messages: at once for a new image, on progress > window/4, and at least every 200 ms."""

from __future__ import annotations

import pytest

from logbuf.driver.udp import StatusMessageSchedule, receiver_window_length

MS = 1_000_000


def test_receiver_window_is_min_of_128k_and_half_a_term() -> None:
    assert receiver_window_length(64 * 1024) == 32 * 1024
    assert receiver_window_length(16 * 1024 * 1024) == 128 * 1024
    assert receiver_window_length(16 * 1024 * 1024, 1024 * 1024) == 1024 * 1024
    with pytest.raises(ValueError):
        receiver_window_length(65536, 0)


def test_first_sm_at_once_then_on_progress_or_timeout() -> None:
    s = StatusMessageSchedule(32768, 1000)
    assert s.due(0, 1000) and s.next_deadline_ns() == 0
    s.on_sent(0, 1000)
    assert not s.due(1, 1000 + 8192)  # exactly window/4: not more than it
    assert s.due(1, 1000 + 8193)
    assert not s.due(200 * MS - 1, 1000) and s.due(200 * MS, 1000)
    assert s.next_deadline_ns() == 200 * MS


def test_forced_sm() -> None:
    s = StatusMessageSchedule(32768, 0)
    s.on_sent(0, 0)
    s.force()
    assert s.due(1, 0)
    s.on_sent(1, 0)
    assert not s.due(2, 0)


def test_last_position_never_goes_back() -> None:
    s = StatusMessageSchedule(32768, 5000)
    s.on_sent(0, 4000)
    assert s.last_sm_position == 5000
