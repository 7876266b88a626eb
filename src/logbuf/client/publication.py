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

from logbuf.errors import ClosedError, LogCorruptedError, MessageTooLargeError
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import check_codes, client, ffi, lib
from logbuf.position import Position


class PublicationResult(enum.IntEnum):
    """Aeron's result codes of an append (negative, so never a position)."""

    NOT_CONNECTED = -1
    BACK_PRESSURED = -2
    ADMIN_ACTION = -3
    CLOSED = -4
    MAX_POSITION_EXCEEDED = -5


check_codes("RESULT_CODES", {r.name: r.value for r in PublicationResult})  # the same codes as logbuf.h's

NOT_CONNECTED = PublicationResult.NOT_CONNECTED
BACK_PRESSURED = PublicationResult.BACK_PRESSURED
ADMIN_ACTION = PublicationResult.ADMIN_ACTION
CLOSED = PublicationResult.CLOSED
MAX_POSITION_EXCEEDED = PublicationResult.MAX_POSITION_EXCEEDED


def describe(result: int) -> str:
    """``"position 4096"`` or the result code's name."""
    return f"position {result}" if result >= 0 else PublicationResult(result).name


def _int64_per_message(values: Any, count: int, name: str) -> Any:
    """An ``int64_t *`` over one value per message (NULL for None); it keeps the array it points into."""
    if values is None:
        return ffi.NULL
    array = np.ascontiguousarray(values, dtype=np.int64)
    if len(array) != count:
        raise ValueError(f"{name} needs one value per message")
    return ffi.from_buffer("int64_t[]", array)


class BatchResult(NamedTuple):
    """What ``offer_batch`` appended: how many messages, and the position (or result code)."""
    appended: int  # messages appended by this call (a prefix of the batch)
    result: int  # new position if appended > 0, else the PublicationResult code


#: One claimed frame (``logbuf._client.BufferClaim``): write the payload into ``buffer``, then ``commit()``
#: (or ``abort()``).  Truthy only when the claim succeeded; otherwise ``result`` says why.  As a context
#: manager it yields the buffer, commits on normal exit and aborts on an exception.  Attributes: ``result``,
#: ``position``, ``buffer``, ``length``, ``reserved_value`` (read/write while open).
BufferClaim = client.BufferClaim


class Publication(client.Publication):
    """Common base; use :class:`ConcurrentPublication` or :class:`ExclusivePublication`.

    ``offer``, ``try_claim``, ``position``, ``position_limit_value`` and ``available_window`` are methods of
    the native base (``logbuf._client.Publication``), called without a Python frame in between.  Once the
    publication or its log is closed, ``offer``/``try_claim`` answer ``CLOSED`` and the positions raise
    :class:`~logbuf.errors.ClosedError`.
    """

    _exclusive = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        client.specialize(cls)  # offer/try_claim: CPython's fast call path needs the exact class

    def __init__(
        self,
        log: LogBuffers,
        position_limit: Position,
        *,
        channel: str = "aeron:ipc",
        registration_id: int = -1,
        on_close: Callable[[Publication], None] | None = None,
        wake_semaphore: str | None = None,
        on_destination: Callable[[bool, str], None] | None = None,
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
        self._on_destination = on_destination
        self._closed = False
        limit_buffer, limit_offset = position_limit.slot
        # subscribers may sleep on the stream's semaphore: the native side posts it after an append when one waits
        self._attach(
            log.native, limit_buffer, limit_offset, log.session_id, log.stream_id, log.initial_term_id,
            log.max_payload_length, log.max_message_length, self._exclusive,
            None if wake_semaphore is None else wake_semaphore.encode(),
        )
        self._appended = ffi.new("int32_t *")

    # -- appending (offer and try_claim are native) ---------------------------------------------------

    def native_struct(self) -> Any:
        """The ``lb_publication_t *`` (cffi) of this open publication, for native code that appends through
        ``logbuf._native`` (``lb_offer_batch``, the feed engine): the same core library as ``offer`` runs on
        it.  Valid while the publication is open; raises ClosedError once it is closed."""
        if self.is_closed:
            raise ClosedError(f"{type(self).__name__} is closed")
        return ffi.cast("lb_publication_t *", self._struct_address)

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
        if self.is_closed:
            return BatchResult(0, CLOSED)
        if lengths is None:
            lengths = [len(m) for m in messages]
            messages = b"".join(messages)
        if type(lengths) is not np.ndarray or lengths.dtype != np.int32 or not lengths.flags.c_contiguous:
            lengths = np.ascontiguousarray(lengths, dtype=np.int32)
        count = len(lengths)
        if count == 0:
            return BatchResult(0, self.position)
        if isinstance(messages, str):
            raise TypeError("offer_batch takes bytes-like data, not str (encode it first)")
        buf = ffi.from_buffer(messages)
        rv_ptr = _int64_per_message(reserved_values, count, "reserved_values")
        offsets_ptr = _int64_per_message(offsets, count, "offsets")
        result = lib.lb_offer_batch(
            self.native_struct(), self._exclusive, buf, len(buf), offsets_ptr, ffi.from_buffer("int32_t[]", lengths), rv_ptr,
            count, self._appended,
        )
        if result == lib.LB_INVALID_BATCH:
            if int(lengths.max()) > self.max_message_length:
                raise MessageTooLargeError(f"a message in the batch is longer than {self.max_message_length} bytes")
            raise ValueError("batch lengths are negative or run past the end of the data")
        if result == lib.LB_CORRUPT_FRAME:
            raise LogCorruptedError("the log's tail counters cannot be a tail (corrupted metadata)", -1)
        return BatchResult(self._appended[0], result)

    # -- multi-destination-cast ---------------------------------------------------------------------

    def add_destination(self, channel: str) -> None:
        """Adds a destination to a manual multi-destination-cast publication (its channel has
        ``control-mode=manual``): from now on every frame also goes to ``channel``'s endpoint, e.g.
        ``aeron:udp?endpoint=10.0.0.2:40456``.  Waits for the driver's answer; raises
        :class:`~logbuf.errors.RegistrationError` (with Aeron's error code) when the driver refuses it."""
        self._destination(True, channel)

    def remove_destination(self, channel: str) -> None:
        """Stops sending to a destination added with :meth:`add_destination` (the same channel string's
        endpoint); removing one that is not there is not an error, as on aeronmd."""
        self._destination(False, channel)

    def _destination(self, add: bool, channel: str) -> None:
        if self.is_closed:
            raise ClosedError(f"{type(self).__name__} is closed")
        if self._on_destination is None:
            raise ClosedError(f"{type(self).__name__} has no driver to ask (not made by a client)")
        self._on_destination(add, channel)

    # -- state ---------------------------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        """True while open and the driver reports a consumer (the log's isConnected flag)."""
        return not self.is_closed and self.log.is_connected

    def close(self) -> None:
        """Closes the publication: later offers answer CLOSED; the log and counters are let go of."""
        if self._closed:
            return
        self._closed = True
        self._close_native()
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> Publication:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.is_closed else f"position={self.position}"
        return (
            f"{type(self).__name__}(channel={self.channel!r}, stream_id={self.stream_id}, "
            f"session_id={self.session_id}, {state})"
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
