"""The one-page Markdown report: a headline, findings, the plots, and the head of every table (with links).

Every table is shown in the report's units: durations in milliseconds, times of day as UTC ``HH:MM:SS.mmm``
(the CSV/Parquet files keep the exact integer nanoseconds); every column is explained under its table
(:data:`COLUMNS`, also in ``docs/analytics.md``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from logbuf.units import NANOS_PER_MILLI as _NS_PER_MS
from logbuf.units import NANOS_PER_SECOND as _NS_PER_S

MAX_ROWS = 12

# Columns holding a duration (shown in ms) and an epoch time (shown as UTC time of day) in the report.
DURATION_COLUMNS = {"delay_ns", "time_to_recover_ns", "fill_delay_ns", "low_ns", "high_ns"}
EPOCH_COLUMNS = {"detected_ns", "recovered_ns", "filled_ns", "silence_start_ns", "resume_ns", "catch_up_end_ns",
                 "window_start_ns"}
SHARE_COLUMNS = {"share"}  # fractions, shown as percentages

# What each column of the report's tables means (the report lists them under each table).
COLUMNS: dict[str, str] = {
    "feed": "A / B: the live feeds; R: answers to re-requests (recovery)",
    "data_packets": "MoldUDP64 packets carrying messages",
    "control_packets": "heartbeats and end-of-session packets",
    "messages_received": "message copies received (duplicates included)",
    "distinct": "distinct sequences received",
    "duplicates": "copies of a sequence already received on the same feed",
    "missing": "sequences of the session the feed never carried",
    "missed_pct": "missing as a share of the session's sequences (%)",
    "gaps": "runs of consecutive missing sequences",
    "earliest": "sequences this feed delivered first (won the A/B arbitration)",
    "percentile": "nearest-rank percentile (exact)",
    "delay_ms": "arrival on B minus arrival on A (ms); > 0: A first",
    "first": "first sequence of the gap",
    "last": "last sequence of the gap (inclusive)",
    "size": "sequences in the gap",
    "status": "recovered / partly recovered / unrecovered by re-request",
    "recovered_messages": "sequences of the gap that arrived by re-request",
    "detected": "UTC time the gap was noticed (the feed handler's event, else the next packet after it)",
    "recovered": "UTC time the last sequence of the gap arrived by re-request",
    "time_to_recover_ms": "recovered minus detected (ms)",
    "handler_event": "the feed handler declared this gap (gap events of the recording)",
    "handler_first": "first sequence of the handler's gap event",
    "handler_last": "last sequence of the handler's gap event",
    "detected_utc": "detection time, full UTC date and time",
    "filled": "UTC time the last missing sequence arrived on another feed (B/A or R)",
    "fill_delay_ms": "filled minus detected (ms): how long the feed handler waited for that gap; < 0: the "
                     "other feed had delivered it before this feed's gap showed",
    "unfilled": "sequences of the gap no feed delivered",
    "on_both": "the gap overlaps a gap of the other feed (then only re-request can fill it)",
    "ended_early": "the feed's tail after it went off the air before the session's end: not on the air, not lost",
    "silence_start": "UTC time of the frozen feed's last packet before its silence",
    "resume": "UTC time of its first packet after the silence",
    "silence_ms": "length of the silence (ms)",
    "next_expected": "first sequence the frozen feed owed when it went silent",
    "resume_sequence": "first sequence of its first packet after the silence",
    "other_new_messages": "messages the other feed delivered during the silence",
    "catch_up_end": "UTC time the frozen feed was level with the other feed again",
    "catch_up_ms": "catch-up end minus resume (ms); 0: it resumed level with the other feed",
    "settled": "its lateness returned to the usual within the examined window",
    "burst_packets": "packets of the catch-up burst",
    "burst_messages": "messages of the catch-up burst",
    "burst_messages_per_packet": "messages per packet in the burst",
    "baseline_messages_per_packet": "messages per packet before the freeze",
    "burst_rate_msgs_per_s": "message rate during the burst (messages/s)",
    "baseline_lateness_ms": "usual lateness of this feed behind the other (ms)",
    "peak_lateness_ms": "largest lateness during the freeze (ms)",
    "held_first": "first sequence held back by the freeze",
    "held_last": "last sequence held back by the freeze",
    "stale_messages": "burst messages the other feed had already delivered",
    "silence_start_utc": "silence start, full UTC date and time",
    "type": "ITCH 5.0 message type",
    "name": "its name in the ITCH specification",
    "messages": "messages delivered",
    "share_pct": "share of all delivered messages (%)",
    "stock_locate": "the day's locate code of the symbol",
    "stock": "symbol",
    "adds": "add-order messages (A, F)",
    "executions": "execution messages (E, C, P)",
    "executed_shares": "shares executed",
}


def _cell(value) -> str:
    """A value as the report shows it: thousands separators, at most 3 decimals, no trailing zeros, no inf."""
    if value is None:
        return ""
    try:
        if pd.isna(value):
            return ""
    except (TypeError, ValueError):
        pass
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return ""
        if abs(value) >= 1e6 or float(value).is_integer():
            return f"{value:,.0f}"
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    return str(value).replace("|", "\\|")


def _time_of_day(ns) -> str:
    if ns is None or pd.isna(ns):
        return ""
    ns = int(ns)
    seconds = (ns // _NS_PER_S) % 86_400
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{ns % _NS_PER_S // _NS_PER_MS:03d}"


def for_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The report's view of a table: ``*_ns`` durations in ms, epoch times as UTC time of day, renamed so."""
    out = pd.DataFrame(index=frame.index)
    for column in frame.columns:
        values = frame[column]
        if column in DURATION_COLUMNS:
            out[column[:-3] + "_ms"] = [None if pd.isna(v) else int(v) / _NS_PER_MS for v in values]
        elif column in EPOCH_COLUMNS:
            out[column[:-3]] = [_time_of_day(v) for v in values]
        elif column in SHARE_COLUMNS:
            out[column + "_pct"] = values * 100
        else:
            out[column] = values
    return out


def markdown_table(frame: pd.DataFrame, max_rows: int = MAX_ROWS, explain: bool = True) -> str:
    if frame.empty:
        return "_(none)_\n"
    frame = for_display(frame)
    head = frame.head(max_rows)
    lines = ["| " + " | ".join(str(c) for c in head.columns) + " |",
             "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(head[c]) else "---" for c in head.columns) + "|"]
    for row in head.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if len(frame) > max_rows:
        lines.append(f"\n_{len(frame) - max_rows:,} more rows in the table files._")
    if explain:
        notes = [f"`{c}` {COLUMNS[c]}" for c in head.columns if c in COLUMNS]
        if notes:
            lines.append("\nColumns: " + "; ".join(notes) + ".")
    return "\n".join(lines) + "\n"


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def _ms(ns) -> str:
    return "-" if ns is None else f"{_cell(ns / _NS_PER_MS)} ms"


def _pct(part: int, whole: int) -> str:
    if not whole:
        return "0 %"
    value = 100 * part / whole
    if 0 < value < 0.01:
        return "< 0.01 %"
    if 99.99 < value < 100:
        return "> 99.99 %"
    return f"{value:.2f} %"


def headline(analysis) -> list[str]:
    """The report's first lines: delivered / recovered / lost, what each feed missed and why, and the gaps
    lost on both feeds by recovery status."""
    s = analysis.summary
    sequences = s["sequences"]
    wins = s.get("wins", {})
    delivered = s.get("messages_delivered", sum(wins.values()))
    recovered = wins.get("R", 0)
    both = analysis.tables["gaps_both"]
    lost = int((both["size"] - both["recovered_messages"]).sum()) if len(both) else 0
    lines = [f"**{_cell(delivered)} of {_cell(sequences)} messages delivered ({_pct(delivered, sequences)}), "
             f"{_cell(recovered)} of them recovered by re-request; {_cell(lost)} lost "
             f"({_pct(lost, sequences)}).**", ""]
    per_feed = analysis.tables["gaps_feed"]
    freezes = analysis.tables["freezes"]
    for feed in ("A", "B"):
        info = s["feeds"].get(feed) or {}
        if not info:
            continue
        missing = int(info.get("missing") or 0)
        gaps = per_feed[per_feed["feed"] == feed]
        tail = gaps[gaps["ended_early"]] if "ended_early" in gaps else gaps.iloc[0:0]
        gaps = gaps.drop(index=tail.index)
        on_both = gaps[gaps["on_both"]]
        single = gaps[~gaps["on_both"]]
        causes = []
        if len(single):
            causes.append(f"{_cell(int(single['size'].sum()))} in {_cell(len(single))} {_plural(len(single), 'gap')} the other "
                          "feed filled")
        if len(on_both):
            causes.append(f"{_cell(int(on_both['size'].sum()))} in {_cell(len(on_both))} {_plural(len(on_both), 'gap')} lost on both feeds")
        frozen = freezes[freezes["feed"] == feed] if len(freezes) else freezes
        if len(frozen):
            causes.append(f"{len(frozen)} {_plural(len(frozen), 'freeze')} ({float(frozen['silence_ms'].max()):,.1f} ms "
                          "the longest; late, not missed)")
        ended = (s.get("ended_early") or {}).get(feed)
        if ended:
            causes.append(f"{_cell(int(ended['not_on_air']))} after it ended early at "
                          f"{_time_of_day(ended['end_ns'])} (sequence {_cell(int(ended['last_sequence']))}; "
                          "not on the air, not lost)")
        text = f"- Feed {feed} missed {_pct(missing, sequences)} ({_cell(missing)} sequences)"
        lines.append(text + (": " + "; ".join(causes) if causes else "") + ".")
    if len(both):
        counts = both["status"].value_counts()
        lines.append(f"- Gaps lost on both feeds: {_cell(len(both))} ({_cell(int(counts.get('recovered', 0)))} "
                     f"recovered, {_cell(int(counts.get('partly recovered', 0)))} partly recovered, "
                     f"{_cell(int(counts.get('unrecovered', 0)))} unrecovered); "
                     f"[table](tables/gaps_both.csv) below.")
    else:
        lines.append("- No gap was lost on both feeds.")
    return lines


def headline_text(analysis) -> str:
    """One line for a terminal: delivered / recovered / lost, the median A-B delay, freezes and gaps."""
    s = analysis.summary
    sequences = s["sequences"]
    wins = s.get("wins", {})
    delivered = s.get("messages_delivered", sum(wins.values()))
    both = analysis.tables["gaps_both"]
    lost = int((both["size"] - both["recovered_messages"]).sum()) if len(both) else 0
    p50 = analysis.delay_percentiles.get(0.5)
    return (f"{_cell(delivered)} of {_cell(sequences)} messages delivered, {_cell(wins.get('R', 0))} recovered, "
            f"{_cell(lost)} lost; A-B delay p50 {_ms(p50)}; {len(analysis.tables['freezes'])} "
            f"{_plural(len(analysis.tables['freezes']), 'freeze')}; {len(both)} {_plural(len(both), 'gap')} on "
            f"both feeds ({s['gaps_both_unrecovered']} unrecovered)")


def _findings(analysis) -> list[str]:
    s = analysis.summary
    out = []
    pct = analysis.delay_percentiles
    if pct:
        out.append(f"Feed B arrives {_ms(pct.get(0.5))} after feed A at the median "
                   f"(p1 {_ms(pct.get(0.01))}, p99 {_ms(pct.get(0.99))}, over "
                   f"{s['delay']['messages_on_both']:,} messages seen on both feeds).")
    for row in analysis.tables["freezes"].itertuples():
        catch_up = (f"caught up in {_cell(row.catch_up_ms)} ms with {row.burst_packets:,} packets of "
                    f"{_cell(row.burst_messages_per_packet)} messages (usually "
                    f"{_cell(row.baseline_messages_per_packet)})" if row.catch_up_ms > 0
                    else "resumed level with the other feed (no catch-up burst)")
        out.append(f"Feed {row.feed} froze for {_cell(row.silence_ms)} ms at {row.silence_start_utc} while feed "
                   f"{'B' if row.feed == 'A' else 'A'} delivered {row.other_new_messages:,} new messages; it "
                   f"{catch_up}; {row.stale_messages:,} of its {row.burst_messages:,} messages were already "
                   "delivered by the other feed.")
    both = analysis.tables["gaps_both"]
    done = both["time_to_recover_ns"].dropna() if len(both) else []
    if len(done):
        out.append(f"Gaps lost on both feeds took {_ms(int(np.median(done)))} to recover at the median "
                   f"(longest {_ms(int(np.max(done)))}).")
    if s.get("freeze_candidates_truncated"):
        out.append(f"More silences qualified as freeze candidates than the {s['freeze_candidates']} examined "
                   "(the strongest first); raise --max-freezes to examine more.")
    wins = s.get("wins", {})
    total = sum(wins.values())
    if total:
        names = {"A": "A", "B": "B", "R": "R (re-request)"}
        out.append("Delivered copies: " + ", ".join(f"{names.get(feed, feed)} {_pct(n, total)}"
                                                    for feed, n in wins.items()) + ".")
    return out


def feeds_table(analysis) -> pd.DataFrame:
    s = analysis.summary
    rows = []
    for feed, info in s["feeds"].items():
        if not info:
            continue
        row = {"feed": feed}
        for column in ("data_packets", "control_packets", "messages_received", "distinct", "duplicates",
                       "missing", "gaps", "earliest"):
            value = info.get(column)
            row[column] = None if value is None else int(value)
        row["missed_pct"] = (100 * row["missing"] / s["sequences"]
                             if row["missing"] is not None and s["sequences"] else None)
        rows.append(row)
    frame = pd.DataFrame(rows)
    for column in frame.columns:
        if column not in ("feed", "missed_pct"):
            frame[column] = pd.array(frame[column], dtype="Int64")
    return frame


def write(analysis, plots: dict[str, Path]) -> Path:
    out = analysis.out
    s = analysis.summary
    lines = [f"# Feed quality report - session {s['session']}", ""]
    lines += [f"> **Warning:** {w}." for w in s.get("host_warnings", [])]
    if s.get("host_warnings"):
        lines.append("")
    lines += headline(analysis)
    lines += ["", f"Recording `{s['recording']}`, {s['start_utc']} to {s['end_utc']}; sequences "
              f"{s['sequence_first']:,}-{s['sequence_last']:,}; time series in "
              f"{_cell(s['window_ns'] / _NS_PER_MS)} ms windows. Analysed in {s['seconds']:.1f} s."]
    lines += ["", "## Findings", ""]
    lines += [f"- {f}" for f in _findings(analysis)]
    lines += ["", "## Feeds", "", markdown_table(feeds_table(analysis))]
    sections = [
        ("Sequence number vs time", "sequence_vs_time", None),
        ("A-B delay", "delay_histogram", "delay_percentiles"),
        ("Message rate, messages per packet, win share", "rate_timeline", None),
        ("Head-end freezes", None, "freezes"),
        ("Gaps over time", "gaps_timeline", None),
        ("Gaps on both feeds", None, "gaps_both"),
        ("Gaps per feed", None, "gaps_feed"),
        ("ITCH message types", None, "message_types"),
        ("Most active symbols", None, "symbols"),
    ]
    for title, plot, table in sections:
        lines += [f"## {title}", ""]
        if plot and plot in plots:
            lines += [f"![{title}](plots/{plots[plot].name})", ""]
        if title == "Head-end freezes":
            for name, path in plots.items():
                if name.startswith("freeze_"):
                    lines += [f"![{name}](plots/{path.name})", ""]
        if table:
            lines.append(f"Table: [{table}.csv](tables/{table}.csv), [{table}.parquet](tables/{table}.parquet)")
            lines += ["", markdown_table(analysis.tables[table])]
    others = [n for n in analysis.tables if n not in {t for _, _, t in sections}]
    lines += ["## Other tables", ""]
    lines += [f"- [{n}.csv](tables/{n}.csv) / [{n}.parquet](tables/{n}.parquet)" for n in others]
    lines += ["", "Times in the table files are integer nanoseconds (`*_ns`: since the Unix epoch, or a "
              "duration where the name says delay or recover); shares there are fractions; the report shows ms, "
              "UTC times of day and percentages.",
              "", "Stage times: " + ", ".join(f"{k} {v:.1f} s" for k, v in s.get("stage_seconds", {}).items()), ""]
    path = out / "report.md"
    tmp = out / ".report.md.tmp"
    tmp.write_text("\n".join(lines))
    tmp.replace(path)
    return path
