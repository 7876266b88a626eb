"""``read_errors`` / ``format_errors`` over a real cnc.dat error log with an injected clock."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from fake_driver import FakeDriver, now_ms

from logbuf.cnc.loss_report import format_timestamp
from logbuf.tools import format_errors, read_errors

pytestmark = pytest.mark.timeout(30)

T0 = 1_750_000_000_123  # epoch ms


def iso_to_ms(text: str) -> int:
    return round(dt.datetime.fromisoformat(text).timestamp() * 1000)


def test_distinct_errors_counts_and_times(driver: FakeDriver):
    driver.now_ms = T0
    driver.error_log.record("receiver: invalid packet from 127.0.0.1:4000")
    driver.now_ms = T0 + 10
    try:
        raise OSError(28, "No space left on device")
    except OSError as exc:
        driver.error_log.record(exc)
    driver.now_ms = T0 + 2_000
    driver.error_log.record("receiver: invalid packet from 127.0.0.1:4000")
    driver.now_ms = T0 + 3_000
    driver.error_log.record("receiver: invalid packet from 127.0.0.1:4000")

    report = read_errors(driver.path)
    assert len(report.entries) == 2 and report.total_observations == 4
    first, second = report.entries
    assert (first.count, first.first_observation_ms, first.last_observation_ms) == (3, T0, T0 + 3_000)
    assert (second.count, second.first_observation_ms, second.last_observation_ms) == (1, T0 + 10, T0 + 10)
    assert second.text.startswith("Traceback") and second.text.endswith("No space left on device")

    text = format_errors(report)  # ErrorStat's layout
    blocks = text.split("***\n")
    assert blocks[0] == ""
    head, body = blocks[1].split("\n", 1)
    assert head == (f"3 observations from {format_timestamp(T0)} to {format_timestamp(T0 + 3_000)} for:")
    assert body == " receiver: invalid packet from 127.0.0.1:4000\n"
    assert blocks[2].startswith("1 observations from ") and "\n Traceback (most recent call last):\n" in blocks[2]
    assert text.endswith("No space left on device\n\n2 distinct errors observed.\n")

    data = json.loads(report.to_json())
    assert (data["distinct_errors"], data["observations"]) == (2, 4)
    assert data["errors"][0]["count"] == 3 and iso_to_ms(data["errors"][0]["last_observation"]) == T0 + 3_000
    assert data["driver_state"] == "active"


def test_since_filters_on_last_observation(driver: FakeDriver):
    driver.now_ms = T0
    driver.error_log.record("old")
    driver.now_ms = T0 + 5_000
    driver.error_log.record("new")
    assert [e.text for e in read_errors(driver.path, since_ms=T0 + 1).entries] == ["new"]


def test_empty_log(driver: FakeDriver):
    report = read_errors(driver.path, clock_ms=lambda: now_ms())
    assert report.entries == ()
    assert format_errors(report) == "\n0 distinct errors observed.\n"
