"""Keeps ``python -m bench aeron-udp`` from rotting: its parsing, and one tiny run where Aeron's C samples are
found (skipped with the reason otherwise).  Checks output, never speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `bench` lives at the repository root, next to src/

from bench import aeron_udp  # noqa: E402

pytestmark = pytest.mark.timeout(300)

TABLE = """Pinging 20000 messages of length 32 bytes
       Value   Percentile   TotalCount 1/(1-Percentile)

       0.391     0.000000            2         1.00
       0.551     0.400000        10395         1.67
       0.561     0.550000        13410         2.22
       4.767     0.990625        19815       106.67
      23.247     0.998828        19977       853.33
"""


def test_percentiles_come_from_cping_s_table() -> None:
    assert aeron_udp.parse_percentiles(TABLE) == {"p50_us": 0.561, "p99_us": 4.767}
    with pytest.raises(RuntimeError, match="no percentile table"):
        aeron_udp.parse_percentiles("Warm up complete")


def test_unknown_modes_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        aeron_udp.main(["--modes", "shared,invoker"])
    assert "unknown invoker" in capsys.readouterr().err


def test_a_tiny_run_writes_its_tables(tmp_path: Path) -> None:
    if aeron_udp.find_aeron_bin() is None:
        pytest.skip("Aeron's C samples not found (set AERON_BIN to the directory holding their bin/)")
    code = aeron_udp.main(["--modes", "shared", "--messages", "20000", "--pings", "50", "--warmup", "10",
                           "--no-busy-core", "--no-aeronmd", "--timeout", "120", "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "aeron_udp.json").read_text())
    (case,) = result["cases"]
    assert "error" not in case, case
    assert case["throughput"]["messages"] == 20000 and case["throughput"]["msgs_per_s"] > 0
    assert 0 < case["rtt"]["p50_us"] <= case["rtt"]["p99_us"]
    assert "| shared | logbuf |" in (tmp_path / "aeron_udp.md").read_text()
