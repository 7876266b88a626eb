"""The type stub of the compiled client extension (src/logbuf/_client.pyi) matches the built module.

mypy checks the package against the stub, never against the C code, so a stub that drifted from
native/ext/client.c would make the type check vouch for calls that fail.  ``mypy.stubtest`` imports the
built module and compares every name, signature (from the C text signatures) and property with the stub.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import logbuf

pytest.importorskip("mypy.stubtest", reason="mypy is not installed")


def test_the_client_stub_matches_the_compiled_module(tmp_path: Path) -> None:
    package_parent = Path(logbuf.__file__).resolve().parents[1]
    assert (package_parent / "logbuf" / "_client.pyi").is_file()
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nmypy_path = {package_parent}\ncache_dir = {tmp_path / 'cache'}\n")
    command = [sys.executable, "-m", "mypy.stubtest", "logbuf._client", "--mypy-config-file", str(config)]
    if sys.version_info < (3, 12):
        # C types gained a Python-visible __buffer__ in 3.12; the stub declares it so that mypy sees a buffer
        allowlist = tmp_path / "allowlist.txt"
        allowlist.write_text("logbuf._client.LogMapping.__buffer__\n")
        command += ["--allowlist", str(allowlist)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_parent), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
