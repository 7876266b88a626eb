"""Renders ``python -m bench peers`` results: a Markdown report and PNG bar charts (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SIZE_NAMES = {32: "32 B", 256: "256 B", 1024: "1 KiB", 4096: "4 KiB"}


def size_name(size: int) -> str:
    return SIZE_NAMES.get(size, f"{size} B")


def rate(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    if value >= 1e3:
        return f"{value / 1e3:.0f} k"
    return f"{value:.0f}"


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def _failed(row: dict[str, Any]) -> str:
    if not row["failed"]:
        return ""
    first = row["failed"][0]
    return f" ⚠ {len(row['failed'])} run(s) failed: {first}"


def _header(result: dict[str, Any]) -> list[str]:
    m, noise, s = result["machine"], result["noise"], result["settings"]
    vm = f", {m['hypervisor']} guest" if m.get("hypervisor") else ""
    sizing = (f"{s['messages']:,} messages per producer per run" if s["messages"]
              else f"runs sized to ≈{s['seconds']:g} s by a calibration round")
    lines = [
        f"Measured {result['date']} on {m['cpu']} ({m['cores']} cores{vm}, Linux {m['kernel']}), "
        f"Python {m['python']}; median of {s['runs']} interleaved rounds ({sizing}, {s['warmup']:,} warm-up "
        f"messages in each run); {result['duration_s'] / 60:.1f} min in all.",
        "",
        f"Command: `{result['command']}`",
        "",
    ]
    others = noise["others_cpu_median"]
    state = ("**The machine was busy — treat the figures as noisy.**" if noise["busy"]
             else "The machine was otherwise quiet.")
    lines.append(
        f"{state} Load average (1 min) {m['load_1m_at_start']:.2f} before the run, {m['load_1m_at_end']:.2f} after "
        f"(the latter includes the benchmark's own processes). Other processes used {_pct(others)} of the CPUs "
        f"during a median run (max {_pct(noise['others_cpu_max'])}; {noise['runs_with_others_over_10pct']} of "
        f"{noise['runs_measured']} runs above 10%); hypervisor steal {_pct(noise['steal_median'])}."
    )
    return lines


def _targets(result: dict[str, Any]) -> list[str]:
    lines = ["", "## Targets", "", "| target | measured | |", "|---|---:|---|"]
    for t in result["targets"]:
        value = t["measured"]
        if value is None:
            shown = "not measured"
        elif t["unit"] == "msg/s":
            shown = f"{rate(value)} msg/s"
        elif t["unit"] == "×":
            shown = f"{value:.2f}×"
        else:
            shown = f"{value:.2f} µs"
        verdict = "—" if t["met"] is None else ("**met**" if t["met"] else "**missed**")
        lines.append(f"| {t['target']} | {shown} | {verdict} |")
    lines.append("")
    lines.append("Ratios are medians of per-round ratios (both measured in the same round). Where a target is "
                 "missed, `PROFILE.md` shows why.")
    return lines


def _throughput(result: dict[str, Any]) -> list[str]:
    lines = ["", "## Throughput: one producer process → one consumer process", "",
             "| peer | payload | msg/s | min..max | MB/s | CPU s / M msg | vs pyzmq | vs naive ring |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in sorted(result["throughput"], key=lambda r: (r["size"], -(r["msgs_per_s"] or 0))):
        vs, vs_naive = row.get("vs_zmq"), row.get("vs_naive")
        lines.append(
            f"| {row['label']}{_failed(row)} | {size_name(row['size'])} | {rate(row['msgs_per_s'])} | "
            f"{rate(row['min_msgs_per_s'])}..{rate(row['max_msgs_per_s'])} | {_num(row['mb_per_s'], '{:,.0f}')} | "
            f"{_num(row['cpu_s_per_million'])} | {'—' if vs is None else f'{vs:.2f}×'} | "
            f"{'—' if vs_naive is None else f'{vs_naive:.2f}×'} |"
        )
    lines.append("")
    lines.append("CPU is the producer's + the consumer's + any helper's (logbuf's conductor duty, the media driver) "
                 "CPU time over the measured part, from rusage / schedstat, per million messages. Every run's "
                 "count and stamp checksum were verified; a failed check fails the run instead of giving a number.")
    return lines


def _multi(result: dict[str, Any]) -> list[str]:
    rows = result["multi"]
    if not rows:
        return []
    counts = sorted({r["producers"] for r in rows})
    size = rows[0]["size"]
    lines = ["", f"## Multi-producer throughput: N producer processes → one consumer ({size_name(size)})", "",
             "| peer | " + " | ".join(f"{n} → 1" for n in counts) + " | CPU s / M msg at " + f"{counts[-1]} → 1 |",
             "|---|" + "---:|" * (len(counts) + 1)]
    by_peer: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        by_peer.setdefault(row["peer"], {})[row["producers"]] = row
    for cells in by_peer.values():
        label = next(iter(cells.values()))["label"]
        last = cells.get(counts[-1])
        flags = "".join(_failed(c) for c in cells.values())
        lines.append(f"| {label}{flags} | " + " | ".join(rate(cells[n]["msgs_per_s"]) if n in cells else "—"
                                                      for n in counts)
                     + f" | {_num(last and last['cpu_s_per_million'])} |")
    lines.append("")
    lines.append(f"Aggregate msg/s over all producers. On {result['machine']['cores']} cores, more producers "
                 "than cores share CPUs with the consumer: the figures show how each transport degrades.")
    return lines


def _rtt(result: dict[str, Any]) -> list[str]:
    rows = result["rtt"]
    if not rows:
        return []
    lines = ["", "## Ping-pong round trip", "",
             "| peer | wait | payload | p50 µs | p99 µs | p99.9 µs | round trips / run |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in sorted(rows, key=lambda r: (r["size"], r["p50_us"] or float("inf"))):
        lines.append(f"| {row['label']}{_failed(row)} | {row['wait']} | {size_name(row['size'])} | "
                     f"{_num(row['p50_us'])} | {_num(row['p99_us'])} | {_num(row['p999_us'])} | "
                     f"{row['samples']:,} |")
    lines.append("")
    lines.append("One message each way over two channels of the peer's kind; `perf_counter_ns` around send + "
                 "receive in the pinger; the echo's stamp is checked. *backoff*: non-blocking receive in a "
                 "spin (≤ 50 µs) → yield (×100) → park loop; *blocking*: the library's blocking receive. Blocking "
                 "round trips are bimodal on this VM: ~5 µs when the other vCPU happens to be busy, 50–100 µs "
                 "when it has halted (each wake-up of a halted vCPU costs ~30 µs), so their medians move with "
                 "the machine's background load; `peers.json` keeps every run.")
    return lines


def _skipped(result: dict[str, Any]) -> list[str]:
    if not result["skipped"]:
        return []
    lines = ["", "## Skipped", ""]
    for s in result["skipped"]:
        lines.append(f"- {s['name']}: {s['reason']}")
    return lines


def _usage(result: dict[str, Any]) -> list[str]:
    lines = ["", "## How each peer is used", ""]
    for key, text in result["usage"].items():
        lines.append(f"- **{result['labels'][key]}** — {text}")
    lines.append("- Every message carries an 8-byte stamp in its last bytes (producer, index); producers send "
                 "from 1024 pre-built messages; the consumer reads every stamp (per message in Python, or "
                 "with numpy for logbuf's batch API) and the harness checks count and checksum.")
    return lines


def markdown(result: dict[str, Any], charts: list[str]) -> str:
    lines = ["# logbuf against its peers", "", "<!-- peers-results -->"]
    lines += _header(result)
    lines += _targets(result)
    lines += _throughput(result)
    lines += _multi(result)
    lines += _rtt(result)
    lines.append("<!-- /peers-results -->")
    lines += _skipped(result)
    lines += _usage(result)
    if charts:
        lines += ["", "## Charts", ""] + [f"![{name}]({name})" for name in charts]
    return "\n".join(lines) + "\n"


# -- charts -------------------------------------------------------------------------------------------


def charts(result: dict[str, Any], out: Path) -> list[Path]:
    """Writes peers_throughput.png, peers_cpu.png, peers_multi.png and peers_rtt.png (those with data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    subtitle = f"{result['machine']['cpu']}, {result['machine']['cores']} cores — {result['date']}"
    if result["noise"]["busy"]:
        subtitle += " (machine busy: noisy)"

    def save(fig: Any, name: str, bottom: float = 0.0) -> None:
        fig.tight_layout(rect=(0, bottom, 1, 1))
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    tput = [r for r in result["throughput"] if r["msgs_per_s"]]
    sizes = sorted({r["size"] for r in tput})
    for metric, name, xlabel in (("msgs_per_s", "peers_throughput.png", "messages / s (log)"),
                                 ("cpu_s_per_million", "peers_cpu.png", "CPU seconds per million messages (log)")):
        if not tput:
            break
        fig, axes = plt.subplots(1, len(sizes), figsize=(max(7.5, 5.6 * len(sizes)), 5.0), squeeze=False)
        for ax, size in zip(axes[0], sizes, strict=True):
            rows = sorted((r for r in tput if r["size"] == size), key=lambda r: r[metric])
            labels = [r["label"] for r in rows]
            values = [r[metric] for r in rows]
            colors = ["tab:blue" if r["peer"].startswith("logbuf") else "tab:gray" for r in rows]
            if metric == "msgs_per_s":
                err = [[v - r["min_msgs_per_s"] for v, r in zip(values, rows, strict=True)],
                       [r["max_msgs_per_s"] - v for v, r in zip(values, rows, strict=True)]]
                ax.barh(labels, values, xerr=err, color=colors, capsize=3)
                if size == 32:
                    ax.axvline(5e6, color="tab:red", ls="--", lw=1, label="per-message target 5 M")
                    ax.axvline(30e6, color="tab:orange", ls="--", lw=1, label="batch target 30 M")
                    ax.legend(fontsize=7, loc="lower right")
            else:
                ax.barh(labels, values, color=colors)
            ax.set_xscale("log")
            ax.set_title(size_name(size))
            ax.set_xlabel(xlabel)
            ax.tick_params(axis="y", labelsize=8)
        fig.suptitle(("Throughput" if metric == "msgs_per_s" else "CPU cost") + ", 1 producer → 1 consumer "
                     "(median; bars: min..max)\n" + subtitle, fontsize=9)
        save(fig, name)

    multi = [r for r in result["multi"] if r["msgs_per_s"]]
    if multi:
        peers = list(dict.fromkeys(r["peer"] for r in multi))
        counts = sorted({r["producers"] for r in multi})
        fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(peers)), 4.5))
        width = 0.8 / len(counts)
        for i, n in enumerate(counts):
            values = [next((r["msgs_per_s"] for r in multi if r["peer"] == p and r["producers"] == n), 0)
                      for p in peers]
            ax.bar([k + i * width for k in range(len(peers))], values, width, label=f"{n} → 1")
        ax.set_xticks([k + width * (len(counts) - 1) / 2 for k in range(len(peers))])
        ax.set_xticklabels([result["labels"][p] for p in peers], rotation=25, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("messages / s, all producers (log)")
        ax.legend(title="producers", fontsize=8)
        ax.set_title(f"Multi-producer throughput ({size_name(multi[0]['size'])})\n{subtitle}", fontsize=9)
        save(fig, "peers_multi.png")

    rtt = [r for r in result["rtt"] if r["p50_us"]]
    if rtt:
        sizes = sorted({r["size"] for r in rtt})
        fig, axes = plt.subplots(1, len(sizes), figsize=(max(7.5, 5.6 * len(sizes)), 5.0), squeeze=False)
        for ax, size in zip(axes[0], sizes, strict=True):
            rows = sorted((r for r in rtt if r["size"] == size), key=lambda r: -r["p50_us"])
            labels = [f"{r['label']} ({r['wait']})" for r in rows]
            colors = ["tab:blue" if r["peer"].startswith("logbuf") else "tab:gray" for r in rows]
            ax.barh(labels, [r["p50_us"] for r in rows], color=colors, label="p50")
            ax.scatter([r["p99_us"] for r in rows], labels, marker="|", s=120, color="black", label="p99", zorder=3)
            ax.axvline(1.5, color="tab:red", ls="--", lw=1, label="p50 target 1.5 µs")
            ax.set_xscale("log")
            ax.set_xlabel("round trip µs (log)")
            ax.set_title(size_name(size))
            ax.tick_params(axis="y", labelsize=8)
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, fontsize=8, loc="lower center", ncol=3)
        fig.suptitle("Ping-pong round trip (median of runs' p50 and p99)\n" + subtitle, fontsize=9)
        save(fig, "peers_rtt.png", bottom=0.07)
    return written
