"""Small formatting helpers shared by the tools (times, durations, rates, byte previews)."""

from __future__ import annotations

import datetime as _dt


def iso_ms(epoch_ms: int) -> str:
    """ISO-8601 local time with millisecond precision and UTC offset: ``2026-11-22T14:23:45.123+01:00``."""
    return _dt.datetime.fromtimestamp(epoch_ms / 1000).astimezone().isoformat(timespec="milliseconds")


def wall_time(epoch_ms: int) -> str:
    """``2026-11-22 14:23:45`` (local), for header lines."""
    return _dt.datetime.fromtimestamp(epoch_ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def duration(ms: int) -> str:
    """A compact duration: ``850 ms``, ``12.3 s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    if ms < 0:
        return "-" + duration(-ms)
    if ms < 1_000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def rate(per_second: float, unit: str = "") -> str:
    """A signed per-second rate with an SI prefix and its unit: ``+12/s``, ``+1.25k/s`` (a count),
    ``+2 kB/s``, ``-3.4 MB/s`` (``unit="B"``)."""
    sign = "-" if per_second < 0 else "+"
    value = abs(per_second)
    space = " " if unit else ""
    for prefix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{sign}{value / scale:.3g}{space}{prefix}{unit}/s"
    if value >= 10 or value == int(value):
        return f"{sign}{value:.0f}{space}{unit}/s"
    return f"{sign}{value:.2g}{space}{unit}/s"


def age(ms: int) -> str:
    """How long ago an epoch-ms timestamp was: ``age 850 ms``, ``age 4m05s`` (never negative)."""
    return f"age {duration(max(0, ms))}"


def hex_preview(data: bytes, more: bool = False) -> str:
    """``data`` as hex (``…`` appended when ``more`` follows), then its printable-ASCII rendering."""
    if not data:
        return ""
    ascii_text = "".join(chr(b) if 32 <= b < 127 else "." for b in data)
    return f"{data.hex()}{'…' if more else ''} |{ascii_text}|"
