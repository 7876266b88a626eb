"""Fixtures of the tools tests: ``driver``, a fake driver's directory with a real cnc.dat."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_driver import FakeDriver, now_ms


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[FakeDriver]:
    """A fresh driver directory: system counters only, started 5 s ago, heartbeat now, pid = this process."""
    directory = tmp_path / "driver"
    directory.mkdir()
    start = now_ms() - 5_000
    fake = FakeDriver(directory, os.getpid(), start)
    fake.heartbeat(now_ms())
    try:
        yield fake
    finally:
        fake.close()
