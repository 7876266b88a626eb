"""Keeps the benchmark harness and the demo from rotting: tiny runs that check their output, not speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_transport_harness_smoke(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "transport", "--runs", "1", "--messages", "20000", "--sizes", "32",
         "--rtt-samples", "2000", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "transport.json").read_text())
    assert {(r["api"], r["size"]) for r in result["throughput"]} == {("per-message", 32), ("batch", 32)}
    assert all(r["msgs_per_s"] > 0 for r in result["throughput"])
    assert result["rtt"]["p50_us"] > 0
    assert "| logbuf per-message | 32 B |" in (tmp_path / "transport.md").read_text()


@pytest.mark.timeout(120)
def test_demo_command_prints_throughput_and_rtt() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "logbuf.cli", "demo", "--messages", "20000", "--sizes", "32", "--rtt-samples",
         "2000"],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    assert "per-message" in proc.stdout and "batch" in proc.stdout and "p50" in proc.stdout


def test_demo_rejects_bad_arguments() -> None:
    proc = subprocess.run([sys.executable, "-m", "logbuf.cli", "demo", "--messages", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "must be positive" in proc.stderr
