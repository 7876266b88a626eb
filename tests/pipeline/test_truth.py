"""A hostile recording, analysed once: catch-up packets sharing arrival stamps (stored in reverse sequence
order), 20 ranges lost on both feeds, feed A off the air before the session's end. The analysis must find
exactly what the scenario injected."""

from __future__ import annotations

import pytest

from logbuf.exchange.synth import OPEN_NS
from logbuf.pipeline.scenario import MOLD_HEADER, FreezeSpec, ScenarioConfig, generate

pytestmark = pytest.mark.spark
MS = 1_000_000
BOTH_LOST = tuple((2_000 + 1_500 * i, 2_002 + 1_500 * i) for i in range(20))
HOSTILE = ScenarioConfig(
    messages=40_000, seed=5, b_delay_ns=4 * MS, jitter_ns=200_000, loss_a=0.002, loss_b=0.002,
    # small catch-up packets (a message or two each), stamped alike four at a time
    freezes=(FreezeSpec(feed="A", at_ns=OPEN_NS + 300 * MS, duration_ns=150 * MS, shared_stamps=4,
                        catch_up_budget=MOLD_HEADER + 52),),
    both_lost=BOTH_LOST[0], more_both_lost=BOTH_LOST[1:], a_ends_after=36_000,
)


@pytest.fixture(scope="module")
def hostile(spark, tmp_path_factory):
    from logbuf.pipeline.host import late_warnings
    from logbuf.pipeline.job import analyze
    from logbuf.pipeline.options import AnalyzeConfig

    root = tmp_path_factory.mktemp("hostile") / "recording"
    truth = generate(HOSTILE, root, progress=False)
    out = tmp_path_factory.mktemp("hostile-out")
    # file:// in, file:// out: the same filesystem layer a cluster's URIs go through
    # and as if the replay behind it had run 11 s late on a busy host
    warnings = tuple(late_warnings([{"max_late_ms": 11_109.0, "late_packets": 812}]))
    # the persisted projection here (the shared analysis re-reads the local files)
    config = AnalyzeConfig(plots=False, host_warnings=warnings, cache_packets=True)
    result = analyze(spark, root.as_uri(), out.as_uri(), config, progress="off")
    return truth, result


def test_a_freeze_whose_catch_up_packets_share_arrival_stamps_is_found_exactly(hostile):
    truth, result = hostile
    (expected,) = truth.freezes
    assert expected.catch_up_packets >= 8  # several groups of equal stamps
    freezes = result.tables["freezes"]
    assert len(freezes) == 1, freezes
    f = freezes.iloc[0]
    assert (f["feed"], f["silence_start_ns"], f["resume_ns"]) == (expected.feed, expected.silence_start_ns,
                                                                   expected.resume_ns)
    assert f["held_first"] == expected.held_first and f["resume_sequence"] == expected.held_first
    # the catch-up burst as the truth defines it: every packet sent while the backlog lasted
    assert (f["catch_up_end_ns"], f["burst_packets"], f["burst_messages"]) == (
        expected.catch_up_end_ns, expected.catch_up_packets, expected.catch_up_messages)


def test_twenty_ranges_lost_on_both_feeds_with_exact_recovery_times(hostile):
    truth, result = hostile
    both = result.tables["gaps_both"]
    assert [(int(r.first), int(r.last)) for r in both.itertuples()] == list(BOTH_LOST)
    by_first = {g.first: g for g in truth.both_gaps}
    for row in both.itertuples():
        expected = by_first[row.first]
        assert row.status == "recovered" and row.recovered_messages == 3
        assert (row.detected_ns, row.recovered_ns) == (expected.detected_ns, expected.recovered_ns)
        assert row.time_to_recover_ns == expected.recovered_ns - expected.detected_ns


def test_a_feed_that_ended_early_is_reported_as_ended_early_not_as_loss_on_both(hostile):
    truth, result = hostile
    last = truth.a_last_sequence
    ended = result.summary["ended_early"]
    assert set(ended) == {"A"} and ended["A"]["last_sequence"] == last
    assert ended["A"]["not_on_air"] == truth.sequences - last
    gaps = result.tables["gaps_feed"]
    tail = gaps[gaps["ended_early"]]
    assert [(r.feed, r.first, r.last) for r in tail.itertuples()] == [("A", last + 1, truth.sequences)]
    assert not tail["on_both"].any()
    report = (result.out / "report.md").read_text()
    head = report.split("## Findings")[0]
    assert "after it ended early at" in head and "not lost" in head
    assert f"Gaps lost on both feeds: {len(BOTH_LOST)} ({len(BOTH_LOST)} recovered" in head


def test_the_report_opens_with_the_warning_that_delays_reflect_a_late_host(hostile):
    _, result = hostile
    report = (result.out / "report.md").read_text()
    first_lines = report.split("## Findings")[0]
    assert "> **Warning:** the replay ran up to 11,109.0 ms late" in first_lines
    assert "reflect the host, not the feeds" in first_lines
    assert result.summary["host_warnings"] and "11,109.0 ms" in result.summary["host_warnings"][0]
