"""Creating, opening and closing a log buffer file (three terms + metadata) through mmap."""

from __future__ import annotations

import contextlib
import mmap
import os
import random
from pathlib import Path
from typing import Any

from logbuf.directory import allocate, check_storage, set_mode
from logbuf.errors import ClosedError, InvalidLogBufferError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f
from logbuf.native import AtomicBuffer, client, new_mmap


class LogBuffers:
    """A mapped log buffer file.  ``terms`` covers the three terms, ``meta`` the metadata block.

    Create one with :meth:`create` (the driver's job) and map an existing one with :meth:`open`, which
    validates the file before anything reads it.

    Publications and images hold the mapping through :attr:`native` (one buffer export, shared): closing the
    log while they exist is safe; they answer CLOSED / 0 / ClosedError from then on, and the last of them
    to let go unmaps the file.
    """

    def __init__(self, path: str | os.PathLike[str], mapping: mmap.mmap, term_length: int) -> None:
        self.path = Path(path)
        self._mmap = mapping
        self.file_length = len(mapping)
        self.term_length = term_length
        self.position_bits = d.position_bits_to_shift(term_length)
        self.terms = AtomicBuffer(mapping, 0, d.PARTITION_COUNT * term_length)
        self.meta = AtomicBuffer(mapping, self.file_length - d.LOG_META_DATA_LENGTH, d.LOG_META_DATA_LENGTH)
        meta = self.meta
        self.initial_term_id = meta.get_i32(d.LOG_INITIAL_TERM_ID_OFFSET)
        self.mtu = meta.get_i32(d.LOG_MTU_LENGTH_OFFSET)
        self.page_size = meta.get_i32(d.LOG_PAGE_SIZE_OFFSET)
        self.correlation_id = meta.get_i64(d.LOG_CORRELATION_ID_OFFSET)
        self.session_id = meta.get_i32(d.LOG_DEFAULT_FRAME_HEADER_OFFSET + f.SESSION_ID_OFFSET)
        self.stream_id = meta.get_i32(d.LOG_DEFAULT_FRAME_HEADER_OFFSET + f.STREAM_ID_OFFSET)
        self.publication_window_length = meta.get_i32(d.LOG_PUBLICATION_WINDOW_LENGTH_OFFSET)
        self.max_message_length = d.compute_max_message_length(term_length)
        self.max_payload_length = self.mtu - f.HEADER_LENGTH
        self.max_possible_position = d.max_possible_position(term_length)
        self._native: client.LogMapping | None = client.LogMapping(mapping, term_length)
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        term_length: int = d.DEFAULT_IPC_TERM_LENGTH,
        page_size: int = mmap.PAGESIZE,
        mtu: int = d.DEFAULT_MTU,
        session_id: int | None = None,
        stream_id: int = 1001,
        initial_term_id: int | None = None,
        correlation_id: int = 0,
        publication_window_length: int = 0,
        receiver_window_length: int = 0,
        mode: int = 0o600,
        pre_touch: bool = False,
        reserve: int = 0,
    ) -> LogBuffers:
        """Creates a new log file in Aeron's layout (fails if it exists) and maps it.

        The file gets exactly ``mode`` (whatever the umask) and is allocated before it is mapped: a file
        system that cannot hold it, or would keep less than ``reserve`` bytes free afterwards, raises
        :class:`~logbuf.errors.StorageSpaceError` (an OSError, ENOSPC) and leaves no file behind — never a
        mapping that kills its first writer with SIGBUS.
        """
        d.check_term_length(term_length)
        d.check_page_size(page_size)
        d.check_mtu(mtu, term_length)
        rng = random.SystemRandom()
        session_id = rng.randint(-(2**31), 2**31 - 1) if session_id is None else session_id
        initial_term_id = rng.randint(-(2**31), 2**31 - 1) if initial_term_id is None else initial_term_id
        length = d.compute_log_length(term_length, page_size)
        check_storage(path, length, reserve)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            set_mode(fd, mode)
            allocate(fd, length, path)
            mapping = new_mmap(fd, length)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        meta = AtomicBuffer(mapping, length - d.LOG_META_DATA_LENGTH, d.LOG_META_DATA_LENGTH)
        meta.put_i64(d.LOG_CORRELATION_ID_OFFSET, correlation_id)
        meta.put_i32(d.LOG_INITIAL_TERM_ID_OFFSET, initial_term_id)
        meta.put_i32(d.LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET, f.HEADER_LENGTH)
        meta.put_i32(d.LOG_MTU_LENGTH_OFFSET, mtu)
        meta.put_i32(d.LOG_TERM_LENGTH_OFFSET, term_length)
        meta.put_i32(d.LOG_PAGE_SIZE_OFFSET, page_size)
        meta.put_i32(d.LOG_PUBLICATION_WINDOW_LENGTH_OFFSET, publication_window_length)
        meta.put_i32(d.LOG_RECEIVER_WINDOW_LENGTH_OFFSET, receiver_window_length)
        meta.put_i64(d.LOG_END_OF_STREAM_POSITION_OFFSET, d.INT64_MAX)
        header = f.HEADER_STRUCT.pack(
            0, f.CURRENT_VERSION, f.UNFRAGMENTED, f.HDR_TYPE_DATA, 0, session_id, stream_id, initial_term_id, 0
        )
        meta.put_bytes(d.LOG_DEFAULT_FRAME_HEADER_OFFSET, header)
        meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET, d.pack_tail(initial_term_id, 0))
        for i in range(1, d.PARTITION_COUNT):
            # a term not yet in use carries the id it would have had three terms ago (rotation CASes on it)
            meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET + 8 * i, d.pack_tail(initial_term_id + i - 3, 0))
        meta.put_i32_release(d.LOG_ACTIVE_TERM_COUNT_OFFSET, 0)
        meta.release()
        if pre_touch:
            # fault the pages in now, not on the first lap of appends (they are allocated: no SIGBUS)
            for offset in range(0, d.PARTITION_COUNT * term_length, page_size):
                mapping[offset] = 0
        return cls(path, mapping, term_length)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> LogBuffers:
        """Maps an existing log file after validating it; raises :class:`InvalidLogBufferError` otherwise."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise InvalidLogBufferError(f"cannot open log buffer {path}: {exc.strerror}") from exc
        try:
            size = os.fstat(fd).st_size
            if size < d.LOG_META_DATA_LENGTH + d.PARTITION_COUNT * d.TERM_MIN_LENGTH:
                raise InvalidLogBufferError(f"{path}: {size} bytes is too small to be a log buffer")
            mapping = new_mmap(fd, size)
        finally:
            os.close(fd)
        try:
            term_length = cls._validate(path, mapping)
        except InvalidLogBufferError:
            mapping.close()
            raise
        return cls(path, mapping, term_length)

    @staticmethod
    def _validate(path: Any, mapping: mmap.mmap) -> int:
        size = len(mapping)
        meta = memoryview(mapping)[size - d.LOG_META_DATA_LENGTH :]
        try:

            def i32(offset: int) -> int:
                return int.from_bytes(meta[offset : offset + 4], "little", signed=True)

            term_length = i32(d.LOG_TERM_LENGTH_OFFSET)
            page_size = i32(d.LOG_PAGE_SIZE_OFFSET)
            mtu = i32(d.LOG_MTU_LENGTH_OFFSET)
            header_length = i32(d.LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET)
            version = meta[d.LOG_DEFAULT_FRAME_HEADER_OFFSET + f.VERSION_OFFSET]
        finally:
            meta.release()
        try:
            d.check_term_length(term_length)
            d.check_page_size(page_size)
        except ValueError as exc:
            raise InvalidLogBufferError(f"{path}: {exc}") from None
        expected = d.compute_log_length(term_length, page_size)
        if size != expected:
            raise InvalidLogBufferError(
                f"{path}: file is {size} bytes, a log of term length {term_length} and page size {page_size} "
                f"is {expected}"
            )
        if header_length != f.HEADER_LENGTH:
            raise InvalidLogBufferError(f"{path}: default frame header length {header_length}, expected {f.HEADER_LENGTH}")
        if version != f.CURRENT_VERSION:
            raise InvalidLogBufferError(f"{path}: frame header version {version}, expected {f.CURRENT_VERSION}")
        try:
            d.check_mtu(mtu, term_length)
        except ValueError as exc:
            raise InvalidLogBufferError(f"{path}: {exc}") from None
        return term_length

    def close(self) -> None:
        """Closes the log: publications and images on it answer CLOSED / 0 / ClosedError from now on.

        The file is unmapped now if nothing else holds it, else when the last publication, image or handed-out
        view (poll payload, claim buffer) lets go; none of them can see it vanish.
        """
        if self._closed:
            return
        self._closed = True
        if self._native is not None:
            self._native.close()
        self._native = None
        self.terms.release()
        self.meta.release()
        # a caller may still hold a view; then the mapping goes when the last view does
        with contextlib.suppress(BufferError):
            self._mmap.close()

    @property
    def is_closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def check_truncated(self) -> str | None:
        """Why this log can no longer be trusted, or None: its file shrank under the mapping (any process with
        write access can truncate it), or an access past the new end was already recovered (the native SIGBUS
        guard put zero pages there).  A slow-path check (one ``stat``): call it periodically, not per message."""
        native = self._native
        if native is not None and native.truncated:
            return f"log buffer {self.path} was truncated under its mapping (pages past the end read as zeros)"
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return None  # unlinked by the driver (the stream ended): the mapping stays valid
        except OSError:
            return None
        if size < self.file_length:
            return f"log buffer {self.path} shrank from {self.file_length} to {size} bytes under its mapping"
        return None

    @property
    def native(self) -> client.LogMapping:
        """The :class:`logbuf._client.LogMapping` native publications and images hold; ClosedError once closed."""
        if self._closed or self._native is None:
            raise ClosedError(f"log buffer {self.path} is closed")
        return self._native

    def __enter__(self) -> LogBuffers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def mapping(self) -> mmap.mmap:
        """The mmap of the whole file."""
        return self._mmap

    # -- metadata ------------------------------------------------------------------------------------

    def raw_tail(self, index: int) -> int:
        """The raw tail counter of partition ``index`` (acquire)."""
        return self.meta.get_i64_acquire(d.TERM_TAIL_COUNTERS_OFFSET + 8 * index)

    @property
    def active_term_count(self) -> int:
        """Terms since the initial one (the active partition is its index)."""
        return self.meta.get_i32_acquire(d.LOG_ACTIVE_TERM_COUNT_OFFSET)

    @property
    def is_connected(self) -> bool:
        """The driver's isConnected flag (a consumer is there)."""
        return self.meta.get_i32_acquire(d.LOG_IS_CONNECTED_OFFSET) == 1

    @is_connected.setter
    def is_connected(self, value: bool) -> None:
        self.meta.put_i32_release(d.LOG_IS_CONNECTED_OFFSET, 1 if value else 0)

    @property
    def end_of_stream_position(self) -> int:
        """Where the stream ends (INT64_MAX until the publisher closed it)."""
        return self.meta.get_i64_acquire(d.LOG_END_OF_STREAM_POSITION_OFFSET)

    @end_of_stream_position.setter
    def end_of_stream_position(self, value: int) -> None:
        self.meta.put_i64_release(d.LOG_END_OF_STREAM_POSITION_OFFSET, value)

    def producer_position(self) -> int:
        """The position of the active term's tail (what pub-pos samples)."""
        term_count = self.active_term_count
        raw = self.raw_tail(d.index_by_term_count(term_count))
        return d.compute_position(
            d.tail_term_id(raw), d.tail_term_offset(raw, self.term_length), self.position_bits, self.initial_term_id
        )

    def term_pointer(self, index: int) -> Any:
        """A cffi ``uint8_t *`` to term ``index`` (valid while the log is open)."""
        return self.terms.pointer(index * self.term_length)

    def __repr__(self) -> str:
        return (
            f"LogBuffers({str(self.path)!r}, term_length={self.term_length}, session_id={self.session_id}, "
            f"stream_id={self.stream_id}, initial_term_id={self.initial_term_id})"
        )
