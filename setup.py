"""Build hook: compiles native/ through cffi (out-of-line API mode). All metadata lives in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["native/build_native.py:ffibuilder"])
