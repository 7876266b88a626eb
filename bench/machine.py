"""What machine a benchmark ran on, and whether something else was using it."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from typing import Any

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def hypervisor() -> str | None:
    """``KVM`` etc. when lscpu reports one (a VM's vCPUs move and get stolen from)."""
    if shutil.which("lscpu") is None:
        return None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.startswith("Hypervisor vendor:"):
            return line.split(":", 1)[1].strip()
    return None


def load_average() -> float:
    return os.getloadavg()[0]


def describe() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "hypervisor": hypervisor(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_1m_at_start": load_average(),
    }


def _proc_stat() -> tuple[float, float, float]:
    """(busy, idle, steal) CPU seconds summed over all CPUs since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    return (user + nice + system + irq + softirq) / _CLK_TCK, (idle + iowait) / _CLK_TCK, steal / _CLK_TCK


class SystemCpu:
    """CPU used by everything on the machine between construction and :meth:`stop` (Linux /proc/stat).

    ``busy_s`` minus what the benchmark's own processes used is what *other* processes took; ``steal_share``
    is the share of the vCPUs' time the hypervisor ran someone else.  Jiffies are 10 ms: only meaningful
    over windows of a second or so.
    """

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        try:
            self._s0: tuple[float, float, float] | None = _proc_stat()
        except (OSError, ValueError):
            self._s0 = None

    def stop(self) -> dict[str, float]:
        if self._s0 is None:
            return {}
        busy1, idle1, steal1 = _proc_stat()
        busy0, idle0, steal0 = self._s0
        seconds = time.monotonic() - self._t0
        capacity = seconds * (os.cpu_count() or 1)
        return {
            "seconds": seconds,
            "capacity_s": capacity,
            "busy_s": busy1 - busy0,
            "steal_share": (steal1 - steal0) / capacity if capacity > 0 else 0.0,
        }
