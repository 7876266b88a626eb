"""Wireshark's command-line tools, when the machine has them (tests that need one skip with the reason)."""

from __future__ import annotations

import shutil


def require_tool(name: str) -> str:
    """The path of ``name`` (``tshark``, ``dumpcap``) on PATH; else the test is skipped, saying how to get it.

    The tests never install anything: ``./run test`` installs tshark (and dumpcap with it) through
    scripts/ensure-tshark.sh before the suite starts."""
    import pytest  # (lazily: child scripts import this package without pytest's start-up cost)

    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (scripts/ensure-tshark.sh installs it; ./run test calls it)")
    return path
