"""Build hook: compiles native/ into liblogbuf-core.so (the log buffer core), logbuf._native (cffi) and
logbuf._client (CPython extension), both linked with the core.

All metadata lives in pyproject.toml; native/build_native.py lists the sources and builds the core library.
"""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "native"))
from build_native import BuildNative, client_extension  # noqa: E402

setup(
    cffi_modules=["native/build_native.py:ffibuilder"],
    ext_modules=[client_extension()],
    cmdclass={"build_ext": BuildNative},
)
