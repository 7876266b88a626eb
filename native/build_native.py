"""Builders of logbuf's two native modules, the one place that lists their sources.

* ``logbuf._native`` (cffi, out-of-line API mode): ``pip install .`` runs :data:`ffibuilder` through
  setuptools' ``cffi_modules``; it compiles every ``native/*.c``.  The ``native/*.h`` headers declare exactly
  what Python may call (cffi parses them: declarations and integer #defines only).
* ``logbuf._client`` (a CPython extension, :func:`client_extension`): the client's per-message data path as
  extension types (``native/ext/client.c``), linked with the same appender/reader sources
  (:data:`CORE_SOURCES`), so both modules run one implementation of the log buffer.

Private headers (layout constants, static inline frame helpers) live in ``native/include/``, which cffi does
not parse.  Both modules are built for the full CPython API (no ``abi3``), so the wheel's tag is consistent.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADERS = sorted(HERE.glob("*.h"))
SOURCES = sorted(HERE.glob("*.c"))
INCLUDE = HERE / "include"
#: the log buffer core the client extension links (the cffi module compiles these too, with the rest)
CORE_SOURCES = [HERE / name for name in ("lb_appender.c", "lb_reader.c", "lb_wake.c", "lb_atomics.c")]
CLIENT_SOURCES = [HERE / "ext" / "client.c", *CORE_SOURCES]
COMPILE_ARGS = ["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fno-strict-aliasing"]


def _path(source: Path) -> str:
    # setuptools wants paths relative to the project root (where it runs); scripts/rebuild-native.sh compiles
    # from a scratch directory and asks for absolute ones
    return str(source if os.environ.get("LOGBUF_NATIVE_ABSOLUTE") else source.relative_to(HERE.parent))


def _extra_compile_args() -> list[str]:
    # LOGBUF_NATIVE_CFLAGS adds flags (scripts/build-sanitized.sh: -fsanitize=address,undefined)
    return COMPILE_ARGS + os.environ.get("LOGBUF_NATIVE_CFLAGS", "").split()


def _extra_link_args() -> list[str]:
    return os.environ.get("LOGBUF_NATIVE_LDFLAGS", "").split()


def _require_compiler() -> None:
    candidates = [os.environ.get("CC", "").split(" ")[0], "cc", "gcc", "clang"]
    if not any(c and shutil.which(c) for c in candidates):
        sys.stderr.write(
            "\nlogbuf: no C compiler found. logbuf compiles a small native shim (native/*.c) at install time.\n"
            "Install one and retry, e.g. on Debian/Ubuntu: apt-get install -y gcc python3-dev\n\n"
        )
        raise SystemExit("logbuf: a C compiler is required to build the native shim (set CC or install gcc)")


def client_extension() -> Any:
    """The ``logbuf._client`` CPython extension (a setuptools ``Extension``)."""
    from setuptools import Extension

    return Extension(
        "logbuf._client",
        sources=[_path(s) for s in CLIENT_SOURCES],
        include_dirs=[_path(HERE), _path(INCLUDE)],
        extra_compile_args=_extra_compile_args() + ["-fvisibility=hidden"],
        extra_link_args=_extra_link_args(),
    )


ffibuilder = FFI()
ffibuilder.cdef("\n".join(h.read_text() for h in HEADERS))
ffibuilder.set_source(
    "logbuf._native",
    "#include <stdint.h>\n" + "".join(f'#include "{h.name}"\n' for h in HEADERS),
    sources=[_path(s) for s in SOURCES],
    include_dirs=[str(HERE), str(INCLUDE)],
    extra_compile_args=_extra_compile_args(),
    extra_link_args=_extra_link_args(),
    py_limited_api=False,
)

if "egg_info" not in sys.argv and "dist_info" not in sys.argv:
    _require_compiler()
