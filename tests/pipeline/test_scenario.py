"""The scenario generator: its recording really contains the faults its truth claims (checked with numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from logbuf.pipeline.scenario import FreezeSpec, ScenarioConfig, packet_starts
from logbuf.recording import schema
from logbuf.recording.reader import read_dataset


def _received(packets, feed, n):
    sel = (packets["feed"] == feed) & packets["count"].between(1, schema.MAX_DATA_COUNT)
    got = np.zeros(n + 2, bool)
    for first, count in packets[sel][["sequence", "count"]].to_numpy():
        got[first:first + count] = True
    return got[1:n + 1]


def test_truth_matches_the_recording(scenario):
    root, truth = scenario
    packets = read_dataset(root, schema.PACKETS).to_pandas()
    messages = read_dataset(root, schema.MESSAGES).to_pandas()
    n = truth.sequences
    for feed in ("A", "B"):
        missing = ~_received(packets, feed, n)
        edges = np.diff(np.concatenate(([0], missing.view(np.int8), [0])))
        runs = list(zip((np.flatnonzero(edges == 1) + 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))
        assert runs == [tuple(r) for r in truth.feed_gaps[feed]]
    both = ~_received(packets, "A", n) & ~_received(packets, "B", n)
    assert both.sum() == sum(g.last - g.first + 1 for g in truth.both_gaps)
    assert messages["sequence"].is_unique and len(messages) == truth.delivered
    unrecovered = [g for g in truth.both_gaps if g.recovered_ns is None]
    assert truth.delivered == n - sum(g.last - g.first + 1 for g in unrecovered)
    assert messages["feed"].value_counts().to_dict() == {k: v for k, v in truth.wins.items() if v}
    gaps = read_dataset(root, schema.GAPS).to_pandas()
    assert sorted(zip(gaps["first"], gaps["last"], strict=True)) == [(g.first, g.last) for g in truth.both_gaps]


def test_freeze_silences_feed_a_then_bursts(scenario):
    root, truth = scenario
    (f,) = truth.freezes
    packets = read_dataset(root, schema.PACKETS).to_pandas()
    a = packets[(packets["feed"] == "A") & packets["count"].between(1, schema.MAX_DATA_COUNT)]
    inside = a[(a["arrival_ns"] > f.silence_start_ns) & (a["arrival_ns"] < f.resume_ns)]
    assert inside.empty and f.resume_ns - f.silence_start_ns >= 150_000_000
    burst = a[(a["arrival_ns"] >= f.resume_ns) & (a["arrival_ns"] <= f.catch_up_end_ns)]
    assert len(burst) == f.catch_up_packets and int(burst["count"].sum()) == f.catch_up_messages
    assert burst["count"].mean() > 20  # ~70 messages per catch-up packet vs ~1-2 normally


def test_b_is_delayed_by_the_configured_amount(scenario):
    root, truth = scenario
    packets = read_dataset(root, schema.PACKETS).to_pandas()
    data = packets[packets["count"].between(1, schema.MAX_DATA_COUNT)]
    first = {feed: dict(zip(g["sequence"], g["arrival_ns"], strict=True)) for feed, g in data.groupby("feed", observed=True)}
    common = [s for s in first["B"] if s in first["A"]][:5000]  # packets starting at the same message
    delays = np.array([first["B"][s] - first["A"][s] for s in common])
    assert abs(np.median(delays) - truth.config["b_delay_ns"]) < truth.config["jitter_ns"] + 100_000


def test_packets_never_exceed_the_budget():
    rng = np.random.default_rng(1)
    ts = np.cumsum(rng.integers(0, 60_000, 5000))
    lengths = rng.integers(21, 52, 5000)
    starts = packet_starts(ts, lengths, 1400, 50_000, np.array([100, 2000]))
    ends = np.append(starts[1:], ts.size)
    sizes = [int(lengths[s:e].sum()) + 20 for s, e in zip(starts, ends, strict=True)]
    assert max(sizes) <= 1400 and {100, 2000} <= set(starts.tolist())
    quiet = np.flatnonzero(np.diff(ts) > 50_000) + 1
    assert quiet.size and set(quiet.tolist()) <= set(starts.tolist())  # feed-time quiet always flushes


def test_bad_configurations_are_rejected():
    with pytest.raises(ValueError, match="overlap"):
        ScenarioConfig(messages=1000, both_lost=(100, 110), unrecovered=(105, 120))
    with pytest.raises(ValueError, match="within"):
        ScenarioConfig(messages=1000, both_lost=(990, 1010))
    with pytest.raises(ValueError, match="loss_a"):
        ScenarioConfig(loss_a=1.5)
    with pytest.raises(ValueError, match="feed"):
        FreezeSpec(feed="C")
    with pytest.raises(ValueError, match="date"):
        ScenarioConfig(date="05/01/2026")
