"""What machine a benchmark ran on, and whether something else was using it."""

from __future__ import annotations

import os
import platform
from typing import Any


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> float:
    return os.getloadavg()[0]


def describe() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_1m_at_start": load_average(),
    }
