"""The feed handler end to end: `logbuf replay` (A/B with faults) -> `logbuf feed` -> a logbuf subscriber."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import logbuf
from logbuf.exchange.dayfile import read_messages
from logbuf.feed import published as out
from logbuf.marketdata import itch
from logbuf.samples.book import TopOfBook
from logbuf.samples.ports import free_udp_ports
from support import in_namespace, stop_process, wait_until

pytestmark = pytest.mark.timeout(120)
LOGBUF = [sys.executable, "-m", "logbuf.cli"]




@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    path = tmp_path_factory.mktemp("day") / "day.itch"
    subprocess.run([*LOGBUF, "synth", str(path), "--messages", "20000", "--seed", "5", "-q"], check=True, timeout=60)
    return path, [itch.encode(m) for m in read_messages(path)]


def run_scenario(  # type: ignore[no-untyped-def]
    tmp_path: Path, day_file: Path, feed_args: list[str], replay_args: list[str], *,
    prefix: tuple[str, ...] = (), feed_a: str | None = None, feed_b: str | None = None,
):
    """Runs driver (embedded) + feed + replay; returns (messages, events, feed summary, replay summary).

    ``prefix`` runs the feed handler and the replay inside a network namespace (``ip netns exec NAME``); the
    driver and the subscribers stay outside: shared memory does not care about network namespaces."""
    a, b, r = free_udp_ports(3)
    feed_a = feed_a or f"127.0.0.1:{a}"
    feed_b = feed_b or f"127.0.0.1:{b}"
    LOGBUF = [*prefix, sys.executable, "-m", "logbuf.cli"]  # noqa: N806
    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=4 << 20)
    env = dict(os.environ, LOGBUF_DIR=str(driver.directory))
    procs: list[subprocess.Popen] = []
    try:
        with logbuf.connect(driver.directory) as client:
            messages = client.add_subscription("aeron:ipc", out.MESSAGES_STREAM)
            events = client.add_subscription("aeron:ipc", out.EVENTS_STREAM)
            feed = subprocess.Popen(
                [*LOGBUF, "feed", "--feed-a", feed_a, "--feed-b", feed_b, "--until-end-of-session",
                 "--summary-json", str(tmp_path / "feed.json"), "-q", *feed_args,
                 *(["--retransmit", f"127.0.0.1:{r}", "--seed", "1"] if "--no-recovery" not in feed_args else [])],
                env=env,
            )
            procs.append(feed)
            wait_until(lambda: messages.images and events.images, 20, what="the feed handler's publications")
            replay = subprocess.Popen(
                [*LOGBUF, "replay", str(day_file), "--feed-a", feed_a, "--feed-b", feed_b,
                 "--speed", "max", "--retransmit", f"127.0.0.1:{r}", "--linger-s", "5", "--eos-interval-s", "0.2",
                 "--summary-json", str(tmp_path / "replay.json"), "-q", *replay_args],
                env=env,
            )
            procs.append(replay)
            got: list[tuple[int, bytes]] = []
            seen: list[tuple[int, out.FeedEvent]] = []  # (messages received when the event was seen, event)

            def on_event(buf: memoryview, header: logbuf.Header) -> None:
                seen.append((len(got), out.FeedEvent.decode(buf)))

            def on_message(buf: memoryview, header: logbuf.Header) -> None:
                sequence = header.reserved_value
                if got and sequence != got[-1][0] + 1:
                    # a jump: a record published before this message (in the handler's order) is visible now
                    events.poll(on_event, 1000)
                got.append((sequence, bytes(buf)))

            deadline = time.monotonic() + 90
            while feed.poll() is None:
                assert time.monotonic() < deadline, "feed handler did not finish"
                events.poll(on_event, 100)
                if not messages.poll(on_message, 1000):
                    messages.wait(0.01)
            events.poll(on_event, 1000)
            while messages.poll(on_message, 1000):
                pass
            assert feed.wait(10) == 0
            replay.wait(30)
        return got, seen, json.loads((tmp_path / "feed.json").read_text()), json.loads((tmp_path / "replay.json").read_text())
    finally:
        for proc in procs:
            stop_process(proc)
        driver.close()


def test_faulty_a_and_b_with_recovery_give_the_exact_day(tmp_path: Path, day) -> None:  # type: ignore[no-untyped-def]
    day_file, expected = day
    got, seen, feed, replay = run_scenario(
        tmp_path, day_file, [],
        ["--faults-a", "loss=0.02,reorder=0.01,freeze=0.002", "--faults-b", "loss=0.02,duplicate=0.02",
         "--drop-both", "5000-5019"],
    )
    assert [seq for seq, _ in got] == list(range(1, len(expected) + 1))  # exactly once, in order
    assert [msg for _, msg in got] == expected  # byte-identical to the day file
    assert feed["published"] == len(expected) and feed["unpublished"] == 0
    assert feed["gaps_unrecoverable"] == 0 and feed["gaps_recovered"] == feed["gaps_detected"] >= 1
    # the range lost on both feeds was detected and recovered from the retransmission server
    detected = [e for _, e in seen if e.kind == out.GAP_DETECTED]
    recovered = [e for _, e in seen if e.kind == out.GAP_RECOVERED]
    for lost in range(5000, 5020):  # every message of the range was in a declared, then recovered, gap
        assert any(e.first <= lost <= e.last for e in detected)
        assert any(e.first <= lost <= e.last for e in recovered)
    assert feed["RETRANSMIT.delivered"] >= 20
    assert feed["A.duplicates"] + feed["B.duplicates"] > 0  # both feeds carried the same messages


def test_without_recovery_a_range_lost_on_both_is_announced_before_the_jump(tmp_path: Path, day) -> None:  # type: ignore[no-untyped-def]
    day_file, expected = day
    got, seen, feed, _ = run_scenario(
        tmp_path, day_file, ["--no-recovery", "--mode", "a", "--feed-b", "off"], ["--drop-a", "3000-3099"],
    )
    seqs = [seq for seq, _ in got]
    assert 3000 not in seqs and 3100 in seqs
    assert seqs == [s for s in range(1, len(expected) + 1) if not 3000 <= s <= 3099]
    unrecoverable = [(at, e) for at, e in seen if e.kind == out.GAP_UNRECOVERABLE]
    assert [(e.first, e.last) for _, e in unrecoverable] == [(3000, 3099)]
    at, _ = unrecoverable[0]
    assert at <= seqs.index(3100)  # subscribers saw the gap record no later than the jump
    assert feed["gaps_unrecoverable"] == 1 and feed["messages_unrecoverable"] == 100
    assert [msg for seq, msg in got] == [expected[s - 1] for s in seqs]


def test_top_of_book_follows_adds_executions_and_cancels() -> None:
    book = TopOfBook()
    directory = itch.StockDirectory(
        stock_locate=7, tracking_number=0, timestamp=1, stock=b"ACME    ", market_category=b"Q",
        financial_status=b"N", round_lot_size=100, round_lots_only=b"N", issue_classification=b"C",
        issue_sub_type=b"  ", authenticity=b"P", short_sale_threshold=b"N", ipo_flag=b"N", luld_tier=b"1",
        etp_flag=b"N", etp_leverage_factor=0, inverse_indicator=b"N",
    )
    messages = [
        directory,
        itch.AddOrder(7, 0, 2, 1, b"B", 100, b"ACME    ", 1_000_000),
        itch.AddOrder(7, 0, 3, 2, b"B", 50, b"ACME    ", 1_010_000),
        itch.AddOrder(7, 0, 4, 3, b"S", 70, b"ACME    ", 1_020_000),
        itch.OrderExecuted(7, 0, 5, 2, 20, 1),
        itch.OrderCancel(7, 0, 6, 3, 70),
    ]
    for seq, msg in enumerate(messages, 1):
        book.on_message(itch.encode(msg), seq)
    assert book.top("ACME") == ((1_010_000, 30), None)
    book.on_message(itch.encode(itch.OrderDelete(7, 0, 7, 2)), 7)
    assert book.top("ACME") == ((1_000_000, 100), None)


def test_multicast_a_and_b_groups_inside_a_network_namespace(tmp_path: Path, day, multicast_netns: str) -> None:  # type: ignore[no-untyped-def]
    day_file, expected = day
    a, b = free_udp_ports(2)
    got, seen, feed, _ = run_scenario(
        tmp_path, day_file, ["--interface", "127.0.0.1"], ["--faults-a", "loss=0.01", "--faults-b", "loss=0.01"],
        prefix=tuple(in_namespace(multicast_netns)), feed_a=f"239.192.7.1:{a}", feed_b=f"239.192.7.2:{b}",
    )
    assert [seq for seq, _ in got] == list(range(1, len(expected) + 1))
    assert [msg for _, msg in got] == expected
    assert feed["A.packets"] > 0 and feed["B.packets"] > 0  # both groups were joined and received
    assert feed["gaps_unrecoverable"] == 0


def test_delivered_runs_keep_the_32_byte_row_layout() -> None:
    import numpy as np

    runs = out.delivered_runs(np.array([5, 6, 7, 9], np.uint64), np.array([0, 0, 1, 1], np.uint8),
                              np.array([10, 10, 10, 11], np.int64))
    assert [(r["first"], r["count"], r["feed"]) for r in runs] == [(5, 2, 0), (7, 1, 1), (9, 1, 1)]
    assert runs.dtype.itemsize == out.CAPTURE_ROW_LENGTH
    merged = np.concatenate([runs, runs]).astype(out.DELIVERED_ROW)
    assert len(merged.tobytes()) == 6 * out.CAPTURE_ROW_LENGTH
    assert (out.decode_capture(out.CAPTURE_DELIVERED, merged.tobytes())["first"] == [5, 7, 9, 5, 7, 9]).all()
