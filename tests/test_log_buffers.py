"""Creating and opening log files: validation gives a clear logbuf error, never a crash."""

from __future__ import annotations

import os
import struct

import pytest

from logbuf import InvalidLogBufferError, LogBuffers
from logbuf.logbuffer import descriptor as d


def _meta_offset(path: str) -> int:
    return os.path.getsize(path) - d.LOG_META_DATA_LENGTH


def _poke(path: str, offset: int, fmt: str, value: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(struct.pack(fmt, value))


def test_open_sees_what_create_wrote(make_log) -> None:
    log = make_log(term_length=128 * 1024, session_id=5, stream_id=6, initial_term_id=-7)
    other = LogBuffers.open(log.path)
    try:
        assert (other.term_length, other.session_id, other.stream_id, other.initial_term_id) == (
            128 * 1024, 5, 6, -7)
        assert other.mtu == d.DEFAULT_MTU and other.page_size == log.page_size
    finally:
        other.close()


def test_create_refuses_existing_file(make_log) -> None:
    log = make_log()
    with pytest.raises(FileExistsError):
        LogBuffers.create(log.path, term_length=64 * 1024)


@pytest.mark.parametrize("term_length", [1000, 32 * 1024, 3 * 64 * 1024, 2 * 1024 * 1024 * 1024])
def test_create_rejects_bad_term_length(shm_dir, term_length) -> None:
    with pytest.raises(ValueError, match="term length"):
        LogBuffers.create(os.path.join(shm_dir, "x"), term_length=term_length)
    assert not os.path.exists(os.path.join(shm_dir, "x"))


def test_create_rejects_bad_mtu(shm_dir) -> None:
    with pytest.raises(ValueError, match="mtu"):
        LogBuffers.create(os.path.join(shm_dir, "x"), term_length=64 * 1024, mtu=1000)


def test_open_missing_file(shm_dir) -> None:
    with pytest.raises(InvalidLogBufferError, match="cannot open"):
        LogBuffers.open(os.path.join(shm_dir, "nope"))


def test_open_truncated_file(make_log) -> None:
    log = make_log()
    path = str(log.path)
    log.close()
    os.truncate(path, 100_000)
    with pytest.raises(InvalidLogBufferError, match="too small|file is"):
        LogBuffers.open(path)


def test_open_wrong_size_for_term_length(make_log) -> None:
    log = make_log()
    path = str(log.path)
    log.close()
    _poke(path, _meta_offset(path) + d.LOG_TERM_LENGTH_OFFSET, "<i", 128 * 1024)
    with pytest.raises(InvalidLogBufferError, match="file is .* bytes"):
        LogBuffers.open(path)


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (d.LOG_TERM_LENGTH_OFFSET, 12345, "term length"),
        (d.LOG_PAGE_SIZE_OFFSET, 1000, "page size"),
        (d.LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET, 64, "header length"),
        (d.LOG_MTU_LENGTH_OFFSET, 33, "mtu"),
    ],
)
def test_open_rejects_bad_metadata(make_log, offset, value, message) -> None:
    log = make_log()
    path = str(log.path)
    log.close()
    _poke(path, _meta_offset(path) + offset, "<i", value)
    with pytest.raises(InvalidLogBufferError, match=message):
        LogBuffers.open(path)


def test_open_rejects_unknown_header_version(make_log) -> None:
    log = make_log()
    path = str(log.path)
    log.close()
    _poke(path, _meta_offset(path) + d.LOG_DEFAULT_FRAME_HEADER_OFFSET + 4, "<B", 3)
    with pytest.raises(InvalidLogBufferError, match="version 3"):
        LogBuffers.open(path)


def test_open_rejects_a_foreign_file(shm_dir) -> None:
    path = os.path.join(shm_dir, "foreign")
    with open(path, "wb") as fh:
        fh.write(os.urandom(3 * 64 * 1024 + 4096))
    with pytest.raises(InvalidLogBufferError):
        LogBuffers.open(path)


def test_close_with_a_view_still_held_does_not_raise(pipe) -> None:
    p = pipe()
    p.pub.offer(b"abc")
    held = []
    p.image.poll(lambda b, h: held.append(b), 10)
    p.log.close()
    p.log.close()  # idempotent
    assert p.log.is_closed


def test_a_log_is_allocated_before_it_is_mapped(make_log) -> None:
    log = make_log(term_length=64 * 1024)
    info = os.stat(log.path)
    assert info.st_blocks * 512 >= info.st_size  # every byte backed: no sparse holes to fault on later


def test_a_log_that_would_eat_into_the_reserve_is_refused_and_leaves_no_file(shm_dir: str) -> None:
    from logbuf.errors import StorageSpaceError

    path = os.path.join(shm_dir, "reserved.logbuffer")
    free = os.statvfs(shm_dir).f_bavail * os.statvfs(shm_dir).f_frsize
    with pytest.raises(StorageSpaceError, match="insufficient usable storage for new log of length=") as info:
        LogBuffers.create(path, term_length=64 * 1024, reserve=free)
    assert isinstance(info.value, OSError) and info.value.errno == 28  # ENOSPC: handled as a full disk
    assert not os.path.exists(path)


def test_check_truncated_sees_a_file_that_shrank_under_the_mapping(make_log) -> None:
    log = make_log(term_length=64 * 1024)
    assert log.check_truncated() is None
    os.truncate(log.path, 4096)
    assert "shrank" in (log.check_truncated() or "")
    # touching a lost page reads zeros instead of killing the process, and the mapping says so
    assert log.terms.get_i32(3 * 64 * 1024 - 4) == 0
    assert log.native.truncated
    assert "truncated" in (log.check_truncated() or "")


def test_check_truncated_ignores_a_log_the_driver_unlinked(make_log) -> None:
    log = make_log(term_length=64 * 1024)
    os.unlink(log.path)
    assert log.check_truncated() is None
