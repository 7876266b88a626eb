"""Shared fixtures of the exchange simulator tests: small synthetic day files (tshark comes from the root conftest)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # the simulator needs no native build; run from a source checkout too
os.environ.setdefault("ITCH_NO_CPP", "1")  # itchfeed: the pure-Python parser is the reference

from logbuf.exchange.synth import SynthConfig, write_day  # noqa: E402

SMALL_DAY_MESSAGES = 30_000


@pytest.fixture(scope="session")
def small_day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "small.itch"
    write_day(SynthConfig(messages=SMALL_DAY_MESSAGES, seed=11), str(path), progress=False)
    return path


@pytest.fixture(scope="session")
def tiny_day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "tiny.itch"
    write_day(SynthConfig(messages=3_000, seed=5), str(path), progress=False)
    return path
