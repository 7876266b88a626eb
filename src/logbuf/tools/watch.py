"""``logbuf stat --watch``: a live view of the counters, redrawn every interval, with per-second rates
(with units: ``B/s`` for positions and byte counters), ages of timestamp counters (client heartbeats) and
a streams section giving each subscriber's lag behind its publication (``pub-pos - sub-pos``).

``RateTracker`` is pure (fed snapshots and a monotonic time); ``watch`` does the I/O: it reads, renders,
writes and sleeps.  On a terminal each frame clears the screen and redraws; otherwise (a pipe, a file) the
frames follow each other separated by a blank line, or as JSON Lines with ``--json``.  The view never
exits on the driver's state: a missing or dead driver is shown in the frame and the view keeps polling
(a restarted driver's new cnc.dat is picked up).  Ctrl-C ends it with status 0.

A driver has 40 system counters before any stream (a feed handler adds ~90 more), most of them 0: on a
terminal, unless ``--type``/``--label`` choose, the view leaves out counters that are 0 (``--all`` shows
them) and cuts the frame to the terminal's height, saying what it left out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TextIO

from logbuf.tools import _fmt
from logbuf.tools.cnc_stat import CounterSample, StatSnapshot, format_stat
from logbuf.tools.exit_codes import ExitCode, ToolError
from logbuf.units import epoch_ms

CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, erase display


class RateTracker:
    """Per-second change of each counter between consecutive snapshots.

    A counter is the same counter across snapshots only if its id, type, registration id and label are
    unchanged (ids are reused after a counter is freed).  Counters whose value is a timestamp (client
    heartbeats) get no rate.
    """

    def __init__(self) -> None:
        self._last_s: float | None = None
        self._last: dict[int, tuple[tuple[int, int, str], int]] = {}

    @staticmethod
    def _identity(sample: CounterSample) -> tuple[int, int, str]:
        return sample.type_id, sample.registration_id, sample.label

    def update(self, snapshot: StatSnapshot, now_s: float) -> dict[int, float]:
        """Rates (counter id -> units per second) since the previous ``update``; {} on the first one."""
        rates: dict[int, float] = {}
        elapsed = None if self._last_s is None else now_s - self._last_s
        current: dict[int, tuple[tuple[int, int, str], int]] = {}
        for sample in snapshot.counters:
            identity = self._identity(sample)
            current[sample.counter_id] = (identity, sample.value)
            if elapsed is None or elapsed <= 0 or sample.value_is_epoch_ms:
                continue
            previous = self._last.get(sample.counter_id)
            if previous is not None and previous[0] == identity:
                rates[sample.counter_id] = (sample.value - previous[1]) / elapsed
        self._last, self._last_s = current, now_s
        return rates

    def reset(self) -> None:
        self._last_s, self._last = None, {}


def watch(
    read: Callable[[], StatSnapshot],
    out: TextIO,
    *,
    interval_s: float = 1.0,
    count: int | None = None,
    json_lines: bool = False,
    tty: bool | None = None,
    keep: Callable[[CounterSample], bool] | None = None,
    hide_zero: bool = False,
    max_lines: int | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    clock_ms: Callable[[], int] = epoch_ms,
) -> int:
    """Renders ``read()`` every ``interval_s`` until Ctrl-C or ``count`` frames; returns 0.

    ``read`` raising a ToolError (no driver, bad file) shows the error in that frame and carries on.
    ``hide_zero`` leaves out the counters that are 0 and ``max_lines`` cuts a text frame to that many
    lines; the frame's last line then says what was left out.
    """
    if tty is None:
        tty = out.isatty()
    tracker = RateTracker()
    frames = 0
    try:
        while True:
            started = monotonic()
            try:
                snapshot = read()
                rates = tracker.update(snapshot, started)
                shown = snapshot.select(keep) if keep else snapshot
                zeros = 0
                if hide_zero:
                    nonzero = shown.select(lambda sample: sample.value != 0)
                    zeros = len(shown.counters) - len(nonzero.counters)
                    shown = nonzero
                # lags pair counters the filter may hide (a sub-pos with its pub-pos): computed on the whole
                # snapshot, shown for the subscriber positions the filter keeps
                kept = {s.counter_id for s in shown.counters}
                lags = [lag for lag in snapshot.stream_lags() if lag.subscriber_counter_id in kept]
                if json_lines:
                    text = shown.to_json(rates=rates, lags=lags) + "\n"
                else:
                    text = format_stat(shown, rates=rates, details=True, lags=lags)
                    if shown.header.inactive_reason():
                        text += f"\n{shown.header.inactive_reason()}\n"
                    text = _fit(text, zeros, max_lines)
            except ToolError as exc:
                tracker.reset()
                now_ms = clock_ms()
                if json_lines:
                    text = (
                        json.dumps(
                            {
                                "time_ms": now_ms,
                                "time": _fmt.iso_ms(now_ms),
                                "error": str(exc),
                                "exit_code": int(exc.exit_code),
                            }
                        )
                        + "\n"
                    )
                else:
                    text = f"{_fmt.wall_time(now_ms)} - {exc}\n(waiting; Ctrl-C to quit)\n"
            if json_lines:
                out.write(text)
            elif tty:
                out.write(CLEAR_SCREEN + text)
            else:
                out.write(("\n" if frames else "") + text)
            out.flush()
            frames += 1
            if count is not None and frames >= count:
                return ExitCode.OK
            sleep(max(0.0, interval_s - (monotonic() - started)))
    except KeyboardInterrupt:
        if tty and not json_lines:
            out.write("\n")
            out.flush()
        return ExitCode.OK


def _fit(text: str, zeros: int, max_lines: int | None) -> str:
    """``text`` cut to ``max_lines`` lines (the last saying what was cut) and a note of hidden zero counters."""
    notes = [f"{zeros} counters at 0 not shown (--all shows them)"] if zeros else []
    lines = text.splitlines()
    if max_lines is not None and len(lines) + len(notes) > max_lines:
        keep = max(1, max_lines - 1)
        notes = [f"{len(lines) - keep} more lines"
                 + (f", {zeros} counters at 0" if zeros else "")
                 + " not shown: narrow with --type/--label (or a taller terminal)"]
        lines = lines[:keep]
    return "\n".join(lines + [f"({note})" for note in notes]) + "\n"
