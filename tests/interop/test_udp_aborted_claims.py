"""Aborted and abandoned claims over UDP: 4 writer processes share one concurrent publication (one log, one
session) and claim 30 000 small frames each, aborting about 5 % of them (each becomes a PAD frame of the
claim's length); one writer is SIGKILLed holding a claim it never commits, which holds the sender at it until
the driver's unblocker pads it.  Through two logbuf drivers, and through logbuf and aeronmd either way, every
committed message arrives exactly once and nothing else does.  The aeronmd routes skip, with the reason, where
Aeron's binaries are not there (``aeron_driver``)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from aeron_driver import require_aeron_bin, running_aeronmd
from claim_writer import HEAD, is_aborted

import logbuf
from logbuf.cnc.counters import SystemCounter
from support import WaitTimeout, lines_of, stop_process, wait_until

pytestmark = pytest.mark.timeout(180)
STREAM = 1077
WRITERS = 4
COUNT = 30_000
DEAD_WRITER = 0
KILL_AT = 10_000  # the dead writer's committed messages are those before this sequence
WRITER = Path(__file__).resolve().parent / "claim_writer.py"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def driver(kind: str, directory: Path) -> Iterator[Path]:
    """A driver whose unblocker pads a dead writer's claim within seconds (aeronmd needs its unblock timeout
    above the client liveness timeout)."""
    if kind == "aeronmd":
        with running_aeronmd(directory, AERON_CLIENT_LIVENESS_TIMEOUT="5s",
                             AERON_PUBLICATION_UNBLOCK_TIMEOUT="6s") as path:
            yield path
    else:
        with logbuf.MediaDriver.launch(directory, unblock_timeout_ns=1_000_000_000, timer_interval_ns=100_000_000,
                                       idle_strategy="backoff:1000000") as drv:
            yield drv.directory


def expected_messages() -> set[tuple[int, int]]:
    return {(writer, seq) for writer in range(WRITERS)
            for seq in range(KILL_AT if writer == DEAD_WRITER else COUNT) if not is_aborted(writer, seq)}


def _lines(proc: subprocess.Popen[bytes]) -> list[str]:
    """The lines the writer printed since the last call (never waits)."""
    assert proc.stdout is not None
    reader = lines_of(proc.stdout, f"writer {proc.pid}")
    lines: list[str] = []
    while True:
        try:
            line = reader.read_line(0.0)
        except WaitTimeout:
            return lines
        if line is None:
            return lines
        lines.append(line)


@pytest.mark.parametrize("route", ["logbuf-to-logbuf", "logbuf-to-aeronmd", "aeronmd-to-logbuf"])
def test_every_committed_message_arrives_once_despite_aborted_and_abandoned_claims(tmp_path: Path,
                                                                                  route: str) -> None:
    sending, receiving = route.split("-to-")
    if "aeronmd" in route:
        require_aeron_bin()
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=1m"
    received: Counter[tuple[int, int]] = Counter()

    def on_fragment(buffer: memoryview, header: logbuf.Header) -> None:
        received[HEAD.unpack_from(buffer)] += 1

    writers: list[subprocess.Popen[bytes]] = []
    with ExitStack() as stack:
        send_dir = stack.enter_context(driver(sending, tmp_path / "send"))
        receive_dir = stack.enter_context(driver(receiving, tmp_path / "receive"))
        client = stack.enter_context(logbuf.connect(receive_dir))
        sub = client.add_subscription(channel, STREAM)
        try:
            for writer in range(WRITERS):
                writers.append(subprocess.Popen(
                    [sys.executable, str(WRITER), str(send_dir), channel, str(STREAM), str(writer), str(COUNT),
                     str(KILL_AT if writer == DEAD_WRITER else -1)], stdout=subprocess.PIPE))
            done: set[int] = set()
            killed = False
            expected = expected_messages()

            def step() -> bool:
                nonlocal killed
                for writer, proc in enumerate(writers):
                    for line in _lines(proc):
                        if line.startswith("claimed") and not killed:
                            stop_process(proc, signal.SIGKILL)  # mid-claim: the claim stays uncommitted
                            killed = True
                        elif line.startswith("done"):
                            done.add(writer)
                    if proc.poll() is not None and writer != DEAD_WRITER:
                        raise AssertionError(f"writer {writer} exited with {proc.returncode}")
                while sub.poll(on_fragment, 1000):
                    pass
                return killed and len(done) == WRITERS - 1 and len(received) >= len(expected)

            wait_until(step, timeout=120, what="every writer done and every committed message in")
            with logbuf.connect(send_dir) as sender:  # the dead writer's claim was padded by the unblocker
                # (on busy cores the others may finish before the claim, which is then padded only after)
                wait_until(lambda: sender.counters.counter_value(SystemCounter.UNBLOCKED_PUBLICATIONS) >= 1,
                           timeout=30, what="the unblocker to pad the dead writer's claim")
        finally:
            for proc in writers:
                stop_process(proc)
    assert set(received) == expected  # nothing aborted, nothing of the dead claim, nothing missing
    assert max(received.values()) == 1  # and nothing twice
