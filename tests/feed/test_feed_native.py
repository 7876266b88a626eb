"""The native fast path (native/feed.c through logbuf.feed.feed_native): identical results to the pure-Python
arbiter, robustness against malformed datagrams, recvmmsg receive with arrival timestamps."""

from __future__ import annotations

import random
import socket
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logbuf.feed import moldudp64 as m
from logbuf.feed.arbiter import Arbiter, ArbiterConfig, parse_blocks
from logbuf.feed.arbsim import Arrival, catch_up_scenario, simulate
from logbuf.feed.events import Deliver, DeliverBatch, Event, Feed, FeedMode
from logbuf.feed.feed_native import (
    RX_KERNEL_TIMESTAMP,
    RX_TRUNCATED,
    NativeArbiter,
    RecvRing,
    enable_kernel_timestamps,
    ffi,
    lib,
    monotonic_ns,
)
from logbuf.feed.recovery import Recovery

S1 = m.encode_session("NAT1")
S2 = m.encode_session("NAT2")
MS = 1_000_000
SLOT = 1024


def content(seq: int) -> bytes:
    return b"%d|" % seq + bytes((seq * 7 + i) % 251 for i in range(seq % 23))


def data(first: int, count: int, session: bytes = S1) -> bytes:
    return m.encode_downstream(session, first, [content(s) for s in range(first, first + count)])


def flatten(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for e in events:
        out.extend(e.delivers() if isinstance(e, DeliverBatch) else [e])
    return out


# -- traffic generator: mostly in order (the C path), with everything the slow path must handle ----------------


def malformed(rng: random.Random, cursor: int) -> bytes:
    good = data(max(1, cursor - 1), rng.randint(1, 4))
    variant = rng.randrange(7)
    if variant == 0:
        return good[: rng.randrange(0, 20)]  # shorter than the header
    if variant == 1:
        return good[:-1]  # last block runs past the end
    if variant == 2:
        return good + b"\x00"  # bytes left over
    if variant == 3:  # a block length pointing far past the end
        return good[:20] + b"\xff\xff" + good[22:]
    if variant == 4:
        return m.encode_header(S1, 0, 1) + b"\x00\x01x"  # sequence 0
    if variant == 5:
        return m.encode_header(S1, 2**64 - 1, 1) + b"\x00\x01x"  # next sequence overflows
    return m.encode_header(S1, cursor, 3) + good[20:]  # count says more blocks than there are


def traffic(seed: int, n: int) -> list[tuple[Feed, bytes, int]]:
    """``n`` datagrams as real feeds look: one source stream packetised differently on A and B, B a few packets
    behind, light loss, duplication and reordering per feed; sprinkled with retransmissions, heartbeats, other
    sessions, malformed and oversized datagrams, and pauses long enough for the wait criterion to fire."""
    rng = random.Random(seed)
    lag = rng.randint(0, 6)
    cursors = {Feed.A: 1, Feed.B: 1}
    backlog: dict[Feed, list[bytes]] = {Feed.A: [], Feed.B: []}
    session, highest, t, sessions = S1, 0, 0, 1
    out: list[tuple[Feed, bytes, int]] = []
    while len(out) < n:
        t += rng.choice([100, 1_000, 5_000, 20_000]) if rng.random() > 0.01 else 60 * MS
        r = rng.random()
        if r < 0.80:  # the feeds
            feed = rng.choice([Feed.A, Feed.B])
            first, count = cursors[feed], rng.randint(1, 9)
            cursors[feed] += count
            highest = max(highest, first + count - 1)
            backlog[feed].append(data(first, count, session))
            if len(backlog[feed]) > (lag if feed == Feed.B else 0):
                packet = backlog[feed].pop(0)
                if rng.random() < 0.04:  # lost
                    continue
                if backlog[feed] and rng.random() < 0.04:  # reordered with the next one
                    packet, backlog[feed][0] = backlog[feed][0], packet
                out.append((feed, packet, t))
                if rng.random() < 0.03:  # duplicated
                    out.append((feed, packet, t))
            continue
        if r < 0.85:  # a retransmission answer (recent past)
            first = rng.randint(max(1, highest - 30), highest + 1)
            packet, feed = data(first, rng.randint(1, 5), session), Feed.RETRANSMIT
        elif r < 0.90:
            packet, feed = m.encode_heartbeat(session, highest + 1), rng.choice([Feed.A, Feed.B])
        elif r < 0.93:  # another session: a stray packet, or the next session after this one ended
            sessions += 1
            other = m.encode_session(b"NAT%d" % sessions)  # sessions never come back
            if rng.random() < 0.2:
                eos = m.encode_end_of_session(session, highest + 1)
                out += [(Feed.A, eos, t), (Feed.B, eos, t)]
                t += 11_000 * MS  # long enough for any hole of the old session to be resolved
                session, highest = other, 3
                cursors = {Feed.A: 4, Feed.B: 4}
                backlog = {Feed.A: [], Feed.B: []}
            packet, feed = data(1, 3, other), Feed.A
        elif r < 0.98:
            packet, feed = malformed(rng, highest), rng.choice([Feed.A, Feed.B])
        else:  # larger than a receive slot: truncated by the kernel
            packet, feed = data(max(1, highest - 1), 3, session) + b"\x00" * SLOT, Feed.A
        out.append((feed, packet, t))
    return out[:n]


def recovery(seed: int | None) -> Recovery | None:
    return None if seed is None else Recovery(rng=random.Random(seed))


def run_pure(packets: list[tuple[Feed, bytes, int]], cuts: list[int], config: ArbiterConfig, seed: int | None
             ) -> tuple[Arbiter, list[Event]]:
    arb = Arbiter(config, recovery(seed))
    events: list[Event] = []
    for k, (feed, packet, t) in enumerate(packets):
        events += arb.on_packet(feed, packet[:SLOT], t, truncated=len(packet) > SLOT)
        if k + 1 in cuts:
            events += arb.on_tick(t)
    return arb, events


def run_native(packets: list[tuple[Feed, bytes, int]], cuts: list[int], config: ArbiterConfig,
               seed: int | None, ring_slots: int) -> tuple[Arbiter, NativeArbiter, list[Event]]:
    arb = Arbiter(config, recovery(seed))
    ring = RecvRing(ring_slots, SLOT)
    fast = NativeArbiter(arb, ring, out_capacity=(SLOT - 20) // 2)  # small: exercises the out-full path
    events: list[Event] = []
    begin = 0
    for end in [*cuts, len(packets)]:
        if end <= begin:
            continue
        for slot, (feed, packet, t) in enumerate(packets[begin:end]):
            ring.load(slot, packet, feed, t)
        events += flatten(fast.process(0, end - begin))  # copy out: the ring is reused
        if end in cuts:
            events += arb.on_tick(packets[end - 1][2])
        begin = end
    return arb, fast, events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), n=st.integers(1, 150), mode=st.sampled_from(list(FeedMode)),
       start=st.sampled_from([1, None]), batch=st.integers(1, 32), with_recovery=st.booleans())
def test_native_path_gives_identical_results(seed: int, n: int, mode: FeedMode, start: int | None,
                                             batch: int, with_recovery: bool) -> None:
    packets = traffic(seed, n)
    cuts = list(range(batch, n, batch))  # receive batches; the arbiter is ticked between them
    config = ArbiterConfig(mode=mode, start_sequence=start, out_of_order_max_interval=3)
    rec = seed if with_recovery else None
    pure, pure_events = run_pure(packets, cuts, config, rec)
    arb, fast, native_events = run_native(packets, cuts, config, rec, batch)
    assert native_events == pure_events
    assert np.array_equal(arb.feed_stats, pure.feed_stats)
    assert np.array_equal(arb.delay_stats, pure.delay_stats)
    assert arb.counter_values() == pure.counter_values()
    assert (arb.expected, arb.session, arb.last_session_arrival_ns) == (
        pure.expected, pure.session, pure.last_session_arrival_ns)


def test_the_fast_path_takes_most_of_the_traffic() -> None:
    """Guards the equivalence test's relevance: most packets must actually go through C."""
    fast_total = slow_total = 0
    for seed in range(5):
        packets = traffic(seed, 400)
        _, fast, _ = run_native(packets, list(range(32, 400, 32)), ArbiterConfig(), None, 32)
        fast_total += fast.fast_packets
        slow_total += fast.slow_packets
    assert fast_total > 2 * slow_total and slow_total > 0


def test_seed_002_catch_up_packets_are_arbitrated_per_message_in_c() -> None:
    """The incident's straddling catch-up packet (old messages first, fresh ones after) is handled by C."""
    messages, arrivals = catch_up_scenario(S1)
    pure = simulate(Arbiter(ArbiterConfig()), arrivals)
    arb = Arbiter(ArbiterConfig())
    ring = RecvRing(1, SLOT)
    fast = NativeArbiter(arb, ring)
    straddlers = []

    def through_c(arbiter: Arbiter, a: Arrival) -> list[Event]:
        ring.load(0, a.data, a.feed, a.time_ns)
        before, handled = arbiter.expected, fast.fast_packets
        events = fast.process(0, 1)
        p = m.decode(a.data)
        if before is not None and p.sequence < before < p.next_sequence:
            straddlers.append(fast.fast_packets > handled)
        return events

    native = simulate(arb, arrivals, process=through_c)
    assert [(d.seq, d.message, d.feed, d.arrival_ns) for d in native.delivered] == [
        (d.seq, d.message, d.feed, d.arrival_ns) for d in pure.delivered]
    assert [d.message for d in native.delivered] == messages and native.events == pure.events
    assert straddlers and all(straddlers)  # every packet starting with old messages but carrying fresh ones: C
    assert fast.fast_packets > 50 * fast.slow_packets


# -- the C function directly ----------------------------------------------------------------------------------


class Direct:
    """lbf_arb_packet on raw bytes with a fresh state: fast, expecting ``expected``, session S1."""

    def __init__(self, expected: int = 1, capacity: int = 64) -> None:
        self.arbiter = Arbiter(ArbiterConfig(mode=FeedMode.A_ONLY))
        self.native = NativeArbiter(self.arbiter, RecvRing(1, SLOT), out_capacity=max(capacity, (SLOT - 20) // 2))
        self.c = self.native._c
        ffi.memmove(self.c.session, S1, 10)
        self.c.expected = expected
        self.c.fast = lib.LBF_FAST_IN_ORDER
        self.out = ffi.new("lbf_out_t *")
        self.seq = np.zeros(capacity, np.uint64)
        self.offset = np.zeros(capacity, np.int64)
        self.length = np.zeros(capacity, np.int32)
        self.slot = np.zeros(capacity, np.int32)
        for name in ("seq", "offset", "length", "slot"):
            setattr(self.out, name, ffi.cast(ffi.typeof(getattr(self.out, name)), ffi.from_buffer(getattr(self, name))))
        self.out.capacity = capacity

    def packet(self, packet: bytes, feed: Feed = Feed.A, flags: int = 0) -> int:
        buf = ffi.from_buffer(packet)  # exactly len(packet) bytes: any over-read is outside the object
        return lib.lbf_arb_packet(self.c, buf, len(packet), int(feed), flags, 5, 0, 0, self.out)

    def messages(self, packet: bytes) -> list[tuple[int, bytes]]:
        n = self.out.count
        return [(int(self.seq[i]), packet[self.offset[i] : self.offset[i] + self.length[i]]) for i in range(n)]

    def stat(self, name: str, feed: Feed = Feed.A) -> int:
        return getattr(self.arbiter.stats(feed), name)


def test_c_delivers_only_fresh_messages_and_advances() -> None:
    d = Direct(expected=4)
    packet = data(1, 6)
    assert d.packet(packet) == lib.LBF_DONE
    assert d.messages(packet) == [(s, content(s)) for s in (4, 5, 6)]
    assert d.c.expected == 7
    assert (d.stat("delivered"), d.stat("duplicates"), d.stat("messages"), d.stat("packets")) == (3, 3, 6, 1)


def test_c_leaves_every_unusual_packet_to_python_untouched() -> None:
    d = Direct(expected=4)
    for packet in (data(5, 2), data(4, 1, S2), m.encode_heartbeat(S1, 9), m.encode_end_of_session(S1, 4)):
        assert d.packet(packet) == lib.LBF_SLOW
    d.c.fast = 0
    assert d.packet(data(4, 1)) == lib.LBF_SLOW
    assert d.out.count == 0 and d.c.expected == 4 and not d.arbiter.feed_stats.any()


def test_c_takes_only_duplicates_while_a_hole_is_pending_and_only_before_the_deadline() -> None:
    d = Direct(expected=10)
    d.c.fast = lib.LBF_FAST_DUPLICATES
    d.c.deadline_ns = 6  # the packets below arrive at 5
    assert d.packet(data(3, 4)) == lib.LBF_DONE  # all duplicates
    assert d.packet(data(1, 2) + b"x") == lib.LBF_DONE  # malformed
    assert (d.stat("duplicates"), d.stat("decode_errors"), d.out.count) == (4, 1, 0)
    assert d.packet(data(8, 3)) == lib.LBF_SLOW  # carries a fresh message: Python fills and drains
    d.c.deadline_ns = 5  # Python's timers are due at this arrival
    assert d.packet(data(3, 4)) == lib.LBF_SLOW
    assert d.stat("duplicates") == 4 and d.c.expected == 10


def test_c_out_full_changes_nothing() -> None:
    d = Direct(expected=1, capacity=4)
    d.out.capacity = 4
    assert d.packet(data(1, 3)) == lib.LBF_DONE
    assert d.packet(data(4, 2)) == lib.LBF_OUT_FULL  # one slot left, two fresh messages
    assert d.out.count == 3 and d.c.expected == 4 and d.stat("packets") == 1
    assert d.packet(data(1, 4)) == lib.LBF_DONE  # only one of them is fresh: fits
    assert d.out.count == 4 and d.c.expected == 5


def test_c_ignored_feed_and_truncation() -> None:
    d = Direct()
    assert d.packet(data(1, 1), Feed.B) == lib.LBF_DONE  # A_ONLY: B is ignored
    assert d.stat("ignored", Feed.B) == 1 and d.c.expected == 1
    assert d.packet(data(1, 1), Feed.A, lib.LBF_RX_TRUNCATED) == lib.LBF_DONE
    assert d.stat("decode_errors") == 1 and d.c.expected == 1


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=200), count=st.integers(0, 0xFFFF), first=st.integers(0, 2**64 - 1),
       expected=st.integers(1, 2**64 - 1))
def test_c_survives_arbitrary_datagrams_and_agrees_with_the_codec(body: bytes, count: int, first: int,
                                                                  expected: int) -> None:
    """Any bytes after a header of our session: C never reads outside the datagram (it is handed a buffer of
    exactly that size), and decides exactly what the strict Python codec decides."""
    packet = m.encode_header(S1, first, count) + body
    d = Direct(expected=min(expected, first) if first else expected)  # mostly in order: the interesting case
    before = int(d.c.expected)
    r = d.packet(packet)
    for i in range(d.out.count):
        assert d.offset[i] >= 20 and d.offset[i] + d.length[i] <= len(packet)
    try:
        decoded = m.decode(packet)
        valid = isinstance(decoded, m.DownstreamPacket) and decoded.next_sequence <= 2**64 - 1
    except m.MoldUDP64Error:
        decoded, valid = None, False
    if count in (m.HEARTBEAT_COUNT, m.END_OF_SESSION_COUNT) or first > before:
        assert r == lib.LBF_SLOW  # heartbeats, end of session and packets ahead are Python's
    elif valid:
        assert r == lib.LBF_DONE
        skip = before - decoded.sequence
        assert [x for _, x in d.messages(packet)] == list(decoded.messages[skip:])
        assert [s for s, _ in d.messages(packet)] == list(range(before, decoded.next_sequence))
        assert int(d.c.expected) == max(before, decoded.next_sequence)
    else:
        assert r == lib.LBF_DONE
        assert d.stat("decode_errors") == 1 and d.out.count == 0 and int(d.c.expected) == before


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=120), count=st.integers(0, 0xFFFF), cut=st.integers(0, 19))
def test_c_block_validation_matches_python(body: bytes, count: int, cut: int) -> None:
    packet = m.encode_header(S1, 1, count) + body
    ours = lib.lbf_mold_valid(ffi.from_buffer("uint8_t[]", packet), len(packet), count)
    assert bool(ours) == (parse_blocks(memoryview(packet), count) is not None)
    short = packet[:cut]  # shorter than the header: refused without reading past it
    assert lib.lbf_mold_valid(ffi.from_buffer("uint8_t[]", short), len(short), count) == 0


def test_c_walk_alone_counts_only_what_it_delivers() -> None:
    d = Direct(expected=3)

    def walk(packet: bytes) -> int:
        return lib.lbf_arb_walk(d.c, ffi.from_buffer("uint8_t[]", packet), len(packet), 0, 5, 0, 0, d.out)

    for bad in (b"", data(1, 2)[:19], data(1, 2)[:-1], m.encode_heartbeat(S1, 3),
                m.encode_header(S1, 0, 1) + b"\x00\x01x"):
        assert walk(bad) == lib.LBF_INVALID
    assert walk(data(4, 1)) == lib.LBF_SLOW  # starts past expected: it belongs in the queue
    packet = data(1, 4)
    assert walk(packet) == lib.LBF_DONE
    assert d.messages(packet) == [(3, content(3)), (4, content(4))]
    assert (d.stat("delivered"), d.stat("duplicates"), d.stat("packets"), d.stat("messages")) == (2, 2, 0, 0)
    assert d.c.expected == 5


def test_drained_packets_come_as_batches_that_own_their_bytes() -> None:
    arb = Arbiter(ArbiterConfig())
    ring = RecvRing(4, SLOT)
    fast = NativeArbiter(arb, ring)
    ring.load(0, data(1, 2), Feed.A, 0)
    ring.load(1, data(5, 3), Feed.A, 1)  # ahead of 3: queued (a copy)
    ring.load(2, data(3, 2), Feed.B, 2)  # fills the hole: the queue drains
    events = fast.process(0, 3)
    # all three went through Python (the join, the packet filling the hole, the drain): walked in C, each
    # batch over its own copy of the datagram
    assert fast.slow_packets == 3
    batches = [e for e in events if isinstance(e, DeliverBatch)]
    assert [e.seqs.tolist() for e in batches] == [[1, 2], [3, 4], [5, 6, 7]]
    assert not any(np.shares_memory(e.buffer, ring.slab) for e in batches)
    for slot in range(3):  # the ring is reused: the batches are unaffected
        ring.load(slot, data(100, 3), Feed.A, 9)
    assert [(d.seq, d.message, d.feed, d.arrival_ns) for d in flatten(events) if isinstance(d, Deliver)] == [
        (s, content(s), feed, t) for s, feed, t in [(1, Feed.A, 0), (2, Feed.A, 0), (3, Feed.B, 2),
                                                    (4, Feed.B, 2), (5, Feed.A, 1), (6, Feed.A, 1), (7, Feed.A, 1)]]


# -- NativeArbiter plumbing ---------------------------------------------------------------------------------


def test_deliver_batch_views_and_out_full_copies() -> None:
    arb = Arbiter(ArbiterConfig())
    ring = RecvRing(8, SLOT)
    fast = NativeArbiter(arb, ring, out_capacity=(SLOT - 20) // 2)
    arb.on_packet(Feed.A, data(1, 1), 0)  # join (slow path)
    big = (SLOT - 20) // 2 - 100
    first = 2
    for slot in range(3):
        ring.load(slot, m.encode_downstream(S1, first, [b""] * big), Feed.B, 10 + slot)
        first += big
    events = fast.process(0, 3)
    assert [type(e) for e in events] == [DeliverBatch] * 3  # out filled up twice: earlier batches were copied
    seqs = np.concatenate([e.seqs for e in events])
    assert seqs.tolist() == list(range(2, first))
    assert events[1].feeds.tolist() == [Feed.B] * big and events[2].arrivals_ns.tolist() == [12] * big
    assert not np.shares_memory(events[0].seqs, fast.out_seq)


def test_native_arbiter_rejects_bad_arguments() -> None:
    ring = RecvRing(4, SLOT)
    with pytest.raises(ValueError):
        NativeArbiter(Arbiter(), ring, out_capacity=10)
    with pytest.raises(ValueError):
        NativeArbiter(Arbiter(), ring).process(0, 5)
    with pytest.raises(ValueError):
        RecvRing(0)
    with pytest.raises(ValueError):
        RecvRing(4, 8)


# -- recvmmsg ---------------------------------------------------------------------------------------------------


@pytest.fixture
def udp_pair():
    socks = []

    def make() -> tuple[socket.socket, socket.socket]:
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tx.connect(rx.getsockname())
        socks.extend((rx, tx))
        return rx, tx

    yield make
    for s in socks:
        s.close()


def receive_all(ring: RecvRing, sock: socket.socket, feed: Feed, want: int, start: int = 0) -> int:
    got, deadline = 0, time.monotonic() + 5
    while got < want and time.monotonic() < deadline:
        n = ring.receive(sock, feed, start=start + got)
        got += n
        if not n:
            time.sleep(0.001)
    return got


def test_recvmmsg_on_loopback_feeds_the_arbiter(udp_pair) -> None:
    rx_a, tx_a = udp_pair()
    rx_b, tx_b = udp_pair()
    ring = RecvRing(32, SLOT)
    assert ring.receive(rx_a, Feed.A) == 0  # nothing waiting: non-blocking
    before = monotonic_ns()
    for first in range(1, 31, 3):
        tx_a.send(data(first, 3))
    for first in range(1, 31, 5):
        tx_b.send(data(first, 5))
    n_a = receive_all(ring, rx_a, Feed.A, 10)
    n_b = receive_all(ring, rx_b, Feed.B, 6, start=n_a)
    after = monotonic_ns()
    assert (n_a, n_b) == (10, 6)
    assert ring.feeds[:16].tolist() == [Feed.A] * 10 + [Feed.B] * 6
    assert bytes(ring.packet(0)) == data(1, 3) and bytes(ring.packet(10)) == data(1, 5)
    assert np.all((before <= ring.arrivals[:16]) & (ring.arrivals[:16] <= after))
    arb = Arbiter(ArbiterConfig())
    events = flatten(NativeArbiter(arb, ring).process(0, 16))
    assert [e.seq for e in events if isinstance(e, Deliver)] == list(range(1, 31))
    assert arb.stats(Feed.A).delivered == 30 and arb.stats(Feed.B).duplicates == 30


def test_kernel_timestamps_and_truncation(udp_pair) -> None:
    rx, tx = udp_pair()
    enable_kernel_timestamps(rx)
    ring = RecvRing(4, 64)
    before = monotonic_ns()
    tx.send(data(1, 2))
    tx.send(data(3, 1) + b"\x00" * 100)  # longer than a 64-byte slot
    assert receive_all(ring, rx, Feed.A, 2) == 2
    after = monotonic_ns()
    assert ring.flags[0] & RX_KERNEL_TIMESTAMP and not ring.flags[0] & RX_TRUNCATED
    assert ring.flags[1] & RX_TRUNCATED and ring.lengths[1] == 64
    # the kernel stamp, moved to CLOCK_MONOTONIC, lies between the send and the receive (1 ms clock slack)
    assert np.all((before - MS <= ring.arrivals[:2]) & (ring.arrivals[:2] <= after))
    arb = Arbiter(ArbiterConfig())
    events = flatten(NativeArbiter(arb, ring).process(0, 2))
    assert [e.seq for e in events if isinstance(e, Deliver)] == [1, 2]
    assert arb.stats(Feed.A).decode_errors == 1


def test_blocking_wait_and_errors(udp_pair) -> None:
    rx, tx = udp_pair()
    ring = RecvRing(4, SLOT)
    tx.send(data(1, 1))
    assert ring.receive(rx, Feed.A, wait=True) == 1  # blocking socket: returns once one is there
    with pytest.raises(OSError):
        ring.receive(10**6, Feed.A)  # not a descriptor
    with pytest.raises(ValueError):
        ring.receive(rx, Feed.A, start=5)
    ring.close()
    ring.close()  # idempotent
