"""The handler's native round (``lbf_round``) through real sockets on loopback, in process: an embedded driver,
the handler on a thread, MoldUDP64 datagrams written here with ``struct`` (independent of logbuf's codec).

Each test checks what the round publishes against the source: the messages stream (exactly once, in order,
byte-identical), the events stream, and the capture rows."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import logbuf
from logbuf.feed import published as out
from logbuf.feed.arbiter import ArbiterConfig
from logbuf.feed.events import Feed, GapReason
from logbuf.feed.feed_native import NativeRound, RecvRing, lib
from logbuf.feed.handler import FeedHandler, FeedHandlerConfig
from logbuf.feed.recovery import RecoveryConfig
from logbuf.samples.ports import free_udp_ports
from logbuf.units import NANOS_PER_MILLI as MILLI

pytestmark = pytest.mark.timeout(120)
SESSION = b"ROUND0001 "
HEADER = struct.Struct(">10sQH")
BLOCK = struct.Struct(">H")
U64 = 1 << 64


def message(seq: int) -> bytes:
    return b"R" + struct.pack(">Q", seq) + bytes([seq % 251]) * (seq % 29)


def mold(first: int, count: int, session: bytes = SESSION) -> bytes:
    return HEADER.pack(session, first, count) + b"".join(BLOCK.pack(len(message(s))) + message(s)
                                                        for s in range(first, first + count))


def source_packets(messages: int, seed: int) -> list[tuple[int, int]]:
    """(first, count) of the source's packets: 1 to 40 messages each."""
    rng = random.Random(seed)
    packets, seq = [], 1
    while seq <= messages:
        count = min(rng.randint(1, 40), messages - seq + 1)
        packets.append((seq, count))
        seq += count
    return packets


@dataclass
class Rig:
    handler: FeedHandler
    ports: tuple[int, int, int]
    messages: logbuf.Subscription
    events: logbuf.Subscription
    capture: logbuf.Subscription | None
    got: list[tuple[int, bytes]] = field(default_factory=list)
    seen: list[tuple[int, out.FeedEvent]] = field(default_factory=list)  # (messages read then, record)
    rows: list[tuple[int, np.ndarray]] = field(default_factory=list)
    thread: threading.Thread | None = None
    tx: socket.socket = field(default_factory=lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))

    def send(self, feed: str, datagram: bytes) -> None:
        self.tx.sendto(datagram, ("127.0.0.1", self.ports[0] if feed == "A" else self.ports[1]))

    def start(self) -> None:
        self.thread = threading.Thread(target=self.handler.run, name="feed-handler", daemon=True)
        self.thread.start()

    def _on_event(self, buf: memoryview, header: logbuf.Header) -> None:
        self.seen.append((len(self.got), out.FeedEvent.decode(buf)))

    def _on_message(self, buf: memoryview, header: logbuf.Header) -> None:
        sequence = header.reserved_value % U64
        if self.got and sequence != self.got[-1][0] + 1:
            # a jump: a record published before this message (in the handler's order) is visible now
            self.events.poll(self._on_event, 100)
        self.got.append((sequence, bytes(buf)))

    def poll(self, capture: bool = True) -> int:
        n = self.events.poll(self._on_event, 100)
        n += self.messages.poll(self._on_message, 4096)
        if capture and self.capture is not None:
            n += self.capture.poll(lambda buf, h: self.rows.append((h.reserved_value,
                                                                    out.decode_capture(h.reserved_value, buf))), 100)
        return n

    def wait_for(self, messages: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.got) < messages:
            assert self.thread is None or self.thread.is_alive(), "the handler thread died"
            assert time.monotonic() < deadline, f"{len(self.got)} of {messages} messages after {timeout} s"
            if not self.poll():
                self.messages.wait(0.005)

    def settle(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if not self.poll():
                time.sleep(0.002)

    def stop(self) -> None:
        self.handler.stop()
        if self.thread is not None:
            self.thread.join(10)
            assert not self.thread.is_alive(), "the handler did not stop"
        self.settle(0.05)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator:
    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=64 << 10)
    client = logbuf.connect(driver.directory)
    made: list[Rig] = []
    servers: list[threading.Event] = []

    def make(*, capture: bool = False, retransmit: bool = False, **config: object) -> Rig:
        messages = client.add_subscription("aeron:ipc", out.MESSAGES_STREAM)
        events = client.add_subscription("aeron:ipc", out.EVENTS_STREAM)
        capture_sub = client.add_subscription("aeron:ipc", out.CAPTURE_STREAM) if capture else None
        a, b, r = free_udp_ports(3)
        handler = FeedHandler(FeedHandlerConfig(
            feed_a=("127.0.0.1", a), feed_b=("127.0.0.1", b), retransmit=("127.0.0.1", r) if retransmit else None,
            driver_directory=str(driver.directory), capture_stream=out.CAPTURE_STREAM if capture else None,
            seed=1, **config))  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while not (messages.images and events.images and (capture_sub is None or capture_sub.images)):
            assert time.monotonic() < deadline, "the handler's publications did not appear"
            time.sleep(0.01)
        made.append(Rig(handler, (a, b, r), messages, events, capture_sub))
        return made[-1]

    def serve(port: int, messages: int) -> None:
        """A retransmission server on ``port``: one packet of up to 30 messages per request."""
        stop = threading.Event()
        servers.append(stop)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", port))
        sock.settimeout(0.02)

        def loop() -> None:
            with sock:
                while not stop.is_set():
                    try:
                        request, address = sock.recvfrom(64)
                    except TimeoutError:
                        continue
                    if len(request) != HEADER.size:
                        continue
                    session, seq, count = HEADER.unpack(request)
                    if session == SESSION and 1 <= seq <= messages and count:
                        sock.sendto(mold(seq, min(count, 30, messages - seq + 1)), address)

        threading.Thread(target=loop, name="retransmission-server", daemon=True).start()

    try:
        yield make, serve
    finally:
        for stop in servers:
            stop.set()
        for made_rig in made:
            made_rig.handler.stop()
            if made_rig.thread is not None:
                made_rig.thread.join(10)
            made_rig.handler.close()
            made_rig.tx.close()
        client.close()
        driver.close()


def delivered_from_rows(rows: list[tuple[int, np.ndarray]]) -> list[tuple[int, int]]:
    """(sequence, feed letter) of every delivered message the DELIVERED rows describe, in order."""
    expanded = []
    for kind, frame in rows:
        if kind == out.CAPTURE_DELIVERED:
            for row in frame:
                expanded.extend((int(row["first"]) % U64 + k, int(row["feed"])) for k in range(int(row["count"])))
    return expanded


def test_loss_reorder_and_duplicates_on_loopback_give_the_source_byte_for_byte(rig) -> None:
    make, serve = rig
    feed = make(capture=True, retransmit=True,
                recovery=RecoveryConfig(initial_backoff_ns=2 * MILLI, retry_interval_ns=50 * MILLI),
                arbiter=ArbiterConfig(lost_packet_wait_time_ns=20 * MILLI))
    total = 12_000
    packets = source_packets(total, seed=7)
    serve(feed.ports[2], total)
    rng = random.Random(3)
    lost_a = {i for i in range(len(packets)) if rng.random() < 0.04}
    lost_b = {i for i in range(len(packets)) if rng.random() < 0.04}
    lost_both = lost_a & lost_b
    assert lost_both  # some ranges come only from the retransmission server
    feed.start()
    order = list(range(len(packets)))
    for i in range(0, len(order) - 1, 7):  # A reorders neighbours now and then
        order[i], order[i + 1] = order[i + 1], order[i]
    for k, i in enumerate(order):
        if i not in lost_a:
            feed.send("A", mold(*packets[i]))
        j = k - 3  # B runs three packets behind, duplicating some
        if j >= 0 and j not in lost_b:
            feed.send("B", mold(*packets[j]))
            if j % 11 == 0:
                feed.send("B", mold(*packets[j]))
        if k % 200 == 0:
            feed.poll()
    for j in range(len(packets) - 3, len(packets)):
        if j not in lost_b:
            feed.send("B", mold(*packets[j]))
    feed.wait_for(total)
    feed.stop()
    assert [seq for seq, _ in feed.got] == list(range(1, total + 1))  # exactly once, in order
    assert all(body == message(seq) for seq, body in feed.got)  # byte-identical
    values = feed.handler.counter_values()
    assert values["published"] == total and values["unpublished"] == 0
    assert values["RETRANSMIT.delivered"] >= sum(packets[i][1] for i in lost_both)
    assert values["gaps_unrecoverable"] == 0
    # capture: one PACKET row per datagram received, DELIVERED rows name every message once, with its feed
    packet_rows = np.concatenate([frame for kind, frame in feed.rows if kind == out.CAPTURE_PACKETS])
    received = sum(values[f"{f.name}.packets"] for f in Feed)
    assert len(packet_rows) == received
    assert set(packet_rows["feed"].tolist()) == {ord("A"), ord("B"), ord("R")}
    firsts = {first for first, _ in packets}
    live = packet_rows[packet_rows["feed"] != ord("R")]  # answers start wherever a request asked
    assert set(live["sequence"].tolist()) <= firsts
    delivered = delivered_from_rows(feed.rows)
    assert [seq for seq, _ in delivered] == list(range(1, total + 1))
    by_feed = {letter: sum(1 for _, f in delivered if f == letter) for letter in (ord("A"), ord("B"), ord("R"))}
    assert by_feed == {ord("A"): values["A.delivered"], ord("B"): values["B.delivered"],
                       ord("R"): values["RETRANSMIT.delivered"]}
    # the handler's wire-to-log latency was sampled by the round
    assert feed.handler.latency_count > 0 and feed.handler.latency_percentiles_ns()["p50"] > 0


def test_back_pressure_mid_round_resumes_without_loss_or_duplication(rig) -> None:
    make, _ = rig
    feed = make(capture=True)  # 64 KiB terms: a window of ~500 small frames
    total = 20_000
    packets = source_packets(total, seed=11)
    feed.start()
    # the handler's publication sees the subscriber (an append before would count as unpublished, not wait)
    deadline = time.monotonic() + 10
    while not feed.handler.messages.is_connected:
        assert time.monotonic() < deadline, "the messages publication never saw the subscriber"
        time.sleep(0.005)
    for first, count in packets:  # nobody reads yet: the round fills the window and waits, mid-round
        feed.send("A", mold(first, count))
        feed.send("B", mold(first, count))
    deadline = time.monotonic() + 10
    while feed.handler.back_pressure_waits < 3:  # found the log full, and still full when it tried again
        assert time.monotonic() < deadline, "the handler never found the log full (or stayed so)"
        time.sleep(0.005)
    # it waited instead of dropping: nothing was counted unpublished and not everything went out
    assert feed.handler.unpublished == 0 and feed.handler.published < total
    feed.wait_for(total)
    feed.stop()
    assert [seq for seq, _ in feed.got] == list(range(1, total + 1))
    assert all(body == message(seq) for seq, body in feed.got)
    assert feed.handler.published == total and feed.handler.back_pressure_waits > 0
    assert [seq for seq, _ in delivered_from_rows(feed.rows)] == list(range(1, total + 1))


def test_hostile_datagrams_in_the_round_are_counted_and_change_nothing(rig) -> None:
    make, _ = rig
    feed = make(capture=True, arbiter=ArbiterConfig(max_jump=10_000))
    total = 3_000
    packets = source_packets(total, seed=5)
    feed.start()
    rng = random.Random(9)
    hostile = [
        b"",  # empty
        b"\x00" * 19,  # shorter than a header
        bytes(rng.getrandbits(8) for _ in range(40)),  # noise with a random "session"
        HEADER.pack(SESSION, 5, 3) + b"\x00\x01x",  # fewer blocks than the count says
        HEADER.pack(SESSION, 5, 1) + BLOCK.pack(60_000) + b"short",  # a block longer than the datagram
        HEADER.pack(SESSION, 0, 1) + BLOCK.pack(1) + b"z",  # sequence 0
        HEADER.pack(SESSION, U64 - 1, 2) + BLOCK.pack(1) + b"a" + BLOCK.pack(1) + b"b",  # runs past 2**64
        HEADER.pack(SESSION, 7, 0) + b"tail",  # a heartbeat with a body
    ]
    decode_errors = len(hostile) - 1  # the noise may or may not parse as a header of another session
    for k, (first, count) in enumerate(packets):
        feed.send("A", mold(first, count))
        feed.send("B", mold(first, count))
        if k < len(hostile):
            feed.send("A" if k % 2 else "B", hostile[k])
        if k == 50:  # a forged jump far ahead on one feed only: held, never confirmed
            feed.send("A", mold(10**9, 1))
    feed.wait_for(total)
    feed.settle(0.2)
    feed.stop()
    assert [seq for seq, _ in feed.got] == list(range(1, total + 1))
    assert all(body == message(seq) for seq, body in feed.got)
    values = feed.handler.counter_values()
    errors = values["A.decode_errors"] + values["B.decode_errors"]
    assert decode_errors <= errors <= decode_errors + 1
    assert values["jumps_held"] == 1 and values["gaps_detected"] == 0
    packet_rows = np.concatenate([frame for kind, frame in feed.rows if kind == out.CAPTURE_PACKETS])
    short = packet_rows[packet_rows["bytes"] < 20]
    assert len(short) == 2 and (short["sequence"] == -1).all() and (short["count"] == -1).all()
    assert len(packet_rows) == values["A.packets"] + values["B.packets"]


def test_a_range_lost_on_both_without_recovery_is_announced_before_the_jump(rig) -> None:
    make, _ = rig
    feed = make(arbiter=ArbiterConfig(lost_packet_wait_time_ns=10 * MILLI))
    total = 2_000
    packets = source_packets(total, seed=3)
    lost = next(i for i, (first, _) in enumerate(packets) if first > 1_000)
    first_lost, count_lost = packets[lost]
    feed.start()
    for i, (first, count) in enumerate(packets):
        if i != lost:
            feed.send("A", mold(first, count))
            feed.send("B", mold(first, count))
    feed.wait_for(total - count_lost)
    feed.settle(0.05)
    feed.stop()
    seqs = [seq for seq, _ in feed.got]
    assert seqs == [s for s in range(1, total + 1) if not first_lost <= s < first_lost + count_lost]
    lost_records = [(at, e) for at, e in feed.seen if e.kind == out.GAP_UNRECOVERABLE]
    assert [(e.first, e.last) for _, e in lost_records] == [(first_lost, first_lost + count_lost - 1)]
    at, record = lost_records[0]
    assert at <= seqs.index(first_lost + count_lost)  # the record was readable no later than the jump
    assert record.reason == GapReason.RECOVERY_OFF
    assert feed.handler.lost_by_reason[GapReason.RECOVERY_OFF] == count_lost


def test_the_round_refuses_a_bad_configuration(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ring_slots"):
        FeedHandlerConfig(ring_slots=4)  # A, B and the answers could not all receive in one round
    ring = RecvRing(capacity=4)
    with pytest.raises(ValueError, match="power of two"):
        NativeRound(ring, None, None, None, {}, {}, np.zeros(3, np.int64), max_block_ns=0, batch_wait_ns=0,
                    epoch_offset_ns=0, counters_interval_ns=0)
    from logbuf.feed.feed_native import ffi

    c = ffi.new("lbf_round_t *")
    assert lib.lbf_round_init(c) < 0  # nothing set
    assert lib.lbf_round(ffi.NULL, 1) == lib.LBF_ROUND_FAILED
    assert lib.lbf_round(c, 0) == lib.LBF_ROUND_FAILED  # never initialised
    assert lib.lbf_round_run(ffi.NULL, 0) == lib.LBF_ROUND_FAILED
    assert lib.lbf_round_run(c, 1_000_000) == lib.LBF_ROUND_FAILED


def test_the_answers_socket_gets_the_receive_buffer_of_the_feeds(rig) -> None:
    make, _serve = rig
    handler = make(retransmit=True, rcvbuf=4 << 20).handler
    size = {feed: sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for feed, sock in handler.sockets.items()}
    # the kernel doubles what was set (bookkeeping), capped by rmem_max when not privileged: the same for all
    assert size[Feed.RETRANSMIT] == size[Feed.A] == size[Feed.B]
    assert size[Feed.RETRANSMIT] > 212_992  # more than the kernel's default


UDP_SEGMENT = 103  # linux/udp.h: the sender's segmentation offload (GSO)


def fixed_mold(first: int, count: int, length: int) -> bytes:
    """A packet of ``count`` messages of ``length`` bytes each (a run of equal-sized datagrams for GSO)."""
    def body(seq: int) -> bytes:
        return (b"F" + struct.pack(">Q", seq) + bytes([seq % 251]) * length)[:length]
    return HEADER.pack(SESSION, first, count) + b"".join(BLOCK.pack(length) + body(s) for s in range(first, first + count))


def gso_runs(total: int) -> list[list[tuple[int, int, int]]]:
    """Runs of (first, count, message length): within a run every packet has the same size but the last, which
    is shorter; runs differ in size (a coalesced run is only ever equal-sized datagrams and a shorter last)."""
    runs, seq, k = [], 1, 0
    while seq <= total:
        length, per_packet, packets = 12 + 5 * (k % 4), 6 + k % 5, 2 + k % 7
        run = []
        for _ in range(packets):
            count = min(per_packet, total - seq + 1)
            run.append((seq, count, length))
            seq += count
            if seq > total:
                break
        if len(run) > 1 and run[-1][1] == per_packet:  # make the last one shorter (fewer messages)
            first, count, _ = run[-1]
            run[-1] = (first, count - 1, length)
            seq -= 1
        runs.append(run)
        k += 1
    return runs


def send_segmented(sock: socket.socket, port: int, run: list[tuple[int, int, int]]) -> None:
    """One send of the whole run, segmented by the kernel into the run's datagrams (UDP_SEGMENT)."""
    datagrams = [fixed_mold(*packet) for packet in run]
    size = len(datagrams[0])
    assert all(len(d) == size for d in datagrams[:-1]) and len(datagrams[-1]) <= size
    if len(datagrams) == 1:
        sock.sendto(datagrams[0], ("127.0.0.1", port))
        return
    sock.sendmsg([b"".join(datagrams)], [(socket.IPPROTO_UDP, UDP_SEGMENT, struct.pack("=H", size))],
                 0, ("127.0.0.1", port))


def _gso_supported() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.setsockopt(socket.IPPROTO_UDP, UDP_SEGMENT, 1000)
        except OSError:
            return False
    return True


needs_gso = pytest.mark.skipif(not _gso_supported(), reason="this kernel has no UDP segmentation offload (GSO)")


@needs_gso
def test_a_coalesced_run_is_received_as_one_slot_and_split_into_its_datagrams() -> None:
    from logbuf.feed.feed_native import enable_gro

    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        assert enable_gro(rx)
        ring = RecvRing(capacity=8)
        run = [(1, 5, 20), (6, 5, 20), (11, 5, 20), (16, 2, 20)]  # three of 230 bytes, then one of 64
        send_segmented(tx, rx.getsockname()[1], run)
        deadline = time.monotonic() + 10
        n = 0
        while n == 0:
            assert time.monotonic() < deadline, "nothing arrived"
            n = ring.receive(rx, Feed.A)
        assert n == 1  # the kernel handed the run over as one datagram
        assert int(ring.segments[0]) == len(fixed_mold(1, 5, 20))
        assert [bytes(d) for d in ring.datagrams(0)] == [fixed_mold(*p) for p in run]
        ring.close()


@needs_gso
def test_coalesced_runs_of_differing_sizes_give_the_source_byte_for_byte(rig) -> None:
    make, _ = rig
    feed = make(capture=True)
    total = 6_000
    runs = gso_runs(total)
    feed.start()
    for k, run in enumerate(runs):
        send_segmented(feed.tx, feed.ports[0], run)  # A: segmented sends, coalesced on a GRO socket
        if k % 3:  # B: one datagram per packet, a third of them missing
            for packet in run:
                feed.send("B", fixed_mold(*packet))
        if k % 50 == 0:
            feed.poll()
    feed.wait_for(total)
    feed.stop()
    expected = {p[0] + i: fixed_mold(p[0] + i, 1, p[2])[22:] for run in runs for p in run for i in range(p[1])}
    assert [seq for seq, _ in feed.got] == list(range(1, total + 1))
    assert all(body == expected[seq] for seq, body in feed.got)
    values = feed.handler.counter_values()
    sent_a = sum(len(run) for run in runs)
    assert values["A.packets"] == sent_a and values["A.decode_errors"] == 0  # every datagram on its own
    assert values["gaps_detected"] == 0 and values["published"] == total
    # capture: one PACKET row per datagram, a coalesced run's each with its own sequence and size
    rows = np.concatenate([frame for kind, frame in feed.rows if kind == out.CAPTURE_PACKETS])
    a_rows = rows[rows["feed"] == ord("A")]
    assert a_rows["sequence"].tolist() == [p[0] for run in runs for p in run]
    assert a_rows["bytes"].tolist() == [len(fixed_mold(*p)) for run in runs for p in run]
    assert len(rows) == values["A.packets"] + values["B.packets"]


def test_a_round_arbitrates_its_datagrams_in_arrival_order_across_the_feeds(rig) -> None:
    """Within one round B's copy that arrived first wins, although A's socket is read first: the round merges
    the sockets' datagrams by kernel arrival stamp (read socket by socket, A's later copy would overtake it)."""
    make, _ = rig
    feed = make()
    feed.send("A", mold(1, 10))
    feed.send("B", mold(1, 10))
    feed.handler.do_work()
    feed.send("B", mold(11, 10))  # B first ...
    feed.send("A", mold(11, 10))  # ... then A, both waiting for the same round
    feed.send("A", mold(21, 5))
    feed.send("B", mold(21, 5))
    feed.handler.do_work()
    feed.wait_for(25)
    values = feed.handler.arbiter.counter_values()
    assert [seq for seq, _ in feed.got] == list(range(1, 26))
    assert (values["A.delivered"], values["B.delivered"]) == (15, 10)
    assert (values["A.duplicates"], values["B.duplicates"]) == (10, 15)


def test_prefaulting_terms_larger_than_one_step_succeeds_and_changes_nothing(tmp_path: Path) -> None:
    """The terms are populated a few MiB per call (the memory-map lock is released between calls): 3 x 16 MiB
    take several calls; the whole span succeeds, a NULL publication is refused, what the log held is kept."""
    import errno

    from logbuf.feed.feed_native import ffi, lib

    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=16 << 20)
    client = logbuf.connect(driver.directory)
    try:
        publication = client.add_publication("aeron:ipc", 77)
        subscription = client.add_subscription("aeron:ipc", 77)
        deadline = time.monotonic() + 10
        while publication.offer(b"kept") < 0:
            assert time.monotonic() < deadline, "the publication never connected"
            time.sleep(0.01)
        assert lib.lbf_prefault_terms(publication.native_struct()) == 0
        assert lib.lbf_prefault_terms(ffi.NULL) == -errno.EINVAL
        got: list[bytes] = []
        while not got:
            assert time.monotonic() < deadline, "the message did not arrive"
            subscription.poll(lambda buf, header: got.append(bytes(buf)), 10)
        assert got == [b"kept"]
    finally:
        client.close()
        driver.close()


def test_the_round_sends_the_re_requests_itself(rig) -> None:
    """Recovering a late start takes one request per answer; the round sends every one of them (sendmmsg from C,
    those that come with a record such as the hole's GAP_DETECTED included): Python only publishes records."""
    make, serve = rig
    feed = make(retransmit=True, recovery=RecoveryConfig(initial_backoff_ns=2 * MILLI, retry_interval_ns=50 * MILLI))
    total = 3_000
    serve(feed.ports[2], total)
    assert not hasattr(feed.handler, "_send_requests")  # no second sender in Python
    feed.start()
    for first in range(2_001, total + 1, 20):  # joined late: 1..2,000 only from the server, 30 per answer
        feed.send("A", mold(first, 20))
        feed.send("B", mold(first, 20))
    feed.wait_for(total)
    feed.stop()
    assert [seq for seq, _ in feed.got] == list(range(1, total + 1))
    sent = feed.handler.counter_values()["recovery_requests"]
    assert sent >= 2_000 // 30  # one answer carries at most 30 messages
    assert feed.handler._r.requests_sent_ok == 1  # the round's sendmmsg went out
