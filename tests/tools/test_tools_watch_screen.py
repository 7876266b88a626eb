"""``logbuf stat --watch`` on a terminal: the counters at 0 are left out and the frame fits the screen, each
said in the frame; ``--all`` (and any ``--type``/``--label``) shows everything chosen."""

from __future__ import annotations

import io
import re

import pytest
from fake_driver import FakeDriver

from logbuf.tools import read_stat, watch

pytestmark = pytest.mark.timeout(30)


def frame(driver: FakeDriver, **options: object) -> list[str]:
    out = io.StringIO()
    assert watch(lambda: read_stat(driver.path), out, count=1, sleep=lambda s: None, tty=False, **options) == 0
    return out.getvalue().splitlines()


COUNTER = re.compile(r"^ *\d+: +([\d,]+) .* - (.*)$")


def counters(lines: list[str]) -> dict[str, int]:
    return {m.group(2): int(m.group(1).replace(",", "")) for m in map(COUNTER.match, lines) if m}


def test_counters_at_0_are_left_out_and_counted(driver: FakeDriver) -> None:
    driver.set(driver.system[1], 7)
    every = counters(frame(driver))
    lines = frame(driver, hide_zero=True)
    shown = counters(lines)
    assert shown["Bytes received"] == 7 and "Bytes sent" not in shown
    assert shown == {label: value for label, value in every.items() if value}
    zeros = sum(1 for value in every.values() if value == 0)
    assert zeros > 10 and lines[-1] == f"({zeros} counters at 0 not shown (--all shows them))"


def test_a_long_frame_is_cut_to_the_screen_and_says_so(driver: FakeDriver) -> None:
    every = frame(driver)
    assert len(every) > 12
    lines = frame(driver, max_lines=12)
    assert len(lines) == 12 and lines[1:11] == every[1:11]  # (line 0: the header, with the heartbeat's age)
    assert lines[-1] == f"({len(every) - 11} more lines not shown: narrow with --type/--label (or a taller terminal))"
    assert frame(driver, max_lines=len(every))[1:] == every[1:]  # what fits is left alone
