"""SETUP every 100 ms until the first SM, then on request; heartbeats after 100 ms without sending."""

from __future__ import annotations

import pytest

from logbuf.driver.udp import SenderSchedule

MS = 1_000_000


def test_setup_at_once_then_every_interval_until_a_status_message() -> None:
    s = SenderSchedule(0)
    assert s.setup_due(0)
    s.on_setup_sent(0)
    assert not s.setup_due(100 * MS - 1) and s.setup_due(100 * MS)
    s.on_setup_sent(100 * MS)
    s.on_status_message(150 * MS, setup_requested=False)
    assert not s.setup_due(10_000 * MS)


def test_setup_on_request_at_most_once_per_interval() -> None:
    s = SenderSchedule(0)
    s.on_setup_sent(0)
    s.on_status_message(10 * MS, setup_requested=False)
    s.on_status_message(20 * MS, setup_requested=True)
    assert s.setup_elicited and not s.setup_due(99 * MS) and s.setup_due(100 * MS)
    s.on_setup_sent(100 * MS)
    assert not s.setup_elicited and not s.setup_due(1_000 * MS)


def test_a_setup_request_alone_does_not_count_as_connected() -> None:
    s = SenderSchedule(0)
    s.on_setup_sent(0)
    s.on_status_message(1 * MS, setup_requested=True)
    s.on_setup_sent(100 * MS)
    assert not s.has_status_message and s.setup_due(200 * MS)


def test_heartbeat_after_idle_interval_reset_by_any_send() -> None:
    s = SenderSchedule(0)
    assert not s.heartbeat_due(99 * MS) and s.heartbeat_due(100 * MS)
    s.on_data_sent(90 * MS)
    assert not s.heartbeat_due(189 * MS) and s.heartbeat_due(190 * MS)
    s.on_heartbeat_sent(190 * MS)
    assert not s.heartbeat_due(289 * MS)
    s.on_setup_sent(250 * MS)
    assert not s.heartbeat_due(349 * MS) and s.heartbeat_due(350 * MS)


def test_next_deadline() -> None:
    s = SenderSchedule(0)
    assert s.next_deadline_ns() == 0  # the first SETUP is due now
    s.on_setup_sent(5 * MS)
    assert s.next_deadline_ns() == 105 * MS
    s.on_status_message(6 * MS, setup_requested=False)
    s.on_data_sent(50 * MS)
    assert s.next_deadline_ns() == 150 * MS


def test_intervals_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SenderSchedule(0, setup_interval_ns=0)
