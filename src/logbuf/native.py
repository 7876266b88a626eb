"""Loads the compiled native modules and wraps the atomics in a typed, bounds-checked buffer.

Two modules are built at install time from ``native/``: ``logbuf._native`` (cffi: atomics, scanner,
unblocker, cleaner, batch paths; ``ffi``/``lib`` here) and ``logbuf._client`` (a CPython extension: the
client's per-message offer/claim/poll as extension types).  Both link one shared library of the log buffer
core, ``liblogbuf-core.so`` beside them, so a publication the extension set up is appended to by the same code
when the cffi side is handed it (``Publication.native_struct()``).  ``AtomicBuffer`` is the only way Python code
reaches the atomics: it checks offsets, sizes and alignment before anything reaches C, the way Agrona's
``UnsafeBuffer`` does for Aeron.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Mapping
from typing import Any

if os.environ.get("LOGBUF_NATIVE_DIR"):
    # a separately built copy of the native modules (scripts/build-sanitized.sh) takes precedence: searched
    # first in the package's path (the package object, not its public facade)
    sys.modules[__name__.rpartition(".")[0]].__path__.insert(0, os.path.join(os.environ["LOGBUF_NATIVE_DIR"], "logbuf"))

try:
    from logbuf import _client
    from logbuf._native import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on how the package was installed
    raise ImportError(
        "logbuf's native modules (logbuf._native, logbuf._client) are not built. Install the package with "
        "`pip install .` (or `./run setup`), which compiles native/; a C compiler is required."
    ) from exc

from logbuf.errors import ClosedError

__all__ = ["AtomicBuffer", "check_codes", "check_control_layout", "check_layout", "client", "ffi", "lib"]

#: the CPython extension module ``logbuf._client`` (its types: the stub ``_client.pyi`` next to it)
client = _client

#: ``LOGBUF_CPYTHON_INTERNALS=0`` turns the client's CPython-specific fast paths off (payload views re-pointed
#: in place, per-subclass method descriptors): the portable path, through the public C API only; ``1`` asks for
#: them and refuses to import where this build has none.  Unset: on wherever the build has them.
INTERNALS_ENV = "LOGBUF_CPYTHON_INTERNALS"
_internals = os.environ.get(INTERNALS_ENV)
if _internals is not None:
    if _internals not in ("0", "1"):
        raise ImportError(f"{INTERNALS_ENV}={_internals!r}: expected 0 or 1")
    try:
        _client._use_cpython_internals(_internals == "1")
    except ValueError as exc:
        raise ImportError(f"{INTERNALS_ENV}=1: {exc}") from None


def check_layout(*namespaces: Any) -> None:
    """Asserts that every layout constant compiled into the native code equals Python's named constant.

    ``namespaces`` are modules or dicts (``logbuf.logbuffer.frame``, ``descriptor``); each native name must
    be defined in one of them with the same value.
    """
    dicts = [ns if isinstance(ns, dict) else vars(ns) for ns in namespaces]
    for name, value in _client.LAYOUT.items():
        python_value = next((d[name] for d in dicts if name in d), None)
        if python_value != value:
            raise ImportError(
                f"logbuf's native build disagrees on the log layout: {name} is {value} in C, "
                f"{python_value} in Python (rebuild the native modules)"
            )


def check_control_layout(modules: Mapping[str, Any]) -> None:
    """Asserts that the control frames' layouts compiled into the native code equal Python's codecs.

    ``modules`` maps each ``logbuf.protocol`` module's short name (``status_message``, ``nak``, ``setup``,
    ``rttm``, ``error_frame``) to the module; every field offset, length and flag the C names for that frame
    must be the module's constant of the same name.  Raises ImportError on any difference (a stale build).
    """
    native = _client.CONTROL_LAYOUT
    if set(native) != set(modules):
        raise ImportError(f"logbuf's native build names control frames {sorted(native)}, Python {sorted(modules)} "
                          "(rebuild the native modules)")
    for frame, table in native.items():
        namespace = vars(modules[frame])
        for name, value in table.items():
            if namespace.get(name) != value:
                raise ImportError(
                    f"logbuf's native build disagrees on the {frame} frame: {name} is {value} in C, "
                    f"{namespace.get(name)} in Python (rebuild the native modules)"
                )


def check_codes(table: str, python: Mapping[str, int]) -> None:
    """Asserts that a table of named codes compiled into the native code equals Python's.

    ``table`` names the ``logbuf._client`` table (``RESULT_CODES``: ``logbuf.h``'s publication results, which
    ``logbuf._native`` must also export as ``LB_<name>``; ``POLL_ACTIONS``: the controlled-poll actions);
    ``python`` maps the same names to Python's values (an enum's members).  Raises ImportError on any
    difference, naming it (a stale build).
    """
    native = dict(getattr(_client, table))
    if table == "RESULT_CODES":
        for name, value in native.items():
            if getattr(lib, f"LB_{name}", None) != value:
                raise ImportError(f"logbuf's native modules disagree: {name} is {value} in logbuf._client, "
                                  f"{getattr(lib, f'LB_{name}', None)} in logbuf._native (rebuild them)")
    if native != dict(python):
        differences = sorted(set(native.items()) ^ set(dict(python).items()))
        raise ImportError(f"logbuf's native build disagrees with Python on {table}: {differences} "
                          "(rebuild the native modules)")


class AtomicBuffer:
    """A writable buffer (mmap, bytearray, numpy array, …) with atomic and plain accessors at byte offsets.

    ``get_*_acquire`` / ``put_*_release`` are the volatile/ordered accessors of the Aeron protocol;
    ``cas_*`` and ``get_and_add_*`` are the read-modify-write operations.  Integers are little-endian.
    """

    __slots__ = ("_obj", "_cdata", "_address", "_view", "capacity", "base_offset")

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
        #: where this region starts inside ``obj`` (native objects export ``obj`` and address from there)
        self.base_offset = offset

    # -- plumbing for the owning objects (publications, images) --------------------------------------

    def pointer(self, offset: int = 0) -> Any:
        """A ``uint8_t *`` to ``offset`` (checked); the buffer must outlive its use."""
        self._check(offset, 0)
        return self._address + offset

    @property
    def view(self) -> memoryview:
        """A writable memoryview of the whole region."""
        return self._view

    @property
    def obj(self) -> Any:
        """The underlying buffer object (an mmap, bytearray, …); ClosedError once released."""
        if self._cdata is None:
            raise ClosedError("the buffer was released")
        return self._obj

    def _check(self, offset: int, size: int) -> None:
        if self._cdata is None:
            raise ClosedError("the buffer was released (its log or counters file is closed)")
        if offset < 0 or offset + size > self.capacity:
            raise IndexError(f"offset {offset} (+{size}) is outside a buffer of {self.capacity} bytes")
        if size and offset % size:
            raise ValueError(f"offset {offset} is not aligned to {size} bytes for an atomic access")

    # -- atomics -------------------------------------------------------------------------------------

    def get_i32_acquire(self, offset: int) -> int:
        """The int32 at ``offset`` (acquire load)."""
        self._check(offset, 4)
        return lib.lb_get_i32_acquire(self._address + offset)

    def get_i64_acquire(self, offset: int) -> int:
        """The int64 at ``offset`` (acquire load)."""
        self._check(offset, 8)
        return lib.lb_get_i64_acquire(self._address + offset)

    def put_i32_release(self, offset: int, value: int) -> None:
        """Stores an int32 at ``offset`` (release store)."""
        self._check(offset, 4)
        lib.lb_put_i32_release(self._address + offset, value)

    def put_i64_release(self, offset: int, value: int) -> None:
        """Stores an int64 at ``offset`` (release store)."""
        self._check(offset, 8)
        lib.lb_put_i64_release(self._address + offset, value)

    def cas_i32(self, offset: int, expected: int, desired: int) -> bool:
        """Compare-and-set of the int32 at ``offset``; True if it was ``expected``."""
        self._check(offset, 4)
        return bool(lib.lb_cas_i32(self._address + offset, expected, desired))

    def cas_i64(self, offset: int, expected: int, desired: int) -> bool:
        """Compare-and-set of the int64 at ``offset``; True if it was ``expected``."""
        self._check(offset, 8)
        return bool(lib.lb_cas_i64(self._address + offset, expected, desired))

    def get_and_add_i32(self, offset: int, delta: int) -> int:
        """Atomically adds ``delta`` to the int32 at ``offset``; returns the old value."""
        self._check(offset, 4)
        return lib.lb_get_and_add_i32(self._address + offset, delta)

    def get_and_add_i64(self, offset: int, delta: int) -> int:
        """Atomically adds ``delta`` to the int64 at ``offset``; returns the old value."""
        self._check(offset, 8)
        return lib.lb_get_and_add_i64(self._address + offset, delta)

    # -- plain accessors (no ordering; for fields published by a later release store) ----------------

    def _check_span(self, offset: int, size: int) -> None:
        if self._cdata is None:
            raise ClosedError("the buffer was released (its log or counters file is closed)")
        if offset < 0 or size < 0 or offset + size > self.capacity:
            raise IndexError(f"[{offset}, {offset + size}) is outside a buffer of {self.capacity} bytes")

    def get_i32(self, offset: int) -> int:
        """The little-endian int32 at ``offset`` (plain read)."""
        self._check_span(offset, 4)
        return int.from_bytes(self._view[offset : offset + 4], "little", signed=True)

    def get_i64(self, offset: int) -> int:
        """The little-endian int64 at ``offset`` (plain read)."""
        self._check_span(offset, 8)
        return int.from_bytes(self._view[offset : offset + 8], "little", signed=True)

    def put_i32(self, offset: int, value: int) -> None:
        """Stores ``value`` as a little-endian int32 at ``offset`` (plain write)."""
        self._check_span(offset, 4)
        self._view[offset : offset + 4] = value.to_bytes(4, "little", signed=True)

    def put_i64(self, offset: int, value: int) -> None:
        """Stores ``value`` as a little-endian int64 at ``offset`` (plain write)."""
        self._check_span(offset, 8)
        self._view[offset : offset + 8] = value.to_bytes(8, "little", signed=True)

    def get_bytes(self, offset: int, length: int) -> bytes:
        """A copy of ``length`` bytes at ``offset``."""
        self._check_span(offset, length)
        return bytes(self._view[offset : offset + length])

    def put_bytes(self, offset: int, data: bytes) -> None:
        """Copies ``data`` to ``offset``."""
        self._check_span(offset, len(data))
        self._view[offset : offset + len(data)] = data

    def set_memory(self, offset: int, length: int, value: int = 0) -> None:
        """Fills ``length`` bytes at ``offset`` with ``value``."""
        self._check_span(offset, length)
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
