"""cffi builder for logbuf's native shim (out-of-line API mode), the one builder script of the project.

`pip install .` runs it through setuptools' ``cffi_modules`` and it compiles every ``native/*.c`` into the
extension ``logbuf._native``.  The ``native/*.h`` headers declare exactly what Python may call (cffi parses
them: declarations and integer #defines only); each module of the shim keeps its own .c/.h pair.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADERS = sorted(HERE.glob("*.h"))
SOURCES = sorted(HERE.glob("*.c"))


def _require_compiler() -> None:
    candidates = [os.environ.get("CC", "").split(" ")[0], "cc", "gcc", "clang"]
    if not any(c and shutil.which(c) for c in candidates):
        sys.stderr.write(
            "\nlogbuf: no C compiler found. logbuf compiles a small native shim (native/*.c) at install time.\n"
            "Install one and retry, e.g. on Debian/Ubuntu: apt-get install -y gcc python3-dev\n\n"
        )
        raise SystemExit("logbuf: a C compiler is required to build the native shim (set CC or install gcc)")


ffibuilder = FFI()
ffibuilder.cdef("\n".join(h.read_text() for h in HEADERS))
ffibuilder.set_source(
    "logbuf._native",
    "#include <stdint.h>\n" + "".join(f'#include "{h.name}"\n' for h in HEADERS),
    # setuptools wants paths relative to the project root (where it runs); scripts/rebuild-native.sh compiles
    # from a scratch directory and asks for absolute ones
    sources=[str(s if os.environ.get("LOGBUF_NATIVE_ABSOLUTE") else s.relative_to(HERE.parent)) for s in SOURCES],
    include_dirs=[str(HERE)],
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fno-strict-aliasing"],
)

if "egg_info" not in sys.argv and "dist_info" not in sys.argv:
    _require_compiler()
