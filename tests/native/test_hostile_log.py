"""Shared memory is hostile input: whatever another process wrote into a log's metadata or terms, appends and
polls answer with a result code, skip, or raise LogCorruptedError; they never read or write outside the
mapping.  (The sanitized run of the suite builds the native code with AddressSanitizer/UBSan, which turns any
such access, or a signed-shift UB, into a failure.)
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from log_pipe import Pipe
from logbuf import ExclusivePublication, Position
from logbuf.client.publication import PublicationResult
from logbuf.errors import LogCorruptedError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f

T = 64 * 1024
INITIAL = 5

HOSTILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def set_active(log, term_count: int, raw_tail: int) -> None:
    log.meta.put_i32_release(d.LOG_ACTIVE_TERM_COUNT_OFFSET, term_count)
    index = d.index_by_term_count(term_count)
    log.meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET + 8 * index, raw_tail)


def test_negative_active_term_count_with_matching_tail_is_an_error_not_a_write(tmp_path) -> None:
    # the regression: term_count % 3 on -1 indexed below the first term
    script = textwrap.dedent(f"""
        import os, sys
        from logbuf import ConcurrentPublication, ExclusivePublication, LogBuffers, Position
        from logbuf.errors import LogCorruptedError
        from logbuf.logbuffer import descriptor as d
        log = LogBuffers.create(os.path.join(sys.argv[1], "log"), term_length={T}, initial_term_id={INITIAL})
        log.meta.put_i32_release(d.LOG_ACTIVE_TERM_COUNT_OFFSET, -1)
        for i in range(d.PARTITION_COUNT):
            log.meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET + 8 * i, d.pack_tail({INITIAL} - 1, 0))
        before = bytes(log.mapping)
        for cls in (ConcurrentPublication, ExclusivePublication):
            pub = cls(log, Position.standalone(1 << 40))
            for call in (lambda: pub.offer(b"x" * 100), lambda: pub.try_claim(10)):
                try:
                    call()
                except LogCorruptedError:
                    pass
                else:
                    raise AssertionError(cls.__name__ + ": no LogCorruptedError")
        assert bytes(log.mapping) == before, "the log changed"
        print("OK")
    """)
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "OK"


@HOSTILE
@given(
    term_count=st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-3, 3)),
    term_id_delta=st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-2, 2)),
    tail_offset=st.one_of(st.integers(0, 2**32 - 1), st.integers(T - 256, T + 256), st.just(0)),
    exclusive=st.booleans(),
    length=st.sampled_from([0, 1, 32, 1000, 5000]),
)
def test_any_tail_gives_a_position_or_a_code(make_log, term_count, term_id_delta, tail_offset, exclusive, length) -> None:
    log = make_log(initial_term_id=INITIAL)
    term_id = (INITIAL + term_count + term_id_delta) & 0xFFFFFFFF
    raw = struct.unpack("<q", struct.pack("<Q", (term_id << 32) | tail_offset))[0]
    set_active(log, term_count, raw)
    p = Pipe(log, exclusive=exclusive)
    for call in (lambda: p.pub.offer(b"y" * length), lambda: p.pub.try_claim(min(length, 1000))):
        try:
            result = call()
        except LogCorruptedError:
            continue
        value = result if isinstance(result, int) else result.result
        assert value >= 0 or value in set(PublicationResult), value
        if not isinstance(result, int) and result:
            result.commit()
    # reading whatever is there never leaves the term either
    for _ in range(3):
        try:
            p.image.poll(lambda b, h: None, 100)
        except LogCorruptedError:
            break


@HOSTILE
@given(
    frames=st.lists(
        st.tuples(
            st.integers(-(2**31), 2**31 - 1) | st.integers(0, 200) | st.sampled_from([T, T - 32, 2**31 - 1]),
            st.sampled_from([f.HDR_TYPE_DATA, f.HDR_TYPE_PAD, 7, 0xFFFF]),
            st.booleans(),  # own session/stream/term id
        ),
        min_size=1,
        max_size=20,
    ),
    start=st.integers(0, T // 32 - 1),
)
def test_any_frames_are_delivered_skipped_or_reported(make_log, frames, start) -> None:
    log = make_log(initial_term_id=INITIAL)
    p = Pipe(log)
    offset = start * 32
    p.image._position = offset
    term = log.terms.view
    at = offset
    for length, frame_type, own in frames:
        if at + f.HEADER_LENGTH > T:
            break
        session = 77 if own else 78
        header = f.HEADER_STRUCT.pack(length, 0, f.UNFRAGMENTED, frame_type, at, session, 1001, INITIAL, 0)
        term[at : at + f.HEADER_LENGTH] = header
        at += f.align(max(f.HEADER_LENGTH, min(abs(length), 256)))
    for poll in (p.image.poll, p.image.controlled_poll):
        try:
            while poll(lambda b, h: len(b) + h.position, 50):
                pass
        except LogCorruptedError as exc:
            assert exc.position == p.image.position
        assert offset <= p.image.position <= T


@pytest.mark.parametrize(
    ("field", "value"), [(f.SESSION_ID_OFFSET, 1), (f.STREAM_ID_OFFSET, 2), (f.TERM_ID_OFFSET, INITIAL + 3)]
)
def test_frame_of_another_session_stream_or_term_is_not_delivered(pipe, field, value) -> None:
    p = pipe()
    assert p.pub.offer(b"good") > 0
    assert p.pub.offer(b"foreign") > 0
    frame_offset = f.align(f.HEADER_LENGTH + 4)
    p.log.terms.put_i32(frame_offset + field, value)
    got = []
    assert p.image.poll(lambda b, h: got.append(bytes(b)), 10) == 1  # stops before the foreign frame
    assert got == [b"good"]
    with pytest.raises(LogCorruptedError) as info:
        p.image.poll(lambda b, h: got.append(bytes(b)), 10)
    assert info.value.position == frame_offset
    assert got == [b"good"]


def test_frame_length_past_the_term_is_reported_not_read(pipe) -> None:
    p = pipe()
    p.log.terms.put_i32_release(0, T + 32)
    with pytest.raises(LogCorruptedError):
        p.image.poll(lambda b, h: None)
    assert p.image.position == 0


def test_hostile_waiting_count_posts_once_and_a_real_one_once_per_sleeper(make_log) -> None:
    posix_ipc = pytest.importorskip("posix_ipc")
    name = f"/logbuf-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, initial_value=0)
    try:
        log = make_log(initial_term_id=INITIAL)
        pub = ExclusivePublication(log, Position.standalone(1 << 40), wake_semaphore=name)
        for waiting, posts in ((0x7FFFFFFF, 1), (3, 3), (-5, 0), (d.MAX_WAKE_POSTS + 1, 1)):
            log.meta.put_i32_release(d.LOG_WAITING_SUBSCRIBERS_OFFSET, waiting)
            assert pub.offer(b"wake") > 0
            assert sem.value == posts, (waiting, sem.value)
            expected_left = waiting if waiting <= 0 else 0
            assert log.meta.get_i32_acquire(d.LOG_WAITING_SUBSCRIBERS_OFFSET) == expected_left
            for _ in range(posts):
                sem.acquire(0)
        pub.close()
    finally:
        sem.unlink()
        sem.close()
