"""The arbitration engine (native/feed_*.c behind logbuf.feed.arbiter.Arbiter), its re-request pacing included:
identical results to the executable specifications (logbuf.feed.spec, logbuf.feed.recovery) on random traffic, robustness against arbitrary datagrams,
recvmmsg receive with arrival timestamps and kernel drop counts."""

from __future__ import annotations

import random
import socket
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from logbuf.feed.arbiter import Arbiter, ArbiterConfig, DeliverRun
from logbuf.feed.coverage import parse_blocks
from logbuf.feed.events import Deliver, DeliverBatch, Event, Feed, FeedMode, RecoveryRequest
from logbuf.feed.feed_native import (
    RX_KERNEL_TIMESTAMP,
    RX_TRUNCATED,
    RecvRing,
    enable_drop_counts,
    enable_kernel_timestamps,
    ffi,
    lib,
    monotonic_ns,
    socket_drops,
)
from logbuf.feed.recovery import Jitter, Recovery, RecoveryConfig
from logbuf.feed.spec import SpecArbiter
from logbuf.marketdata import moldudp64 as m
from support.arbsim import Arrival, catch_up_scenario, simulate

S1 = m.encode_session("NAT1")
S2 = m.encode_session("NAT2")
MS = 1_000_000
SLOT = 1024
JUMP = 200  # max_jump of the equivalence tests: small, so the traffic exercises the confirmation


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
        elif r < 0.955:
            packet, feed = malformed(rng, highest), rng.choice([Feed.A, Feed.B])
        elif r < 0.98:  # a jump far ahead (forged, or real and confirmed by the next one), data or heartbeat
            far = highest + rng.choice([JUMP + 1, 2 * JUMP, 10**9, 2**63 + 5, 2**64 - 10])
            far = min(far, 2**64 - 4)
            packet = data(far, 1, session) if rng.random() < 0.7 else m.encode_heartbeat(session, far)
            feed = rng.choice([Feed.A, Feed.B])
        else:  # larger than a receive slot: truncated by the kernel
            packet, feed = data(max(1, highest - 1), 3, session) + b"\x00" * SLOT, Feed.A
        out.append((feed, packet, t))
    return out[:n]


def recovery(seed: int | None, eager: bool = False) -> RecoveryConfig | None:
    """``eager``: a short initial back-off and quick retries (answers then come within the generated traffic);
    the pacing is otherwise the default (its jitter drawn from ``seed``)."""
    if seed is None:
        return None
    if not eager:
        return RecoveryConfig()
    return RecoveryConfig(initial_backoff_ns=2_000, retry_interval_ns=20_000, give_up_ns=200_000 + seed % 400_000,
                          max_outstanding=1 + seed % 8, request_rate=50_000.0 + seed % 200_000,
                          request_burst=1 + seed % 6)


def answers(events: list[Event], done: int, t: int, per_answer: int, forge: bool
            ) -> tuple[list[tuple[Feed, bytes, int]], int]:
    """The server's answers to the requests among ``events[done:]``: one packet of up to ``per_answer``
    messages each, every fifth lost (by sequence, so both runs lose the same ones); with ``forge``, some answers
    carry wrong bytes past what was asked, or come for sequences nobody asked for."""
    out: list[tuple[Feed, bytes, int]] = []
    for e in events[done:]:
        if isinstance(e, RecoveryRequest):
            if e.seq % 5 == 4:
                continue
            n = min(e.count, per_answer)
            body = [content(s) for s in range(e.seq, e.seq + n)]
            if forge and n == e.count and e.seq % 3 == 0 and e.seq + n + 2 < 2**64:
                body += [b"tail"] * 2  # more than was asked: the answer is cut at the request's end
            out.append((Feed.RETRANSMIT, m.encode_downstream(e.session, e.seq, body), t))
            far = e.seq + e.count + 5_000_000
            if forge and e.seq % 3 == 1 and far < 2**64 - 10:  # an answer nobody asked for
                out.append((Feed.RETRANSMIT, m.encode_downstream(e.session, far, [b"forged"]), t))
    return out, len(events)


def run_pure(packets: list[tuple[Feed, bytes, int]], cuts: list[int], config: ArbiterConfig, seed: int | None,
             per_answer: int = 0, forge: bool = False) -> tuple[SpecArbiter, list[Event]]:
    """The specification; with ``per_answer``, a server answers the requests of a batch before the next one."""
    pacing = recovery(seed, bool(per_answer))
    arb = SpecArbiter(config, None if pacing is None else Recovery(pacing, rng=Jitter(seed or 0)))
    events: list[Event] = []
    done = 0
    begin = 0
    for end in [*cuts, len(packets)]:
        if end <= begin:
            continue
        batch = packets[begin:end]
        if per_answer and begin:
            extra, done = answers(events, done, packets[begin - 1][2], per_answer, forge)
            batch = extra + batch
        for feed, packet, t in batch:
            events += arb.on_packet(feed, packet[:SLOT], t, truncated=len(packet) > SLOT)
        if end in cuts:
            events += arb.on_tick(packets[end - 1][2])
        begin = end
    return arb, events


def run_native(packets: list[tuple[Feed, bytes, int]], cuts: list[int], config: ArbiterConfig,
               seed: int | None, ring_slots: int, per_answer: int = 0, forge: bool = False
               ) -> tuple[Arbiter, list[Event]]:
    arb = Arbiter(config, recovery(seed, bool(per_answer)), seed=seed or 0)
    ring = RecvRing(ring_slots + 64 if per_answer else ring_slots, SLOT)
    events: list[Event] = []
    done = 0
    begin = 0
    for end in [*cuts, len(packets)]:
        if end <= begin:
            continue
        batch = packets[begin:end]
        if per_answer and begin:
            extra, done = answers(events, done, packets[begin - 1][2], per_answer, forge)
            batch = extra + batch
        for start in range(0, len(batch), ring.capacity):  # answers may overflow one ring's worth
            part = batch[start:start + ring.capacity]
            for slot, (feed, packet, t) in enumerate(part):
                ring.load(slot, packet, feed, t)
            events += flatten(arb.process(ring, 0, len(part)))  # copy out: the ring is reused
        if end in cuts:
            events += flatten(arb.on_tick(packets[end - 1][2]))
        begin = end
    return arb, events


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), n=st.integers(1, 200), mode=st.sampled_from(list(FeedMode)),
       start=st.sampled_from([1, None]), batch=st.integers(1, 32), with_recovery=st.booleans(),
       queue=st.sampled_from([4, 16_384]))
def test_the_engine_gives_the_results_of_the_specification(seed: int, n: int, mode: FeedMode, start: int | None,
                                                           batch: int, with_recovery: bool, queue: int) -> None:
    """Loss, duplication, reordering, retransmissions, heartbeats, sessions, end of session, garbage, jumps,
    both feeds, clock ticks between receive batches: the same events, deliveries, counters and state."""
    packets = traffic(seed, n)
    cuts = list(range(batch, n, batch))  # receive batches; the arbiter is ticked between them
    config = ArbiterConfig(mode=mode, start_sequence=start, out_of_order_max_interval=3, max_jump=JUMP,
                           max_queue_packets=queue)
    rec = seed if with_recovery else None
    pure, pure_events = run_pure(packets, cuts, config, rec)
    arb, native_events = run_native(packets, cuts, config, rec, batch)
    assert native_events == pure_events
    assert np.array_equal(arb.feed_stats, pure.feed_stats)
    assert np.array_equal(arb.delay_stats, pure.delay_stats)
    assert arb.counter_values() == pure.counter_values()
    assert (arb.expected, arb.session, arb.highest, arb.last_session_arrival_ns, arb.holes()) == (
        pure.expected, pure.session, pure.highest, pure.last_session_arrival_ns, pure.holes())
    assert arb.next_deadline_ns() == pure.next_deadline_ns()


def coalesce(packets: list[tuple[Feed, bytes, int]], longest: int) -> list[tuple[Feed, list[bytes], int]]:
    """Runs as UDP_GRO hands them over: consecutive datagrams of one feed, all as long as the first but the
    last, which may be shorter (so runs of differing sizes follow each other), at most ``longest`` in a run;
    every datagram of a run arrives at the run's time."""
    runs: list[tuple[Feed, list[bytes], int]] = []
    for feed, packet, t in packets:
        if runs:
            last_feed, run, _ = runs[-1]
            size = len(run[0])
            if (last_feed == feed and len(run) < longest and len(run[-1]) == size and 0 < len(packet) <= size
                    and len(run) * size + len(packet) <= 65_535):
                run.append(packet)
                continue
        runs.append((feed, [packet], t))
    return runs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), n=st.integers(1, 200), longest=st.integers(2, 8), batch=st.integers(1, 16),
       with_recovery=st.booleans())
def test_coalesced_runs_give_the_results_of_one_datagram_per_slot(seed: int, n: int, longest: int, batch: int,
                                                                  with_recovery: bool) -> None:
    """A slot holding a run the kernel coalesced (UDP_GRO: its segment size in ``segments``) is arbitrated as
    its datagrams one after another in their own slots would be: the same events, deliveries, counters and
    state, on the random traffic of the equivalence tests (malformed and short last datagrams included)."""
    runs = coalesce(traffic(seed, n), longest)
    config = ArbiterConfig(out_of_order_max_interval=3, max_jump=JUMP)
    results = []
    for coalesced in (False, True):
        rec = seed if with_recovery else None
        arb = Arbiter(config, recovery(rec), seed=rec or 0)
        ring = RecvRing(8 * batch, 65_536)
        events: list[Event] = []
        for begin in range(0, len(runs), batch):
            slot = 0
            for feed, run, t in runs[begin:begin + batch]:
                if coalesced:
                    ring.load(slot, b"".join(run), feed, t)
                    ring.segments[slot] = len(run[0]) if len(run) > 1 else 0
                    slot += 1
                else:
                    for packet in run:
                        ring.load(slot, packet, feed, t)
                        slot += 1
            events += flatten(arb.process(ring, 0, slot))
            events += flatten(arb.on_tick(runs[min(begin + batch, len(runs)) - 1][2]))
        results.append((events, arb.feed_stats.copy(), arb.delay_stats.copy(), arb.counter_values(),
                        (arb.expected, arb.session, arb.highest, arb.holes()), arb.next_deadline_ns()))
    plain, split = results
    assert split[0] == plain[0]
    assert np.array_equal(split[1], plain[1]) and np.array_equal(split[2], plain[2])
    assert split[3:] == plain[3:]


def test_the_ring_reports_a_coalesced_run_as_its_datagrams() -> None:
    ring = RecvRing(2, 65_536)
    run = [m.encode_downstream(S1, first, [b"%08d" % s for s in range(first, first + count)])
           for first, count in ((1, 4), (5, 4), (9, 1))]  # two of 60 bytes, then one of 30
    ring.load(0, b"".join(run), Feed.A, 5)
    ring.segments[0] = len(run[0])
    assert [bytes(d) for d in ring.datagrams(0)] == run
    ring.segments[0] = 0  # no segment size: one datagram
    assert [bytes(d) for d in ring.datagrams(0)] == [b"".join(run)]
    ring.segments[0] = len(b"".join(run))  # a size the kernel cannot give (not below the length): one datagram
    assert len(ring.datagrams(0)) == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), n=st.integers(1, 200), batch=st.integers(1, 16),
       queue=st.sampled_from([4, 16_384]), queue_bytes=st.sampled_from([3_000, 1 << 20]),
       per_answer=st.integers(1, 6), forge=st.booleans(), resume=st.sampled_from([None, 1, 40, 10**6]))
# a paced request timed out (congestion: the rate halves) between two tokens, before any deadline but seen by a poll
@example(seed=6537, n=127, batch=7, queue=4, queue_bytes=3_000, per_answer=1, forge=False, resume=None)
# a reordered packet undid a true small jump past declared gaps; the holes in between were never declared again,
# yet recovery asked for them once the stream came back (a deadline the C engine had no reason to recompute)
@example(seed=951068, n=96, batch=1, queue=4, queue_bytes=3_000, per_answer=2, forge=False, resume=None)
@example(seed=951068, n=96, batch=2, queue=4, queue_bytes=3_000, per_answer=1, forge=False, resume=None)
def test_the_engine_with_recovery_gives_the_results_of_the_specification(
        seed: int, n: int, batch: int, queue: int, queue_bytes: int, per_answer: int, forge: bool,
        resume: int | None) -> None:
    """Recovery end to end: holes are declared and re-requested, a server answers each batch's requests before
    the next batch (a few messages per answer, some answers lost, some forged: past the request or unasked),
    forged jumps are held, confirmed and undone, the queue fills by packets or by bytes, a restart resumes the
    first session: the same events, deliveries, counters and state."""
    packets = traffic(seed, n)
    cuts = list(range(batch, n, batch))
    config = ArbiterConfig(start_sequence=1, out_of_order_max_interval=3, max_jump=JUMP, max_queue_packets=queue,
                           max_queue_bytes=queue_bytes, resume=None if resume is None else (S1, resume))
    pure, pure_events = run_pure(packets, cuts, config, seed, per_answer, forge)
    arb, native_events = run_native(packets, cuts, config, seed, batch, per_answer, forge)
    assert native_events == pure_events
    assert np.array_equal(arb.feed_stats, pure.feed_stats)
    assert arb.counter_values() == pure.counter_values()
    assert (arb.expected, arb.highest, arb.holes(), arb.queued_bytes) == (
        pure.expected, pure.highest, pure.holes(), pure.queued_bytes)
    assert arb.next_deadline_ns() == pure.next_deadline_ns()
    # nothing forged is ever delivered
    assert not [e for e in pure_events if isinstance(e, Deliver) and e.message == b"forged"]


def test_catch_up_packets_are_arbitrated_per_message() -> None:
    """The incident's straddling catch-up packet (old messages first, fresh ones after) delivers its tail."""
    messages, arrivals = catch_up_scenario(S1)
    pure = simulate(SpecArbiter(ArbiterConfig()), arrivals)
    arb = Arbiter(ArbiterConfig())
    ring = RecvRing(1, SLOT)

    def through_ring(arbiter: Arbiter, a: Arrival) -> list[Event]:
        ring.load(0, a.data, a.feed, a.time_ns)
        return flatten(arbiter.process(ring, 0, 1))

    native = simulate(arb, arrivals, process=through_ring)
    assert [(d.seq, d.message, d.feed, d.arrival_ns) for d in native.delivered] == [
        (d.seq, d.message, d.feed, d.arrival_ns) for d in pure.delivered]
    assert [d.message for d in native.delivered] == messages and native.events == pure.events


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=200), count=st.integers(0, 0xFFFF), first=st.integers(0, 2**64 - 1),
       expected=st.integers(1, 2**64 - 1), session=st.sampled_from([S1, S2]))
def test_arbitrary_datagrams_get_the_specifications_answer(body: bytes, count: int, first: int, expected: int,
                                                           session: bytes) -> None:
    """Any bytes after any header: the engine reads nothing outside the datagram (it gets a copy of exactly that
    size), and decides what the specification decides — also when it arrives before the first valid packet."""
    packet = m.encode_header(session, first, count) + body
    for joined in (True, False):
        config = ArbiterConfig(start_sequence=expected, max_jump=JUMP)
        arbs = [SpecArbiter(config), Arbiter(config)]
        results = []
        for arb in arbs:
            events = []
            if joined:
                events += flatten(arb.on_packet(Feed.A, m.encode_heartbeat(S1, expected), 0))
            events += flatten(arb.on_packet(Feed.B, packet, 1))
            events += flatten(arb.on_packet(Feed.A, data(1, 2), 2))
            results.append((events, arb.counter_values(), arb.expected, arb.session))
        assert results[0] == results[1]


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=120), count=st.integers(0, 0xFFFF), cut=st.integers(0, 19))
def test_c_block_validation_matches_python(body: bytes, count: int, cut: int) -> None:
    packet = m.encode_header(S1, 1, count) + body
    ours = lib.lbf_mold_valid(ffi.from_buffer("uint8_t[]", packet), len(packet), count)
    assert bool(ours) == (parse_blocks(memoryview(packet), count) is not None)
    short = packet[:cut]  # shorter than the header: refused without reading past it
    assert lib.lbf_mold_valid(ffi.from_buffer("uint8_t[]", short), len(short), count) == 0


def test_ring_messages_are_views_and_queued_ones_copies() -> None:
    arb = Arbiter(ArbiterConfig(confirm=False))  # the session from one datagram: its messages stay ring views
    ring = RecvRing(4, SLOT)
    ring.load(0, data(1, 2), Feed.A, 0)
    ring.load(1, data(5, 3), Feed.A, 1)  # ahead of 3: held (a copy) until confirmed
    ring.load(2, m.encode_heartbeat(S1, 8), Feed.A, 1)  # A continuing after it confirms it: queued
    ring.load(3, data(3, 2), Feed.B, 2)  # fills the hole: the queue drains
    events = arb.process(ring, 0, 4)
    batches = [e for e in events if isinstance(e, DeliverBatch)]
    assert [e.seqs.tolist() for e in batches] == [[1, 2, 3, 4], [5, 6, 7]]
    assert batches[0].buffer is ring.slab and not np.shares_memory(batches[1].buffer, ring.slab)
    assert [(d.seq, d.message, d.feed, d.arrival_ns) for d in flatten(events) if isinstance(d, Deliver)] == [
        (s, content(s), feed, t) for s, feed, t in [(1, Feed.A, 0), (2, Feed.A, 0), (3, Feed.B, 2),
                                                    (4, Feed.B, 2), (5, Feed.A, 1), (6, Feed.A, 1), (7, Feed.A, 1)]]


def test_a_hole_does_not_send_packets_to_python() -> None:
    """While a hole is pending (single-feed loss, the other feed late), the whole batch stays in C: no
    recovery starts, and the batch comes back as one delivery run per source."""
    arb = Arbiter(ArbiterConfig(out_of_order_max_interval=1000, confirm=False), RecoveryConfig(), seed=1)
    ring = RecvRing(64, SLOT)
    slot = 0
    for first in range(1, 200, 5):  # A lost 6-10; B is 30 packets late
        if first != 6:
            ring.load(slot, data(first, 5), Feed.A, slot)
            slot += 1
    ring.load(slot, data(6, 5), Feed.B, slot)
    events = arb.process(ring, 0, slot + 1)
    batches = [e for e in events if isinstance(e, DeliverBatch)]
    assert len(batches) == 2  # 1-10 from the ring (A, then B's copy of 6-10); the rest drained from the queue
    assert np.concatenate([e.seqs for e in batches]).tolist() == list(range(1, 201))
    assert not arb.recovering and arb.requests_sent == 0 and arb.counters.recovery_requests == 0
    assert not arb.holes()


def test_the_engine_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Arbiter().process(RecvRing(4, SLOT), 0, 5)
    with pytest.raises(ValueError):
        Arbiter().on_packet(7, data(1, 1), 0)
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
    events = flatten(arb.process(ring, 0, 16))
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
    arb = Arbiter(ArbiterConfig(confirm=False))
    events = flatten(arb.process(ring, 0, 2))
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


def test_kernel_drops_are_counted_per_feed(udp_pair) -> None:
    rx, tx = udp_pair()
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel's minimum: a few datagrams
    enable_drop_counts(rx)
    for first in range(1, 2001):
        tx.send(data(first, 1) + b"x" * 1000)
    ring = RecvRing(64, 2048)
    while ring.receive(rx, Feed.B):  # what fitted the buffer was queued before the drops: no count yet
        pass
    tx.send(data(2001, 1))  # queued after the drops: the kernel attaches its drop count
    assert receive_all(ring, rx, Feed.B, 1) == 1
    assert ring.kernel_drops[Feed.B] > 0 and ring.kernel_drops[Feed.A] == 0


def test_socket_drops_are_read_at_once_without_a_later_datagram(udp_pair) -> None:
    """SO_MEMINFO's drop count: what the handler reports as kernel_drops, readable as soon as the kernel dropped
    (SO_RXQ_OVFL only comes with the next datagram read)."""
    rx, tx = udp_pair()
    quiet, _ = udp_pair()
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel's minimum: a few datagrams
    for first in range(1, 2001):
        tx.send(data(first, 1) + b"x" * 1000)
    dropped = socket_drops(rx)
    assert dropped is not None and dropped > 0
    assert socket_drops(quiet) == 0


def test_delivery_runs_stay_in_the_engine_and_expire_with_the_next_call() -> None:
    arb = Arbiter(ArbiterConfig(confirm=False))  # the session from one datagram: the first run is a ring view
    ring = RecvRing(4, SLOT)
    ring.load(0, data(1, 3), Feed.A, 7)
    ring.load(1, data(4, 2), Feed.B, 8)
    run = next(e for e in arb.process(ring, 0, 2, runs=True) if isinstance(e, DeliverRun))
    assert len(run) == 5 and run.from_ring and run.first_arrival_ns() == 7
    assert [d.seq for d in run.batch().delivers()] == [1, 2, 3, 4, 5]
    arb.on_tick(9)  # the engine's output is reset: the run must not be used any more
    with pytest.raises(ValueError):
        run.batch()
