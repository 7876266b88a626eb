"""Jumps below ``max_jump``: a live packet past the end of its feed's last packet and past the next expected
sequence is held until its feed continues after it or the other feed announces all of it; its feed continuing
below it reveals it as forged. Nothing a forged datagram announces is published or declared a gap, and honest
loss on one feed costs nothing.

The in-process tests run twice: against the executable specification (pure Python) and against the C engine;
the last two run ``logbuf feed`` as a process against datagrams sent from here (the rig of
test_feed_recovery_cli)."""

from __future__ import annotations

import time

import pytest
from test_feed_recovery_cli import (  # the process rig: its fixture, sender and checks
    PER_PACKET,
    Rig,
    Server,
    end_session,
    marker,
    mold,
    rig,  # noqa: F401  (the fixture)
    send,
    send_stream,
    started,
    wait_for,
)

from logbuf.feed import arbiter as native
from logbuf.feed.arbiter import ArbiterConfig
from logbuf.feed.events import (
    Deliver,
    DeliverBatch,
    EndOfSession,
    Event,
    Feed,
    FeedMode,
    GapDetected,
    GapReason,
    GapUnrecoverable,
    RecoveryRequest,
    SessionChanged,
)
from logbuf.feed.recovery import Jitter, Recovery, RecoveryConfig
from logbuf.feed.spec import SpecArbiter
from logbuf.marketdata import moldudp64 as m

S1 = m.encode_session("FORGE")
S2 = m.encode_session("FORGE2")
MS = 1_000_000
PER = 10  # messages per packet


def _flat(events: list) -> list:
    out = []
    for event in events:
        out.extend(event.delivers() if isinstance(event, DeliverBatch) else [event])
    return out


class NativeFlat(native.Arbiter):
    """The C engine with its delivery batches flattened into Deliver events (as the specification emits)."""

    def __init__(self, config: ArbiterConfig | None = None, recovery: Recovery | None = None) -> None:
        seed = recovery.rng.seed if recovery is not None and isinstance(recovery.rng, Jitter) else 0
        super().__init__(config, None if recovery is None else recovery.config, seed=seed)

    def on_packet(self, *args: object, **kwargs: object) -> list:
        return _flat(super().on_packet(*args, **kwargs))

    def on_tick(self, now_ns: int) -> list:
        return _flat(super().on_tick(now_ns))


Arbiter: type = SpecArbiter  # replaced per test by the fixture below
both = pytest.mark.usefixtures("implementation")


@pytest.fixture(params=["spec", "native"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(globals(), "Arbiter", SpecArbiter if request.param == "spec" else NativeFlat)
    return request.param


def true(seq: int) -> bytes:
    return b"m%d" % seq


def forged(seq: int) -> bytes:
    return b"FORGED-%d" % seq


def pk(first: int, count: int = PER, make=true, session: bytes = S1) -> bytes:  # type: ignore[no-untyped-def]
    return m.encode_downstream(session, first, [make(first + i) for i in range(count)])


def hb(next_sequence: int) -> bytes:
    return m.encode_heartbeat(S1, next_sequence)


class Run:
    """An arbiter and everything it emitted."""

    def __init__(self, recovery: bool = False, **config: object) -> None:
        cfg = ArbiterConfig(**config)  # type: ignore[arg-type]
        self.arb = Arbiter(cfg, Recovery(RecoveryConfig(initial_backoff_ns=0), rng=Jitter(0)) if recovery else None)
        self.events: list[Event] = []
        self.now = 0

    def send(self, feed: Feed, packet: bytes, dt: int = 1_000) -> list[Event]:
        self.now += dt
        out = self.arb.on_packet(feed, packet, self.now)
        self.events += out
        return out

    def tick(self, dt: int) -> None:
        self.now += dt
        self.events += self.arb.on_tick(self.now)

    def stream(self, first: int, last: int, feeds: tuple[Feed, ...] = (Feed.A, Feed.B)) -> None:
        """True packets of PER messages from ``first`` to ``last``, each on every feed in turn."""
        for seq in range(first, last + 1, PER):
            for feed in feeds:
                self.send(feed, pk(seq, min(PER, last + 1 - seq)))

    def delivered(self) -> list[tuple[int, bytes]]:
        return [(e.seq, bytes(e.message)) for e in self.events if isinstance(e, Deliver)]

    def of_type(self, kind: type) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]

    def counter(self, name: str) -> int:
        return int(self.arb.counter_values()[name])


def exact(run: Run, last: int) -> None:
    """The stream is exactly 1..last with the true bytes, each once."""
    assert run.delivered() == [(s, true(s)) for s in range(1, last + 1)]


# -- forged datagrams a little ahead ---------------------------------------------------------------------------


@both
def test_a_forged_packet_a_little_ahead_is_revealed_by_its_feed_continuing_below_it() -> None:
    run = Run()
    run.stream(1, 1000)
    assert run.send(Feed.B, pk(1021, make=forged)) == []  # held: B skipped 1001-1020 to announce it
    run.stream(1001, 1500)  # B's true 1001 is below it: forged
    exact(run, 1500)
    assert run.counter("jumps_held") == 1 and run.counter("jumps_forged") == 1
    assert run.counter("jumps_confirmed") == 0 and not run.of_type(GapDetected)


@both
def test_a_forged_packet_reached_by_the_other_feed_first_loses_to_its_copies() -> None:
    """A's batch is looked at before B's (one round): A reaches the forged packet before B's true traffic can
    reveal it; A's copies win, also where the forged packet straddles A's packets."""
    for forged_first in (1021, 1025):
        run = Run()
        run.stream(1, 1000)
        run.send(Feed.B, pk(forged_first, make=forged))
        run.stream(1001, 1100, feeds=(Feed.A,))
        run.stream(1001, 1100, feeds=(Feed.B,))
        exact(run, 1100)
        assert run.counter("jumps_confirmed") == 1 and run.counter("jumps_forged") == 0


@both
def test_a_forged_packet_a_little_ahead_across_a_hole_is_not_published() -> None:
    """A lost 1001-1010 and B is late: A's packets after the hole are confirmed by A continuing and queued; a
    forged B packet straddling them is cut where A's copies begin and comes after them."""
    run = Run()
    run.stream(1, 1000)
    run.send(Feed.B, pk(1015, make=forged))  # B skipped: held
    for seq in range(1011, 1101, PER):
        run.send(Feed.A, pk(seq))  # 1011 held until 1021 confirms it; 1021 confirms B's forged one (cut at 1021)
    run.stream(1001, 1100, feeds=(Feed.B,))  # B's true copies: 1001-1010 fill the hole
    exact(run, 1100)


@both
def test_a_forged_heartbeat_a_little_ahead_declares_no_gap_and_asks_for_nothing() -> None:
    """Recovery on, slow true traffic after a heartbeat on A announcing 1,000 more: nothing is declared,
    requested or given up; the true stream continues."""
    run = Run(recovery=True)
    run.stream(1, 1000)
    run.send(Feed.A, hb(2001))
    for seq in range(1001, 2001, PER):
        run.stream(seq, seq + PER - 1)
        run.tick(50 * MS)
    exact(run, 2000)
    assert not run.of_type(GapDetected) and not run.of_type(RecoveryRequest)
    assert run.counter("jumps_forged") == 1


@both
def test_a_forged_heartbeat_with_nothing_after_it_is_never_acted_upon() -> None:
    run = Run(recovery=True)
    run.stream(1, 1000)
    run.send(Feed.A, hb(1500))
    run.tick(10_000 * MS)
    assert not run.of_type(GapDetected) and not run.of_type(RecoveryRequest)
    assert run.arb.holes() == []


@both
def test_the_same_forged_packet_on_both_feeds_is_undone_by_its_feeds_going_back() -> None:
    """One forged packet sent on A and on B: the two copies confirm each other, but the jump stays provisional;
    A's true traffic continuing below it reveals it, and nothing of it is published."""
    for ahead in (20, 1000):
        run = Run()
        run.stream(1, 1000)
        run.send(Feed.A, pk(1001 + ahead, make=forged))  # held: A skipped
        run.send(Feed.B, pk(1001 + ahead, make=forged))  # B's copy announces all of it: taken, provisional
        assert run.counter("jumps_confirmed") == 1
        run.stream(1001, 1001 + ahead + 500)
        exact(run, 1001 + ahead + 500)
        assert run.counter("jumps_forged") == 1


@both
def test_the_same_forged_heartbeat_on_both_feeds_gives_nothing_up() -> None:
    """A heartbeat announcing 1,010 more, on A and on B, then slow true traffic and the true end: nothing is
    asked for or given up, and the end of session is the true one."""
    run = Run(recovery=True)
    run.stream(1, 1000)
    run.send(Feed.A, hb(2011))
    run.send(Feed.B, hb(2011))
    for seq in range(1001, 1301, PER):
        run.stream(seq, seq + PER - 1)
        run.tick(50 * MS)
    for feed in (Feed.A, Feed.B):
        run.send(feed, m.encode_end_of_session(S1, 1301))
    run.tick(ArbiterConfig().end_of_session_quiet_ns)
    run.tick(20_000 * MS)
    exact(run, 1300)
    assert not run.of_type(GapUnrecoverable) and not run.of_type(RecoveryRequest)
    assert run.of_type(EndOfSession) == [EndOfSession(S1, 1301)]
    assert run.arb.holes() == [] and run.counter("jumps_forged") == 1


@both
def test_the_same_forged_heartbeat_on_both_feeds_in_a_quiet_market_is_undone_by_the_true_heartbeat() -> None:
    """Nothing but heartbeats: a forged one announcing 1,000 more on A and B is undone by A's true heartbeat
    (its feed going back to what it said before), before anything is given up."""
    run = Run(recovery=True)
    run.stream(1, 1000)
    run.send(Feed.A, hb(2001))
    run.send(Feed.B, hb(2001))
    run.send(Feed.A, hb(1001), dt=MS)
    run.tick(20_000 * MS)
    run.stream(1001, 1100)
    exact(run, 1100)
    assert not run.of_type(GapUnrecoverable) and run.arb.holes() == []
    assert run.counter("jumps_forged") == 1


@both
def test_a_true_jump_on_both_feeds_stands_while_answers_fill_it() -> None:
    """Both feeds lost 1001-1010: their next packets confirm the jump, the feeds continue above it, the answer
    fills the hole; nothing is undone."""
    run = Run(recovery=True)
    run.stream(1, 1000)
    run.send(Feed.A, pk(1011))
    run.send(Feed.B, pk(1011))
    run.stream(1021, 1100)
    run.tick(ArbiterConfig().lost_packet_wait_time_ns)
    assert run.of_type(RecoveryRequest)
    run.send(Feed.RETRANSMIT, pk(1001))
    run.stream(1101, 1200)
    exact(run, 1200)
    assert run.counter("jumps_forged") == 0


# -- honest traffic -------------------------------------------------------------------------------------------------


@both
def test_one_feed_losing_a_packet_costs_nothing() -> None:
    """A loses 1001-1010 with B late: A's next packet is held until A's one after it confirms the jump; B's
    copy fills the hole; nothing declared, nothing forged."""
    run = Run()
    run.stream(1, 1000)
    assert run.send(Feed.A, pk(1011)) == []  # held
    assert run.arb.queued_packets == 0
    run.send(Feed.A, pk(1021))  # A continues after it: both queued
    assert run.arb.queued_packets == 2
    run.stream(1031, 1100, feeds=(Feed.A,))
    run.stream(1001, 1100, feeds=(Feed.B,))
    exact(run, 1100)
    assert run.counter("jumps_held") == 1 and run.counter("jumps_confirmed") == 1
    assert run.counter("jumps_forged") == 0 and not run.of_type(GapDetected)


@both
def test_both_feeds_losing_the_same_packet_confirm_each_other() -> None:
    run = Run()
    run.stream(1, 1000)
    run.send(Feed.A, pk(1011))  # held
    run.send(Feed.B, pk(1011))  # the other feed announcing all of it, itself confirmed by A's: both taken
    assert run.arb.holes() == [(1001, 1010)]
    run.tick(ArbiterConfig().lost_packet_wait_time_ns)
    gaps = run.of_type(GapDetected)
    assert gaps == [GapDetected(S1, 1001, 1010, GapReason.WAIT_TIMEOUT)]
    assert [s for s, _ in run.delivered()] == [*range(1, 1001), *range(1011, 1021)]
    assert run.counter("jumps_forged") == 0


@both
def test_a_repeated_end_of_session_confirms_a_lost_tail_on_a_single_feed() -> None:
    run = Run(mode=FeedMode.A_ONLY)
    run.stream(1, 100, feeds=(Feed.A,))
    eos = m.encode_end_of_session(S1, 121)
    assert run.send(Feed.A, eos) == []  # 101-120 lost, or a forged end: held
    run.send(Feed.A, eos)  # repeated: its feed continues after it
    assert run.arb.holes() == [(101, 120)]


@both
def test_a_late_duplicate_of_an_old_packet_does_not_reveal_a_held_jump() -> None:
    run = Run()
    run.stream(1, 1000)
    run.send(Feed.A, pk(1011))  # A lost 1001-1010: held
    run.send(Feed.A, pk(991))  # a late duplicate of what A sent before: not new traffic below the jump
    run.send(Feed.A, pk(1021))  # A continues after it
    assert run.counter("jumps_forged") == 0 and run.counter("jumps_confirmed") == 1
    run.stream(1031, 1100, feeds=(Feed.A,))
    run.stream(1001, 1100, feeds=(Feed.B,))
    exact(run, 1100)


@both
def test_a_reorder_within_a_feed_falls_back_to_the_other_feed() -> None:
    """A's 1011 overtakes its 1001: held, then taken for forged when 1001 comes; B's copy fills, nothing lost."""
    run = Run()
    run.stream(1, 1000)
    run.send(Feed.A, pk(1011))
    run.send(Feed.A, pk(1001))
    run.stream(1021, 1100, feeds=(Feed.A,))
    run.stream(1001, 1100, feeds=(Feed.B,))
    exact(run, 1100)
    assert run.counter("jumps_forged") == 1 and not run.of_type(GapDetected)


@both
def test_nothing_held_survives_a_session_change() -> None:
    run = Run(session_change_idle_ns=MS)
    run.stream(1, 100)
    run.send(Feed.A, pk(121, make=forged))  # held
    run.send(Feed.A, m.encode_end_of_session(S1, 101))
    run.send(Feed.B, m.encode_end_of_session(S1, 101))
    out = run.send(Feed.A, pk(1, session=S2), dt=2 * MS)
    out += run.send(Feed.B, pk(1, session=S2))  # the new session confirmed by the other feed's copy
    assert SessionChanged(S1, S2, 1) in out
    run.send(Feed.A, pk(21, session=S2))  # held: A skipped 11-20 of the new session
    run.send(Feed.B, pk(11, session=S2))
    run.send(Feed.B, pk(21, session=S2))
    assert [s for s, _ in run.delivered()][100:] == list(range(1, 31))
    assert all(not msg.startswith(b"FORGED") for _, msg in run.delivered())


# -- the handler as a process --------------------------------------------------------------------------------------


def test_process_a_forged_packet_a_little_ahead_is_never_published(rig: Rig) -> None:  # noqa: F811
    server = Server(rig.ports[2], rig.sent)
    server.start()
    try:
        proc = started(rig, "--lost-packet-wait-ms", "100", "--give-up", "10")
        send_stream(rig, 1, 1000)
        wait_for(rig, proc, 1000)
        send(rig, "B", mold(1021, [b"FORGED-%d" % s for s in range(1021, 1031)]))  # 20 ahead, wrong bytes
        for seq in range(1001, 1501, PER_PACKET):
            send_stream(rig, seq, seq + PER_PACKET - 1)
            time.sleep(0.002)
        wait_for(rig, proc, 1500)
        summary = end_session(rig, proc, 1500)
        rig.reader.check_exactly(1500)  # byte-identical: nothing of the forged packet
        assert summary["jumps_held"] >= 1 and summary["gaps_detected"] == 0
    finally:
        server.stop()


def test_process_the_same_forged_packet_on_both_feeds_is_never_published(rig: Rig) -> None:  # noqa: F811
    server = Server(rig.ports[2], rig.sent)
    server.start()
    try:
        proc = started(rig, "--lost-packet-wait-ms", "100", "--give-up", "10")
        send_stream(rig, 1, 1000)
        wait_for(rig, proc, 1000)
        forgery = mold(1021, [b"FORGED-%d" % s for s in range(1021, 1031)])  # 20 ahead, wrong bytes
        send(rig, "A", forgery)
        send(rig, "B", forgery)
        for seq in range(1001, 1501, PER_PACKET):
            send_stream(rig, seq, seq + PER_PACKET - 1)
            time.sleep(0.002)
        wait_for(rig, proc, 1500)
        summary = end_session(rig, proc, 1500)
        rig.reader.check_exactly(1500)  # byte-identical: nothing of the forged packet
        assert summary["jumps_forged"] >= 1
    finally:
        server.stop()


def test_process_a_forged_heartbeat_a_little_ahead_asks_for_nothing(rig: Rig) -> None:  # noqa: F811
    """Slow true traffic after a heartbeat announcing 1,000 more: no gap, no request, nothing given up."""
    server = Server(rig.ports[2], rig.sent)
    server.start()
    try:
        proc = started(rig, "--give-up", "1")
        send_stream(rig, 1, 1000)
        wait_for(rig, proc, 1000)
        send(rig, "A", marker(2001))
        for seq in range(1001, 1301, PER_PACKET):
            send_stream(rig, seq, seq + PER_PACKET - 1)
            time.sleep(0.02)
        wait_for(rig, proc, 1300)
        summary = end_session(rig, proc, 1300)
        rig.reader.check_exactly(1300)
        assert summary["gaps_detected"] == 0 and summary["recovery_requests"] == 0
        assert summary["jumps_forged"] >= 1 and server.requests == 0
    finally:
        server.stop()
