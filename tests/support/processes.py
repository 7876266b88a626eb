"""Child processes of the tests: started with this checkout's sources importable, stopped by their PID."""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

Stoppable = subprocess.Popen | multiprocessing.process.BaseProcess


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout's ``src`` first on ``PYTHONPATH`` (and ``extra``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _exit_status(proc: Stoppable) -> int | None:
    if isinstance(proc, subprocess.Popen):
        return proc.poll()
    return proc.exitcode  # None while running (a Process that was never started is refused below)


def _wait(proc: Stoppable, timeout: float) -> bool:
    """True when ``proc`` ended within ``timeout`` seconds."""
    if isinstance(proc, subprocess.Popen):
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    proc.join(timeout)
    return proc.exitcode is not None


def stop_process(proc: Stoppable, sig: int = signal.SIGTERM, timeout: float = 10.0, *,
                 grace: float = 0.0, group: bool = False) -> int | None:
    """Stops ``proc`` (a ``subprocess.Popen`` or a ``multiprocessing`` process) by its PID; returns its exit
    status (negative: the signal that ended it).

    ``grace`` seconds for it to end on its own first, then ``sig``, ``timeout`` seconds to end, then SIGKILL
    (and ``timeout`` again).  ``group``: the signals go to the process group ``proc`` leads (a child started
    with ``start_new_session=True``, whose own children must go too).  A Popen's pipes are closed.  Safe to
    call on a process that already ended.
    """
    if not isinstance(proc, subprocess.Popen) and proc.pid is None:
        return None  # never started: nothing to stop
    pid = proc.pid
    assert pid is not None
    send = os.killpg if group else os.kill
    try:
        if _exit_status(proc) is None and grace > 0:
            _wait(proc, grace)
        if _exit_status(proc) is None:
            with contextlib.suppress(ProcessLookupError):
                send(pid, sig)
            if not _wait(proc, timeout):
                with contextlib.suppress(ProcessLookupError):
                    send(pid, signal.SIGKILL)
                _wait(proc, timeout)
        else:
            _wait(proc, timeout)  # reap it
    finally:
        if isinstance(proc, subprocess.Popen):
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
    return _exit_status(proc)
