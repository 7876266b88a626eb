"""End to end with a real driver process and client processes (issue 3's list)."""

from __future__ import annotations

import os
import signal
import stat
import time
import zlib
from pathlib import Path

import pytest
from driver_rig import (
    driver_process,
    read_line,
    start_driver,
    start_worker,
    system_counter,
    wait_for_driver,
)
from driver_workers import STREAM

import logbuf
from logbuf.cnc import counters as c
from logbuf.directory import CNC_FILE, PUBLICATIONS_DIR
from support import stop_process, wait_until

UNBLOCKED_PUBLICATIONS = 19
CLIENT_LIVENESS_TIMEOUTS = 24

pytestmark = pytest.mark.timeout(90)


def expected_crc(count: int, size: int) -> int:
    crc = 0
    for i in range(count):
        crc = zlib.crc32(i.to_bytes(8, "little") + bytes((i + j) & 0xFF for j in range(size - 8)), crc)
    return crc


def test_data_flows_from_publisher_process_to_subscriber_process(tmp_path: Path) -> None:
    count, size = 20_000, 100
    with driver_process(tmp_path / "drv"):
        sub = start_worker("subscriber", str(tmp_path / "drv"), str(count))
        pub = None
        try:
            assert read_line(sub) == "ready"
            pub = start_worker("publisher", str(tmp_path / "drv"), str(count), str(size))
            assert read_line(pub) == "ready"
            done_pub = read_line(pub, 60).split()
            done_sub = read_line(sub, 60).split()
        finally:
            stop_process(sub)
            if pub is not None:
                stop_process(pub)
    assert done_pub == ["done", str(count), str(expected_crc(count, size))]
    # every message, in order (bad = 0), byte-identical (same CRC)
    assert done_sub == ["done", str(count), str(expected_crc(count, size)), "0"]


def test_back_pressure_when_the_subscriber_stops(tmp_path: Path) -> None:
    with driver_process(tmp_path / "drv"), logbuf.connect(tmp_path / "drv") as client:
        sub = client.add_subscription("aeron:ipc", STREAM)
        pub = client.add_publication("aeron:ipc", STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connection")
        window = pub.log.term_length // 2
        appended = 0
        while (result := pub.offer(b"x" * 224)) > 0:
            appended += 256
            assert appended <= window + 256 * 2, "publisher ran past the window"
        assert result == logbuf.BACK_PRESSURED
        assert window <= appended <= window + 256
        # the subscriber moves on: the driver raises pub-lmt and the publisher continues
        assert sub.poll(lambda b, h: None, 1000) > 0
        wait_until(lambda: pub.offer(b"y" * 224) > 0, what="pub-lmt to move")


def test_sigkilled_publisher_mid_claim_is_unblocked(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    with driver_process(directory), logbuf.connect(directory) as client:
        sub = client.add_subscription("aeron:ipc", STREAM)
        claimer = start_worker("claimer", str(directory))
        try:
            line = read_line(claimer)
            assert line.startswith("claimed") and int(line.split()[1]) > 0
            pub = client.add_publication("aeron:ipc", STREAM)  # shares the claimer's log
            for i in range(10):
                assert pub.offer(b"after-%d" % i) > 0
            os.kill(claimer.pid, signal.SIGKILL)
            claimer.wait(10)
        finally:
            stop_process(claimer)
        got: list[bytes] = []
        wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 100) >= 0 and len(got) == 10,
                   timeout=15, what="messages behind the stalled claim")
        assert got == [b"after-%d" % i for i in range(10)]
        assert system_counter(client, UNBLOCKED_PUBLICATIONS) == 1


def test_sigkilled_subscriber_frees_the_publisher_after_the_client_timeout(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    with driver_process(directory), logbuf.connect(directory) as client:
        live = client.add_subscription("aeron:ipc", STREAM)
        pub = client.add_publication("aeron:ipc", STREAM)
        idle = start_worker("idle-subscriber", str(directory))
        try:
            assert read_line(idle) == "ready 1"
            # fill the window: the idle subscriber holds the publisher back even though `live` keeps up
            wait_until(lambda: (pub.offer(b"z" * 480), live.poll(lambda b, h: None, 100))[0] == logbuf.BACK_PRESSURED,
                       what="back-pressure from the idle subscriber")
            os.kill(idle.pid, signal.SIGKILL)
            idle.wait(10)
        finally:
            stop_process(idle)
        # after the client liveness timeout (3 s) the dead subscriber's sub-pos is released
        wait_until(lambda: (live.poll(lambda b, h: None, 100), pub.offer(b"w" * 480))[1] > 0,
                   timeout=15, what="publisher to be released")
        assert system_counter(client, CLIENT_LIVENESS_TIMEOUTS) == 1
        # only `live`'s (the dead one's is freed as the timed-out client is cleaned up: on busy cores, after)
        wait_until(lambda: len([i for i in client.counters if i.type_id == c.SUBSCRIBER_POSITION_TYPE_ID]) == 1,
                   timeout=10, what="the dead subscriber's sub-pos to go")


def test_sigkilled_driver_makes_clients_raise_driver_timeout(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    proc = start_driver(directory)
    errors: list[BaseException] = []
    try:
        wait_for_driver(directory, proc)
        client = logbuf.connect(directory, driver_timeout_ms=500, error_handler=errors.append)
        pub = client.add_publication("aeron:ipc", STREAM)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: client.is_closed, timeout=10, what="the client to notice")
        with pytest.raises(logbuf.DriverTimeout, match="inactive"):
            client.add_publication("aeron:ipc", STREAM)
        assert pub.offer(b"late") == logbuf.CLOSED
        assert errors and isinstance(errors[0], logbuf.DriverTimeout)
        client.close()
    finally:
        stop_process(proc)


def test_second_driver_refuses_and_a_dead_drivers_directory_is_taken_over_with_force(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    with driver_process(directory) as first:
        second = start_driver(directory)
        try:
            assert second.wait(30) == 1
            message = second.stderr.read() if second.stderr else ""
        finally:
            stop_process(second)
        assert "already running" in message and str(first.pid) in message
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    # the dead driver left its files behind: a new driver refuses them, unless told to take them over
    assert (directory / CNC_FILE).exists()
    refused = start_driver(directory)
    try:
        assert refused.wait(30) == 1
        message = refused.stderr.read() if refused.stderr else ""
    finally:
        stop_process(refused)
    assert "no longer running" in message and "--force" in message and message.count("\n") == 1
    assert (directory / CNC_FILE).exists()
    with driver_process(directory, "--force") as third, logbuf.connect(directory) as client:
        assert client.driver_pid == third.pid


def test_clean_shutdown_on_sigterm_tells_clients_at_once(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    proc = start_driver(directory)
    try:
        wait_for_driver(directory, proc)
        client = logbuf.connect(directory, driver_timeout_ms=60_000, error_handler=lambda e: None)
        client.add_publication("aeron:ipc", STREAM)
        start = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0
        wait_until(lambda: client.is_closed, timeout=5, what="shutdown seen")
        assert time.monotonic() - start < 5  # the NULL heartbeat, not the 60 s timeout
        with pytest.raises(logbuf.DriverTimeout, match="shut down"):
            client.add_subscription("aeron:ipc", STREAM)
        client.close()
    finally:
        stop_process(proc)
    assert not directory.exists()  # everything it made is gone


def test_directory_and_files_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    with driver_process(directory), logbuf.connect(directory) as client:
        client.add_publication("aeron:ipc", STREAM)
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE((directory / CNC_FILE).stat().st_mode) == 0o600
        logs = list((directory / PUBLICATIONS_DIR).iterdir())
        assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another user")
def test_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir()
    os.chown(directory, 65534, 65534)
    proc = start_driver(directory)
    try:
        assert proc.wait(30) == 1
        assert "belongs to uid 65534" in (proc.stderr.read() if proc.stderr else "")
    finally:
        stop_process(proc)
