"""`logbuf feed` as a process against hostile or broken input, driven by a MoldUDP64 sender written here with
`struct` (independent of logbuf's codec): garbage before the first packet, sequences >= 2**63, a forged jump
a billion messages ahead, a retransmission server that is not there."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import logbuf
from logbuf.feed import published as out
from logbuf.samples.ports import free_udp_ports

pytestmark = pytest.mark.timeout(120)
LOGBUF = [sys.executable, "-m", "logbuf.cli"]
SESSION = b"HOSTILE01 "
HEADER = struct.Struct(">10sQH")  # MoldUDP64: session, sequence of the first message, message count
BLOCK = struct.Struct(">H")
U64 = 1 << 64


def mold(first: int, messages: list[bytes], session: bytes = SESSION) -> bytes:
    return HEADER.pack(session, first, len(messages)) + b"".join(BLOCK.pack(len(m)) + m for m in messages)


def heartbeat(next_sequence: int, session: bytes = SESSION) -> bytes:
    return HEADER.pack(session, next_sequence, 0)


def message(seq: int) -> bytes:
    return b"M" + struct.pack(">Q", seq) + b"x" * (seq % 17)


@dataclass
class Feed:
    proc: subprocess.Popen
    ports: tuple[int, int, int]
    messages: logbuf.Subscription
    events: logbuf.Subscription
    summary: Path
    got: list[tuple[int, bytes]] = field(default_factory=list)
    seen: list[out.FeedEvent] = field(default_factory=list)

    def send(self, feed: str, datagram: bytes) -> None:
        port = self.ports[0] if feed == "A" else self.ports[1]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(datagram, ("127.0.0.1", port))

    def poll(self) -> int:
        n = self.events.poll(lambda buf, h: self.seen.append(out.FeedEvent.decode(buf)), 100)
        return n + self.messages.poll(lambda buf, h: self.got.append((h.reserved_value % U64, bytes(buf))), 1000)

    def wait_for(self, messages: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.got) < messages:
            assert self.proc.poll() is None, f"logbuf feed exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, f"{len(self.got)} of {messages} messages after {timeout} s"
            if not self.poll():
                time.sleep(0.002)  # back-off while the handler works (a process: nothing to wait on here)

    def settle(self, seconds: float) -> None:
        """Keep reading for a while (to see that nothing else comes)."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if not self.poll():
                time.sleep(0.002)

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(20) == 0
        self.settle(0.1)
        return json.loads(self.summary.read_text())


@pytest.fixture
def feed_process(tmp_path: Path) -> Iterator:
    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=4 << 20)
    procs: list[subprocess.Popen] = []
    client = logbuf.connect(driver.directory)
    errors = tmp_path / "feed.stderr"
    stderr = errors.open("w")

    def start(*args: str) -> Feed:
        messages = client.add_subscription("aeron:ipc", out.MESSAGES_STREAM)
        events = client.add_subscription("aeron:ipc", out.EVENTS_STREAM)
        summary = tmp_path / "feed.json"
        for _attempt in range(3):  # a free port may be taken by another process before the handler binds it
            a, b, r = free_udp_ports(3)
            proc = subprocess.Popen(
                [*LOGBUF, "feed", "--feed-a", f"127.0.0.1:{a}", "--feed-b", f"127.0.0.1:{b}", "-q",
                 "--summary-json", str(summary), *[arg.replace("{R}", str(r)) for arg in args]],
                env=dict(os.environ, LOGBUF_DIR=str(driver.directory)), stderr=stderr)
            procs.append(proc)
            deadline = time.monotonic() + 30
            while not (messages.images and events.images) and proc.poll() is None:
                assert time.monotonic() < deadline, "logbuf feed did not publish"
                time.sleep(0.01)
            if proc.poll() is None or "cannot bind" not in errors.read_text():
                break
        assert proc.poll() is None, f"logbuf feed exited with {proc.returncode}: {errors.read_text()}"
        return Feed(proc, (a, b, r), messages, events, summary)

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        client.close()
        driver.close()
        stderr.close()


def send_stream(feed: Feed, first: int, last: int, per_packet: int = 30, feeds: str = "AB") -> None:
    for seq in range(first, last + 1, per_packet):
        packet = mold(seq, [message(s) for s in range(seq, min(seq + per_packet, last + 1))])
        for name in feeds:
            feed.send(name, packet)


def test_garbage_before_the_first_packet_does_not_choose_the_session(feed_process) -> None:
    feed = feed_process("--no-recovery")
    feed.send("A", os.urandom(40))  # 40 bytes: passes for a header with a random session
    feed.send("B", b"GARBAGE   " + struct.pack(">QH", 5, 3) + b"\x00\x01x")  # well-formed header, bad blocks
    send_stream(feed, 1, 3000)
    feed.wait_for(3000)
    assert [seq for seq, _ in feed.got] == list(range(1, 3001))
    assert all(body == message(seq) for seq, body in feed.got)
    summary = feed.stop()
    assert summary["A.decode_errors"] + summary["B.decode_errors"] == 2
    assert summary["gaps_detected"] == 0


def test_sequences_past_2_63_are_unsigned_end_to_end(feed_process) -> None:
    feed = feed_process("--no-recovery", "--max-jump", "1000")
    send_stream(feed, 1, 100, per_packet=10)
    feed.wait_for(100)
    high = (1 << 63) + 5
    send_stream(feed, high, high + 59, per_packet=20)  # a real jump: confirmed by the following packets
    feed.wait_for(160)
    assert [seq for seq, _ in feed.got[100:]] == list(range(high, high + 60))  # reserved values read as u64
    summary = feed.stop()
    assert summary["gaps_unrecoverable"] == 1 and summary["messages_unrecoverable"] == high - 101
    lost = [e for e in feed.seen if e.kind == out.GAP_UNRECOVERABLE]
    assert [(e.first, e.last) for e in lost] == [(101, high - 1)]


def test_one_forged_packet_a_billion_ahead_changes_nothing(feed_process) -> None:
    feed = feed_process("--no-recovery")
    send_stream(feed, 1, 1500)
    feed.wait_for(1500)
    feed.send("A", mold(10**9, [b"bogus"]))
    feed.send("B", heartbeat(2 * 10**9))  # a heartbeat announcing a jump, from elsewhere
    send_stream(feed, 1501, 3000)
    feed.wait_for(3000)
    feed.settle(0.3)  # past the lost-packet wait: no gap may appear
    assert [seq for seq, _ in feed.got] == list(range(1, 3001))
    summary = feed.stop()
    assert summary["gaps_detected"] == 0 and summary["gaps_unrecoverable"] == 0
    assert summary["jumps_held"] == 2 and summary["jumps_confirmed"] == 0
    assert not [e for e in feed.seen if e.kind in (out.GAP_DETECTED, out.GAP_UNRECOVERABLE)]


def test_an_unreachable_retransmission_server_is_retried_not_fatal(feed_process) -> None:
    # nothing listens on {R}: every request comes back as ECONNREFUSED
    feed = feed_process("--retransmit", "127.0.0.1:{R}", "--initial-backoff-ms", "1", "--retry-interval-ms", "20",
                        "--lost-packet-wait-ms", "10", "--give-up", "1")
    send_stream(feed, 1, 300, per_packet=10)
    feed.wait_for(300)
    send_stream(feed, 311, 600, per_packet=10)  # 301-310 lost on both feeds
    feed.wait_for(590, timeout=30)  # the hole is given up after --give-up and the rest delivered
    assert feed.proc.poll() is None
    assert [seq for seq, _ in feed.got] == [*range(1, 301), *range(311, 601)]
    summary = feed.stop()
    assert summary["retransmit_unreachable"] >= 1
    assert summary["gaps_unrecoverable"] == 1 and summary["messages_unrecoverable"] == 10


def test_a_stopped_handler_does_not_declare_holes_the_other_feed_fills(feed_process) -> None:
    """One clock: the lost-packet wait runs on arrival stamps. A handler stopped for longer than the wait
    finds A's loss and B's copy both waiting in its sockets: no gap (recovery off would lose it for good).

    The wait (2 s) is long against the time the sends take even on a loaded machine (B's copy must truly
    arrive within the wait of A's packets that reveal the hole), and the handler stays stopped 1.5 waits past
    A's packets, so a handler running on its own clock would declare the hole."""
    wait_s = 2.0
    feed = feed_process("--no-recovery", "--lost-packet-wait-ms", str(int(wait_s * 1000)))
    send_stream(feed, 1, 300, per_packet=30)
    feed.wait_for(300)
    feed.proc.send_signal(signal.SIGSTOP)
    try:
        began = time.monotonic()
        for seq in range(301, 3301, 30):
            if seq != 1501:  # A loses one packet
                feed.send("A", mold(seq, [message(s) for s in range(seq, seq + 30)]))
        for _ in range(8):  # B is behind: its copy of the lost packet comes rounds after A revealed the hole
            send_stream(feed, 1, 300, per_packet=30, feeds="B")
        send_stream(feed, 301, 3300, per_packet=30, feeds="B")
        sending = time.monotonic() - began
        assert sending < wait_s, f"the sends took {sending:.2f} s: B's copy came too late to be the test's case"
        while time.monotonic() - began < 1.5 * wait_s:  # stopped for 1.5 lost-packet waits
            time.sleep(0.05)
    finally:
        feed.proc.send_signal(signal.SIGCONT)
    feed.wait_for(3300)
    assert [seq for seq, _ in feed.got] == list(range(1, 3301))
    summary = feed.stop()
    assert summary["gaps_detected"] == 0 and summary["messages_unrecoverable"] == 0
