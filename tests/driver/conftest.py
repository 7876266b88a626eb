"""Fixtures shared by the driver tests: a client of the test module's own ``driver`` fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import logbuf


@pytest.fixture
def client(driver: logbuf.MediaDriver) -> Iterator[logbuf.Client]:
    """A client connected to the module's ``driver`` (each module launches the driver it needs)."""
    with logbuf.connect(driver.directory) as connected:
        yield connected
