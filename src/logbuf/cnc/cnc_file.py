"""``CncFile``: creating (driver) and mapping (clients, tools) a cnc.dat, with each section as an object.

See ``layout.py`` for the byte layout.  ``create`` writes the whole file before the version (last, with
release); ``open`` validates everything it reads before it maps a single section, so a truncated,
foreign, half-initialised or incompatible file is a clear ``CncFileError``, never a crash or a bad index.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable

from logbuf.cnc.broadcast import BroadcastReceiver, BroadcastTransmitter, CopyBroadcastReceiver
from logbuf.cnc.counters import CountersManager, CountersReader
from logbuf.cnc.error_log import DistinctErrorLog, ErrorLogReader
from logbuf.cnc.errors import CncFileError, CncMissingError, CncNotReadyError
from logbuf.cnc.layout import (
    CNC_VERSION,
    CNC_VERSION_OFFSET,
    HEADER_LENGTH,
    CncLayout,
)
from logbuf.cnc.ring_buffer import ManyToOneRingBuffer
from logbuf.directory import allocate
from logbuf.native import AtomicBuffer, client


class CncFile:
    """A mapped cnc.dat.  Use ``create`` (driver) or ``open`` (clients); ``close()`` unmaps it.

    Everything built from it (ring buffer, receivers, counters, positions) points into the mapping and
    must not be used after ``close()``.
    """

    def __init__(self, path: str, mapping: mmap.mmap, layout: CncLayout) -> None:
        self.path = path
        self.layout = layout
        self._mmap = mapping
        # a process that truncates cnc.dat must not kill every driver and client mapping it (see docs/native.md)
        self._guard = client.MappingGuard(mapping)
        self._buffers: list[AtomicBuffer] = []
        self.header_buffer = self._section(0, HEADER_LENGTH)
        self.to_driver_buffer = self._section(layout.to_driver_offset, layout.to_driver_buffer_length)
        self.to_clients_buffer = self._section(layout.to_clients_offset, layout.to_clients_buffer_length)
        self.counters_metadata_buffer = self._section(
            layout.counters_metadata_offset, layout.counters_metadata_length
        )
        self.counters_values_buffer = self._section(
            layout.counters_values_offset, layout.counters_values_length
        )
        self.error_log_buffer = self._section(layout.error_log_offset, layout.error_log_length)
        self.to_driver = ManyToOneRingBuffer(self.to_driver_buffer)

    def _section(self, offset: int, length: int) -> AtomicBuffer:
        buffer = AtomicBuffer(self._mmap, offset, length)
        self._buffers.append(buffer)
        return buffer

    # -- creation / opening ----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        to_driver_capacity: int,
        to_clients_capacity: int,
        counters_values_length: int,
        error_log_length: int,
        client_liveness_timeout_ns: int,
        pid: int,
        start_ms: int,
        mode: int = 0o600,
        ready: bool = True,
    ) -> CncFile:
        """Creates a new cnc.dat at ``path`` (capacities are powers of two, trailers are added).

        ``ready=False`` leaves the version 0 (clients wait) until :meth:`signal_ready`: a driver calls it once
        its system counters exist, as Aeron's driver does, so no client reads a half-initialised file.

        An existing file is unlinked, not truncated: processes still mapping an old driver's file keep
        their pages (truncating under them would SIGBUS them).  Deciding that an existing driver is
        dead is the caller's job (its consumer heartbeat).
        """
        layout = CncLayout.for_capacities(
            to_driver_capacity,
            to_clients_capacity,
            counters_values_length,
            error_log_length,
            client_liveness_timeout_ns,
            pid,
            start_ms,
        )
        path = os.fspath(path)
        length = _page_align(layout.total_length)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)  # the umask must not widen or narrow what was asked for
            allocate(fd, length, path)  # zero-filled and backed: empty rings, unused counters, empty error log
            mapping = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # no half-made file for a client to find
            raise
        os.close(fd)
        cnc = cls(path, mapping, layout)
        cnc.header_buffer.put_bytes(0, layout.encode(version=0))
        # Clients judge driver liveness on this; a fresh file must not look like a dead driver's.
        cnc.to_driver.consumer_heartbeat_time = start_ms
        if ready:
            cnc.signal_ready()
        return cnc

    def signal_ready(self) -> None:
        """Publishes the version (release): the file is complete, clients may use it."""
        self.header_buffer.put_i32_release(CNC_VERSION_OFFSET, CNC_VERSION)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> CncFile:
        """Maps an existing cnc.dat read/write (clients write commands and heartbeats into it).

        Raises CncNotReadyError (a CncFileError) while the driver is still initialising the file — retry —
        and CncFileError/CncVersionError when the file cannot be used.
        """
        path = os.fspath(path)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise CncMissingError(f"no CnC file at {path}: is the driver running?") from None
        except OSError as exc:  # e.g. another user's driver: clients need read/write access
            raise CncFileError(f"cannot open CnC file {path} read/write: {exc.strerror}") from exc
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_LENGTH:
                # a driver sizes the file right after creating it: short means "not ready yet" to a client,
                # which retries within its connect timeout (as Aeron's client waits for a non-empty file)
                raise CncNotReadyError(
                    f"CnC file {path} truncated: {size} bytes, the header alone is {HEADER_LENGTH}"
                )
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        try:
            header = AtomicBuffer(mapping, 0, HEADER_LENGTH)
            version = header.get_i32_acquire(CNC_VERSION_OFFSET)  # acquire: the rest is complete if non-zero
            raw = bytearray(header.get_bytes(0, HEADER_LENGTH))
            header.release()
            raw[0:4] = version.to_bytes(4, "little", signed=True)
            try:
                layout = CncLayout.decode(bytes(raw), file_length=size)
            except CncFileError as exc:
                raise type(exc)(f"{path}: {exc}") from None
            return cls(path, mapping, layout)
        except BaseException:
            mapping.close()
            raise

    # -- sections as objects ---------------------------------------------------------------------------

    def broadcast_transmitter(self) -> BroadcastTransmitter:
        return BroadcastTransmitter(self.to_clients_buffer)

    def broadcast_receiver(self) -> BroadcastReceiver:
        return BroadcastReceiver(self.to_clients_buffer)

    def copy_broadcast_receiver(self, strict: bool = False) -> CopyBroadcastReceiver:
        return CopyBroadcastReceiver(self.broadcast_receiver(), strict)

    def counters_reader(self) -> CountersReader:
        return CountersReader(self.counters_metadata_buffer, self.counters_values_buffer)

    def counters_manager(
        self, clock_ms: Callable[[], int] | None = None, free_to_reuse_timeout_ms: int = 1_000
    ) -> CountersManager:
        if clock_ms is None:
            return CountersManager(
                self.counters_metadata_buffer,
                self.counters_values_buffer,
                free_to_reuse_timeout_ms=free_to_reuse_timeout_ms,
            )
        return CountersManager(
            self.counters_metadata_buffer, self.counters_values_buffer, clock_ms, free_to_reuse_timeout_ms
        )

    def distinct_error_log(self, clock_ms: Callable[[], int] | None = None) -> DistinctErrorLog:
        if clock_ms is None:
            return DistinctErrorLog(self.error_log_buffer)
        return DistinctErrorLog(self.error_log_buffer, clock_ms)

    def error_log_reader(self) -> ErrorLogReader:
        return ErrorLogReader(self.error_log_buffer)

    # -- lifetime --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmaps the file (the file itself stays; the driver deletes it when it shuts down)."""
        if self._mmap.closed:
            return
        for buffer in self._buffers:
            buffer.release()
        self._guard.release()
        self._mmap.close()

    def __enter__(self) -> CncFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _page_align(length: int) -> int:
    page = mmap.PAGESIZE
    return (length + page - 1) // page * page
