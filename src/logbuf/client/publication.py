"""Publications: append messages to a log buffer (Aeron's ``ConcurrentPublication`` / ``ExclusivePublication``).

``offer`` copies (and fragments messages longer than one frame's payload), ``try_claim`` hands out a writable
view of one frame for zero-copy writing, ``offer_batch`` appends many messages in one native call.  Every
append reserves space first, writes the frame header with a *negative* length, then the body, then stores the
positive length with release semantics: readers only ever see whole frames.

Results are the new stream position (>= 0) or a :class:`PublicationResult` code (< 0), as in Aeron.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from logbuf.errors import ClaimStateError, MessageTooLargeError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import ffi, lib
from logbuf.position import Position


class PublicationResult(enum.IntEnum):
    NOT_CONNECTED = -1
    BACK_PRESSURED = -2
    ADMIN_ACTION = -3
    CLOSED = -4
    MAX_POSITION_EXCEEDED = -5


NOT_CONNECTED = PublicationResult.NOT_CONNECTED
BACK_PRESSURED = PublicationResult.BACK_PRESSURED
ADMIN_ACTION = PublicationResult.ADMIN_ACTION
CLOSED = PublicationResult.CLOSED
MAX_POSITION_EXCEEDED = PublicationResult.MAX_POSITION_EXCEEDED


def describe(result: int) -> str:
    """``"position 4096"`` or the result code's name."""
    return f"position {result}" if result >= 0 else PublicationResult(result).name


class BatchResult(NamedTuple):
    appended: int  # messages appended by this call (a prefix of the batch)
    result: int  # new position if appended > 0, else the PublicationResult code


class BufferClaim:
    """One claimed frame: write the payload into :attr:`buffer`, then :meth:`commit` (or :meth:`abort`).

    Truthy only when the claim succeeded; otherwise :attr:`result` says why (a PublicationResult).  As a
    context manager it yields the buffer, commits on normal exit and aborts on an exception.
    """

    __slots__ = ("_pub", "_terms", "_view", "_frame_offset", "_frame_length", "result", "buffer", "_open")

    def __init__(self) -> None:
        self._pub: Any = None
        self._terms: Any = None
        self._view: memoryview | None = None
        self._frame_offset = 0
        self._frame_length = 0
        self.result = 0
        self.buffer: memoryview | None = None
        self._open = False

    def _wrap(
        self, pub: Any, terms: Any, view: memoryview, frame_offset: int, frame_length: int, result: int
    ) -> None:
        self._pub = pub
        self._terms = terms
        self._view = view
        self._frame_offset = frame_offset
        self._frame_length = frame_length
        self.result = result
        self.buffer = view[frame_offset + f.HEADER_LENGTH : frame_offset + frame_length]
        self._open = True

    def _fail(self, result: int) -> None:
        self.result = result
        self.buffer = None
        self._open = False

    def __bool__(self) -> bool:
        return self._open

    @property
    def position(self) -> int:
        """The stream position after this frame (when claimed)."""
        return self.result

    @property
    def length(self) -> int:
        return self._frame_length - f.HEADER_LENGTH

    @property
    def reserved_value(self) -> int:
        self._check_open()
        return int.from_bytes(self._slice(f.RESERVED_VALUE_OFFSET, 8), "little", signed=True)

    @reserved_value.setter
    def reserved_value(self, value: int) -> None:
        self._check_open()
        self._view[self._frame_offset + f.RESERVED_VALUE_OFFSET : self._frame_offset + f.HEADER_LENGTH] = (
            value.to_bytes(8, "little", signed=True)
        )

    def _slice(self, offset: int, length: int) -> memoryview:
        start = self._frame_offset + offset
        return self._view[start : start + length]

    def _check_open(self) -> None:
        if not self._open:
            raise ClaimStateError("no open claim: try_claim failed, or it was already committed or aborted")

    def commit(self) -> None:
        """Makes the frame visible to readers (stores its positive length with release semantics)."""
        self._check_open()
        self._open = False
        self.buffer = None
        lib.lb_claim_commit_wake(self._pub, self._frame_offset, self._frame_length)

    def abort(self) -> None:
        """Turns the frame into padding that readers skip."""
        self._check_open()
        self._open = False
        self.buffer = None
        lib.lb_claim_abort(self._terms, self._frame_offset, self._frame_length)

    def __enter__(self) -> memoryview:
        self._check_open()
        assert self.buffer is not None
        return self.buffer

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._open:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def __repr__(self) -> str:
        state = "open" if self._open else ("failed" if self.result < 0 else "done")
        return f"BufferClaim({state}, result={describe(self.result) if self.result else 0}, length={self.length})"


class Publication:
    """Common base; use :class:`ConcurrentPublication` or :class:`ExclusivePublication`."""

    _exclusive = 0

    def __init__(
        self,
        log: LogBuffers,
        position_limit: Position,
        *,
        channel: str = "aeron:ipc",
        registration_id: int = -1,
        on_close: Callable[[Publication], None] | None = None,
        wake_semaphore: str | None = None,
    ) -> None:
        self.log = log
        self.position_limit = position_limit
        self.channel = channel
        self.registration_id = registration_id
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self.max_message_length = log.max_message_length
        self.max_payload_length = log.max_payload_length
        self.max_possible_position = log.max_possible_position
        self._on_close = on_close
        self._closed = False
        self._terms = log.term_pointer(0)
        self._view = log.terms.view
        p = ffi.new("lb_publication_t *")
        p.terms = self._terms
        p.meta = log.meta.pointer(0)
        p.limit = ffi.cast("int64_t *", position_limit.pointer)
        p.max_possible_position = log.max_possible_position
        p.term_length = log.term_length
        p.position_bits = log.position_bits
        p.initial_term_id = log.initial_term_id
        p.session_id = log.session_id
        p.stream_id = log.stream_id
        p.max_payload_length = log.max_payload_length
        p.max_message_length = log.max_message_length
        p.waiting = ffi.NULL
        p.wake = ffi.NULL
        if wake_semaphore is not None:
            # subscribers may sleep on the stream's semaphore: post it after an append when one is waiting
            wake = lib.lb_wake_open(wake_semaphore.encode())
            if wake == ffi.NULL:
                raise FileNotFoundError(f"wake-up semaphore {wake_semaphore} does not exist")
            p.waiting = ffi.cast("int32_t *", log.meta.pointer(d.LOG_WAITING_SUBSCRIBERS_OFFSET))
            p.wake = wake
        self._pub = p
        self._claim_out = ffi.new("lb_claim_t *")
        self._appended = ffi.new("int32_t *")
        self._offer_fn = lib.lb_offer_exclusive if self._exclusive else lib.lb_offer
        self._claim_fn = lib.lb_try_claim_exclusive if self._exclusive else lib.lb_try_claim

    # -- appending -----------------------------------------------------------------------------------

    def offer(self, data: Any, reserved_value: int = 0) -> int:
        """Copies ``data`` (any contiguous bytes-like object) into the log, fragmenting if needed.

        Returns the new position, or a PublicationResult code; raises MessageTooLargeError past
        :attr:`max_message_length`.
        """
        if self._closed:
            return CLOSED
        if type(data) is bytes:
            length = len(data)
            if length > self.max_message_length:
                raise MessageTooLargeError(f"message of {length} bytes > max {self.max_message_length}")
            return self._offer_fn(self._pub, data, length, reserved_value)
        buf = ffi.from_buffer(data)
        length = len(buf)
        if length > self.max_message_length:
            raise MessageTooLargeError(f"message of {length} bytes > max {self.max_message_length}")
        return self._offer_fn(self._pub, buf, length, reserved_value)

    def try_claim(self, length: int, claim: BufferClaim | None = None) -> BufferClaim:
        """Claims one frame of ``length`` payload bytes for zero-copy writing.

        Returns ``claim`` (or a new BufferClaim), truthy when claimed; its ``result`` is the position or the
        PublicationResult code.  A claim is one frame: ``length`` is at most :attr:`max_payload_length`.
        """
        if claim is None:
            claim = BufferClaim()
        if self._closed:
            claim._fail(CLOSED)
            return claim
        if not 0 <= length <= self.max_payload_length:
            raise MessageTooLargeError(
                f"claim of {length} bytes: must be 0..{self.max_payload_length} (one frame; use offer to fragment)"
            )
        out = self._claim_out
        result = self._claim_fn(self._pub, length, out)
        if result > 0:
            claim._wrap(self._pub, self._terms, self._view, out.frame_offset, out.frame_length, result)
        else:
            claim._fail(result)
        return claim

    def offer_batch(
        self,
        messages: Sequence[bytes] | Any,
        lengths: Any = None,
        reserved_values: Any = None,
        offsets: Any = None,
    ) -> BatchResult:
        """Appends many messages with one reservation and one native call, each in its own frame.

        Either ``messages`` is a sequence of bytes-like objects, or it is one contiguous buffer (bytes,
        numpy array, …) holding the messages back to back and ``lengths`` gives each message's length, or
        scattered through it at ``offsets`` (int64 per message: e.g. messages inside received datagrams).
        ``reserved_values`` (optional, int64 per message) goes into each frame's reserved value.  Appends the
        longest prefix that fits the window and the current term; returns how many went in and the position
        (or the result code when none did).  Call again with the rest.
        """
        if self._closed:
            return BatchResult(0, CLOSED)
        if lengths is None:
            lengths = [len(m) for m in messages]
            messages = b"".join(messages)
        if type(lengths) is not np.ndarray or lengths.dtype != np.int32 or not lengths.flags.c_contiguous:
            lengths = np.ascontiguousarray(lengths, dtype=np.int32)
        count = len(lengths)
        if count == 0:
            return BatchResult(0, self.position)
        buf = ffi.from_buffer(messages)
        rv_ptr = ffi.NULL
        if reserved_values is not None:
            reserved_values = np.ascontiguousarray(reserved_values, dtype=np.int64)
            if len(reserved_values) != count:
                raise ValueError("reserved_values needs one value per message")
            rv_ptr = ffi.from_buffer("int64_t[]", reserved_values)
        offsets_ptr = ffi.NULL
        if offsets is not None:
            offsets = np.ascontiguousarray(offsets, dtype=np.int64)
            if len(offsets) != count:
                raise ValueError("offsets needs one value per message")
            offsets_ptr = ffi.from_buffer("int64_t[]", offsets)
        result = lib.lb_offer_batch(
            self._pub, self._exclusive, buf, len(buf), offsets_ptr, ffi.from_buffer("int32_t[]", lengths), rv_ptr,
            count, self._appended,
        )
        if result == lib.LB_INVALID_BATCH:
            if int(lengths.max()) > self.max_message_length:
                raise MessageTooLargeError(f"a message in the batch is longer than {self.max_message_length} bytes")
            raise ValueError("batch lengths are negative or run past the end of the data")
        return BatchResult(self._appended[0], result)

    # -- state ---------------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """The producer position (the tail of the active term)."""
        return lib.lb_producer_position(self._pub)

    @property
    def position_limit_value(self) -> int:
        return self.position_limit.get()

    @property
    def is_connected(self) -> bool:
        return not self._closed and self.log.is_connected

    @property
    def is_closed(self) -> bool:
        return self._closed

    def available_window(self) -> int:
        """Bytes that can be appended before back-pressure."""
        return self.position_limit.get() - self.position

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pub.wake != ffi.NULL:
            wake, self._pub.wake = self._pub.wake, ffi.NULL
            lib.lb_wake_close(wake)
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> Publication:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(channel={self.channel!r}, stream_id={self.stream_id}, "
            f"session_id={self.session_id}, position={self.position})"
        )


class ConcurrentPublication(Publication):
    """Any number of threads and processes may append to the same log through this publication.

    Space is reserved with one atomic get-and-add on the active term's tail counter.
    """

    _exclusive = 0


class ExclusivePublication(Publication):
    """One writer (one thread) owns the log: it keeps its position locally and publishes the tail with a
    release store before writing each frame; no atomic read-modify-write needed.  Never unblocked by the
    driver."""

    _exclusive = 1

    def __init__(self, log: LogBuffers, position_limit: Position, **kwargs: Any) -> None:
        super().__init__(log, position_limit, **kwargs)
        term_count = log.active_term_count
        raw = log.raw_tail(d.index_by_term_count(term_count))
        self._pub.ex_term_count = term_count
        self._pub.ex_term_id = d.tail_term_id(raw)
        self._pub.ex_term_offset = d.tail_term_offset(raw, log.term_length)

    @property
    def position(self) -> int:
        p = self._pub
        return (p.ex_term_count << p.position_bits) + p.ex_term_offset
