"""``read_errors`` / ``format_errors`` over a real cnc.dat error log with an injected clock."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from fake_driver import FakeDriver, now_ms

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

    text = format_errors(report)
    blocks = text.split("\n\n")
    head, body = blocks[0].split("\n", 1)
    words = head.split()
    assert words[:3] == ["3", "observations", "from"] and words[4] == "to" and words[6] == "for:"
    assert (iso_to_ms(words[3]), iso_to_ms(words[5])) == (T0, T0 + 3_000)
    assert body == "  receiver: invalid packet from 127.0.0.1:4000"
    assert blocks[1].startswith("1 observation from ")
    assert "\n  Traceback (most recent call last):\n" in blocks[1]
    summary = blocks[-1].strip()
    assert summary.startswith("2 distinct errors observed (4 observations) - driver pid ")

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
    assert format_errors(report).startswith("0 distinct errors observed (0 observations) - driver pid ")
