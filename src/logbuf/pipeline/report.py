"""The one-page Markdown report: summary, findings, the plots, and the head of every table (with links)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

_NS_PER_MS = 1_000_000
MAX_ROWS = 12


def _cell(value) -> str:
    if value is None:
        return ""
    try:
        if pd.isna(value):
            return ""
    except (TypeError, ValueError):
        pass
    if isinstance(value, (float, np.floating)):
        return f"{value:,.3f}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return str(value).replace("|", "\\|")


def markdown_table(frame, max_rows: int = MAX_ROWS) -> str:
    if frame.empty:
        return "_(none)_\n"
    head = frame.head(max_rows)
    lines = ["| " + " | ".join(str(c) for c in head.columns) + " |",
             "|" + "|".join("---" for _ in head.columns) + "|"]
    for row in head.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if len(frame) > max_rows:
        lines.append(f"\n_{len(frame) - max_rows} more rows in the table files._")
    return "\n".join(lines) + "\n"


def _ms(ns) -> str:
    return "-" if ns is None else f"{ns / _NS_PER_MS:.3f} ms"


def _findings(analysis) -> list[str]:
    s = analysis.summary
    out = []
    pct = analysis.delay_percentiles
    if pct:
        out.append(f"Feed B arrives {_ms(pct.get(0.5))} after feed A at the median "
                   f"(p1 {_ms(pct.get(0.01))}, p99 {_ms(pct.get(0.99))}, over "
                   f"{s['delay']['messages_on_both']:,} messages seen on both feeds).")
    for row in analysis.tables["freezes"].itertuples():
        out.append(f"Feed {row.feed} froze for {row.silence_ms:.1f} ms at {row.silence_start_utc} while feed "
                   f"{'B' if row.feed == 'A' else 'A'} delivered {row.other_new_messages:,} new messages; it "
                   f"caught up in "
                   f"{row.catch_up_ms:.1f} ms with {row.burst_packets:,} packets of "
                   f"{row.burst_messages_per_packet:.1f} messages (usually {row.baseline_messages_per_packet:.1f}), "
                   f"{row.stale_messages:,} of its {row.burst_messages:,} messages already delivered by the "
                   "other feed.")
    for feed in ("A", "B"):
        info = s["feeds"].get(feed, {})
        if info:
            out.append(f"Feed {feed} missed {info.get('missing', 0):,} of {s['sequences']:,} sequences in "
                       f"{info.get('gaps', 0):,} gaps, and carried {info.get('duplicates', 0):,} duplicates.")
    for row in analysis.tables["gaps_both"].itertuples():
        text = f"Sequences {row.first}-{row.last} ({row.size}) were lost on both feeds: {row.status}"
        if row.status == "recovered" and pd.notna(row.time_to_recover_ns):
            text += f" {_ms(int(row.time_to_recover_ns))} after detection"
        out.append(text + ".")
    if s.get("freeze_candidates_truncated"):
        out.append(f"More silences qualified as freeze candidates than the {s['freeze_candidates']} examined "
                   "(the strongest first); raise max_freezes to see them all.")
    wins = s.get("wins", {})
    total = sum(wins.values())
    if total:
        out.append("Delivered copies: " + ", ".join(f"{feed} {100 * n / total:.2f} %" for feed, n in wins.items())
                   + ".")
    return out


def write(analysis, plots: dict[str, Path]) -> Path:
    out = analysis.out
    s = analysis.summary
    lines = [f"# Feed quality report - session {s['session']}", ""]
    lines.append(f"Recording `{s['recording']}`, {s['start_utc']} to {s['end_utc']}; sequences "
                 f"{s['sequence_first']:,}-{s['sequence_last']:,}, {s['messages_delivered']:,} messages delivered. "
                 f"Analysed in {s['seconds']:.1f} s.")
    lines += ["", "## Findings", ""]
    lines += [f"- {f}" for f in _findings(analysis)]
    lines += ["", "## Feeds", ""]
    feeds = pd.DataFrame([{"feed": k, **{c: v.get(c) for c in ("data_packets", "messages_received", "distinct",
                                                                "duplicates", "missing", "gaps", "earliest",
                                                                "control_packets")}}
                          for k, v in s["feeds"].items() if v])
    lines.append(markdown_table(feeds))
    sections = [
        ("Sequence number vs time", "sequence_vs_time", None),
        ("A-B delay", "delay_histogram", "delay_percentiles"),
        ("Message rate, messages per packet, win share", "rate_timeline", None),
        ("Head-end freezes", None, "freezes"),
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
    lines += ["", "Stage times: " + ", ".join(f"{k} {v:.1f} s" for k, v in s.get("stage_seconds", {}).items()), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
