"""Builders of logbuf's native code, the one place that lists its sources.

* ``liblogbuf-core.so``: the log buffer core (every ``native/lb_*.c``: atomics, appender, reader, scanner,
  unblocker, cleaner, wake-up, SPSC queues, agent runner), one shared library installed beside the two modules
  below and linked by both, so there is one copy of the code in a process and a ``lb_publication_t`` one module
  set up is appended to by the same code when the other hands it on (``Publication.native_struct()``).  The
  modules find it through their run path, ``$ORIGIN`` (the directory they were loaded from), wherever the
  package is installed: a wheel, an editable install, or a scratch build (``scripts/rebuild-native.sh``).
* ``logbuf._native`` (cffi, out-of-line API mode): ``pip install .`` runs :data:`ffibuilder` through
  setuptools' ``cffi_modules``; it compiles the rest of ``native/*.c`` (the driver's agents, the feed engine,
  the datagram batches).  The ``native/*.h`` headers declare exactly what Python may call (cffi parses them:
  declarations and integer #defines only).
* ``logbuf._client`` (a CPython extension, :func:`client_extension`): the client's per-message data path as
  extension types (``native/ext/client.c``).

:class:`BuildNative` (setup.py's ``build_ext``) builds the core library before the modules and ships it with
them.  Private headers (layout constants, static inline frame helpers) live in ``native/include/``, which cffi
does not parse.  Both modules are built for the full CPython API (no ``abi3``), so the wheel's tag is
consistent.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from cffi import FFI
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
HEADERS = sorted(HERE.glob("*.h"))
INCLUDE = HERE / "include"
#: the log buffer core: one shared library both modules link
CORE_SOURCES = sorted(HERE.glob("lb_*.c"))
#: what the cffi module compiles itself (the driver's agents, the feed engine, the datagram batches)
SOURCES = sorted(set(HERE.glob("*.c")) - set(CORE_SOURCES))
CLIENT_SOURCES = [HERE / "ext" / "client.c"]
COMPILE_ARGS = ["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fno-strict-aliasing"]
#: the core library's name for the linker (-l) and its file, installed in the package beside the modules
CORE_LIBRARY = "logbuf-core"
CORE_FILE = f"lib{CORE_LIBRARY}.so"
#: the modules look for the core library in their own directory, wherever the package was installed
LINK_CORE = [f"-l{CORE_LIBRARY}", "-Wl,-rpath,$ORIGIN"]


def _path(source: Path) -> str:
    # setuptools wants paths relative to the project root (where it runs); scripts/rebuild-native.sh compiles
    # from a scratch directory and asks for absolute ones
    return str(source if os.environ.get("LOGBUF_NATIVE_ABSOLUTE") else source.relative_to(HERE.parent))


def _extra_compile_args() -> list[str]:
    # LOGBUF_NATIVE_CFLAGS adds flags (scripts/build-sanitized.sh: -fsanitize=address,undefined)
    return COMPILE_ARGS + os.environ.get("LOGBUF_NATIVE_CFLAGS", "").split()


def _extra_link_args() -> list[str]:
    return os.environ.get("LOGBUF_NATIVE_LDFLAGS", "").split()


class BuildNative(build_ext):
    """setuptools' ``build_ext`` that first builds ``liblogbuf-core.so`` into the package's build directory
    (where both modules link it from, and from where a wheel or an editable install takes it)."""

    def build_extensions(self) -> None:
        core = self._core_path()
        objects = self.compiler.compile(
            [_path(s) for s in CORE_SOURCES],
            output_dir=self.build_temp,
            include_dirs=[_path(HERE), _path(INCLUDE)],
            # calls inside the library bind to its own functions (no interposition): as fast as one module
            extra_postargs=_extra_compile_args() + ["-fno-semantic-interposition"],
        )
        os.makedirs(os.path.dirname(core), exist_ok=True)
        self.compiler.link_shared_object(
            objects, core, extra_postargs=_extra_link_args() + [f"-Wl,-soname,{CORE_FILE}", "-Wl,-Bsymbolic"]
        )
        for ext in self.extensions:
            ext.library_dirs.append(os.path.dirname(core))
        super().build_extensions()

    def _core_path(self) -> str:
        # the package's build directory, beside the modules (run() builds there, then copies for --inplace)
        return os.path.join(self.build_lib, "logbuf", CORE_FILE)

    def _inplace_core_path(self) -> str:
        package_dir = self.get_finalized_command("build_py").get_package_dir("logbuf")
        return os.path.join(package_dir, CORE_FILE)

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        return outputs if self.inplace else [*outputs, self._core_path()]

    def get_output_mapping(self) -> dict[str, str]:
        mapping = super().get_output_mapping()
        if self.inplace:
            mapping[self._core_path()] = self._inplace_core_path()
        return mapping

    def copy_extensions_to_source(self) -> None:
        super().copy_extensions_to_source()
        self.copy_file(self._core_path(), self._inplace_core_path(), level=self.verbose)


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
        extra_link_args=_extra_link_args() + LINK_CORE,
    )


ffibuilder = FFI()
ffibuilder.cdef("\n".join(h.read_text() for h in HEADERS))
ffibuilder.set_source(
    "logbuf._native",
    "#include <stdint.h>\n" + "".join(f'#include "{h.name}"\n' for h in HEADERS),
    sources=[_path(s) for s in SOURCES],
    include_dirs=[str(HERE), str(INCLUDE)],
    extra_compile_args=_extra_compile_args(),
    extra_link_args=_extra_link_args() + LINK_CORE,
    py_limited_api=False,
)

if "egg_info" not in sys.argv and "dist_info" not in sys.argv:
    _require_compiler()
