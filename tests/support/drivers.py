"""An embedded media driver for a fixture: launched, yielded, closed whatever the test did."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import logbuf


def running_driver(directory: Path, **options: Any) -> Iterator[logbuf.MediaDriver]:
    """``yield from running_driver(tmp_path / "drv", ...)`` in a fixture: the driver is closed afterwards."""
    driver = logbuf.MediaDriver.launch(directory, **options)
    try:
        yield driver
    finally:
        driver.close()
