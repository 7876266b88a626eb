"""`logbuf feed` as a process against a MoldUDP64 session sent by this file (`struct`, independent of logbuf's
codec) at a steady packet rate, with a retransmission server written here too: a late start, both feeds dark,
SIGKILL and restart, forged datagrams (a heartbeat far ahead, a confirmed pair near 2**64, an answer nobody
asked for), a second handler on the same ports, no subscriber. Every run checks the stream message by
message: each sequence exactly once, in order, byte-identical.

Scaled to run well under a minute on a loaded 2-core machine: 2,000 packets/s per feed of 10 messages."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import logbuf
from logbuf.cnc.counters import FEED_HANDLER_COUNTER_TYPE_ID
from logbuf.feed import published as out
from logbuf.feed.handler import read_checkpoint
from logbuf.samples.ports import free_udp_ports
from support.processes import stop_process
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)
LOGBUF = [sys.executable, "-m", "logbuf.cli"]
SESSION = b"RECOVERY01"
HEADER = struct.Struct(">10sQH")  # MoldUDP64: session, sequence of the first message, message count
BLOCK = struct.Struct(">H")
U64 = 1 << 64
PER_PACKET = 10
ANSWER_BUDGET = 1400  # bytes of message blocks per answer packet, as a server fills one MTU


def message(seq: int) -> bytes:
    return b"M" + struct.pack(">Q", seq) + b"x" * (seq % 17)


def mold(first: int, messages: list[bytes], session: bytes = SESSION) -> bytes:
    return HEADER.pack(session, first, len(messages)) + b"".join(BLOCK.pack(len(m)) + m for m in messages)


def marker(next_sequence: int, count: int = 0, session: bytes = SESSION) -> bytes:
    return HEADER.pack(session, next_sequence, count)  # count 0: heartbeat, 0xFFFF: end of session


class Server(threading.Thread):
    """A retransmission server: one packet per request (as many of the asked messages as fit, of those sent
    so far), at most ``rate`` answers per second; ``forge`` sends any datagram to the last client."""

    def __init__(self, port: int, sent: list[int], rate: float = 1000.0) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", port))
        self.sock.settimeout(0.05)
        self.sent = sent  # [next sequence the sender has sent]
        self.interval = 1.0 / rate
        self.client: tuple[str, int] | None = None
        self.requests = self.answers = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.is_set():
            try:
                data, client = self.sock.recvfrom(64)
            except (TimeoutError, OSError):
                continue
            if len(data) != HEADER.size:
                continue
            session, first, count = HEADER.unpack(data)
            self.client = client
            self.requests += 1
            blocks, size, seq = [], 0, first
            while seq < min(first + count, self.sent[0]) and size + 2 + len(message(seq)) <= ANSWER_BUDGET:
                blocks.append(message(seq))
                size += 2 + len(message(seq))
                seq += 1
            if not blocks:
                continue
            now = time.monotonic()
            if now < next_at:  # the server's own pace
                time.sleep(next_at - now)
            next_at = max(now, next_at) + self.interval
            self.sock.sendto(mold(first, blocks, session), client)
            self.answers += 1

    def forge(self, datagram: bytes) -> None:
        assert self.client is not None, "no request came yet"
        self.sock.sendto(datagram, self.client)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.sock.close()


class Sender(threading.Thread):
    """Sends ``packets`` packets of PER_PACKET messages on A and B at ``rate`` packets/s per feed, both feeds
    silent during ``dark`` (seconds from the start; the messages are skipped, as a switch would lose them),
    then end of session three times."""

    def __init__(self, ports: tuple[int, int], packets: int, rate: float = 2000.0,
                 dark: tuple[float, float] | None = None) -> None:
        super().__init__(daemon=True)
        self.ports = ports
        self.packets = packets
        self.rate = rate
        self.dark = dark
        self.sent = [1]  # next sequence sent (shared with the server)
        self.started = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    @property
    def last(self) -> int:
        return self.packets * PER_PACKET

    def run(self) -> None:
        start = time.monotonic()
        self.started.set()
        for k in range(self.packets):
            due = start + k / self.rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            first = 1 + k * PER_PACKET
            packet = mold(first, [message(s) for s in range(first, first + PER_PACKET)])
            self.sent[0] = first + PER_PACKET
            if self.dark is not None and self.dark[0] <= k / self.rate < self.dark[1]:
                continue
            for port in self.ports:
                self.sock.sendto(packet, ("127.0.0.1", port))
        for _ in range(3):
            for port in self.ports:
                self.sock.sendto(marker(self.last + 1, 0xFFFF), ("127.0.0.1", port))
            time.sleep(0.05)
        self.sock.close()


@dataclass
class Reader:
    """Subscriptions to the messages and events streams, read by the test."""

    messages: logbuf.Subscription
    events: logbuf.Subscription
    got: list[tuple[int, int, bytes]] = field(default_factory=list)  # (image session id, sequence, message)
    seen: list[tuple[out.FeedEvent, int]] = field(default_factory=list)  # (record, reserved value)

    def poll(self) -> int:
        n = self.events.poll(lambda buf, h: self.seen.append((out.FeedEvent.decode(buf), h.reserved_value % U64)),
                             100)
        return n + self.messages.poll(
            lambda buf, h: self.got.append((h.session_id, h.reserved_value % U64, bytes(buf))), 4096)

    def sequences(self) -> list[int]:
        return [seq for _, seq, _ in self.got]

    def check_exactly(self, last: int) -> None:
        """Every sequence 1..last exactly once, in order (across images in the order they were read), with
        the message that was sent."""
        seqs = self.sequences()
        assert len(seqs) == len(set(seqs)), f"{len(seqs) - len(set(seqs))} duplicates"
        assert seqs == list(range(1, last + 1)), f"{len(seqs)} of {last} delivered"
        bad = [seq for _, seq, body in self.got if body != message(seq)]
        assert not bad, f"wrong bytes for {bad[:5]}"


@dataclass
class Rig:
    driver: logbuf.MediaDriver
    client: logbuf.Client
    tmp: Path
    ports: tuple[int, int, int]
    reader: Reader
    procs: list[subprocess.Popen] = field(default_factory=list)
    sent: list[int] = field(default_factory=lambda: [1])  # next sequence send_stream has sent (the server's end)

    def start(self, *args: str) -> subprocess.Popen:
        a, b, r = self.ports
        server = [] if "--no-recovery" in args else ["--retransmit", f"127.0.0.1:{r}"]
        proc = subprocess.Popen(
            [*LOGBUF, "feed", "--feed-a", f"127.0.0.1:{a}", "--feed-b", f"127.0.0.1:{b}", "-q", *server,
             "--summary-json", str(self.tmp / "feed.json"), *args],
            env=dict(os.environ, LOGBUF_DIR=str(self.driver.directory)), stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def read_until_exit(self, proc: subprocess.Popen, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            assert time.monotonic() < deadline, f"logbuf feed still running after {timeout} s"
            if not self.reader.poll():
                time.sleep(0.002)
        while self.reader.poll():
            pass
        return proc.returncode

    def summary(self) -> dict:
        return json.loads((self.tmp / "feed.json").read_text())


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=16 << 20)
    client = logbuf.connect(driver.directory)
    reader = Reader(client.add_subscription("aeron:ipc", out.MESSAGES_STREAM),
                    client.add_subscription("aeron:ipc", out.EVENTS_STREAM))
    a, b, r = free_udp_ports(3)
    made = Rig(driver, client, tmp_path, (a, b, r), reader)
    try:
        yield made
    finally:
        for proc in made.procs:
            stop_process(proc, signal.SIGKILL, timeout=10)
        client.close()
        driver.close()


def run_session(rig: Rig, sender: Sender, server: Server, *handler_args: str, start_after: float = 0.0,
                kill_after: float | None = None) -> subprocess.Popen:
    """The sender and server run; the handler starts ``start_after`` s into the session (after its own start
    when 0); with ``kill_after`` it is SIGKILLed that long into the session and started again at once."""
    args = ("--until-end-of-session", "--give-up", "2", *handler_args)
    server.start()
    proc = None
    if not start_after:
        proc = rig.start(*args)
        deadline = time.monotonic() + 30
        while not rig.reader.messages.images:
            assert proc.poll() is None and time.monotonic() < deadline, "logbuf feed did not publish"
            time.sleep(0.01)
    sender.start()
    sender.started.wait(10)
    began = time.monotonic()
    if start_after:
        while time.monotonic() - began < start_after:
            time.sleep(0.01)
        proc = rig.start(*args)
    assert proc is not None
    if kill_after is not None:
        # killed once ``kill_after`` has passed and the first run has published something (a starved machine
        # may take longer than ``kill_after`` to publish the first message: the wait is for that, bounded)
        deadline = began + kill_after + 30
        while time.monotonic() - began < kill_after or not rig.reader.sequences():
            assert time.monotonic() < deadline, "nothing was published before the kill"
            assert proc.poll() is None, f"logbuf feed exited with {proc.returncode} before the kill"
            if not rig.reader.poll():
                time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        while rig.reader.poll():  # what the first run published, read before the second run publishes
            pass
        proc = rig.start(*args)
    return proc


def test_a_late_start_recovers_everything_the_server_answers_at_its_rate(rig: Rig) -> None:
    """Started 3 s into a 2,000 packets/s session: ~60,000 messages to fetch at the server's pace (1,000 answers
    of ~50 messages per second) take longer than --give-up 2 s, yet nothing is given up: the server answers."""
    sender = Sender(rig.ports[:2], packets=16_000)
    server = Server(rig.ports[2], sender.sent)
    try:
        proc = run_session(rig, sender, server, start_after=3.0)
        assert rig.read_until_exit(proc, 90) == 0, proc.stderr.read() if proc.stderr else ""
        rig.reader.check_exactly(sender.last)
        summary = rig.summary()
        assert summary["gaps_unrecoverable"] == 0 and summary["messages_unrecoverable"] == 0
        assert summary["RETRANSMIT.delivered"] > 10_000  # the past came from the server
    finally:
        server.stop()


def test_both_feeds_dark_for_half_a_second_loses_nothing_with_the_defaults(rig: Rig) -> None:
    sender = Sender(rig.ports[:2], packets=8_000, dark=(1.5, 2.0))
    server = Server(rig.ports[2], sender.sent)
    try:
        proc = run_session(rig, sender, server)
        assert rig.read_until_exit(proc, 90) == 0, proc.stderr.read() if proc.stderr else ""
        rig.reader.check_exactly(sender.last)
        summary = rig.summary()
        assert summary["gaps_unrecoverable"] == 0 and summary["shed_packets"] == 0
        assert summary["RETRANSMIT.delivered"] >= 9_000  # the dark half second came from the server
    finally:
        server.stop()


def test_a_handler_killed_and_restarted_mid_session_publishes_no_duplicate_and_loses_nothing(rig: Rig) -> None:
    sender = Sender(rig.ports[:2], packets=10_000)
    server = Server(rig.ports[2], sender.sent)
    try:
        proc = run_session(rig, sender, server, kill_after=2.0)
        assert rig.read_until_exit(proc, 90) == 0, proc.stderr.read() if proc.stderr else ""
        rig.reader.check_exactly(sender.last)
        images = []
        for image, _, _ in rig.reader.got:
            if not images or images[-1] != image:
                images.append(image)
        assert len(images) == 2  # the first run's publication, then the restarted one's
        # each run's events start with a SESSION_CHANGED naming where its messages start (the second: the resume)
        resumed_at = next(seq for image, seq, _ in rig.reader.got if image == images[1])
        changes = [(record.first, reserved) for record, reserved in rig.reader.seen
                   if record.kind == out.SESSION_CHANGED]
        assert changes == [(1, 1), (resumed_at, resumed_at)]
        # the session was published to its end: nothing is left to resume
        checkpoint = rig.driver.directory / "feed-1001.checkpoint"
        assert checkpoint.exists() and read_checkpoint(str(checkpoint)) is None
    finally:
        server.stop()


# -- forged datagrams: nothing unconfirmed is ever published --------------------------------------------------


def send(rig: Rig, feed: str, datagram: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(datagram, ("127.0.0.1", rig.ports[0] if feed == "A" else rig.ports[1]))


def send_stream(rig: Rig, first: int, last: int, feeds: str = "AB", skip: range = range(0)) -> None:
    rig.sent[0] = max(rig.sent[0], last + 1)
    for seq in range(first, last + 1, PER_PACKET):
        if seq in skip:
            continue
        packet = mold(seq, [message(s) for s in range(seq, min(seq + PER_PACKET, last + 1))])
        for name in feeds:
            send(rig, name, packet)


def wait_for(rig: Rig, proc: subprocess.Popen, messages: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while len(rig.reader.got) < messages:
        assert proc.poll() is None, f"logbuf feed exited with {proc.returncode}: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"{len(rig.reader.got)} of {messages} messages after {timeout} s"
        if not rig.reader.poll():
            time.sleep(0.002)


def end_session(rig: Rig, proc: subprocess.Popen, last: int) -> dict:
    for _ in range(3):
        send(rig, "A", marker(last + 1, 0xFFFF))
        send(rig, "B", marker(last + 1, 0xFFFF))
    assert rig.read_until_exit(proc, 60) == 0, proc.stderr.read() if proc.stderr else ""
    return rig.summary()


def started(rig: Rig, *args: str) -> subprocess.Popen:
    proc = rig.start("--until-end-of-session", "--lost-packet-wait-ms", "20", *args)
    deadline = time.monotonic() + 30
    while not rig.reader.messages.images:
        assert proc.poll() is None and time.monotonic() < deadline, "logbuf feed did not publish"
        time.sleep(0.01)
    return proc


def test_a_forged_heartbeat_far_ahead_is_revealed_by_the_traffic_that_continues(rig: Rig) -> None:
    server = Server(rig.ports[2], rig.sent)
    server.start()
    try:
        proc = started(rig)
        send_stream(rig, 1, 1000)
        wait_for(rig, proc, 1000)
        send(rig, "A", marker(1001 + 500_000))  # a heartbeat on A announcing 500,000 messages nobody sent
        for seq in range(1001, 3001, PER_PACKET):
            send_stream(rig, seq, seq + PER_PACKET - 1)
            if seq % 500 == 1:
                send(rig, "A", marker(seq + PER_PACKET))  # the true heartbeats go on too
        wait_for(rig, proc, 3000)
        summary = end_session(rig, proc, 3000)
        rig.reader.check_exactly(3000)
        assert summary["gaps_detected"] == 0 and summary["gaps_unrecoverable"] == 0
        assert summary["jumps_held"] >= 1 and summary["jumps_forged"] >= 1
    finally:
        server.stop()


def test_one_forged_end_of_session_does_not_end_the_session(rig: Rig) -> None:
    """A forged END_OF_SESSION on A mid-session: the true stream past it on A reveals it; the handler run with
    --until-end-of-session publishes everything and exits only at the true end."""
    server = Server(rig.ports[2], rig.sent)
    server.start()
    try:
        proc = started(rig)
        send_stream(rig, 1, 1000)
        wait_for(rig, proc, 1000)
        send(rig, "A", marker(1001, 0xFFFF))
        send_stream(rig, 1001, 3000)
        wait_for(rig, proc, 3000)
        summary = end_session(rig, proc, 3000)
        rig.reader.check_exactly(3000)
        assert [(record.kind, reserved) for record, reserved in rig.reader.seen] == [
            (out.SESSION_CHANGED, 1), (out.END_OF_SESSION, 3001)]
        assert summary["ends_forged"] == 1
    finally:
        server.stop()


def test_one_datagram_of_another_session_first_does_not_choose_the_session(rig: Rig) -> None:
    server = Server(rig.ports[2], rig.sent)
    server.start()
    try:
        proc = started(rig)
        send(rig, "A", mold(1, [b"EVIL-1", b"EVIL-2"], session=b"EVILSESS01"))
        send_stream(rig, 1, 2000)
        wait_for(rig, proc, 2000)
        summary = end_session(rig, proc, 2000)
        rig.reader.check_exactly(2000)
        assert summary["sessions_forged"] == 1 and summary["session_changes"] == 1
    finally:
        server.stop()


def handler_counter(rig: Rig, name: str) -> int:
    """The running handler's counter ``name`` in cnc.dat (copied there every 100 ms)."""
    values = [c.value for c in rig.client.counters if c.type_id == FEED_HANDLER_COUNTER_TYPE_ID
              and c.key.rstrip(b"\0") == name.encode()]
    return values[-1] if values else 0


def test_a_forged_pair_near_2_64_is_undone_when_the_true_stream_continues(rig: Rig) -> None:
    server = Server(rig.ports[2], rig.sent)
    server.start()
    try:
        proc = started(rig)
        send_stream(rig, 1, 1000)
        wait_for(rig, proc, 1000)
        send(rig, "B", mold(U64 - 2, [b"FORGED"]))  # a packet at 2**64 - 2 on B ...
        send(rig, "A", marker(U64 - 1))  # ... confirmed by a heartbeat on A
        wait_until(lambda: handler_counter(rig, "jumps_confirmed") == 1, 30, what="the forged pair confirmed")
        send_stream(rig, 1001, 3000)  # the true stream goes on below the jump
        wait_for(rig, proc, 3000)
        summary = end_session(rig, proc, 3000)
        rig.reader.check_exactly(3000)
        assert summary["jumps_confirmed"] == 1 and summary["jumps_forged"] == 1
        assert summary["gaps_unrecoverable"] == 0 and summary["messages_unrecoverable"] == 0
    finally:
        server.stop()


def test_an_answer_nobody_asked_for_is_ignored_even_from_the_servers_address(rig: Rig) -> None:
    server = Server(rig.ports[2], rig.sent)
    server.start()
    try:
        proc = started(rig)
        send_stream(rig, 1, 300, skip=range(101, 111))  # 101..110 lost on both feeds: requested, answered
        wait_for(rig, proc, 300)
        assert server.answers >= 1
        wrong = [b"W" + struct.pack(">Q", s) + b"?" * (s % 17) for s in range(301, 311)]
        server.forge(mold(301, wrong))  # wrong bytes for the next sequences, before A and B bring them
        time.sleep(0.05)
        send_stream(rig, 301, 600)
        wait_for(rig, proc, 600)
        summary = end_session(rig, proc, 600)
        rig.reader.check_exactly(600)
        assert summary["RETRANSMIT.ignored"] >= 1
        assert summary["A.delivered"] + summary["B.delivered"] >= 300  # the true copies won
    finally:
        server.stop()


def test_event_records_carry_the_next_sequence_of_the_message_stream_as_reserved_value(rig: Rig) -> None:
    proc = rig.start("--no-recovery", "--until-end-of-session", "--lost-packet-wait-ms", "20")
    deadline = time.monotonic() + 30
    while not rig.reader.messages.images:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    send_stream(rig, 1, 300, skip=range(101, 111))
    wait_for(rig, proc, 290)
    end_session(rig, proc, 300)
    records = {record.kind: (record, reserved) for record, reserved in rig.reader.seen}
    lost, reserved = records[out.GAP_UNRECOVERABLE]
    assert (lost.first, lost.last, reserved) == (101, 110, 111)  # the stream goes on at 111
    assert records[out.SESSION_CHANGED][1] == 1
    assert records[out.END_OF_SESSION][1] == 301


# -- refusals ----------------------------------------------------------------------------------------------------


def test_a_second_handler_on_the_same_unicast_ports_is_refused_naming_the_port(rig: Rig) -> None:
    first = started(rig)
    second = rig.start("--until-end-of-session")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 1
    assert f"cannot bind 127.0.0.1:{rig.ports[0]}: Address already in use" in err and "never shared" in err
    assert first.poll() is None  # the first one keeps its feeds


def test_no_subscriber_is_refused_unless_told_and_unpublished_messages_fail_the_run(tmp_path: Path) -> None:
    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=1 << 20)
    env = dict(os.environ, LOGBUF_DIR=str(driver.directory))
    a, b = free_udp_ports(2)
    feeds = ["--feed-a", f"127.0.0.1:{a}", "--feed-b", f"127.0.0.1:{b}", "--checkpoint", "off"]
    try:
        refused = subprocess.run([*LOGBUF, "feed", *feeds, "--wait-for-subscriber", "0.5", "-q"], env=env,
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "no subscriber" in refused.stderr and "stream 1001" in refused.stderr
        proc = subprocess.Popen([*LOGBUF, "feed", *feeds, "--wait-for-subscriber", "0", "-q",
                                 "--until-end-of-session"], env=env, stderr=subprocess.PIPE, text=True)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                deadline = time.monotonic() + 60
                while proc.poll() is None:  # until it has bound the feeds, read them and seen the end
                    assert time.monotonic() < deadline, "logbuf feed did not end"
                    s.sendto(mold(1, [message(1), message(2)]), ("127.0.0.1", a))
                    s.sendto(marker(3, 0xFFFF), ("127.0.0.1", a))
                    time.sleep(0.05)
            assert proc.returncode == 1
            assert "warning: 2 messages were not published" in (proc.stderr.read() if proc.stderr else "")
        finally:
            stop_process(proc, signal.SIGKILL, timeout=10)
    finally:
        driver.close()


def test_join_live_starts_at_the_first_packet_with_one_session_event_and_no_gap(rig: Rig) -> None:
    server = Server(rig.ports[2], rig.sent)
    server.start()
    try:
        proc = started(rig, "--join", "live")
        send_stream(rig, 5001, 6000)  # joined mid-session: 1..5000 are the skipped past
        wait_for(rig, proc, 1000)
        summary = end_session(rig, proc, 6000)
        assert rig.reader.sequences() == list(range(5001, 6001))
        assert [(record.kind, reserved) for record, reserved in rig.reader.seen] == [
            (out.SESSION_CHANGED, 5001), (out.END_OF_SESSION, 6001)]
        assert summary["recovery_requests"] == 0 and server.requests == 0
        # recovery was on: the answers' counters are in the summary although all are 0
        assert summary["RETRANSMIT.packets"] == summary["RETRANSMIT.kernel_drops"] == 0
    finally:
        server.stop()
