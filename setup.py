"""Build hook: compiles native/ into logbuf._native (cffi) and logbuf._client (CPython extension).

All metadata lives in pyproject.toml; native/build_native.py lists the sources of both modules.
"""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "native"))
from build_native import client_extension  # noqa: E402

setup(cffi_modules=["native/build_native.py:ffibuilder"], ext_modules=[client_extension()])
