"""``logbuf logdump`` over log buffers filled through real publications: metadata, tails, committed,
fragmented, padded and claimed-but-uncommitted frames, rotation, walk limits, and files that are not logs."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from log_pipe import Pipe
from logbuf import ADMIN_ACTION, LogBuffers
from logbuf.cli import main
from logbuf.tools import FrameState, MissingFileError, UnusableFileError, format_log_dump, read_log_dump
from logbuf.tools.log_dump import StopReason, dump_log

pytestmark = pytest.mark.timeout(30)

T = 64 * 1024
SESSION, STREAM, INITIAL = 77, 1001, 5  # tests/conftest.py make_log defaults


def fill_mixed(pipe: Pipe) -> object:
    """hello / 100 bytes / an open claim / a message after it / a 3-fragment message / an aborted claim."""
    pub = pipe.pub
    assert pub.offer(b"hello", reserved_value=7) == 64
    assert pub.offer(bytes(range(100)), reserved_value=-1) == 224
    claim = pub.try_claim(40)
    assert claim
    claim.buffer[:5] = b"WXYZ!"  # written into but never committed: a stalled publisher
    assert pub.offer(b"after the claim") == 384
    assert pub.offer(b"x" * 3_000) == 3_488
    aborted = pub.try_claim(8)
    aborted.abort()
    return claim  # keep it referenced: still open


def test_frames_of_a_concurrent_publication(pipe: Callable[..., Pipe]):
    p = pipe(correlation_id=42)
    _claim = fill_mixed(p)
    dump = dump_log(p.log)

    m = dump.metadata
    assert (m.term_length, m.mtu, m.initial_term_id, m.correlation_id) == (T, 1408, INITIAL, 42)
    assert m.page_size == os.sysconf("SC_PAGE_SIZE") and m.position_bits == 16
    assert m.is_connected and m.active_term_count == 0 and m.end_of_stream_position is None
    dh = m.default_frame_header
    assert (dh.session_id, dh.stream_id, dh.term_id, dh.flags, dh.type) == (SESSION, STREAM, INITIAL, 0xC0, 1)

    assert [(t.partition, t.term_id, t.term_offset, t.position, t.active) for t in dump.tails] == [
        (0, INITIAL, 3_552, 3_552, True),
        (1, INITIAL - 2, 0, None, False),  # initial term id + 1 - 3: not used yet
        (2, INITIAL - 1, 0, None, False),
    ]
    assert dump.producer_position == 3_552

    term0, term1, term2 = dump.terms
    assert (term0.stop, term0.stop_offset) == (StopReason.TAIL, 3_552)
    assert term1.stop is term2.stop is StopReason.UNUSED and term1.frames == ()
    rows = [
        (
            fr.term_offset,
            fr.header.frame_length,
            fr.header.type_name,
            fr.header.flags_text,
            fr.state,
            fr.header.reserved_value,
            fr.payload_length,
            fr.preview,
        )
        for fr in term0.frames
    ]
    committed, in_flight = FrameState.COMMITTED, FrameState.IN_FLIGHT
    assert rows == [
        (0, 37, "DATA", "BE", committed, 7, 5, b"hello"),
        (64, 132, "DATA", "BE", committed, -1, 100, bytes(range(16))),
        (224, -72, "DATA", "BE", in_flight, 0, 40, b"WXYZ!" + bytes(11)),
        (320, 47, "DATA", "BE", committed, 0, 15, b"after the claim"),
        (384, 1408, "DATA", "B", committed, 0, 1376, b"x" * 16),
        (1792, 1408, "DATA", "-", committed, 0, 1376, b"x" * 16),
        (3200, 280, "DATA", "E", committed, 0, 248, b"x" * 16),
        (3488, 40, "PAD", "BE", committed, 0, 8, b""),
    ]
    for fr in term0.frames:
        h = fr.header
        assert (h.session_id, h.stream_id, h.term_id, h.term_offset) == (
            SESSION,
            STREAM,
            INITIAL,
            fr.term_offset,
        )
        assert fr.position == fr.term_offset  # term 0 of the log


def test_text_output(pipe: Callable[..., Pipe]):
    p = pipe()
    _claim = fill_mixed(p)
    text = format_log_dump(dump_log(p.log))
    lines = text.splitlines()
    assert lines[0] == f"log buffer {p.log.path}: {p.log.file_length:,} bytes"
    assert "  term length         65,536 (position bits 16)" in lines
    assert "  initial term id     5" in lines
    assert "  connected           yes" in lines
    assert "  active term count   0 (partition 0)" in lines
    assert "  end of stream       none" in lines
    assert "  producer position   3,552" in lines
    assert "  * partition 0: term id 5, offset 3,552, position 3,552" in lines
    assert "    partition 1: term id 3, offset 0, not used yet" in lines
    assert (
        "partition 0 (term id 5, tail offset 3,552): 8 frames (1 pad, 1 in flight); reached the tail" in lines
    )

    rows = [line.split() for line in lines if re.match(r"^ +[\d,]+ +-?\d+ +[A-Z]+ ", line)]
    assert [r[:9] for r in rows[:3]] == [
        ["0", "37", "DATA", "BE", "77", "1001", "5", "7", "0"],
        ["64", "132", "DATA", "BE", "77", "1001", "5", "-1", "64"],
        ["224", "-72", "DATA", "BE", "77", "1001", "5", "0", "224"],
    ]
    assert rows[0][9:] == ["[5]", "68656c6c6f", "|hello|"]
    assert rows[1][10] == "000102030405060708090a0b0c0d0e0f…"
    assert " ".join(rows[2][9:]).startswith("IN FLIGHT (claimed, not committed) [40] 5758595a21")
    assert rows[-1][2] == "PAD" and "(padding, 8 bytes)" in " ".join(rows[-1])


def test_rotation_with_an_exclusive_publication(pipe: Callable[..., Pipe]):
    p = pipe(exclusive=True)
    message = b"m" * 1_000  # 1,032-byte frame, 1,056 aligned: 62 fit in a term, then 64 bytes of padding
    sent = 0
    while sent < 70:
        result = p.pub.offer(message, reserved_value=sent)
        if result == ADMIN_ACTION:
            continue
        assert result > 0
        sent += 1
    dump = dump_log(p.log, max_frames=None)
    assert dump.metadata.active_term_count == 1
    t0, t1, t2 = dump.tails
    assert (t0.term_id, t0.term_offset, t0.position, t0.active) == (INITIAL, T, T, False)
    assert (t1.term_id, t1.term_offset, t1.position, t1.active) == (
        INITIAL + 1,
        8 * 1_056,
        T + 8 * 1_056,
        True,
    )
    assert t2.position is None

    term0, term1, _ = dump.terms
    assert len(term0.frames) == 63 and (term0.stop, term0.stop_offset) == (StopReason.TAIL, T)
    last = term0.frames[-1]
    assert (last.term_offset, last.header.type_name, last.header.frame_length) == (62 * 1_056, "PAD", 64)
    assert [fr.header.reserved_value for fr in term0.frames[:62]] == list(range(62))
    assert [fr.header.reserved_value for fr in term1.frames] == list(range(62, 70))
    assert {fr.header.term_id for fr in term1.frames} == {INITIAL + 1}
    assert [fr.position for fr in term1.frames] == [T + i * 1_056 for i in range(8)]
    assert "reached the end of the term" in format_log_dump(dump)


def test_frame_limit_zero_length_and_corrupt_lengths(pipe: Callable[..., Pipe]):
    p = pipe()
    for i in range(5):
        p.pub.offer(b"abc", reserved_value=i)  # 64 bytes each

    limited = dump_log(p.log, max_frames=2).terms[0]
    assert len(limited.frames) == 2 and (limited.stop, limited.stop_offset) == (StopReason.FRAME_LIMIT, 128)
    assert "stopped after 2 frames at offset 128 (--frames)" in limited.describe_stop(T)

    p.log.terms.put_i32_release(192, 0)  # space reserved but not written yet (or cleaned)
    zero = dump_log(p.log).terms[0]
    assert len(zero.frames) == 3 and (zero.stop, zero.stop_offset) == (StopReason.ZERO_LENGTH, 192)
    assert "zero length at offset 192 before the tail at 320" in zero.describe_stop(T)

    for bad in (12, T, -(T - 100)):
        p.log.terms.put_i32_release(64, bad)
        term = dump_log(p.log).terms[0]
        assert (len(term.frames), term.stop, term.stop_offset, term.stop_length) == (
            1,
            StopReason.CORRUPT,
            64,
            bad,
        )
        assert f"CORRUPT frame length {bad} at offset 64" in format_log_dump(dump_log(p.log))


def test_metadata_flags_and_json(make_log: Callable[..., LogBuffers]):
    log = make_log(correlation_id=9, publication_window_length=32_768)
    log.end_of_stream_position = 4_096
    dump = dump_log(log)
    assert dump.metadata.end_of_stream_position == 4_096 and not dump.metadata.is_connected
    text = format_log_dump(dump)
    assert "  end of stream       4,096" in text and "  connected           no" in text
    assert "  publication window  32,768" in text
    data = json.loads(dump.to_json())
    assert data["metadata"]["correlation_id"] == 9
    assert data["metadata"]["end_of_stream_position"] == 4_096
    assert data["metadata"]["default_frame_header"]["stream_id"] == STREAM
    assert [t["term_id"] for t in data["tails"]] == [INITIAL, INITIAL - 2, INITIAL - 1]
    assert data["terms"][0]["frames"] == [] and data["terms"][0]["stop"] == "tail"


def test_files_that_are_not_log_buffers(tmp_path: Path):
    with pytest.raises(MissingFileError, match="no log buffer file"):
        read_log_dump(tmp_path / "absent.logbuffer")
    small = tmp_path / "small"
    small.write_bytes(b"hello")
    with pytest.raises(UnusableFileError, match="not a log buffer: .*too small"):
        read_log_dump(small)
    wrong = tmp_path / "zeros"
    wrong.write_bytes(bytes(3 * T + 4096))  # right size, but term length 0 in the metadata
    with pytest.raises(UnusableFileError, match="not a log buffer: .*term length 0"):
        read_log_dump(wrong)
    with pytest.raises(UnusableFileError, match="not a regular file"):
        read_log_dump(tmp_path)


# -- command line --------------------------------------------------------------------------------------


def test_cli_text_json_and_exit_codes(pipe: Callable[..., Pipe], tmp_path: Path, capsys):
    p = pipe()
    _claim = fill_mixed(p)
    path = str(p.log.path)

    assert main(["logdump", path]) == 0
    out = capsys.readouterr().out
    assert "8 frames (1 pad, 1 in flight)" in out and "IN FLIGHT" in out

    assert main(["logdump", path, "--json", "--frames", "3", "--preview", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    frames = data["terms"][0]["frames"]
    assert [(fr["term_offset"], fr["frame_length"], fr["state"]) for fr in frames] == [
        (0, 37, "committed"),
        (64, 132, "committed"),
        (224, -72, "in-flight"),
    ]
    assert frames[0]["payload_preview_hex"] == "6865" and frames[0]["type_name"] == "DATA"
    assert data["terms"][0]["stop"] == "frame-limit"

    assert main(["logdump", path, "--frames", "all", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["terms"][0]["frames"]) == 8

    assert main(["logdump", str(tmp_path / "absent")]) == 3
    assert "logbuf logdump: error: no log buffer file" in capsys.readouterr().err
    (tmp_path / "junk").write_bytes(os.urandom(1000))
    assert main(["logdump", str(tmp_path / "junk")]) == 4
    assert "not a log buffer" in capsys.readouterr().err


def test_cli_finds_a_log_by_registration_id(shm_dir: str, capsys):
    directory = Path(shm_dir) / "driver"
    (directory / "publications").mkdir(parents=True)
    log = LogBuffers.create(
        directory / "publications" / "42.logbuffer", term_length=T, stream_id=9, correlation_id=42
    )
    try:
        assert main(["logdump", "42", "--dir", str(directory)]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"log buffer {directory / 'publications' / '42.logbuffer'}:")
        assert "  correlation id      42" in out
        assert main(["logdump", "43", "--dir", str(directory)]) == 3
    finally:
        log.close()
