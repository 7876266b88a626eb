"""Reading back what a killed feed handler's last append put in its log, and the checkpoint records around it.

The log is written by the core's own exclusive publication (one ``offer_batch``, the reserved value of each
frame its sequence, as the handler appends); a kill is imitated by what it leaves behind: a frame left half
written (negative length), frames the driver cleaned behind its subscribers (zeroes, by the core's cleaner),
nothing written after the reservation. Foreign and corrupt files are refused with the reason, and the restart
then falls back to the checkpoint, saying how many messages may be published twice."""

from __future__ import annotations

import mmap
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from log_pipe import Pipe
from logbuf.feed import checkpoint as cp
from logbuf.feed.feed_native import ffi, lib
from logbuf.logbuffer import frame as f
from logbuf.logbuffer.term_cleaner import LogCleaner

SESSION = b"READBACK01"
REGISTRATION = 4242


def payload(seq: int) -> bytes:
    return b"M" + struct.pack(">Q", seq) + b"y" * (seq % 13)


def append(pipe: Pipe, first: int, count: int) -> tuple[int, int]:
    """Sequences [first, first + count) in one batch; returns (the position before, the position after)."""
    before = pipe.pub.position
    messages = [payload(s) for s in range(first, first + count)]
    result = pipe.pub.offer_batch(messages, reserved_values=np.arange(first, first + count, dtype=np.int64))
    assert result.appended == count
    return before, result.result


def slot(pipe: Pipe, path: str | None = None) -> cp.LogSlot:
    log = pipe.log
    return cp.LogSlot(REGISTRATION, log.session_id, log.stream_id, str(log.path) if path is None else path)


def frame_offsets(pipe: Pipe, start: int, count: int) -> list[int]:
    """Byte offsets in the file of the frames of ``count`` messages appended from ``start`` (term 0)."""
    offsets, at = [], start
    for _ in range(count):
        offsets.append(at)
        at += f.align(struct.unpack_from("<i", pipe.log.mapping, at)[0])
    return offsets


def half_written(pipe: Pipe, offset: int) -> None:
    """The frame at ``offset`` as a writer killed before its commit leaves it (its length negative)."""
    length = struct.unpack_from("<i", pipe.log.mapping, offset)[0]
    struct.pack_into("<i", pipe.log.mapping, offset, -length)


@pytest.fixture
def log(pipe: Callable[..., Pipe]) -> Pipe:
    made = pipe(exclusive=True, correlation_id=REGISTRATION)
    append(made, 1, 30)  # an earlier append, fully in (the checkpoint's record would say next 31)
    return made


def test_a_complete_append_is_read_back_to_its_last_message(log: Pipe) -> None:
    start, _ = append(log, 31, 100)
    assert cp.read_back(slot(log), cp.Pending(SESSION, 31, 131, start)) == 131


def test_a_half_written_last_frame_is_not_published_and_a_subscriber_never_sees_it(log: Pipe) -> None:
    start, _ = append(log, 31, 100)
    half_written(log, frame_offsets(log, start, 100)[-1])
    assert cp.read_back(slot(log), cp.Pending(SESSION, 31, 131, start)) == 130
    assert [rv for _, rv, _ in log.drain()] == list(range(1, 130))  # what a subscriber can read agrees


def test_nothing_written_after_the_reservation_or_a_half_written_first_frame_resumes_at_the_first(log: Pipe) -> None:
    start = log.pub.position
    assert cp.read_back(slot(log), cp.Pending(SESSION, 31, 131, start)) == 31  # the tail never moved
    append(log, 31, 5)
    half_written(log, start)
    assert cp.read_back(slot(log), cp.Pending(SESSION, 31, 131, start)) == 31


def test_frames_cleaned_behind_the_subscribers_are_stepped_over_to_the_first_still_there(log: Pipe) -> None:
    start, end = append(log, 31, 100)
    frames = frame_offsets(log, start, 100)
    LogCleaner(log.log, start).clean_to(frames[40])  # sequences 31..70 read by every subscriber and cleaned
    assert cp.read_back(slot(log), cp.Pending(SESSION, 31, 131, start)) == 131
    half_written(log, frames[60])  # sequence 91 was being written when the handler died
    LogCleaner(log.log, frames[40]).clean_to(frames[60])
    assert cp.read_back(slot(log), cp.Pending(SESSION, 31, 131, start)) == 91


def test_all_zeroes_up_to_the_tail_are_settled_by_where_the_subscribers_are(log: Pipe) -> None:
    start, end = append(log, 31, 100)
    LogCleaner(log.log, start).clean_to(end)  # cleaned to the tail, or reserved and never written?
    pending = cp.Pending(SESSION, 31, 131, start, end)
    with pytest.raises(cp.ReadBackError, match="zeroes.*no subscriber position"):
        cp.read_back(slot(log), pending)
    # every subscriber read to the tail: no subscriber passes a frame never committed, so all of it went in
    assert cp.read_back(slot(log), pending, lambda session, stream: [end, end]) == 131
    # nobody got past the start: nothing was written there
    assert cp.read_back(slot(log), pending, lambda session, stream: [start]) == 31
    # a subscriber in between, or an append that would not have ended at this tail: it cannot tell
    with pytest.raises(cp.ReadBackError, match="subscribers at"):
        cp.read_back(slot(log), pending, lambda session, stream: [start + 64, end])
    with pytest.raises(cp.ReadBackError, match="subscribers at"):
        cp.read_back(slot(log), cp.Pending(SESSION, 31, 131, start, end + 64), lambda session, stream: [end])
    # once the stream has ended the driver may have padded what was never written: subscribers prove nothing
    log.log.end_of_stream_position = end
    with pytest.raises(cp.ReadBackError, match="stream has ended"):
        cp.read_back(slot(log), pending, lambda session, stream: [end])
    state = cp.CheckpointState(SESSION, 31, start, 0, slot(log), pending)
    resume = cp.resume_point(state, lambda session, stream: [end])
    assert resume is not None
    assert (resume.next_sequence, resume.may_repeat) == (31, 100) and "zeroes" in resume.how


def test_the_subscriber_positions_asked_are_those_of_the_logs_own_session_and_stream(log: Pipe) -> None:
    start, end = append(log, 31, 100)
    LogCleaner(log.log, start).clean_to(end)
    asked = []

    def positions(session: int, stream: int) -> list[int]:
        asked.append((session, stream))
        return [end]

    assert cp.read_back(slot(log), cp.Pending(SESSION, 31, 131, start, end), positions) == 131
    assert asked == [(log.log.session_id, log.log.stream_id)]


def test_an_append_after_a_term_rotation_is_read_back_in_the_next_term(pipe: Callable[..., Pipe]) -> None:
    log = pipe(exclusive=True, correlation_id=REGISTRATION)
    term = log.log.term_length
    seq = 1
    while log.pub.position + 32 * 64 < term:  # nearly a full term
        append(log, seq, 16)
        seq += 16
    while term - log.pub.position > f.HEADER_LENGTH:  # fillers up to 32 bytes short: the next frame needs a new term
        filler = min(log.pub.max_payload_length, term - log.pub.position - 2 * f.HEADER_LENGTH)
        assert log.pub.offer(b"F" * filler, seq) > 0
        seq += 1
    start = log.pub.position
    assert start == term - f.HEADER_LENGTH
    messages = [payload(s) for s in range(seq, seq + 64)]
    reserved = np.arange(seq, seq + 64, dtype=np.int64)
    appended = 0
    for _ in range(4):  # the first tries pad the term's end and rotate
        appended = log.pub.offer_batch(messages, reserved_values=reserved).appended
        if appended:
            break
    assert appended > 0 and log.pub.position > term  # after a PAD closing the term it started in
    got = cp.read_back(slot(log), cp.Pending(SESSION, seq, seq + 64, start))
    assert got == seq + appended


@pytest.mark.parametrize("case", ["gone", "foreign bytes", "another registration", "too small", "bad sequence",
                                  "tail behind", "a fifo"])
def test_a_log_that_cannot_be_trusted_is_not_used_and_says_why(log: Pipe, tmp_path: Path, case: str,
                                                              pipe: Callable[..., Pipe]) -> None:
    start, _ = append(log, 31, 10)
    pending = cp.Pending(SESSION, 31, 41, start)
    where = slot(log)
    if case == "gone":
        where = slot(log, str(tmp_path / "missing.logbuffer"))
        reason = "gone"
    elif case == "foreign bytes":
        junk = tmp_path / "junk.logbuffer"
        junk.write_bytes(os.urandom(log.log.file_length))
        where = slot(log, str(junk))
        reason = "not a log|not .* bytes|another log"
    elif case == "another registration":
        other = pipe(exclusive=True, correlation_id=REGISTRATION + 1)
        append(other, 31, 10)
        where = slot(other)
        reason = "another log"
    elif case == "too small":
        small = tmp_path / "small.logbuffer"
        small.write_bytes(b"\0" * 4096)
        where = slot(log, str(small))
        reason = "too small"
    elif case == "a fifo":  # opening it for reading must not wait for a writer
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        where = slot(log, str(fifo))
        reason = "not a regular file"
    elif case == "bad sequence":
        pending = cp.Pending(SESSION, 500, 510, start)  # the log holds 31..40 there
        reason = "not one of the append's"
    else:
        pending = cp.Pending(SESSION, 31, 41, log.pub.position + 4096)
        reason = "cannot follow"
    with pytest.raises(cp.ReadBackError, match=reason):
        cp.read_back(where, pending)
    resume = cp.resume_point(cp.CheckpointState(SESSION, 31, start, 0, where, pending))
    assert resume is not None and resume.next_sequence == pending.first
    assert resume.may_repeat == pending.end - pending.first


def test_a_hostile_frame_length_in_the_log_is_refused_not_followed(log: Pipe) -> None:
    start, _ = append(log, 31, 10)
    struct.pack_into("<i", log.log.mapping, start, 1 << 30)  # a length past the term
    with pytest.raises(cp.ReadBackError, match="impossible frame"):
        cp.read_back(slot(log), cp.Pending(SESSION, 31, 41, start))


# -- the checkpoint file ---------------------------------------------------------------------------------------


def intent(mapping: mmap.mmap, session: bytes, first: int, end: int, position: int, end_position: int) -> None:
    buffer = ffi.from_buffer("uint8_t[]", mapping, require_writable=True)
    lib.lbf_checkpoint_intent(buffer, session, first, end, position, end_position)
    del buffer


def test_records_name_the_log_and_the_append_in_flight(tmp_path: Path) -> None:
    path = str(tmp_path / "feed.checkpoint")
    file = cp.CheckpointFile(path)
    mapping = file.mapping
    first_log = cp.name_log(mapping, 7, 70, 1001, "/logs/7.logbuffer")
    cp.commit(mapping, SESSION, 31, 4096, first_log)
    intent(mapping, SESSION, 31, 131, 4096, 10496)
    state = cp.load(path)
    assert state is not None and state.pending == cp.Pending(SESSION, 31, 131, 4096, 10496)
    assert state.log == cp.LogSlot(7, 70, 1001, "/logs/7.logbuffer") and state.next_sequence == 31
    cp.commit(mapping, SESSION, 131, 8192)  # after the append: what went in, nothing in flight
    state = cp.load(path)
    assert state is not None and (state.next_sequence, state.position, state.pending) == (131, 8192, None)
    # a new run names its log in the other slot: until its first record, the last run's log stays named
    second_log = cp.name_log(mapping, 8, 80, 1001, "/logs/8.logbuffer")
    assert second_log != first_log
    state = cp.load(path)
    assert state is not None and state.log is not None and state.log.registration_id == 7
    cp.commit(mapping, SESSION, 131, 0, second_log)
    state = cp.load(path)
    assert state is not None and state.log is not None and state.log.registration_id == 8
    file.close()


def test_a_store_cut_short_leaves_the_last_whole_record(tmp_path: Path) -> None:
    path = str(tmp_path / "feed.checkpoint")
    file = cp.CheckpointFile(path)
    mapping = file.mapping
    cp.commit(mapping, SESSION, 77, 640, cp.name_log(mapping, 7, 70, 1001, "/logs/7.logbuffer"))
    current = struct.unpack_from("=I", mapping, lib.LBF_CHECKPOINT_CURRENT)[0]
    other = lib.LBF_CHECKPOINT_RECORD + (1 - current) * lib.LBF_CHECKPOINT_RECORD_LENGTH
    mapping[other : other + lib.LBF_CHECKPOINT_RECORD_LENGTH] = os.urandom(lib.LBF_CHECKPOINT_RECORD_LENGTH)
    state = cp.load(path)  # killed while writing the other record, before the flip
    assert state is not None and (state.session, state.next_sequence, state.pending) == (SESSION, 77, None)
    file.close()


def test_a_checkpoint_of_the_first_layout_is_read_and_converted(tmp_path: Path) -> None:
    path = tmp_path / "feed.checkpoint"
    path.write_bytes(b"LBFCKPT1" + SESSION + bytes(6) + (99).to_bytes(8, "little" if sys.byteorder == "little"
                                                                                else "big"))
    assert cp.resume_point(cp.load(str(path))) == cp.ResumePoint(SESSION, 99, "the last append stored")
    cp.CheckpointFile(str(path)).close()
    state = cp.load(str(path))
    assert state is not None and (state.session, state.next_sequence, state.log) == (SESSION, 99, None)


def test_something_that_is_not_a_checkpoint_resumes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "feed.checkpoint"
    path.write_bytes(os.urandom(2048))
    assert cp.resume_point(cp.load(str(path))) is None
    assert cp.resume_point(cp.load(str(tmp_path / "none"))) is None


@pytest.mark.parametrize("field", [f.TERM_OFFSET_OFFSET, f.SESSION_ID_OFFSET, f.TERM_ID_OFFSET])
def test_the_first_frame_after_cleaned_zeroes_must_say_it_is_where_it_is_in_this_log(log: Pipe, field: int) -> None:
    start, _ = append(log, 31, 100)
    frames = frame_offsets(log, start, 100)
    LogCleaner(log.log, start).clean_to(frames[40])
    value = struct.unpack_from("<i", log.log.mapping, frames[40] + field)[0]
    struct.pack_into("<i", log.log.mapping, frames[40] + field, value + 1)
    with pytest.raises(cp.ReadBackError, match="another place, stream or term"):
        cp.read_back(slot(log), cp.Pending(SESSION, 31, 131, start))


def test_a_file_that_is_not_a_checkpoint_is_refused_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    path.write_text('{"not": "a checkpoint"}')
    with pytest.raises(cp.CheckpointError, match="notes.json is not a feed checkpoint"):
        cp.CheckpointFile(str(path))
    assert path.read_text() == '{"not": "a checkpoint"}'
    empty = tmp_path / "empty.checkpoint"  # created, never written (a run killed at once): taken
    empty.write_bytes(bytes(100))
    cp.CheckpointFile(str(empty)).close()
    assert empty.read_bytes()[:8] == cp.CHECKPOINT_MAGIC


def test_a_checkpoint_in_use_by_a_running_handler_is_refused_by_name(tmp_path: Path) -> None:
    path = str(tmp_path / "feed-1001.checkpoint")
    held = cp.CheckpointFile(path)
    with pytest.raises(cp.CheckpointError, match="in use by another feed handler"):
        cp.CheckpointFile(path)
    held.close()  # the lock goes with it (and with the process, however it ends)
    cp.CheckpointFile(path).close()


def test_a_session_of_any_ten_bytes_resumes(tmp_path: Path) -> None:
    """A session id is 10 bytes on the wire, whatever they are: the checkpoint stores them and a restart joins
    that session again (not a refusal to start because they are not ASCII)."""
    from logbuf.feed.arbiter import Arbiter
    from logbuf.feed.config import ArbiterConfig

    session = b"\xff\x00SES\xe9\n\x01 \x7f"
    path = str(tmp_path / "feed.checkpoint")
    file = cp.CheckpointFile(path)
    cp.commit(file.mapping, session, 1001, 0, cp.name_log(file.mapping, 7, 70, 1001, "/logs/7.logbuffer"))
    file.close()
    resume = cp.resume_point(cp.load(path))
    assert resume is not None and (resume.session, resume.next_sequence) == (session, 1001)
    config = ArbiterConfig(resume=(resume.session, resume.next_sequence))
    assert config.resume_session_field() == session
    Arbiter(config)
