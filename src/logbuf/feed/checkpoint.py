"""The feed handler's checkpoint, and where a restarted handler resumes.

The checkpoint file (layout: ``LBF_CHECKPOINT_*`` in ``native/feed.h``) is a shared mapping the native round
stores into around every append to the messages stream: *before* it, the append in flight (session, first and
end sequence, the log position where it starts); *after* it, what went in (session, next sequence, position).
Each store writes the record that is not current and then flips ``current``, so a SIGKILL leaves one whole
record. A starting run names the log it publishes into (the file as the driver named it, its registration,
session and stream ids) in the log slot the current record does not name, and its first record points there.

On restart (:func:`resume_point`):

* no append was in flight: resume after the last one (exact);
* an append was in flight: the previous run's log is opened read-only and read from where that append started
  to the log's tail (the active term's tail counter): every complete frame of the messages stream carries its
  MoldUDP64 sequence as its reserved value, so the last one is the last sequence published. A frame left half
  written (length <= 0) ends the read; frames the driver already cleaned behind its subscribers (zeroes) are
  stepped over to the first frame still there, whose sequence says how many came before it; zeroes up to the
  tail are settled by the subscribers' positions (sub-pos counters: the driver cleans only behind every
  subscriber, and none passes a frame that was never committed until the stream has ended), the append being
  sized to go in whole. The file is hostile input: a file of another size, registration, session or stream, a
  tail that cannot follow the append's start, an impossible frame or a sequence outside the append is not used;
* the log cannot tell (gone, foreign, or zeroes the subscribers cannot settle): resume at the last append known complete. At most the
  messages of the append in flight may then be published a second time (``may_repeat`` says how many).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import stat
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from logbuf.errors import LogbufError
from logbuf.feed.feed_native import ffi, lib
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f

CHECKPOINT_MAGIC = b"LBFCKPT2"
V1_MAGIC = b"LBFCKPT1"  # the first layout: the session at 8, the next sequence at 24, nothing else
V1_LENGTH = 32
SESSION_LENGTH = 10
_U64 = struct.Struct("=Q")
_I64 = struct.Struct("=q")
_I32 = struct.Struct("=i")
_U32 = struct.Struct("=I")
READ_BATCH = 4096  # frames per native read of the previous log


class CheckpointError(LogbufError):
    """The checkpoint file cannot be used (another handler holds it, or it is not a checkpoint)."""


class ReadBackError(Exception):
    """The previous run's log cannot say what it published (the reason is the message)."""


class _AllZeroes(Exception):
    """Nothing but zeroes from the append's start to the log's tail."""


@dataclass(frozen=True)
class LogSlot:
    """The log a run published into, as its checkpoint names it."""

    registration_id: int
    session_id: int
    stream_id: int
    path: str | None  # None: the path did not fit the checkpoint


@dataclass(frozen=True)
class Pending:
    """An append that was in flight: sequences [first, end) of ``session`` from log ``position`` on, ending at
    ``end_position`` if all of it went in (-1: unknown; the handler sizes an append so it goes in whole)."""

    session: bytes
    first: int
    end: int
    position: int
    end_position: int = -1


@dataclass(frozen=True)
class CheckpointState:
    """One whole record of a checkpoint file."""

    session: bytes
    next_sequence: int  # 0: nothing to resume
    position: int
    log_slot: int
    log: LogSlot | None
    pending: Pending | None


@dataclass(frozen=True)
class ResumePoint:
    """Where a restarted handler resumes, and how that was learnt."""

    session: bytes
    next_sequence: int
    how: str  # one line for the operator
    may_repeat: int = 0  # messages that may be published a second time (0: exact)


def _record(raw: bytes, k: int) -> int:
    return lib.LBF_CHECKPOINT_RECORD + (k & 1) * lib.LBF_CHECKPOINT_RECORD_LENGTH


def _log_slot(raw: bytes, k: int) -> LogSlot | None:
    at = lib.LBF_CHECKPOINT_LOG + (k & 1) * lib.LBF_CHECKPOINT_LOG_LENGTH
    registration = _I64.unpack_from(raw, at + lib.LBF_CHECKPOINT_LOG_REGISTRATION)[0]
    session_id = _I32.unpack_from(raw, at + lib.LBF_CHECKPOINT_LOG_SESSION_ID)[0]
    stream_id = _I32.unpack_from(raw, at + lib.LBF_CHECKPOINT_LOG_STREAM_ID)[0]
    length = _I32.unpack_from(raw, at + lib.LBF_CHECKPOINT_LOG_PATH_LENGTH)[0]
    if registration == 0 and length == 0:
        return None  # never written
    path = None
    if 0 < length <= lib.LBF_CHECKPOINT_LOG_PATH_MAX:
        start = at + lib.LBF_CHECKPOINT_LOG_PATH
        path = raw[start : start + length].decode("utf-8", "replace")
    return LogSlot(registration, session_id, stream_id, path)


def parse(raw: bytes) -> CheckpointState | None:
    """The current record of a checkpoint file's bytes (None: not a checkpoint, or nothing stored yet)."""
    if raw[:8] == V1_MAGIC and len(raw) >= V1_LENGTH:
        next_sequence = int.from_bytes(raw[24:32], sys.byteorder)
        return CheckpointState(raw[8:18], next_sequence, 0, 0, None, None) if next_sequence >= 1 else None
    if raw[:8] != CHECKPOINT_MAGIC or len(raw) < lib.LBF_CHECKPOINT_LENGTH:
        return None
    current = _U32.unpack_from(raw, lib.LBF_CHECKPOINT_CURRENT)[0]
    if current > 1:
        return None
    at = _record(raw, current)
    session = raw[at + lib.LBF_CHECKPOINT_SESSION : at + lib.LBF_CHECKPOINT_SESSION + SESSION_LENGTH]
    next_sequence = _U64.unpack_from(raw, at + lib.LBF_CHECKPOINT_NEXT)[0]
    position = _I64.unpack_from(raw, at + lib.LBF_CHECKPOINT_POSITION)[0]
    log_slot = _U32.unpack_from(raw, at + lib.LBF_CHECKPOINT_LOG_SLOT)[0] & 1
    pending = None
    if _U64.unpack_from(raw, at + lib.LBF_CHECKPOINT_PENDING)[0]:
        start = at + lib.LBF_CHECKPOINT_PENDING_SESSION
        pending = Pending(raw[start : start + SESSION_LENGTH],
                          _U64.unpack_from(raw, at + lib.LBF_CHECKPOINT_PENDING_FIRST)[0],
                          _U64.unpack_from(raw, at + lib.LBF_CHECKPOINT_PENDING_END)[0],
                          _I64.unpack_from(raw, at + lib.LBF_CHECKPOINT_PENDING_POSITION)[0],
                          _I64.unpack_from(raw, at + lib.LBF_CHECKPOINT_PENDING_END_POSITION)[0])
    return CheckpointState(session, next_sequence, position, log_slot, _log_slot(raw, log_slot), pending)


def load(path: str) -> CheckpointState | None:
    """The state a previous run left at ``path`` (None: no file, or not a checkpoint)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(lib.LBF_CHECKPOINT_LENGTH)
    except FileNotFoundError:
        return None
    return parse(raw)


class CheckpointFile:
    """The checkpoint file mapped shared (stores survive a SIGKILL) and locked for this run (``flock``: the lock
    goes with the process, killed or not), so a second handler cannot share it. A file of the first layout is
    converted (its state stored as the new layout's record); a file that is not empty and not a checkpoint is
    refused, never overwritten."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CheckpointError(f"the checkpoint {path} is in use by another feed handler (give each "
                                      "handler its own --stream or --checkpoint)") from None
            raw = os.pread(fd, lib.LBF_CHECKPOINT_LENGTH, 0)
            if raw[:8] not in (CHECKPOINT_MAGIC, V1_MAGIC) and raw.strip(b"\0"):
                raise CheckpointError(f"{path} is not a feed checkpoint (delete it, or name another file with "
                                      "--checkpoint)")
            if os.fstat(fd).st_size < lib.LBF_CHECKPOINT_LENGTH:
                os.ftruncate(fd, lib.LBF_CHECKPOINT_LENGTH)
            self.mapping = mmap.mmap(fd, lib.LBF_CHECKPOINT_LENGTH)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        if raw[:8] != CHECKPOINT_MAGIC:
            before = parse(raw)
            self.mapping[:] = bytes(lib.LBF_CHECKPOINT_LENGTH)
            self.mapping[:8] = CHECKPOINT_MAGIC
            if before is not None:  # the first layout's state, no log named (it had none)
                commit(self.mapping, before.session, before.next_sequence, 0)

    def close(self) -> None:
        """Unmaps the file (or leaves that to the last view of it) and lets the lock go."""
        with contextlib.suppress(BufferError):  # a view still exported: the mapping goes with it
            self.mapping.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def name_log(mapping: mmap.mmap, registration_id: int, session_id: int, stream_id: int, path: str) -> int:
    """Writes this run's log into the slot the current record does not name; returns that slot (for
    :func:`commit`: until a record names it, the previous run's log stays named)."""
    state = parse(bytes(mapping))
    slot = 1 - state.log_slot if state is not None else 0
    at = lib.LBF_CHECKPOINT_LOG + slot * lib.LBF_CHECKPOINT_LOG_LENGTH
    encoded = path.encode()
    fits = len(encoded) <= lib.LBF_CHECKPOINT_LOG_PATH_MAX
    block = bytearray(lib.LBF_CHECKPOINT_LOG_LENGTH)
    _I64.pack_into(block, lib.LBF_CHECKPOINT_LOG_REGISTRATION, registration_id)
    _I32.pack_into(block, lib.LBF_CHECKPOINT_LOG_SESSION_ID, session_id)
    _I32.pack_into(block, lib.LBF_CHECKPOINT_LOG_STREAM_ID, stream_id)
    _I32.pack_into(block, lib.LBF_CHECKPOINT_LOG_PATH_LENGTH, len(encoded) if fits else 0)
    if fits:
        block[lib.LBF_CHECKPOINT_LOG_PATH : lib.LBF_CHECKPOINT_LOG_PATH + len(encoded)] = encoded
    mapping[at : at + lib.LBF_CHECKPOINT_LOG_LENGTH] = bytes(block)
    return slot


def commit(mapping: mmap.mmap, session: bytes, next_sequence: int, position: int, log_slot: int = -1) -> None:
    """One whole record: ``session`` resumes at ``next_sequence``, the log's next append at ``position``
    (``log_slot`` >= 0: the record now names that log slot). The native store, as the round's."""
    buffer = ffi.from_buffer("uint8_t[]", mapping, require_writable=True)
    lib.lbf_checkpoint_commit(buffer, log_slot, session.ljust(SESSION_LENGTH)[:SESSION_LENGTH], next_sequence,
                              position)
    del buffer


# -- reading the previous run's log back ---------------------------------------------------------------------


def _i32(buf: mmap.mmap, at: int) -> int:
    return int(_I32.unpack_from(buf, at)[0])


#: the positions of the subscribers of the images of (session id, stream id) (the driver's sub-pos counters)
ImagePositions = Callable[[int, int], list[int]]


def read_back(log: LogSlot, pending: Pending, image_positions: ImagePositions | None = None) -> int:
    """The next sequence after what ``pending`` put in ``log`` (``pending.first``: none of it); raises
    :class:`ReadBackError` when the log cannot say. ``image_positions`` settles a log cleaned up to its tail."""
    if log.path is None:
        raise ReadBackError("the checkpoint could not hold its log's path")
    try:  # never blocks: the path comes from a file anyone with write access could have changed (a FIFO there)
        fd = os.open(log.path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ReadBackError(f"the log {log.path} is gone ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ReadBackError(f"{log.path} is not a regular file")
        size = info.st_size
        if size < d.LOG_META_DATA_LENGTH + d.PARTITION_COUNT * d.TERM_MIN_LENGTH:
            raise ReadBackError(f"{log.path}: {size} bytes is too small to be a log")
        buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    try:
        return _read_back(buf, size, log, pending, image_positions)
    finally:
        with contextlib.suppress(BufferError):  # a traceback may still hold a view: the mapping goes with it
            buf.close()


def _read_back(buf: mmap.mmap, size: int, log: LogSlot, pending: Pending,
               image_positions: ImagePositions | None) -> int:
    meta = size - d.LOG_META_DATA_LENGTH
    term_length = _i32(buf, meta + d.LOG_TERM_LENGTH_OFFSET)
    page_size = _i32(buf, meta + d.LOG_PAGE_SIZE_OFFSET)
    try:
        d.check_term_length(term_length)
        d.check_page_size(page_size)
    except ValueError as exc:
        raise ReadBackError(f"not a log ({exc})") from None
    if d.compute_log_length(term_length, page_size) != size:
        raise ReadBackError(f"a log of term length {term_length} is not {size} bytes")
    header = meta + d.LOG_DEFAULT_FRAME_HEADER_OFFSET
    registration = _I64.unpack_from(buf, meta + d.LOG_CORRELATION_ID_OFFSET)[0]
    session_id = _i32(buf, header + f.SESSION_ID_OFFSET)
    stream_id = _i32(buf, header + f.STREAM_ID_OFFSET)
    if (registration, session_id, stream_id) != (log.registration_id, log.session_id, log.stream_id):
        raise ReadBackError(f"another log now (registration {registration}, session {session_id}, stream "
                            f"{stream_id}; the checkpoint names {log.registration_id}, {log.session_id}, "
                            f"{log.stream_id})")
    initial_term_id = _i32(buf, meta + d.LOG_INITIAL_TERM_ID_OFFSET)
    bits = d.position_bits_to_shift(term_length)
    term_count = _i32(buf, meta + d.LOG_ACTIVE_TERM_COUNT_OFFSET)
    raw_tail = _I64.unpack_from(buf, meta + d.TERM_TAIL_COUNTERS_OFFSET
                                + 8 * d.index_by_term_count(term_count))[0]
    tail = d.compute_position(d.tail_term_id(raw_tail), d.tail_term_offset(raw_tail, term_length), bits,
                              initial_term_id)
    start = pending.position
    # one append lies within a term, maybe after a PAD closing the one before: never more than two terms
    if start < 0 or start % f.FRAME_ALIGNMENT or not start <= tail <= start + 2 * term_length:
        raise ReadBackError(f"its tail {tail} cannot follow an append from {start}")
    terms = ffi.from_buffer("uint8_t[]", buf)
    try:
        return _walk(buf, terms, term_length, bits, initial_term_id, session_id, stream_id, start, tail, pending)
    except _AllZeroes:
        pass
    finally:
        del terms
    # zeroes from the append's start to the tail: cleaned behind subscribers that read it all, or reserved and
    # never written. The driver cleans only behind every subscriber, and no subscriber passes a frame that was
    # not committed, unless the driver padded it, which it does only once the stream has ended (end of stream set)
    why = f"zeroes from {start} to its tail {tail}: written and cleaned, or never written"
    if _I64.unpack_from(buf, meta + d.LOG_END_OF_STREAM_POSITION_OFFSET)[0] != d.INT64_MAX:
        raise ReadBackError(f"{why} (the stream has ended: the driver may have padded it)")
    positions = image_positions(session_id, stream_id) if image_positions is not None else []
    if not positions:
        raise ReadBackError(f"{why} (no subscriber position to tell)")
    if max(positions) <= start:
        return pending.first  # nobody passed the start: nothing was written there
    if min(positions) >= tail and pending.end_position == tail:
        return pending.end  # every subscriber read the whole append, which ended at the tail
    raise ReadBackError(f"{why} (subscribers at {min(positions)}..{max(positions)})")


def _walk(buf: mmap.mmap, terms: object, term_length: int, bits: int, initial_term_id: int, session_id: int,
          stream_id: int, start: int, tail: int, pending: Pending) -> int:
    offsets = ffi.new("int32_t[]", READ_BATCH)
    lengths = ffi.new("int32_t[]", READ_BATCH)
    positions = ffi.new("int64_t[]", READ_BATCH)
    reserved = ffi.new("int64_t[]", READ_BATCH)
    flags = ffi.new("uint8_t[]", READ_BATCH)
    next_offset = ffi.new("int32_t *")
    published = pending.first  # the next sequence after what the append put in
    position = start
    at_start = True  # only where the append starts may zeroes be frames cleaned since
    while position < tail:
        index = d.index_by_position(position, bits)
        offset = d.compute_term_offset_from_position(position, bits)
        term_id = d.compute_term_id_from_position(position, bits, initial_term_id)
        base = index * term_length
        term = ffi.cast("uint8_t *", terms) + base
        n = lib.lb_term_read_batch(term, term_length, offset, position - offset, READ_BATCH, offsets, lengths,
                                   positions, reserved, flags, next_offset)
        if n == lib.LB_CORRUPT_FRAME:
            raise ReadBackError(f"an impossible frame at position {position}")
        for k in range(n - 1, -1, -1):  # the last complete message of the batch
            if flags[k] & f.END_FLAG:
                frame = base + offsets[k] - f.HEADER_LENGTH
                _check_own(buf, frame, offsets[k] - f.HEADER_LENGTH, session_id, stream_id, term_id, position)
                published = _sequence(int(reserved[k]), pending, position) + 1
                break
        stopped = int(next_offset[0])
        if stopped > offset:
            position += stopped - offset
            at_start = False
            continue
        if stopped != offset or stopped >= term_length:  # pragma: no cover - the reader's contract
            raise ReadBackError(f"the read stopped at an impossible offset {stopped}")
        # nothing committed here: a frame left half written, never written, or cleaned by the driver
        length = _i32(buf, base + offset)
        if length < 0:  # half written: never visible to a subscriber
            return published
        if not at_start:
            return published  # never written after the last complete frame
        # zeroes where the append started: never written, or read by every subscriber and cleaned since; a
        # frame still there further on (written after those) says by its sequence how many came before it
        found = _first_frame_after_zeroes(buf, base, offset, min(term_length, offset + tail - position))
        if found is None:
            if position - offset + term_length < tail:  # the append went on in the next term
                position += term_length - offset
                continue
            raise _AllZeroes
        _check_own(buf, base + found, found, session_id, stream_id, term_id, position)
        published = _sequence(_I64.unpack_from(buf, base + found + f.RESERVED_VALUE_OFFSET)[0], pending, position)
        position += found - offset
        at_start = False
        if _i32(buf, base + found) < 0:
            return published  # that frame itself is half written
    return published


def _first_frame_after_zeroes(buf: mmap.mmap, base: int, offset: int, end: int) -> int | None:
    """The offset of the first frame word that is not zero in [offset, end) of a term (frame-aligned)."""
    if end <= offset:
        return None
    words = np.frombuffer(buf, dtype=np.int32, count=(end - offset) // 4, offset=base + offset)
    firsts = np.flatnonzero(words[:: f.FRAME_ALIGNMENT // 4])
    del words
    return offset + int(firsts[0]) * f.FRAME_ALIGNMENT if len(firsts) else None


def _check_own(buf: mmap.mmap, frame: int, term_offset: int, session_id: int, stream_id: int, term_id: int,
               position: int) -> None:
    """A frame header that says it is where it is, in this log's session, stream and term."""
    if (_i32(buf, frame + f.TERM_OFFSET_OFFSET), _i32(buf, frame + f.SESSION_ID_OFFSET),
            _i32(buf, frame + f.STREAM_ID_OFFSET), _i32(buf, frame + f.TERM_ID_OFFSET)) != (
            term_offset, session_id, stream_id, term_id):
        raise ReadBackError(f"a frame of another place, stream or term near position {position}")


def _sequence(reserved: int, pending: Pending, position: int) -> int:
    sequence = reserved % (1 << 64)
    if not pending.first <= sequence < pending.end:
        raise ReadBackError(f"sequence {sequence} near position {position} is not one of the append's "
                            f"[{pending.first}, {pending.end})")
    return sequence


def resume_point(state: CheckpointState | None, image_positions: ImagePositions | None = None) -> ResumePoint | None:
    """Where a run resumes after the one that left ``state`` (None: nothing to resume); ``image_positions``
    as for :func:`read_back`."""
    if state is None:
        return None
    pending = state.pending
    if pending is None or pending.end <= pending.first:  # no append in flight: the record is exact
        return ResumePoint(state.session, state.next_sequence, "the last append stored") if state.next_sequence >= 1 else None
    try:
        if state.log is None:
            raise ReadBackError("the checkpoint names no log")
        after = read_back(state.log, pending, image_positions)
    except ReadBackError as exc:
        # resume where the append in flight started: whatever of it went in is published a second time
        return ResumePoint(pending.session, pending.first, f"the append in flight not read back: {exc}",
                           pending.end - pending.first)
    return ResumePoint(pending.session, after, f"read back from {state.log.path}")
