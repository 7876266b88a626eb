"""Keeps the recorder benchmark from rotting: a tiny run (3 processes) that must record every message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "recorder" / "bench_recorder.py"


@pytest.mark.timeout(60)
def test_the_recorder_benchmark_records_every_message(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(BENCH), "--messages", "10000", "--runs", "1", "--term-length", "1m",
                           "--json", str(out)], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    run = result["runs"][0]
    assert run["complete"] and run["messages"] == 10000 and result["median_msg_per_s"] > 0
    assert run["message_files"] >= 1 and run["packets"] > 0
