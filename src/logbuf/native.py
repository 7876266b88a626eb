"""Loads the compiled shim (``logbuf._native``) and wraps its atomics in a typed, bounds-checked buffer.

The cffi extension is built at install time from ``native/``.  ``AtomicBuffer`` is the only way Python code
reaches the atomics: it checks offsets and alignment before anything reaches C, the way Agrona's
``UnsafeBuffer`` does for Aeron.  Hot paths (append, poll, scan) call ``lib`` directly with pointers the
owning objects computed and validated once.
"""

from __future__ import annotations

import mmap
from typing import Any

try:
    from logbuf._native import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on how the package was installed
    raise ImportError(
        "logbuf's native shim (logbuf._native) is not built. Install the package with `pip install .` "
        "(or `./run setup`), which compiles native/ through cffi; a C compiler is required."
    ) from exc

__all__ = ["AtomicBuffer", "ffi", "lib"]


class AtomicBuffer:
    """A writable buffer (mmap, bytearray, numpy array, …) with atomic and plain accessors at byte offsets.

    ``get_*_acquire`` / ``put_*_release`` are the volatile/ordered accessors of the Aeron protocol;
    ``cas_*`` and ``get_and_add_*`` are the read-modify-write operations.  Integers are little-endian.
    """

    __slots__ = ("_obj", "_cdata", "_address", "_view", "capacity")

    def __init__(self, obj: Any, offset: int = 0, length: int | None = None) -> None:
        view = memoryview(obj).cast("B")
        if view.readonly:
            raise ValueError("AtomicBuffer needs a writable buffer")
        total = view.nbytes
        if length is None:
            length = total - offset
        if offset < 0 or length < 0 or offset + length > total:
            raise ValueError(f"region [{offset}, {offset + length}) is outside a buffer of {total} bytes")
        self._obj = obj
        self._cdata = ffi.from_buffer("uint8_t[]", obj, require_writable=True)
        self._address = self._cdata + offset
        self._view = view[offset : offset + length]
        self.capacity = length

    # -- plumbing for the owning objects (publications, images) --------------------------------------

    def pointer(self, offset: int = 0) -> Any:
        """A ``uint8_t *`` to ``offset`` (checked); the buffer must outlive its use."""
        self._check(offset, 0)
        return self._address + offset

    @property
    def view(self) -> memoryview:
        """A writable memoryview of the whole region."""
        return self._view

    def _check(self, offset: int, size: int) -> None:
        if offset < 0 or offset + size > self.capacity:
            raise IndexError(f"offset {offset} (+{size}) is outside a buffer of {self.capacity} bytes")
        if size and offset % size:
            raise ValueError(f"offset {offset} is not aligned to {size} bytes for an atomic access")

    # -- atomics -------------------------------------------------------------------------------------

    def get_i32_acquire(self, offset: int) -> int:
        self._check(offset, 4)
        return lib.lb_get_i32_acquire(self._address + offset)

    def get_i64_acquire(self, offset: int) -> int:
        self._check(offset, 8)
        return lib.lb_get_i64_acquire(self._address + offset)

    def put_i32_release(self, offset: int, value: int) -> None:
        self._check(offset, 4)
        lib.lb_put_i32_release(self._address + offset, value)

    def put_i64_release(self, offset: int, value: int) -> None:
        self._check(offset, 8)
        lib.lb_put_i64_release(self._address + offset, value)

    def cas_i32(self, offset: int, expected: int, desired: int) -> bool:
        self._check(offset, 4)
        return bool(lib.lb_cas_i32(self._address + offset, expected, desired))

    def cas_i64(self, offset: int, expected: int, desired: int) -> bool:
        self._check(offset, 8)
        return bool(lib.lb_cas_i64(self._address + offset, expected, desired))

    def get_and_add_i32(self, offset: int, delta: int) -> int:
        self._check(offset, 4)
        return lib.lb_get_and_add_i32(self._address + offset, delta)

    def get_and_add_i64(self, offset: int, delta: int) -> int:
        self._check(offset, 8)
        return lib.lb_get_and_add_i64(self._address + offset, delta)

    # -- plain accessors (no ordering; for fields published by a later release store) ----------------

    def get_i32(self, offset: int) -> int:
        self._check(offset, 0)
        return int.from_bytes(self._view[offset : offset + 4], "little", signed=True)

    def get_i64(self, offset: int) -> int:
        self._check(offset, 0)
        return int.from_bytes(self._view[offset : offset + 8], "little", signed=True)

    def put_i32(self, offset: int, value: int) -> None:
        self._check(offset, 0)
        self._view[offset : offset + 4] = value.to_bytes(4, "little", signed=True)

    def put_i64(self, offset: int, value: int) -> None:
        self._check(offset, 0)
        self._view[offset : offset + 8] = value.to_bytes(8, "little", signed=True)

    def get_bytes(self, offset: int, length: int) -> bytes:
        self._check(offset, 0)
        self._check(offset + length, 0)
        return bytes(self._view[offset : offset + length])

    def put_bytes(self, offset: int, data: bytes) -> None:
        self._check(offset, 0)
        self._check(offset + len(data), 0)
        self._view[offset : offset + len(data)] = data

    def set_memory(self, offset: int, length: int, value: int = 0) -> None:
        self._check(offset, 0)
        self._check(offset + length, 0)
        ffi.memmove(self._address + offset, bytes([value]) * length, length)

    def release(self) -> None:
        """Drops this buffer's exports so the underlying mmap can be closed."""
        if self._cdata is None:
            return
        self._view.release()
        ffi.release(self._cdata)
        self._cdata = None
        self._address = None


def new_mmap(fd: int, length: int) -> mmap.mmap:
    """A shared read/write mapping of ``length`` bytes of ``fd``."""
    return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
