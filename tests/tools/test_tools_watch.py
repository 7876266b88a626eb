"""The live view: per-second rates (pure ``RateTracker``), redraw on a terminal, frames on a pipe, errors
shown in a frame without stopping, Ctrl-C ending with status 0."""

from __future__ import annotations

import io
import re
from dataclasses import replace

import pytest
from fake_driver import FakeDriver

from logbuf.cnc import counters as c
from logbuf.tools import MissingFileError, RateTracker, read_stat, watch
from logbuf.tools.watch import CLEAR_SCREEN

pytestmark = pytest.mark.timeout(30)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeTime:
    """A monotonic clock advanced only by ``sleep``."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_rate_tracker(driver: FakeDriver):
    sent = driver.system[0]
    hb = driver.client_heartbeat(3, 1_000)
    tracker = RateTracker()
    assert tracker.update(read_stat(driver.path), 10.0) == {}
    driver.set(sent, 5_000)
    driver.set(hb, 3_000)  # a timestamp: no rate
    rates = tracker.update(read_stat(driver.path), 12.0)
    assert rates[sent] == 2_500.0
    assert rates[driver.system[1]] == 0.0
    assert hb not in rates

    # the same id now names another counter (freed, reused): no rate across the two
    snap = read_stat(driver.path)
    relabelled = tuple(replace(s, label="other") if s.counter_id == sent else s for s in snap.counters)
    assert sent not in tracker.update(replace(snap, counters=relabelled), 13.0)

    tracker.reset()
    assert tracker.update(snap, 14.0) == {}


def test_watch_on_a_terminal_redraws_with_rates(driver: FakeDriver):
    sent = driver.system[0]
    clock, out = FakeTime(), Tty()
    values = iter([0, 1_000, 1_000])

    def read():
        driver.set(sent, next(values))
        return read_stat(driver.path)

    code = watch(
        read,
        out,
        interval_s=0.5,
        count=3,
        keep=lambda s: s.type_id == 0 and s.counter_id < 2,
        monotonic=clock.monotonic,
        sleep=clock.sleep,
    )
    assert code == 0
    frames = out.getvalue().split(CLEAR_SCREEN)
    assert frames[0] == "" and len(frames) == 4
    line = re.compile(r"^  0: +([\d,]+) +(\S*(?: \S+)?) - Bytes sent$", re.M)
    assert line.search(frames[1]).groups() == ("0", "")
    assert line.search(frames[2]).groups() == ("1,000", "+2 kB/s")  # 1,000 bytes in 0.5 s
    assert line.search(frames[3]).groups() == ("1,000", "")  # unchanged: blank
    assert "  1:                    0              - Bytes received" in frames[2]
    assert clock.sleeps == [0.5, 0.5]


def test_watch_shows_errors_and_keeps_polling(driver: FakeDriver):
    clock, out = FakeTime(), io.StringIO()
    results = [MissingFileError("no cnc.dat in /x"), None, MissingFileError("no cnc.dat in /x")]

    def read():
        result = results.pop(0)
        if result is not None:
            raise result
        return read_stat(driver.path)

    assert watch(read, out, count=3, monotonic=clock.monotonic, sleep=clock.sleep) == 0
    frames = out.getvalue().split("\n\n")
    assert len(frames) == 3
    assert "no cnc.dat in /x" in frames[0] and "(waiting; Ctrl-C to quit)" in frames[0]
    assert "logbuf stat (CnC v0.2.0)" in frames[1]
    assert "no cnc.dat in /x" in frames[2]


def test_watch_stale_driver_is_marked_in_the_frame(driver: FakeDriver):
    driver.heartbeat(1)
    out = io.StringIO()
    watch(lambda: read_stat(driver.path), out, count=1, sleep=lambda s: None)
    assert "STALE" in out.getvalue().splitlines()[0] and "is not alive" in out.getvalue()


def test_watch_ctrl_c_returns_0(driver: FakeDriver):
    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    out = Tty()
    assert watch(lambda: read_stat(driver.path), out, sleep=interrupted) == 0
    assert out.getvalue().startswith(CLEAR_SCREEN) and out.getvalue().endswith("\n")


def test_watch_json_rates(driver: FakeDriver):
    import json

    pos = driver.stream_counter(c.PUBLISHER_POSITION_TYPE_ID, c.PUBLISHER_POSITION_NAME, 7, 1, 2)
    clock, out = FakeTime(), io.StringIO()
    values = iter([0, 4_096])

    def read():
        driver.set(pos, next(values))
        return read_stat(driver.path)

    watch(
        read,
        out,
        interval_s=2.0,
        count=2,
        json_lines=True,
        keep=lambda s: s.counter_id == pos,
        monotonic=clock.monotonic,
        sleep=clock.sleep,
    )
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["counters"][0]["rate_per_s"] is None
    assert second["counters"][0]["rate_per_s"] == 2_048.0


def test_watch_shows_units_ages_and_subscriber_lag(driver: FakeDriver):
    naks = driver.system[5]  # NAKs sent: events, no unit
    pub = driver.stream_counter(c.PUBLISHER_POSITION_TYPE_ID, c.PUBLISHER_POSITION_NAME, 7, 42, 1001)
    sub = driver.stream_counter(c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos", 9, 42, 1001, join_position=0)
    other = driver.stream_counter(c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos", 11, 43, 1001, join_position=0)
    hb = driver.client_heartbeat(3, 0)
    clock, out = FakeTime(), io.StringIO()
    steps = iter([(0, 0, 0), (3, 1_048_576, 524_288)])
    now = 1_800_000_000_000

    def read():
        n, pub_pos, sub_pos = next(steps)
        driver.set(naks, n)
        driver.set(pub, pub_pos)
        driver.set(sub, sub_pos)
        driver.set(hb, now - 2_500)
        driver.heartbeat(now + 3)  # stored after the reader's clock: age 0, not -3
        return read_stat(driver.path, clock_ms=lambda: now)

    watch(read, out, interval_s=1.0, count=2, monotonic=clock.monotonic, sleep=clock.sleep)
    second = out.getvalue().split("\n\n")[1]
    lines = second.splitlines()
    assert "heartbeat age 0 ms" in lines[0]
    assert f"{naks:3d}:                    3         +3/s - NAKs sent" in lines
    assert f"{pub:3d}:            1,048,576   +1.05 MB/s - pub-pos (sampled): 7 42 1001 aeron:ipc" in lines
    assert f"{hb:3d}: {now - 2_500:20,d}    age 2.5 s - client-heartbeat: 3" in lines
    # the streams section: the subscriber of session 42 lags its publication by 512 KiB; session 43 has no
    # producer on this driver, so no lag line
    lag_lines = [line for line in lines if line.rstrip().endswith(" B  aeron:ipc")]
    assert lag_lines == [
        f"{42:11d} {1001:8d} {sub:4d}  pub-pos {1_048_576:18,d} {524_288:18,d} {524_288:13,d} B  aeron:ipc"
    ]
    assert other != sub


def test_watch_json_lags_follow_the_filter(driver: FakeDriver):
    import json

    pub = driver.stream_counter(c.PUBLISHER_POSITION_TYPE_ID, c.PUBLISHER_POSITION_NAME, 7, 42, 1001, value=900)
    sub = driver.stream_counter(c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos", 9, 42, 1001, value=100)
    out = io.StringIO()
    # only the sub-pos is shown; its lag still pairs it with the hidden pub-pos
    watch(lambda: read_stat(driver.path), out, count=1, json_lines=True, keep=lambda s: s.counter_id == sub,
          sleep=lambda s: None)
    frame = json.loads(out.getvalue())
    assert [item["id"] for item in frame["counters"]] == [sub]
    assert frame["counters"][0]["unit"] == "B"
    assert frame["streams"] == [
        {
            "session_id": 42,
            "stream_id": 1001,
            "channel": "aeron:ipc",
            "subscriber_counter_id": sub,
            "subscriber_registration_id": 9,
            "subscriber_position": 100,
            "producer_type": "pub-pos",
            "producer_counter_id": pub,
            "producer_position": 900,
            "lag_bytes": 800,
        }
    ]
    out = io.StringIO()
    watch(lambda: read_stat(driver.path), out, count=1, json_lines=True, keep=lambda s: s.counter_id == pub,
          sleep=lambda s: None)
    assert json.loads(out.getvalue())["streams"] == []
