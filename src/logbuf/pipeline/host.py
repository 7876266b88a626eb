"""Did the host keep up? Warnings when the replay or the feed handler that produced a recording ran late.

A recording holds arrival times, and a busy host shifts them: a replay that sends packets seconds after their
due time, or a handler that logs them seconds after they arrived, turns host load into "delay" between the
feeds and into "freezes". The summaries those processes write (``logbuf replay --summary-json``: the
``max_late_ms`` of its packets; ``logbuf feed --summary-json``: its ``wire_to_log_p99_ns``) say so, and
:func:`late_warnings` turns them into one line each, for ``logbuf demo`` and for the report.
"""

from __future__ import annotations

import json
import os

from logbuf.units import NANOS_PER_MILLI

DEFAULT_LATE_THRESHOLD_NS = 50 * NANOS_PER_MILLI
REFLECT = "delays and freezes measured then reflect the host, not the feeds"


def late_warnings(summaries: list[dict], threshold_ns: int = DEFAULT_LATE_THRESHOLD_NS) -> list[str]:
    """One warning per summary whose process ran later than ``threshold_ns``: a replay's packets sent late
    (``max_late_ms``) or a feed handler's wire-to-log latency (``wire_to_log_p99_ns``)."""
    out = []
    limit_ms = threshold_ns / NANOS_PER_MILLI
    for summary in summaries:
        if "max_late_ms" in summary:
            late = float(summary.get("max_late_ms") or 0.0)
            if late > limit_ms:
                out.append(f"the replay ran up to {late:,.1f} ms late ({int(summary.get('late_packets', 0)):,} "
                           f"packets more than 1 ms late; threshold {limit_ms:g} ms): {REFLECT}")
        if "wire_to_log_p99_ns" in summary:
            p99 = float(summary.get("wire_to_log_p99_ns") or 0) / NANOS_PER_MILLI
            if p99 > limit_ms:
                out.append(f"the feed handler ran late: wire-to-log p99 {p99:,.1f} ms (threshold {limit_ms:g} ms): "
                           f"{REFLECT}")
    return out


def read_summaries(paths: list[str | os.PathLike]) -> list[dict]:
    """The JSON summaries at ``paths`` (a missing or unreadable one is an error naming it)."""
    out = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable summary ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a summary (a JSON object)")
        out.append(data)
    return out
