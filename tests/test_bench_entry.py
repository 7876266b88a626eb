"""``python path/to/bench`` works from any directory (``python -m bench`` needs the repository root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import ROOT, child_env


def test_the_bench_entry_point_runs_from_another_directory(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench"), "no-such-harness"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=child_env())
    # it got as far as choosing a harness: every module of bench imported (bench/profile.py did not shadow
    # the standard library's profile module)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "unknown benchmark 'no-such-harness'; choose from transport, peers, profile, callgrind, aeron-udp"
