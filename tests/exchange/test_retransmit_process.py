"""The retransmission server inside ``logbuf replay`` runs in a child process: it answers from every message the
replay sent (lost on the feeds or not), and it is gone — with its ring — however the replay ends."""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logbuf.exchange.dayfile import DayFileReader
from logbuf.samples.ports import free_udp_ports
from support import WaitTimeout, child_env, lines_of, stop_process, wait_until

REQUEST = struct.Struct(">10sQH")
SESSION = b"SYNTH0001 "
ENV = child_env()


def _alive(pid: int) -> bool:
    """Running (a zombie or a vanished PID counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    try:
        wait_until(lambda: not _alive(pid), timeout, what=f"process {pid} to end")
    except WaitTimeout:
        return False
    return True


def _shm_names() -> set[str]:
    """Shared-memory names a retransmission ring could have used (other programs' names are not ours)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {name for name in names if "retransmit" in name or "ring" in name}


def _start_replay(day: Path, extra: list[str]) -> tuple[subprocess.Popen, int, int]:
    """A replay with a retransmission server; (process, retransmission port, child pid)."""
    a, r = free_udp_ports(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "replay", str(day), "--feed-a", f"127.0.0.1:{a}", "--feed-b", "off",
         "--retransmit", f"127.0.0.1:{r}", "--eos-count", "1", "--eos-interval", "0", *extra],
        stderr=subprocess.PIPE, text=True, env=ENV)
    line = lines_of(proc.stderr, "replay's stderr").read_line(30) or ""
    match = re.search(r"retransmission on 127\.0\.0\.1:(\d+) \(pid (\d+)\)", line)
    if match is None:
        stop_process(proc, signal.SIGKILL)
        pytest.fail(f"no retransmission line from replay: {line!r}")
    return proc, int(match.group(1)), int(match.group(2))


def _ask(port: int, first: int, count: int, timeout: float = 15.0) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.settimeout(0.2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            client.sendto(REQUEST.pack(SESSION, first, count), ("127.0.0.1", port))
            try:
                return client.recv(65536)
            except TimeoutError:
                continue
    return None


def _messages(answer: bytes) -> list[bytes]:
    _, _, count = REQUEST.unpack_from(answer)
    out, offset = [], REQUEST.size
    for _ in range(count):
        length = int.from_bytes(answer[offset : offset + 2], "big")
        out.append(answer[offset + 2 : offset + 2 + length])
        offset += 2 + length
    assert offset == len(answer)
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_child_serves_every_sent_message_and_leaves_nothing(tiny_day: Path, sig: signal.Signals) -> None:
    shm_before = _shm_names()
    # messages 100..199 are lost on the feed; the retransmission ring holds them all the same
    proc, port, child = _start_replay(tiny_day, ["--speed", "max", "--drop-a", "100-199", "--faults-a", "loss=0.3",
                                                 "--linger", "60"])
    try:
        assert child != proc.pid and _alive(child)
        with open(f"/proc/{child}/cmdline", "rb") as f:
            assert b"logbuf.exchange.retransmit.process" in f.read()
        answer = _ask(port, 150, 5)
        assert answer is not None
        # the ring is an anonymous memfd: it has no name anywhere to leave behind
        with open(f"/proc/{child}/maps") as f:
            assert "/memfd:logbuf-retransmit-ring" in f.read()
        with DayFileReader(tiny_day) as reader:
            expected = [b.message(i) for b in reader.blocks() for i in range(b.count)][149:154]
        assert REQUEST.unpack_from(answer)[1] == 150 and _messages(answer) == expected
        proc.send_signal(sig)
        status = proc.wait(timeout=15)
        # Ctrl-C: a clean stop reported as interrupted (130); SIGTERM: a clean stop (0)
        assert status == {signal.SIGKILL: -signal.SIGKILL, signal.SIGINT: 130, signal.SIGTERM: 0}[sig]
        assert _wait_gone(child), f"retransmission child {child} outlived the replay ({sig.name})"
    finally:
        stop_process(proc, signal.SIGKILL)
        if _alive(child):  # (its PID, read from the replay's own report)
            os.kill(child, signal.SIGKILL)
    assert _shm_names() == shm_before
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:  # the port is free again
        again.bind(("127.0.0.1", port))


def test_a_failing_replay_stops_its_child(tiny_day: Path) -> None:
    """Sending fails after the child started (broadcast without SO_BROADCAST): one-line error, child gone."""
    r, = free_udp_ports(1)
    proc = subprocess.run(
        [sys.executable, "-m", "logbuf.cli", "replay", str(tiny_day), "--feed-a", "255.255.255.255:9",
         "--feed-b", "off", "--speed", "max", "--retransmit", f"127.0.0.1:{r}"],
        capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 1  # a runtime error, not a usage error
    match = re.search(r"\(pid (\d+)\)", proc.stderr)
    assert match is not None, proc.stderr
    assert _wait_gone(int(match.group(1)))
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_a_busy_retransmission_port_fails_before_anything_starts(tiny_day: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        a, = free_udp_ports(1)
        proc = subprocess.run(
            [sys.executable, "-m", "logbuf.cli", "replay", str(tiny_day), "--feed-a", f"127.0.0.1:{a}",
             "--feed-b", "off", "--speed", "max", "--retransmit", f"127.0.0.1:{port}"],
            capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 1  # a runtime error, not a usage error
    assert f"cannot bind 127.0.0.1:{port}: Address already in use" in proc.stderr and "pid" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_retransmit_process_answers_what_the_parent_publishes(tiny_day: Path) -> None:
    from logbuf.exchange.retransmit.process import RetransmitProcess
    from logbuf.exchange.retransmit.ring import RetransmitError

    with pytest.raises(RetransmitError):
        RetransmitProcess(tiny_day, "127.0.0.1", 0, session="SYNTH0001", ring_bits=40)
    server = RetransmitProcess(tiny_day, "127.0.0.1", 0, session="SYNTH0001", ring_bits=10).start()
    try:
        pid = server.pid
        assert pid is not None and pid != os.getpid() and _alive(pid)
        port = server.address[1]
        with DayFileReader(tiny_day) as reader:
            block = next(reader.blocks(100))
            expected = [block.message(i) for i in range(block.count)]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
                client.settimeout(0.5)
                client.sendto(REQUEST.pack(SESSION, 5, 3), ("127.0.0.1", port))
                with pytest.raises(TimeoutError):  # nothing published yet: sequence 5 is in the future
                    client.recv(65536)
                server.ring.publish(1, block.frames)
                answer = _ask(port, 5, 3)
        assert answer is not None and _messages(answer) == expected[4:7]
    finally:
        stats = server.stop()
    assert stats is not None and stats.answers >= 1 and stats.future >= 1
    assert _wait_gone(pid)
