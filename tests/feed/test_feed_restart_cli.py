"""`logbuf feed` SIGKILLed again and again during a session and restarted each time, against a MoldUDP64 session
sent by this file (`struct`, independent of logbuf's codec) and a retransmission server written here too.

A checking subscriber reads every image of the messages stream (each run publishes on an image of its own) and
asserts: every sequence of the session arrives, byte-identical, in order within each image, and exactly once
across all of them. The one exception the handler is allowed is the one it announces: when the last run's log
could not say how much of an append in flight went in, its start line says from which sequence up to how many
messages may be published a second time; a duplicate anywhere else fails the test.

Kills land at random moments (seeded, reported on failure): during live traffic, and during catch-ups (some
restarts wait a second, so the new run first recovers a large hole and then releases a large run). Nothing
here depends on timing beyond bounded waits: a starved machine only makes the session longer."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import logbuf
from logbuf.feed import checkpoint as cp
from logbuf.feed import published as out
from logbuf.feed.feed_native import ffi, lib
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f
from logbuf.samples.ports import free_udp_ports
from support.processes import stop_process
from support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
LOGBUF = [sys.executable, "-m", "logbuf.cli"]
SESSION = b"RESTART001"
HEADER = struct.Struct(">10sQH")  # MoldUDP64: session, sequence of the first message, message count
BLOCK = struct.Struct(">H")
U64 = 1 << 64
PER_PACKET = 10
RATE = 1000.0  # packets per second per feed
ANSWER_BUDGET = 1400  # bytes of message blocks per answer packet
KILLS = 12
RESUMING = re.compile(r"resuming session (\S+) at sequence (\d+) \((.*)\)")
MAY_REPEAT = re.compile(r"up to (\d+) messages from there may be published a second time")


def message(seq: int) -> bytes:
    return b"R" + struct.pack(">Q", seq) + bytes([seq % 251]) * (seq % 23)


def mold(first: int, messages: list[bytes], session: bytes = SESSION) -> bytes:
    return HEADER.pack(session, first, len(messages)) + b"".join(BLOCK.pack(len(m)) + m for m in messages)


class Server(threading.Thread):
    """A retransmission server: one packet per request (as many of the asked messages as fit, of those sent)."""

    def __init__(self, port: int, sent: list[int]) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", port))
        self.sock.settimeout(0.05)
        self.sent = sent
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                data, client = self.sock.recvfrom(64)
            except (TimeoutError, OSError):
                continue
            if len(data) != HEADER.size:
                continue
            session, first, count = HEADER.unpack(data)
            blocks, size, seq = [], 0, first
            while seq < min(first + count, self.sent[0]) and size + 2 + len(message(seq)) <= ANSWER_BUDGET:
                blocks.append(message(seq))
                size += 2 + len(message(seq))
                seq += 1
            if blocks:
                self.sock.sendto(mold(first, blocks, session), client)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.sock.close()


class Sender(threading.Thread):
    """Packets of PER_PACKET messages on A and B at RATE packets/s per feed until ``finish``; then the end of
    session on both feeds every 50 ms until ``stop`` (so a run started after the end still learns it)."""

    def __init__(self, ports: tuple[int, int]) -> None:
        super().__init__(daemon=True)
        self.ports = ports
        self.sent = [1]  # next sequence sent (shared with the server)
        self.finish = threading.Event()
        self.stopping = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    @property
    def last(self) -> int:
        return self.sent[0] - 1

    def run(self) -> None:
        start = time.monotonic()
        k = 0
        while not self.finish.is_set():
            due = start + k / RATE
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            first = 1 + k * PER_PACKET
            packet = mold(first, [message(s) for s in range(first, first + PER_PACKET)])
            self.sent[0] = first + PER_PACKET
            for port in self.ports:
                self.sock.sendto(packet, ("127.0.0.1", port))
            k += 1
        end = HEADER.pack(SESSION, self.sent[0], 0xFFFF)
        while not self.stopping.wait(0.05):
            for port in self.ports:
                self.sock.sendto(end, ("127.0.0.1", port))

    def stop(self) -> None:
        self.finish.set()
        self.stopping.set()
        self.join(5)
        self.sock.close()


@dataclass
class Runs:
    """The handler processes, one after the other, and what each said when it started."""

    driver: logbuf.MediaDriver
    tmp: Path
    ports: tuple[int, int, int]
    procs: list[subprocess.Popen] = field(default_factory=list)
    resumes: list[tuple[int, int, str]] = field(default_factory=list)  # (sequence, may repeat, how)

    def start(self) -> subprocess.Popen:
        a, b, r = self.ports
        proc = subprocess.Popen(
            [*LOGBUF, "feed", "--feed-a", f"127.0.0.1:{a}", "--feed-b", f"127.0.0.1:{b}", "--retransmit",
             f"127.0.0.1:{r}", "--until-end-of-session", "--give-up", "10", "--wait-for-subscriber", "60"],
            env=dict(os.environ, LOGBUF_DIR=str(self.driver.directory)), stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def note(self, proc: subprocess.Popen) -> None:
        """What a run that has ended said about where it resumed."""
        assert proc.stderr is not None
        text = proc.stderr.read()
        found = RESUMING.search(text)
        if found:
            repeat = MAY_REPEAT.search(found.group(3))
            self.resumes.append((int(found.group(2)), int(repeat.group(1)) if repeat else 0, found.group(3)))


@dataclass
class Checker:
    """The checking subscriber: every message of every image, with the image it came on."""

    messages: logbuf.Subscription
    got: list[tuple[int, int, bytes]] = field(default_factory=list)  # (image session id, sequence, message)

    def poll(self) -> int:
        return self.messages.poll(
            lambda buf, h: self.got.append((h.session_id, h.reserved_value % U64, bytes(buf))), 4096)

    def drain(self) -> None:
        while self.poll():
            pass


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Runs, Checker]]:
    # 1 MiB terms: a window of 512 KiB (a stalled subscriber holds the run within a second), rotations and
    # cleaning behind the subscriber every 64 KiB
    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=1 << 20)
    client = logbuf.connect(driver.directory)
    checker = Checker(client.add_subscription("aeron:ipc", out.MESSAGES_STREAM))
    a, b, r = free_udp_ports(3)
    runs = Runs(driver, tmp_path, (a, b, r))
    try:
        yield runs, checker
    finally:
        for proc in runs.procs:
            stop_process(proc, signal.SIGKILL, timeout=10)
        client.close()
        driver.close()


def published_since(checker: Checker, count: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Waits (bounded) until the subscriber has more than ``count`` messages, the run still alive."""
    def more() -> bool:
        assert proc.poll() is None, f"logbuf feed exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
        checker.poll()
        return len(checker.got) > count

    wait_until(more, timeout, what="the restarted handler to publish", max_interval=0.005)


def last_run_to_the_end(checker: Checker, runs: Runs, sender: Sender, proc: subprocess.Popen,
                        timeout: float = 120.0) -> None:
    """The sender ends the session; the last run publishes everything and exits 0 by itself (bounded)."""
    sender.finish.set()
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the last run did not reach the end of the session"
        if not checker.poll():
            time.sleep(0.002)
    checker.drain()
    runs.note(proc)
    assert proc.returncode == 0, f"the last run exited with {proc.returncode}"


def check_every_sequence_once(checker: Checker, runs: Runs, last: int, seed: int) -> None:
    where = f"(seed {seed}; resumes: {runs.resumes})"
    per_image: dict[int, list[int]] = defaultdict(list)
    for image, seq, _ in checker.got:
        per_image[image].append(seq)
    for image, seqs in per_image.items():  # each run publishes in sequence order, without a hole
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"image {image} out of order {where}"
    seqs = [seq for _, seq, _ in checker.got]
    assert set(seqs) == set(range(1, last + 1)), f"{len(set(seqs))} of {last} sequences arrived {where}"
    bad = [seq for _, seq, body in checker.got if body != message(seq)]
    assert not bad, f"wrong bytes for {bad[:5]} {where}"
    announced = [range(seq, seq + repeat) for seq, repeat, _ in runs.resumes if repeat]
    unannounced = sorted(seq for seq, n in Counter(seqs).items()
                         if n > 1 and not any(seq in r for r in announced))
    assert not unannounced, f"{len(unannounced)} duplicates no restart announced, from {unannounced[:5]} {where}"


def test_a_handler_killed_12_times_at_random_moments_publishes_every_sequence_once(
        rig: tuple[Runs, Checker]) -> None:
    """Kills of four kinds, in turn: at a random moment of live traffic; while the subscriber stalls and the run
    waits in an append (back-pressured: its checkpoint has the append in flight, so the restart reads its log
    back); then a restart a second or so late (the next run recovers a large hole and releases it at once),
    killed a random moment into that catch-up."""
    runs, checker = rig
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    path = str(runs.driver.directory / "feed-1001.checkpoint")
    sender = Sender(runs.ports[:2])
    server = Server(runs.ports[2], sender.sent)
    server.start()
    proc = runs.start()
    stalled = 0
    try:
        wait_until(lambda: checker.messages.images, 60, what="the handler's publication")
        sender.start()
        for kill in range(KILLS):
            published_since(checker, len(checker.got), proc)
            if kill % 4 == 1:  # the subscriber stalls until the run waits in an append (the window is full)
                def waiting(seen: list[cp.Pending | None] = [None]) -> bool:  # noqa: B006 - its memory
                    """The same append in flight 50 ms apart: back-pressured, not passing through."""
                    state = cp.load(path)
                    pending = state.pending if state is not None else None
                    same = pending is not None and pending == seen[0]
                    seen[0] = pending
                    return same

                wait_until(waiting, 60, what="the run to wait in an append", interval=0.05, max_interval=0.05)
                stalled += 1
            else:  # a random moment: live traffic, or (after a late restart) the catch-up's large runs
                until = time.monotonic() + rng.uniform(0.0, 0.4)
                while time.monotonic() < until:
                    if not checker.poll():
                        time.sleep(0.001)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            runs.note(proc)
            checker.drain()
            if kill % 4 == 2:  # a late restart: the next run recovers a large hole, then releases it at once
                time.sleep(rng.uniform(0.5, 1.5))
            proc = runs.start()
        published_since(checker, len(checker.got), proc)
        last_run_to_the_end(checker, runs, sender, proc, timeout=180.0)
    finally:
        sender.stop()
        server.stop()
    assert len(runs.resumes) == KILLS, runs.resumes  # every restart resumed (none started the session afresh)
    check_every_sequence_once(checker, runs, sender.last, seed)
    read_back = sum(how.startswith("read back from") for _, _, how in runs.resumes)
    print(f"{stalled} kills while back-pressured; seed {seed}: {sender.last} messages, {KILLS} kills, {read_back} "
          "resumes read back from the log, "
          f"{sum(1 for _, n, _ in runs.resumes if n)} fell back to the checkpoint with an append in flight")


def test_a_restart_after_the_driver_cleaned_up_the_killed_runs_log_resumes_from_the_checkpoint(
        tmp_path: Path) -> None:
    """The killed client's publication is gone (its client timed out, its image drained): the new run resumes
    from the checkpoint, on a new image; the old image reached its end first."""
    # a client liveness timeout of 3 s (not 10): the killed client is timed out sooner; the restarted one keeps
    # its own keepalive well within it, even on a loaded machine
    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=4 << 20,
                                       client_liveness_timeout_ns=3_000_000_000)
    client = logbuf.connect(driver.directory)
    checker = Checker(client.add_subscription("aeron:ipc", out.MESSAGES_STREAM))
    runs = Runs(driver, tmp_path, tuple(free_udp_ports(3)))  # type: ignore[arg-type]
    sender = Sender(runs.ports[:2])
    server = Server(runs.ports[2], sender.sent)
    server.start()
    try:
        proc = runs.start()
        wait_until(lambda: checker.messages.images, 60, what="the handler's publication")
        sender.start()
        published_since(checker, 5_000, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        checker.drain()
        state = cp.load(str(driver.directory / "feed-1001.checkpoint"))
        assert state is not None and state.log is not None and state.log.path is not None
        old_log = Path(state.log.path)
        old_image = checker.messages.images[0]
        # the driver times the killed client out, its publication ends, and the log goes once read to its end
        wait_until(lambda: not old_log.exists(), 60, what="the driver to remove the killed run's log",
                   poll=checker.drain)
        assert old_image.is_closed or old_image.is_end_of_stream()
        proc = runs.start()
        published_since(checker, len(checker.got), proc)
        last_run_to_the_end(checker, runs, sender, proc)
    finally:
        sender.stop()
        server.stop()
        for p in runs.procs:
            stop_process(p, signal.SIGKILL, timeout=10)
        client.close()
        driver.close()
    assert len(runs.resumes) == 1 and "read back from" not in runs.resumes[0][2], runs.resumes  # the checkpoint
    images = list(dict.fromkeys(image for image, _, _ in checker.got))
    assert len(images) == 2  # the killed run's image, then the new run's
    check_every_sequence_once(checker, runs, sender.last, 0)


def frames_after(log_path: Path, start: int) -> list[tuple[int, int]]:
    """(position where the frame starts, sequence) of the complete message frames of a log from ``start`` up to
    its tail or the first frame not committed, read here with ``struct`` (the layout: three terms, then the
    metadata with the term length, the initial term id, the active term count and the tail counters)."""
    data = log_path.read_bytes()
    meta = len(data) - d.LOG_META_DATA_LENGTH
    term = struct.unpack_from("<i", data, meta + d.LOG_TERM_LENGTH_OFFSET)[0]
    initial = struct.unpack_from("<i", data, meta + d.LOG_INITIAL_TERM_ID_OFFSET)[0]
    count = struct.unpack_from("<i", data, meta + d.LOG_ACTIVE_TERM_COUNT_OFFSET)[0]
    raw = struct.unpack_from("<q", data, meta + d.TERM_TAIL_COUNTERS_OFFSET + 8 * (count % d.PARTITION_COUNT))[0]
    tail = (((raw >> 32) - initial) & 0xFFFFFFFF) * term + min(raw & 0xFFFFFFFF, term)  # term ids wrap
    found, position = [], start
    while position < tail:
        at = (position // term) % d.PARTITION_COUNT * term + position % term
        length, _, _, kind = struct.unpack_from("<iBBH", data, at)
        if length <= 0:
            break
        if kind == f.HDR_TYPE_DATA:
            found.append((position, struct.unpack_from("<q", data, at + f.RESERVED_VALUE_OFFSET)[0] % U64))
        position += f.align(length)
    return found


def test_a_kill_between_an_append_and_its_checkpoint_store_is_read_back_from_the_log(
        rig: tuple[Runs, Checker]) -> None:
    """The window the checkpoint alone cannot close: the run appended sequences [m, N) and was killed before it
    stored that. The checkpoint is put back in exactly that state (committed up to m, the append of [m, N) in
    flight, from where it started in the log); the restart must read [m, N) back from the log and resume at N:
    no duplicate, nothing announced."""
    runs, checker = rig
    sender = Sender(runs.ports[:2])
    server = Server(runs.ports[2], sender.sent)
    server.start()
    path = runs.driver.directory / "feed-1001.checkpoint"
    try:
        proc = runs.start()
        wait_until(lambda: checker.messages.images, 60, what="the handler's publication")
        sender.start()
        published_since(checker, 2_000, proc)
        # the subscriber pauses: what the run appends from now on stays in the log (the driver cleans a log
        # only behind its subscribers)
        seen = checker.messages.images[0].position
        count = len(checker.got)

        def ahead() -> bool:
            state = cp.load(str(path))
            return state is not None and state.pending is None and state.next_sequence > count + 200

        wait_until(ahead, 60, what="the run to publish past the paused subscriber", max_interval=0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        runs.procs.remove(proc)
        state = cp.load(str(path))
        assert state is not None and state.log is not None and state.log.path is not None
        frames = frames_after(Path(state.log.path), seen)  # what a subscriber can read past where it paused
        published = frames[-1][1] + 1
        start, m = frames[len(frames) // 2]  # an append of [m, N) from `start`, as if its store never came
        # (were the run killed inside an append of its own, that append's end and its unknown end position)
        end, end_position = ((state.pending.end, -1) if state.pending is not None
                             else (state.next_sequence, state.position))
        file = cp.CheckpointFile(str(path))  # the killed run's lock went with it
        cp.commit(file.mapping, state.session, m, start)
        buffer = ffi.from_buffer("uint8_t[]", file.mapping, require_writable=True)
        lib.lbf_checkpoint_intent(buffer, state.session, m, end, start, end_position)
        del buffer
        file.close()
        assert cp.resume_point(cp.load(str(path))) == cp.ResumePoint(state.session, published,
                                                                      f"read back from {state.log.path}")
        proc = runs.start()
        published_since(checker, len(checker.got), proc)
        last_run_to_the_end(checker, runs, sender, proc)
    finally:
        sender.stop()
        server.stop()
    assert runs.resumes == [(published, 0, f"read back from {state.log.path}; checkpoint {path}")]
    check_every_sequence_once(checker, runs, sender.last, 0)
    assert len(checker.got) == sender.last  # not one duplicate


def test_a_second_handler_on_the_same_stream_is_refused_naming_the_checkpoint(rig: tuple[Runs, Checker]) -> None:
    """Two handlers on other ports but one stream would share its checkpoint (and each resume from the other's
    session): the second exits at once, saying so."""
    runs, checker = rig
    first = runs.start()
    wait_until(lambda: checker.messages.images, 60, what="the first handler's publication (its checkpoint held)")
    c, d_ = free_udp_ports(2)
    second = subprocess.run(
        [*LOGBUF, "feed", "--feed-a", f"127.0.0.1:{c}", "--feed-b", f"127.0.0.1:{d_}", "--no-recovery",
         "--wait-for-subscriber", "0", "--duration", "30", "-q"],
        env=dict(os.environ, LOGBUF_DIR=str(runs.driver.directory)), capture_output=True, text=True, timeout=120)
    assert second.returncode == 1
    assert "feed-1001.checkpoint is in use by another feed handler" in second.stderr
    assert first.poll() is None  # the first goes on
