"""Closing a client or subscription while other threads use them: in child processes, exit status checked."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import posix_ipc
import pytest

import logbuf
from logbuf.cnc.cnc_file import CncFile
from logbuf.directory import CNC_FILE, wake_semaphore_name
from support import child_env, lines_of, stop_process, wait_until

pytestmark = pytest.mark.timeout(120)

SCENARIOS = Path(__file__).with_name("client_scenarios.py")
STREAM = 11  # client_scenarios.STREAM
RACE_ROUNDS = 50


def run_scenario(*args: str, timeout: float = 90.0) -> list[dict[str, object]]:
    """Runs a scenario to its end; asserts it exited 0 (a segfault is -11) and returns its JSON lines."""
    proc = subprocess.run(
        [sys.executable, str(SCENARIOS), *args], capture_output=True, text=True, env=child_env(), timeout=timeout
    )
    assert proc.returncode == 0, f"scenario {args[0]} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def read_json_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> dict[str, object]:
    assert proc.stdout is not None
    line = lines_of(proc.stdout, f"{proc.args}").read_line(timeout)
    if line is None:
        stderr = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"{proc.args} ended (status {proc.wait(10)}) without output:\n{stderr[-3000:]}")
    return json.loads(line)


@contextlib.contextmanager
def driver_process(directory: Path) -> Iterator[subprocess.Popen[str]]:
    """A ``logbuf driver`` process, stopped by its PID; the stream semaphore it made is removed after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "driver", "--dir", str(directory), "--ipc-term-length", "64k"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        def up() -> bool:
            assert proc.poll() is None, f"driver exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            with contextlib.suppress(Exception), CncFile.open(directory / CNC_FILE) as cnc:
                return cnc.to_driver.consumer_heartbeat_time > 0 and cnc.layout.pid == proc.pid
            return False

        wait_until(up, 30, what="the driver to come up")
        yield proc
    finally:
        stop_process(proc)
        # a killed driver cannot unlink it
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_semaphore(wake_semaphore_name(directory, STREAM))


def test_publications_images_and_counters_used_after_client_close_answer_closed(tmp_path: Path) -> None:
    [r] = run_scenario("use_after_close", str(tmp_path / "drv"))
    assert r["offer"] == str(int(logbuf.CLOSED))
    assert r["is_closed"] == "True"
    # state of a closed publication or image: its last value (read from a mapping still there) or ClosedError
    for name in ("position", "position_limit_value", "released_position"):
        assert r[name] == "ClosedError" or int(str(r[name])) >= 0, (name, r[name])
    assert r["available_window"] == "ClosedError" or int(str(r["available_window"])) <= 64 * 1024  # any int
    assert "ConcurrentPublication(" in str(r["repr"])
    assert (r["image_poll"], r["sub_poll"]) == ("0", "0")
    assert r["sub_wait"] == "ClosedError"
    assert r["counter_get"] == "ClosedError"
    for call in ("add_publication", "add_exclusive_publication", "add_subscription", "add_counter", "do_work",
                 "counters"):
        assert r[call] == "ClosedError", call
    assert r["add_publication_message"] == r["add_subscription_message"] == "client is closed"
    assert r["close_again"] == "None"


def test_closing_while_a_thread_waits_wakes_it_every_time(tmp_path: Path) -> None:
    results = run_scenario("wait_close_race", str(tmp_path / "drv"), str(RACE_ROUNDS))
    assert len(results) == RACE_ROUNDS
    for r in results:
        # woken (False), or closed before it got into wait() (ClosedError); never stuck, never a crash
        assert r["waiter"] in ("False", "ClosedError"), r
        assert r["semaphore"] is True  # the waiters slept on the driver's semaphore
    assert {r["closed"] for r in results} == {"client", "subscription", "subscription from a thread"}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_waiter_wakes_with_driver_timeout_when_the_driver_dies(tmp_path: Path, mode: str) -> None:
    directory = tmp_path / "drv"
    with driver_process(directory) as driver:
        client = subprocess.Popen(
            [sys.executable, str(SCENARIOS), "driver_dies_while_waiting", str(directory), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        try:
            assert read_json_line(client) == {"state": "waiting"}
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait(10)
            woken = read_json_line(client)
            after = read_json_line(client)
            assert client.wait(30) == 0, client.stderr.read() if client.stderr else ""
        finally:
            stop_process(client, signal.SIGKILL)
    assert woken == {"waiter": "DriverTimeout", "offer": str(int(logbuf.CLOSED)), "add": "DriverTimeout"}
    assert after == {"after_close": "ClosedError"}
