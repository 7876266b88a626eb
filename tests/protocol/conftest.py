"""Fixtures of the wire-protocol tests: tshark (installed by the project's own script, or skipped)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tshark() -> str:
    script = ROOT / "scripts" / "ensure-tshark.sh"
    try:
        result = subprocess.run([str(script)], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"scripts/ensure-tshark.sh could not run: {exc}")
    path = shutil.which("tshark")
    if result.returncode != 0 or path is None:
        pytest.skip(f"tshark is not installable here: {result.stderr.strip() or result.stdout.strip()}")
    return path
