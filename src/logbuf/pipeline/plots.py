"""PNG figures of an analysis (matplotlib, Agg backend; drawn on the driver from collected results).

One theme for all of them: white, feed A black, feed B blue, re-request answers (R) green, freezes red.

- ``sequence_vs_time.png``: highest sequence per window on each feed (the slope is the message rate), with
  freezes and gaps on both feeds marked.
- ``freeze_<n>.png``: close-ups of each freeze: every packet a vertical mark from its first to its last
  sequence at its arrival time; left the whole freeze, right the end of the catch-up (the frozen feed level
  with the other again).
- ``delay_histogram.png``: A-B arrival delay (B minus A) of every message seen on both feeds: the core of the
  distribution and the full range (log counts), percentiles marked.
- ``rate_timeline.png``: messages/s per feed (a window without packets is zero, never the last value carried
  on), the lowest rate of any freeze bin (``--min-silence``, 50 ms) inside each window - a 150 ms freeze
  shows as a drop to zero in any window length -, messages per packet, and the share of delivered copies won
  by A, B and R (re-request) per window (no deliveries: a break in the line), freezes marked.
- ``gaps_timeline.png``: every gap (per feed and on both feeds) at its detection time, against its time to
  recover (filled by the other feed or by re-request); unrecovered gaps on the top edge. More than
  :data:`MAX_GAP_POINTS` gaps of one kind are aggregated per window: the slowest of the window, its marker
  sized by how many gaps the window had.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from logbuf.units import NANOS_PER_MILLI as _NS_PER_MS

# one theme for every figure (matplotlib's default, white): a colour per feed, one for freezes and gaps
COLORS = {"A": "#1f1f1f", "B": "#3d8bfd", "R": "#2ca02c"}
STYLES = {"A": "-", "B": "--", "R": "-"}  # A solid on top, B dashed: one never hides the other
ZORDER = {"A": 3, "B": 2, "R": 2}
MAX_GAP_POINTS = 1_000
FREEZE_COLOR = "#d62728"
CATCH_UP_COLOR = "#ff7f0e"
UNRECOVERED_COLOR = "#d62728"
_GAP_FLOOR_MS = 0.01  # gaps filled before (or as) they were detected are drawn on this line
_MIN_CATCH_UP_MS = 0.05  # a catch-up shorter than this is none: the feed resumed level with the other
MAX_FREEZE_PLOTS = 3


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _times(ns) -> np.ndarray:
    return np.asarray(ns, dtype="int64").astype("datetime64[ns]").astype("datetime64[ms]")


def _mark_events(ax, analysis) -> None:
    freezes = analysis.tables["freezes"]
    for i, row in enumerate(freezes.itertuples()):
        ax.axvspan(_times([row.silence_start_ns])[0], _times([row.catch_up_end_ns])[0], color=FREEZE_COLOR,
                   alpha=0.35, lw=0)
        ax.axvline(_times([row.silence_start_ns])[0], color=FREEZE_COLOR, lw=0.8, ls="--",
                   label="freeze" if i == 0 else None)


def sequence_vs_time(analysis, path: Path) -> Path:
    plt = _plt()
    rates = analysis.tables["rates"]
    fig, ax = plt.subplots(figsize=(11, 5))
    for feed in ("A", "B"):
        part = rates[rates["feed"] == feed]
        if part.empty:
            continue
        seq = np.maximum.accumulate(part["max_sequence"].to_numpy())
        ax.step(_times(part["window_start_ns"] + analysis.window_ns), seq, where="post", color=COLORS[feed],
                lw=1.2, ls=STYLES[feed], zorder=ZORDER[feed], label=f"feed {feed}")
    both = analysis.tables["gaps_both"]
    for i, row in enumerate(both.itertuples()):
        if pd.notna(row.detected_ns):
            ax.plot(_times([int(row.detected_ns)]), [row.first], "x", color="#ff7f0e", ms=9,
                    label="gap on both feeds" if i == 0 else None)
    _mark_events(ax, analysis)
    ax.set_xlabel("arrival time (UTC)")
    ax.set_ylabel("MoldUDP64 sequence")
    ax.set_title(f"Sequence number vs time, session {analysis.session} (slope = message rate)")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _packet_marks(ax, packets, t_ref: int, color: str, label: str, lw: float = 1.6) -> None:
    if packets is None or not packets.arrival.size:
        return
    x = (packets.arrival - t_ref) / _NS_PER_MS
    ax.vlines(x, packets.first - 0.4, packets.last + 0.4, colors=color, lw=lw, label=label)


def freeze_closeup(freeze_window: dict, path: Path, index: int) -> Path:
    plt = _plt()
    f = freeze_window["freeze"]
    packets = freeze_window["packets"]
    other = "B" if f.feed == "A" else "A"
    t_ref = f.silence_start_ns
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    end_ms = (f.catch_up_end_ns - t_ref) / _NS_PER_MS
    for ax in (left, right):
        # the end of the catch-up first (drawn underneath): the packet marks stay visible on top of it
        ax.axvline(end_ms, color=CATCH_UP_COLOR, lw=2.5, alpha=0.35, zorder=1,
                   label=f"end of catch-up (+{end_ms:,.1f} ms)")
        for feed in (other, f.feed, "R"):
            _packet_marks(ax, packets.get(feed), t_ref, COLORS[feed], f"feed {feed}")
        ax.set_xlabel(f"ms after feed {f.feed}'s last packet before the silence")
        ax.set_ylabel("sequence (each mark: one packet, first..last message)")
        ax.grid(alpha=0.3)
    left.set_xlim(-0.25 * f.silence_ms, end_ms + 0.35 * f.silence_ms)
    seq_lo = f.next_expected - max(50, f.burst_messages // 2)
    seq_hi = f.held_last + max(50, f.burst_messages // 2)
    left.set_ylim(seq_lo, seq_hi)
    left.axvspan(0, f.silence_ms, color=FREEZE_COLOR, alpha=0.15, lw=0, label="silence")
    left.set_title(f"Freeze on feed {f.feed}: {f.silence_ms:,.1f} ms silent, catch-up {f.catch_up_ms:,.1f} ms, "
                   f"{f.burst_messages_per_packet:,.0f} messages/packet", fontsize=10)
    left.legend(loc="upper left")
    # around the end of the catch-up: where feed X is level with feed Y again
    span = max(2.0, 0.1 * f.silence_ms)
    right.set_xlim(end_ms - 2 * span, end_ms + span)
    ranges: list[np.ndarray] = []
    for feed in (f.feed, other):
        p = packets.get(feed)
        if p is None:
            continue
        x = (p.arrival - t_ref) / _NS_PER_MS
        sel = (x >= end_ms - 2 * span) & (x <= end_ms + span)
        ranges += [p.first[sel], p.last[sel]]
    ys = np.concatenate(ranges) if ranges else np.array([0])
    if ys.size:
        right.set_ylim(ys.min() - 2, ys.max() + 2)
    if f.catch_up_ms < _MIN_CATCH_UP_MS:
        title = f"No catch-up burst: feed {f.feed} resumed level with feed {other}"
    else:
        title = f"Feed {f.feed} level with feed {other} again after a {f.catch_up_ms:,.1f} ms catch-up"
    right.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rebin(lows: np.ndarray, highs: np.ndarray, counts: np.ndarray, lo: int, hi: int, bins: int):
    """Spread log-linear bin counts over uniform bins on [lo, hi] (clipped), proportionally to overlap."""
    edges = np.linspace(lo, hi + 1, bins + 1)
    out = np.zeros(bins)
    sel = (highs >= lo) & (lows <= hi)
    for bl, bh, c in zip(lows[sel], highs[sel], counts[sel], strict=True):
        left, right = max(bl, lo), min(bh, hi) + 1
        width = bh - bl + 1
        i0 = int(np.searchsorted(edges, left, side="right")) - 1
        i1 = int(np.searchsorted(edges, right, side="left"))
        for i in range(max(i0, 0), min(i1, bins)):
            overlap = min(right, edges[i + 1]) - max(left, edges[i])
            if overlap > 0:
                out[i] += c * overlap / width
    return edges, out


def delay_histogram(analysis, path: Path) -> Path:
    plt = _plt()
    table = analysis.tables["delay_histogram"]
    lows, highs, counts = (table[c].to_numpy() for c in ("low_ns", "high_ns", "messages"))
    pct = analysis.delay_percentiles
    fig, (core, full) = plt.subplots(1, 2, figsize=(13, 4.8))
    if counts.size:
        cum = np.cumsum(counts) / counts.sum()  # the core: bins holding the 0.1 % .. 99.9 % quantiles
        lo = int(lows[min(np.searchsorted(cum, 0.001), cum.size - 1)])
        hi = int(highs[min(np.searchsorted(cum, 0.999), cum.size - 1)])
        if hi <= lo:
            lo, hi = int(lows.min()), int(highs.max())
        pad = max(1, (hi - lo) // 20)
        edges, values = _rebin(lows, highs, counts, lo - pad, hi + pad, 120)
        core.bar(edges[:-1] / _NS_PER_MS, values, width=np.diff(edges) / _NS_PER_MS, align="edge",
                 color="#3d8bfd")
        core.set_title("A-B delay, core (p0.1 - p99.9)")
        edges, values = _rebin(lows, highs, counts, int(lows.min()), int(highs.max()), 200)
        full.bar(edges[:-1] / _NS_PER_MS, np.maximum(values, 0), width=np.diff(edges) / _NS_PER_MS,
                 align="edge", color="#6c757d")
        full.set_yscale("log")
        full.set_title("A-B delay, full range (log count)")
        for ax in (core, full):
            for q, style in ((0.5, "-"), (0.99, "--")):
                if q in pct:
                    ax.axvline(pct[q] / _NS_PER_MS, color="#d62728", ls=style, lw=1,
                               label=f"p{q * 100:g} = {pct[q] / _NS_PER_MS:.3f} ms")
            ax.set_xlabel("arrival on B - arrival on A (ms); > 0: A first")
            ax.set_ylabel("messages")
            ax.grid(alpha=0.3)
            ax.legend()
    else:
        core.text(0.5, 0.5, "no message was received on both feeds", ha="center", transform=core.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def dense_windows(frame: pd.DataFrame, window_ns: int, start_ns: int, end_ns: int) -> pd.DataFrame:
    """``frame`` (one row per window with data, ``window_start_ns``) on every window from the first to the
    last arrival: windows without data are rows of NaN, for the caller to make zero or a break."""
    first = start_ns - start_ns % window_ns
    grid = np.arange(first, end_ns + 1, window_ns, dtype=np.int64)
    return frame.set_index("window_start_ns").reindex(grid).rename_axis("window_start_ns").reset_index()


def lowest_bin_rates(analysis, feed: str) -> pd.DataFrame:
    """Per window: the lowest message rate of any freeze bin inside it (an empty bin is 0 messages/s)."""
    bins = analysis.bins
    bin_ns = analysis.config.freeze.bin_ns
    per_window = analysis.window_ns // bin_ns
    live = bins[(bins["feed"] == feed) & (bins["packets"] > 0)]
    if live.empty or analysis.window_ns % bin_ns:
        return pd.DataFrame(columns=["window_start_ns", "lowest_per_s"])
    window = live["bin"].astype("int64") // per_window
    grouped = live.assign(window=window).groupby("window")["messages"].agg(["min", "count"])
    lowest = np.where(grouped["count"].to_numpy() < per_window, 0.0,
                      grouped["min"].astype("float64").to_numpy() / (bin_ns / 1e9))
    return pd.DataFrame({"window_start_ns": grouped.index.to_numpy(np.int64) * analysis.window_ns + analysis.t0,
                         "lowest_per_s": lowest})


def rate_timeline(analysis, path: Path) -> Path:
    plt = _plt()
    rates = analysis.tables["rates"]
    wins = analysis.tables["wins"]
    start, end = analysis.domain.start_ns, analysis.domain.end_ns
    fig, (ax_rate, ax_mpp, ax_win) = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True)
    bin_ms = analysis.config.freeze.bin_ns / _NS_PER_MS
    for feed in ("A", "B"):
        part = dense_windows(rates[rates["feed"] == feed].drop(columns="feed"), analysis.window_ns, start, end)
        t = _times(part["window_start_ns"])
        style = {"color": COLORS[feed], "ls": STYLES[feed], "zorder": ZORDER[feed]}
        ax_rate.step(t, part["messages_per_s"].fillna(0.0), where="post", lw=1.2, label=f"feed {feed}", **style)
        low = lowest_bin_rates(analysis, feed)
        if len(low):
            low = dense_windows(low, analysis.window_ns, start, end)
            ax_rate.step(_times(low["window_start_ns"]), low["lowest_per_s"].fillna(0.0), where="post", lw=0.7,
                         alpha=0.55, color=COLORS[feed], ls=":", label=f"feed {feed}: lowest {bin_ms:g} ms in window")
        # no packets, no messages per packet: a break in the line
        # a window between two empty ones is a step of one point: the marker keeps it visible
        ax_mpp.step(t, part["messages_per_packet"], where="post", lw=1.2, marker=".", ms=2, label=f"feed {feed}",
                    **style)
    if not wins.empty:
        dense = dense_windows(wins, analysis.window_ns, start, end)
        for feed in ("A", "B", "R"):
            ax_win.step(_times(dense["window_start_ns"]), 100 * dense[f"share_{feed}"], where="post",
                        color=COLORS[feed], ls=STYLES[feed], zorder=ZORDER[feed], lw=1.2, marker=".", ms=2,
                        label=f"won by {feed}" if feed != "R" else "recovered (R)")
    for ax in (ax_rate, ax_mpp, ax_win):
        _mark_events(ax, analysis)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    ax_rate.set_ylabel("messages / s")
    ax_rate.set_title(f"Message rate per {analysis.window_ns / _NS_PER_MS:,.0f} ms window (red: freezes)")
    ax_mpp.set_ylabel("messages / packet")
    ax_win.set_ylabel("delivered copy (%)")
    ax_win.set_xlabel("arrival time (UTC)")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _aggregate_gaps(times_ns: np.ndarray, ms: np.ndarray, window_ns: int) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray]:
    """Many gaps -> one point per window: the slowest gap's time to recover, and how many gaps there were."""
    windows = times_ns // window_ns
    frame = pd.DataFrame({"w": windows, "ms": ms}).groupby("w")["ms"].agg(["max", "count"])
    return frame.index.to_numpy(np.int64) * window_ns, frame["max"].to_numpy(), frame["count"].to_numpy()


def gaps_timeline(analysis, path: Path) -> Path:
    """Gaps over the session: detection time against time to recover (log ms); unrecovered on the top edge."""
    plt = _plt()
    per_feed = analysis.tables["gaps_feed"]
    both = analysis.tables["gaps_both"]
    fig, ax = plt.subplots(figsize=(11, 5))
    recover_ms: list[float] = []
    series = [(per_feed[per_feed["feed"] == f], "fill_delay_ns", COLORS[f], f"missed on feed {f} (filled by the "
               "other feed or re-request)", "o") for f in ("A", "B")]
    series.append((both, "time_to_recover_ns", CATCH_UP_COLOR, "lost on both feeds (re-request)", "D"))
    points = []
    unrecovered: list[np.ndarray] = []
    for frame, column, color, label, marker in series:
        if frame.empty:
            continue
        detected = frame["detected_ns"]
        known = detected.notna()
        delay = frame[column]
        done = known & delay.notna()
        ms = delay[done].astype("float64").to_numpy() / _NS_PER_MS
        recover_ms += ms.tolist()
        at = detected[done].astype("int64").to_numpy()
        if at.size > MAX_GAP_POINTS:  # overplotted: the slowest per window, sized by the window's gap count
            window = max(analysis.window_ns, (int(at.max()) - int(at.min())) // 500 + 1)
            at, ms, counts = _aggregate_gaps(at, ms, window)
            sizes = 12 + 4 * np.sqrt(counts.astype("float64"))
            label += f" - {int(counts.sum()):,} gaps: slowest per {window / 1e9:,.1f} s, area ~ count"
        else:
            sizes = 12 + 4 * np.sqrt(frame["size"][done].astype("float64").to_numpy())
        points.append((_times(at), np.maximum(ms, _GAP_FLOOR_MS), sizes, color, label, marker))
        open_ = known & delay.isna()
        if open_.any():
            unrecovered.append(_times(detected[open_].astype("int64")))
    top = max(max(recover_ms) * 3 if recover_ms else 1000.0, 10 * _GAP_FLOOR_MS)
    for times, ms, sizes, color, label, marker in points:
        ax.scatter(times, ms, s=sizes, color=color, marker=marker, alpha=0.7, label=label)
    if unrecovered:
        times = np.concatenate(unrecovered)
        ax.plot(times, np.full(len(times), top), "x", color=UNRECOVERED_COLOR, ms=9, ls="none",
                label="unrecovered (top edge)")
        ax.axhline(top, color=UNRECOVERED_COLOR, lw=0.6, ls=":")
    if not points and not unrecovered:
        ax.text(0.5, 0.5, "no gaps", ha="center", transform=ax.transAxes)
    else:
        ax.set_yscale("log")
        ax.axhline(_GAP_FLOOR_MS, color="#888888", lw=0.6, ls=":")
        ax.annotate(f"<= {_GAP_FLOOR_MS:g} ms: the other feed had delivered it already", (0.01, _GAP_FLOOR_MS),
                    xycoords=("axes fraction", "data"), xytext=(0, 4), textcoords="offset points", fontsize=8,
                    color="#555555")
    _mark_events(ax, analysis)
    if points or unrecovered:
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("detection time (UTC)")
    ax.set_ylabel("time to recover (ms, log; marker area ~ gap size)")
    ax.set_title(f"Gaps over time and their time to recover, session {analysis.session}")
    ax.grid(alpha=0.3)
    ax.grid(alpha=0.15, which="minor", axis="y")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_all(analysis, directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = {
        "sequence_vs_time": sequence_vs_time(analysis, directory / "sequence_vs_time.png"),
        "delay_histogram": delay_histogram(analysis, directory / "delay_histogram.png"),
        "rate_timeline": rate_timeline(analysis, directory / "rate_timeline.png"),
        "gaps_timeline": gaps_timeline(analysis, directory / "gaps_timeline.png"),
    }
    for i, window in enumerate(analysis.detail.get("freeze_windows", [])[:MAX_FREEZE_PLOTS], start=1):
        out[f"freeze_{i}"] = freeze_closeup(window, directory / f"freeze_{i}.png", i)
    return out
