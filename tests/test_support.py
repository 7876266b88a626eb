"""The test helpers themselves (tests/support): the line reader loses no line, waits time out clearly,
processes are stopped by their PID whatever they do with SIGTERM."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from support import LineReader, LineSplitter, WaitTimeout, stop_process, wait_until

SPAWN = multiprocessing.get_context("spawn")


def test_two_lines_in_one_chunk_are_both_delivered_and_a_partial_line_waits_for_its_end() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"ready\ndone 5 77\npart") == [b"ready", b"done 5 77"]
    assert splitter.pending == b"part"
    assert splitter.feed(b"ial") == []  # still no end
    assert splitter.feed(b" line\n\nnext") == [b"partial line", b""]
    assert splitter.pending == b"next"


class Writer:
    """The write end of a pipe, closed once (a closed descriptor's number may already be someone else's)."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def write(self, data: bytes) -> None:
        assert self.fd is not None
        os.write(self.fd, data)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@pytest.fixture
def pipe() -> Iterator[tuple[LineReader, Writer]]:
    read_fd, write_fd = os.pipe()
    reader, writer = LineReader(read_fd, "test pipe"), Writer(write_fd)
    try:
        yield reader, writer
    finally:
        reader.close()
        writer.close()
        os.close(read_fd)


def test_the_reader_hands_out_both_lines_of_one_write(pipe: tuple[LineReader, Writer]) -> None:
    reader, writer = pipe
    writer.write(b"first\nsecond\n")  # one write: one chunk for the reader
    assert reader.read_line(5) == "first"
    assert reader.read_line(0) == "second"  # already read from the pipe: no wait, nothing lost


def test_the_reader_keeps_a_partial_line_until_its_end_arrives(pipe: tuple[LineReader, Writer]) -> None:
    reader, writer = pipe
    writer.write(b"half a ")
    with pytest.raises(WaitTimeout, match="pending: b'half a '"):
        reader.read_line(0.05)
    writer.write(b"line\nthen")
    assert reader.read_line(5) == "half a line"
    writer.close()  # the writer ends: its last, unfinished line still counts, then the end
    assert reader.read_line(5) == "then"
    assert reader.read_line(5) is None and reader.at_end


def test_read_until_returns_the_lines_up_to_the_wanted_one(pipe: tuple[LineReader, Writer]) -> None:
    reader, writer = pipe
    writer.write(b"File: x\nCapturing on 'lo'\nafter\n")
    assert reader.read_until("Capturing on", 5) == ["File: x", "Capturing on 'lo'"]
    assert reader.read_line(0) == "after"


def test_a_child_s_lines_arrive_even_when_printed_together() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "print('ready\\ndone', flush=True); import time; time.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        reader = LineReader(proc.stdout, "child")
        assert reader.read_line(20) == "ready"
        assert reader.read_line(5) == "done"  # the child is still running: not the end of the pipe
    finally:
        stop_process(proc)


def test_wait_until_returns_the_first_true_value_and_backs_off() -> None:
    calls: list[float] = []

    def third_time() -> int | None:
        calls.append(time.monotonic())
        return 42 if len(calls) == 3 else None

    assert wait_until(third_time, 5, interval=0.01, max_interval=0.02) == 42
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert gaps[0] >= 0.01 and gaps[1] >= 0.02  # doubled, up to the cap


def test_wait_until_names_what_it_waited_for_on_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"timed out after .* waiting for the moon; last value: \[\]"):
        wait_until(lambda: [], 0.05, what="the moon")
    assert time.monotonic() - start < 2


def test_wait_until_runs_poll_between_checks() -> None:
    seen: list[int] = []
    wait_until(lambda: len(seen) >= 5, 5, poll=lambda: seen.append(1) or True)
    assert len(seen) == 5


def _ignore_sigterm_and_sleep() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


def test_stop_process_kills_a_popen_that_ignores_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                             "time.sleep(60)"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert LineReader(proc.stdout, "child").read_line(20) == "ready"  # its handler is in place
    assert stop_process(proc, timeout=0.2) == -signal.SIGKILL
    assert proc.stdout.closed


def test_stop_process_stops_a_multiprocessing_process_and_one_already_gone() -> None:
    polite = SPAWN.Process(target=time.sleep, args=(60,))
    stubborn = SPAWN.Process(target=_ignore_sigterm_and_sleep)
    polite.start()
    stubborn.start()
    try:
        assert stop_process(polite) == -signal.SIGTERM
        assert stop_process(polite) == -signal.SIGTERM  # again: nothing left to stop
        # whether SIGTERM lands before or after the child's handler is in place, it ends by the PID
        assert stop_process(stubborn, timeout=0.5) in (-signal.SIGTERM, -signal.SIGKILL)
    finally:
        for proc in (polite, stubborn):
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
    assert stop_process(SPAWN.Process(target=time.sleep, args=(1,))) is None  # never started


def test_grace_lets_a_process_end_on_its_own() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert stop_process(proc, grace=20) == 0
