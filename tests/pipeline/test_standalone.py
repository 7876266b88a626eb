"""The cluster path: the same job through spark-submit against a standalone master + worker on 127.0.0.1.

scripts/spark-standalone-check.sh starts both daemons from pyspark's jars, submits src/logbuf/pipeline/job.py
in client mode and stops them by PID (also on failure). About a minute on 2 quiet cores; the timeouts allow
for both cores busy elsewhere (two more JVMs start here). Plots are off: the local run draws them already.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)
def test_spark_submit_to_a_standalone_cluster_matches_local(spark, scenario, analysis, tmp_path):
    root, _ = scenario
    out = tmp_path / "cluster"
    env = dict(os.environ, SPARK_MASTER_PORT=str(_free_port()), CHECK_TIMEOUT_S="360",
               START_TIMEOUT_S="120",
               PYTHON=str(Path(os.sys.executable)))
    done = subprocess.run([str(ROOT / "scripts" / "spark-standalone-check.sh"), str(root), str(out),
                           "--no-plots"], capture_output=True, text=True, timeout=560, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    cluster = json.loads((out / "summary.json").read_text())
    local = analysis.summary
    for key in ("sequences", "messages_delivered", "freezes", "gaps_both", "gaps_both_unrecovered", "wins"):
        assert cluster[key] == local[key], key
    assert cluster["delay"]["percentiles_ns"] == {k: v for k, v in local["delay"]["percentiles_ns"].items()}
    assert cluster["feeds"]["A"]["missing"] == local["feeds"]["A"]["missing"]
    assert (out / "report.md").is_file()
