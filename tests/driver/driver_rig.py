"""Processes for the driver tests: a real ``logbuf driver`` and client workers (stopped with
``support.stop_process``)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import logbuf
from logbuf.cnc.cnc_file import CncFile
from logbuf.directory import CNC_FILE
from support import WaitTimeout, child_env, lines_of, stop_process, wait_until

WORKERS = Path(__file__).with_name("driver_workers.py")
FAST_TIMERS = [
    "--ipc-term-length", "64k",
    "--unblock-timeout", "1",
    "--client-liveness-timeout", "3",  # short, yet longer than a busy 2-core machine stalls a keepalive
    "--timer-interval", "0.1",
    "--linger-timeout", "1",
]


def start_driver(directory: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "driver", "--dir", str(directory), *FAST_TIMERS, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def wait_for_driver(directory: Path, proc: subprocess.Popen[str], timeout: float = 15.0) -> None:
    """Until the driver process ``proc`` runs the conductor of ``directory`` (its cnc.dat, heart-beating)."""

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"driver exited early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        with contextlib.suppress(Exception), CncFile.open(directory / CNC_FILE) as cnc:
            return cnc.to_driver.consumer_heartbeat_time > 0 and cnc.layout.pid == proc.pid
        return False

    wait_until(up, timeout, what=f"the driver of {directory} to come up")


def start_worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKERS), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    )


def read_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """Next stdout line of a worker, bounded by ``timeout`` (the worker is stopped on expiry)."""
    assert proc.stdout is not None
    try:
        line = lines_of(proc.stdout, f"worker {proc.args}").read_line(timeout)
    except WaitTimeout:
        stop_process(proc)
        raise
    if line is None:
        stderr = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"worker {proc.args} ended without output: {stderr}")
    return line.strip()


@contextlib.contextmanager
def driver_process(directory: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    proc = start_driver(directory, *extra)
    try:
        wait_for_driver(directory, proc)
        yield proc
    finally:
        stop_process(proc)


def system_counter(client: logbuf.Client, system_id: int) -> int:
    return client.counters.counter_value(system_id)
