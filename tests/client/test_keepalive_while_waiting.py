"""A client without a conductor thread (the feed handler's way: it runs the duty cycle in its own loop) keeps its
keepalive going while it waits for the driver's answer to a command. A driver slow to answer (creating 3 x 256 MiB
logs on a loaded machine took seconds per publication) otherwise timed the client out before its loop ever ran.

The driver runs as a process of its own, stopped (SIGSTOP) while the client waits longer than the driver's client
liveness timeout; it is started again by PID."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import logbuf
from support import child_env, stop_process
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
LIVENESS_S = 2.0


def test_a_client_waiting_longer_than_the_liveness_timeout_for_an_answer_is_not_timed_out(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    driver = subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "driver", "--dir", str(directory), "--client-liveness-timeout",
         str(LIVENESS_S), "--timer-interval", "0.1", "--ipc-term-length", "64k", "-q"],
        env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    resume = threading.Timer(1.5 * LIVENESS_S, lambda: driver.send_signal(signal.SIGCONT))
    try:
        wait_until(lambda: (directory / "cnc.dat").exists(), 60, what="the driver's cnc.dat")
        client = logbuf.connect(directory, conductor_thread=False)
        try:
            client.add_exclusive_publication("aeron:ipc", 1)
            driver.send_signal(signal.SIGSTOP)  # answers nothing for 1.5 liveness timeouts
            resume.start()
            started = time.monotonic()
            client.add_exclusive_publication("aeron:ipc", 2)  # waits until the driver runs again
            assert time.monotonic() - started >= LIVENESS_S  # the wait was longer than the liveness timeout
            # the driver has run its liveness check since: the client is still alive and answered
            deadline = time.monotonic() + 2 * LIVENESS_S
            while time.monotonic() < deadline:
                client.do_work()
                time.sleep(0.05)
            client.add_exclusive_publication("aeron:ipc", 3)
        finally:
            client.close()
    finally:
        resume.cancel()
        driver.send_signal(signal.SIGCONT)
        stop_process(driver, signal.SIGTERM, timeout=10)
