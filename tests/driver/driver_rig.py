"""Processes for the driver tests: a real ``logbuf driver`` and client workers, each stopped by its PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import logbuf
from logbuf.cnc.cnc_file import CncFile
from logbuf.directory import CNC_FILE

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).with_name("driver_workers.py")
FAST_TIMERS = [
    "--ipc-term-length", "64k",
    "--unblock-timeout", "1",
    "--client-liveness-timeout", "1",
    "--timer-interval", "0.1",
    "--linger-timeout", "1",
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_driver(directory: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "driver", "--dir", str(directory), *FAST_TIMERS, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )


def wait_for_driver(directory: Path, proc: subprocess.Popen[str], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"driver exited early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        with contextlib.suppress(Exception), CncFile.open(directory / CNC_FILE) as cnc:
            if cnc.to_driver.consumer_heartbeat_time > 0 and cnc.layout.pid == proc.pid:
                return
        time.sleep(0.02)
    raise AssertionError("driver did not come up")


def start_worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKERS), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )


def read_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """Next stdout line of a worker, bounded by ``timeout`` (the worker is killed on expiry)."""
    import selectors

    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not selector.select(timeout):
            stop(proc)
            raise AssertionError(f"no output from worker {proc.args} within {timeout} s")
        line = proc.stdout.readline()
    finally:
        selector.close()
    if not line:
        stderr = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"worker {proc.args} ended without output: {stderr}")
    return line.strip()


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return proc.returncode


@contextlib.contextmanager
def driver_process(directory: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    proc = start_driver(directory, *extra)
    try:
        wait_for_driver(directory, proc)
        yield proc
    finally:
        stop(proc)


def wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def system_counter(client: logbuf.Client, system_id: int) -> int:
    return client.counters.counter_value(system_id)
