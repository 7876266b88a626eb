"""Retransmission answers are taken only where a request started, and only for what it asked: ``logbuf feed`` as a
process against an independent ``struct`` MoldUDP64 retransmission server in this file that answers each request
first with a packet starting off the request (wrong bytes), then truly. Nothing of the off-request packets is
published; a server that answers from the first sequence it still has (it lacks the start of a request) still
gets exactly what it lacks given up and everything else fetched.

The process rig (driver, subscriber, ports, the feed sender) is test_feed_recovery_cli's."""

from __future__ import annotations

import socket
import struct
import threading
import time

from test_feed_recovery_cli import (  # the process rig: its fixture and checks
    SESSION,
    Rig,
    end_session,
    rig,  # noqa: F401  (the fixture)
    send,
    started,
    wait_for,
)

from logbuf.feed import published as out

HEADER = struct.Struct(">10sQH")  # MoldUDP64: session, sequence of the first message, message count
BLOCK = struct.Struct(">H")
BUDGET = 1400  # bytes of message blocks per answer packet: about 33 messages, so a hole takes two answers
LAST = 3000
PER_PACKET = 10


def message(seq: int) -> bytes:
    """The true message ``seq``: 10 to 69 bytes (so an answer carries fewer messages than a hole of 40 has)."""
    return b"R" + struct.pack(">Q", seq) + bytes((seq * 7 + i) % 251 for i in range(1 + (seq * 2654435761 >> 5) % 60))


def wrong(seq: int) -> bytes:
    return b"F" + struct.pack(">Q", seq) + b"?" * (1 + seq % 13)


def packet(first: int, messages: list[bytes]) -> bytes:
    return HEADER.pack(SESSION, first, len(messages)) + b"".join(BLOCK.pack(len(m)) + m for m in messages)


class OffServer(threading.Thread):
    """Answers each request ``(first, count)`` with one packet of the asked messages sent so far that fit
    ``BUDGET``; first, per ``mode``:

    - ``shifted``: a packet starting at ``first + 1`` with wrong bytes (as long as the true answer);
    - ``earlier``: a packet starting at ``first - 3`` with wrong bytes, covering what the true answer covers;
    - ``lacks``: no forgery, but the server lacks ``lacking``: a request starting there is answered from the first
      sequence past it (true bytes) if the request reaches that far, and an answer stops before it."""

    def __init__(self, port: int, sent: list[int], mode: str, lacking: range = range(0)) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", port))
        self.sock.settimeout(0.05)
        self.sent = sent  # [next sequence the feeds have sent]
        self.mode = mode
        self.lacking = lacking
        self.requests: list[tuple[int, int]] = []
        self.forged = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                data, client = self.sock.recvfrom(64)
            except (TimeoutError, OSError):
                continue
            if len(data) != HEADER.size:
                continue
            _, first, count = HEADER.unpack(data)
            self.requests.append((first, count))
            start = first
            if start in self.lacking:  # answered from the first sequence it still has
                start = self.lacking.stop
            end = min(first + count, self.sent[0])
            if start < self.lacking.start:
                end = min(end, self.lacking.start)
            blocks, size, seq = [], 0, start
            while seq < end and size + 2 + len(message(seq)) <= BUDGET:
                blocks.append(message(seq))
                size += 2 + len(blocks[-1])
                seq += 1
            if not blocks:
                continue
            if self.mode == "shifted":
                self.sock.sendto(packet(start + 1, [wrong(s) for s in range(start + 1, seq + 1)]), client)
                self.forged += 1
            elif self.mode == "earlier":
                f0 = max(1, start - 3)
                self.sock.sendto(packet(f0, [wrong(s) for s in range(f0, seq)]), client)
                self.forged += 1
            self.sock.sendto(packet(start, blocks), client)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.sock.close()


def send_stream(rig: Rig, first: int, last: int, skip: range = range(0)) -> None:  # noqa: F811
    """Packets of PER_PACKET true messages from ``first`` to ``last`` on A and B, but those starting in ``skip``."""
    rig.sent[0] = max(rig.sent[0], last + 1)
    for seq in range(first, last + 1, PER_PACKET):
        if seq not in skip:
            datagram = packet(seq, [message(s) for s in range(seq, min(seq + PER_PACKET, last + 1))])
            send(rig, "A", datagram)
            send(rig, "B", datagram)


def stream_with_holes(rig: Rig) -> None:  # noqa: F811
    """1..LAST on both feeds, 4 packets (101..140 of every 300) lost on both: each hole is asked of the server."""
    for base in range(0, LAST, 300):
        send_stream(rig, base + 1, base + 300, skip=range(base + 101, base + 141))
        time.sleep(0.05)


def check(rig: Rig, expected: list[int]) -> None:  # noqa: F811
    """The stream is exactly ``expected``, each with its true bytes."""
    assert rig.reader.sequences() == expected
    bad = [seq for _, seq, body in rig.reader.got if body != message(seq)]
    assert not bad, f"wrong bytes for {bad[:5]}"


def off_request_answers_are_never_published(rig: Rig, mode: str) -> None:  # noqa: F811
    server = OffServer(rig.ports[2], rig.sent, mode)
    server.start()
    try:
        proc = started(rig, "--give-up", "10")
        stream_with_holes(rig)
        wait_for(rig, proc, LAST)
        summary = end_session(rig, proc, LAST)
        check(rig, list(range(1, LAST + 1)))  # byte-identical: nothing of the forged packets
        assert server.forged >= 10 and summary["RETRANSMIT.ignored"] >= 10
        assert summary["RETRANSMIT.delivered"] == 10 * 40  # the true answers filled every hole
        assert summary["gaps_unrecoverable"] == 0
    finally:
        server.stop()


def test_an_answer_starting_after_the_requested_first_is_never_published(rig: Rig) -> None:  # noqa: F811
    """Each request (first F) answered first at F + 1 with wrong bytes, then truly at F: the stream is
    byte-identical (the packet at F + 1 is at most a hint; a request starting there gets the true bytes)."""
    off_request_answers_are_never_published(rig, "shifted")


def test_an_answer_starting_before_the_requested_first_is_never_published(rig: Rig) -> None:  # noqa: F811
    """Each request answered first from 3 before its first with wrong bytes covering what was asked, then
    truly: the stream is byte-identical."""
    off_request_answers_are_never_published(rig, "earlier")


def test_a_server_answering_from_the_first_sequence_it_has_loses_exactly_what_it_lacks(rig: Rig) -> None:  # noqa: F811
    """The server lacks 1001..1030 of a hole 1001..1040 both feeds lost and answers a request for the hole from
    1031: that packet is not taken as the answer (it does not start where asked), a request starting at 1031 is,
    and exactly 1001..1030 is given up (asked, retried, never answered); everything else is byte-identical."""
    lacking = range(1001, 1031)
    server = OffServer(rig.ports[2], rig.sent, "lacks", lacking)
    server.start()
    try:
        proc = started(rig, "--give-up", "1")
        send_stream(rig, 1, 1000)
        wait_for(rig, proc, 1000)
        send_stream(rig, 1001, 2000, skip=range(1001, 1041))
        expected = [s for s in range(1, 2001) if s not in lacking]
        wait_for(rig, proc, len(expected))
        summary = end_session(rig, proc, 2000)
        check(rig, expected)
        assert summary["messages_unrecoverable"] == len(lacking)
        given_up = [(r.first, r.last) for r, _ in rig.reader.seen if r.kind == out.GAP_UNRECOVERABLE]
        assert given_up and given_up[0][0] == lacking.start and given_up[-1][1] == lacking.stop - 1
        assert any(first == lacking.stop for first, _ in server.requests)  # asked from where it has data
        assert summary["RETRANSMIT.ignored"] >= 1
    finally:
        server.stop()

