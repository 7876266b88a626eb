from __future__ import annotations

import collections
import hashlib
from pathlib import Path

import numpy as np
import pytest

from logbuf.exchange.dayfile import DayFileReader, read_messages
from logbuf.exchange.synth import CLOSE_NS, OPEN_NS, SynthConfig, write_day
from logbuf.marketdata import itch
from support import child_env, stop_process, wait_until


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_day(SynthConfig(messages=8_000, seed=3), str(a), progress=False)
    write_day(SynthConfig(messages=8_000, seed=3), str(b), progress=False)
    write_day(SynthConfig(messages=8_000, seed=4), str(c), progress=False)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_exact_count_and_too_small_is_an_error(tmp_path: Path) -> None:
    assert write_day(SynthConfig(messages=4_321, seed=1), str(tmp_path / "d"), progress=False) == 4_321
    assert len(read_messages(tmp_path / "d")) == 4_321
    with pytest.raises(ValueError, match="too few"):
        write_day(SynthConfig(messages=50, seed=1), str(tmp_path / "e"), progress=False)


def test_day_structure_and_stateful_book(small_day: Path) -> None:
    messages = read_messages(small_day)
    events = [(m.event_code, m.timestamp) for m in messages if isinstance(m, itch.SystemEvent)]
    assert [e for e, _ in events] == [b"O", b"S", b"Q", b"M", b"E", b"C"]
    assert dict((e, t) for e, t in events)[b"Q"] == OPEN_NS and dict((e, t) for e, t in events)[b"M"] == CLOSE_NS
    assert messages[0] == itch.SystemEvent(0, 0, messages[0].timestamp, b"O")
    assert messages[-1].event_code == b"C"

    # the directory comes before any order, one R per symbol
    first_order = next(i for i, m in enumerate(messages) if isinstance(m, itch.AddOrder | itch.AddOrderMpid))
    directory = [m for m in messages[:first_order] if isinstance(m, itch.StockDirectory)]
    locates = {m.stock_locate for m in messages if hasattr(m, "order_ref") or isinstance(m, itch.OrderReplace)}
    assert {m.stock_locate for m in directory} >= locates - {0}
    assert len({m.stock_locate for m in directory}) == len(directory)

    timestamps = [m.timestamp for m in messages]
    assert timestamps == sorted(timestamps)
    assert sum(a == b for a, b in zip(timestamps, timestamps[1:], strict=False)) > 0.02 * len(timestamps)  # same-ns runs

    # replay the book: every E/C/X/D/U names a live order, refs unique and increasing, never crossed
    live: dict[int, list] = {}  # ref -> [locate, side, shares, price]
    last_ref = 0
    best: dict[tuple[int, bytes], set[int]] = collections.defaultdict(set)
    noii = cross = 0
    for m in messages:
        if isinstance(m, itch.AddOrder | itch.AddOrderMpid):
            assert m.order_ref > last_ref
            last_ref = m.order_ref
            live[m.order_ref] = [m.stock_locate, m.side, m.shares, m.price]
            best[(m.stock_locate, m.side)].add(m.price)
            bids, asks = best[(m.stock_locate, b"B")], best[(m.stock_locate, b"S")]
            assert not bids or not asks or max(bids) < min(asks)
        elif isinstance(m, itch.OrderReplace):
            assert m.original_order_ref in live and m.new_order_ref > last_ref
            last_ref = m.new_order_ref
            locate, side, _, _ = live.pop(m.original_order_ref)
            live[m.new_order_ref] = [locate, side, m.shares, m.price]
            best[(locate, side)].add(m.price)
        elif isinstance(m, itch.OrderExecuted | itch.OrderExecutedWithPrice | itch.OrderCancel):
            order = live[m.order_ref]
            taken = m.cancelled_shares if isinstance(m, itch.OrderCancel) else m.executed_shares
            assert 0 < taken <= order[2]
            if isinstance(m, itch.OrderCancel):
                assert taken < order[2]  # partial
            order[2] -= taken
            if order[2] == 0:
                del live[m.order_ref]
        elif isinstance(m, itch.OrderDelete):
            del live[m.order_ref]
        elif isinstance(m, itch.Noii):
            noii += 1
            assert OPEN_NS - 5 * 60 * 10**9 <= m.timestamp < OPEN_NS or CLOSE_NS - 10 * 60 * 10**9 <= m.timestamp < CLOSE_NS
        elif isinstance(m, itch.CrossTrade):
            cross += 1
            assert m.timestamp >= OPEN_NS
    assert noii > 0 and cross == 2 * len(directory)


def test_mix_is_close_to_a_real_open(small_day: Path) -> None:
    with DayFileReader(small_day) as reader:
        types = np.concatenate([b.headers().type for b in reader.blocks()])
    share = {chr(t): float(np.mean(types == t)) for t in np.unique(types)}
    assert 0.30 < share["A"] < 0.47
    assert 0.15 < share["U"] < 0.27
    assert 0.14 < share["F"] < 0.24
    assert 0.12 < share["D"] < 0.22
    assert 0.01 < share["E"] < 0.05
    assert {"X", "C", "P", "I", "Q", "H", "Y", "L"} <= share.keys()


def test_intensity_is_u_shaped_with_open_spike(small_day: Path) -> None:
    with DayFileReader(small_day) as reader:
        ts = np.concatenate([b.headers().timestamp for b in reader.blocks()]).astype(np.int64)
    minute = 60 * 10**9
    first = np.sum((ts >= OPEN_NS) & (ts < OPEN_NS + minute))
    midday = np.sum((ts >= OPEN_NS + 180 * minute) & (ts < OPEN_NS + 181 * minute))
    last = np.sum((ts >= CLOSE_NS - 10 * minute) & (ts < CLOSE_NS)) / 10
    premarket = np.sum((ts >= OPEN_NS - 120 * minute) & (ts < OPEN_NS - 119 * minute))
    assert first > 5 * max(midday, 1)
    assert last > midday * 1.5
    assert premarket < max(midday, 1)


def test_itchfeed_decodes_every_message(small_day: Path) -> None:
    from itch.parser import MessageParser

    ours = read_messages(small_day)
    theirs = []
    with open(small_day, "rb") as f:
        theirs = list(MessageParser().parse_file(f))
    assert len(theirs) == len(ours)
    for mine, other in zip(ours, theirs, strict=True):
        assert other.message_type == itch.message_type(mine)
        assert other.to_bytes() == itch.encode(mine)


def test_itch_book_finds_a_consistent_book(small_day: Path) -> None:
    core = pytest.importorskip("itch_book._core", reason="itch-book is not installed (pip install itch-book)")
    session = core.Session(tables=[], depth=0, symbols=[])
    session.feed(np.fromfile(small_day, dtype=np.uint8))
    stats = session.stats()
    assert stats["messages"] == 30_000
    assert stats["malformed"] == 0 and stats["unknown"] == 0 and stats["pending_bytes"] == 0
    assert stats["missing_ref"] == 0
    assert stats["dup_ref"] == 0
    assert stats["crossed_books"] == 0
    assert stats["rejected"] == 0
    assert stats["last_event"] == "C"


def test_itch_book_notices_a_broken_stream(tmp_path: Path) -> None:
    """The validator above can fail: a delete of an unknown order is counted as missing_ref."""
    core = pytest.importorskip("itch_book._core", reason="itch-book is not installed")
    raws = [itch.encode(itch.SystemEvent(0, 0, 1, b"O")), itch.encode(itch.OrderDelete(1, 0, 2, 12345))]
    framed = b"".join(len(r).to_bytes(2, "big") + r for r in raws)
    session = core.Session(tables=[], depth=0, symbols=[])
    session.feed(np.frombuffer(framed, dtype=np.uint8))
    assert session.stats()["missing_ref"] == 1


# ---- the command line: atomic output, validation, interruption --------------------------------------------


def _logbuf(*argv: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "logbuf.cli", *argv]


def test_synth_accepts_count_suffixes_and_writes_atomically(tmp_path: Path) -> None:
    from logbuf.cli import main

    out = tmp_path / "day.itch"
    assert main(["synth", str(out), "-n", "5k", "--symbols", "10", "-q"]) == 0
    assert len(read_messages(out)) == 5_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day.itch"]  # no temporary left beside it


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupted_synth_leaves_no_partial_day(tmp_path: Path, sig: str) -> None:
    import signal
    import subprocess

    out = tmp_path / "day.itch"
    out.write_bytes(b"the previous day")
    proc = subprocess.Popen(_logbuf("synth", str(out), "-n", "50M", "-q"), stderr=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        def writing() -> bool:
            assert proc.poll() is None, f"synth ended ({proc.returncode}) before it was interrupted"
            return any(p.name.endswith(".partial") and p.stat().st_size > 0 for p in tmp_path.iterdir())

        wait_until(writing, timeout=60, what="synth to start writing")
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(timeout=30) == 130
        err = proc.stderr.read()
    finally:
        stop_process(proc)
    assert "interrupted" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day.itch"]
    assert out.read_bytes() == b"the previous day"


@pytest.mark.parametrize("argv, fragment", [
    (["synth", "{tmp}/x.itch", "-n", "10"], "too few"),
    (["synth", "{tmp}/missing/x.itch", "-n", "5k"], "no such directory"),
    (["replay", "{bad}"], "truncated day file"),
    (["retransmit", "{bad}"], "truncated day file"),
])
def test_one_line_errors_and_nothing_written(argv: list[str], fragment: str, tmp_path: Path, tiny_day: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from logbuf.cli import main

    bad = tmp_path / "cut.itch"
    bad.write_bytes(tiny_day.read_bytes()[:-7])  # what an interrupted writer used to leave
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main([a.format(tmp=tmp_path, bad=bad) for a in argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_help_shows_every_default_and_one_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import re

    from logbuf.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("synth", "replay", "retransmit"):
        command = sub.choices[name]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
            if action.option_strings and action.nargs != 0:  # flags (store_true, -v counts) have no value
                assert "default" in action.help, f"{name} {action.option_strings} does not show its default"
        text = command.format_help()
        assert not re.search(r"seed \d", text, re.IGNORECASE)
        for old in ("--duration-s", "--linger-s", "--eos-interval-s", "--heartbeat-s", "--workers"):
            assert old not in text
    assert "--duration" in sub.choices["retransmit"].format_help()
    assert "--quiet" in sub.choices["replay"].format_help() and "-q" in sub.choices["synth"].format_help()


@pytest.mark.parametrize("argv", [
    ["retransmit", "x", "--rate", "0"], ["retransmit", "x", "--ring-bits", "31"], ["replay", "x", "--budget", "10"],
    ["replay", "x", "--budget", "70000"], ["replay", "x", "--linger", "-1"], ["replay", "x", "--queue", "0"],
    ["replay", "x", "--heartbeat-interval", "0"], ["synth", "x", "-n", "1.5"], ["retransmit", "x", "--duration", "nan"],
])
def test_bad_values_are_refused_before_anything_starts(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from logbuf.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


# ---- frame scanning: the vectorised ITCH path agrees with the frame-by-frame definition ------------------


def _plain_scan(data: bytes, start: int, limit: int) -> tuple[list[int], int]:
    offsets, offset = [], start
    while len(offsets) < limit and offset + 2 <= len(data):
        end = offset + 2 + int.from_bytes(data[offset : offset + 2], "big")
        if end > len(data):
            break
        offsets.append(offset)
        offset = end
    return offsets, offset


def _mixed_day(tiny_day: Path, seed: int) -> bytes:
    """ITCH frames with non-ITCH frames (odd lengths, unknown types, a long one) spliced in."""
    rng = np.random.default_rng(seed)
    with DayFileReader(tiny_day) as reader:
        frames = [bytes(reader.buffer[b.frames[i] : (b.frames[i + 1] if i + 1 < b.count else b.end)])
                  for b in reader.blocks() for i in range(b.count)]
    out = []
    for frame in frames:
        out.append(frame)
        if rng.random() < 0.01:
            size = int(rng.choice([0, 1, 7, 300, 70_000 % 65_536]))
            out.append(size.to_bytes(2, "big") + rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return b"".join(out)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_scan_matches_the_plain_definition(tiny_day: Path, seed: int) -> None:
    from logbuf.exchange.dayfile import scan_frames

    rng = np.random.default_rng(seed)
    pure = tiny_day.read_bytes()
    for data in (pure, _mixed_day(tiny_day, seed), rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes(),
                 pure[: len(pure) - 5], b"", b"\x00", b"\x00\x05abc"):
        for start, limit in ((0, 1 << 40), (0, 777), (0, 1)):
            expected, after = _plain_scan(data, start, limit)
            got, got_after = scan_frames(data, start, limit)
            assert got.tolist() == expected and got_after == after
            got, got_after = scan_frames(np.frombuffer(data, dtype=np.uint8), start, limit)
            assert got.tolist() == expected and got_after == after


@pytest.mark.parametrize(("day", "messages", "sizes"), [
    ("tiny_day", 3_000, (1,)),
    # 1: a scan window sized to one frame, 30 000 times; 97: a short last block (30 000 = 309 * 97 + 27)
    ("small_day", 30_000, (1, 97, 4_096, 65_536)),
])
def test_blocks_from_the_kept_index_equal_scanned_blocks(day: str, messages: int, sizes: tuple[int, ...],
                                                         request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from logbuf.exchange.dayfile import DayFileError

    path: Path = request.getfixturevalue(day)
    with DayFileReader(path) as scanned, DayFileReader(path) as indexed:
        assert indexed.verify() == messages
        for size in sizes:
            a, b = list(scanned.blocks(size)), list(indexed.blocks(size))
            assert [(x.frames.tolist(), x.end, x.first_index) for x in a] == \
                   [(y.frames.tolist(), y.end, y.first_index) for y in b]
            assert len(a) == -(-messages // size)
    cut = tmp_path / "cut.itch"
    cut.write_bytes(path.read_bytes()[:-1])
    with DayFileReader(cut) as reader, pytest.raises(DayFileError, match="truncated day file"):
        reader.verify()
