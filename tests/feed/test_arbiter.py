"""The sans-IO arbiter: the classic gap interval, the catch-up incident, per-feed thresholds, heartbeats,
end of session, sessions, the bounded queue, decode errors, statistics.

Every test runs twice: against the executable specification (pure Python) and against the C engine."""

from __future__ import annotations

import dataclasses
import random

import pytest

from logbuf.feed import arbiter as native
from logbuf.feed.arbiter import ArbiterConfig
from logbuf.feed.coverage import Coverage
from logbuf.feed.events import (
    Deliver,
    DeliverBatch,
    EndOfSession,
    Feed,
    FeedMode,
    GapDetected,
    GapReason,
    GapRecovered,
    GapUnrecoverable,
    QueueOverflow,
    RecoveryRequest,
    SessionChanged,
)
from logbuf.feed.recovery import Jitter, Recovery, RecoveryConfig
from logbuf.feed.spec import SpecArbiter
from logbuf.marketdata import moldudp64 as m
from support.arbsim import Arrival, RetransmitStub, catch_up_scenario, packetise, simulate

S1 = m.encode_session("S1")
S2 = m.encode_session("S2")
MS = 1_000_000
WAIT = ArbiterConfig().lost_packet_wait_time_ns


def _flat(events: list) -> list:
    out = []
    for event in events:
        out.extend(event.delivers() if isinstance(event, DeliverBatch) else [event])
    return out


class NativeFlat(native.Arbiter):
    """The C engine with its delivery batches flattened into Deliver events (as the specification emits); given
    the specification's pacing object, it runs the same pacing in C (its settings, its generator's seed)."""

    def __init__(self, config: ArbiterConfig | None = None, recovery: Recovery | None = None) -> None:
        seed = recovery.rng.seed if recovery is not None and isinstance(recovery.rng, Jitter) else 0
        super().__init__(_one_datagram(config), None if recovery is None else recovery.config, seed=seed)


    def on_packet(self, *args: object, **kwargs: object) -> list:
        return _flat(super().on_packet(*args, **kwargs))

    def on_tick(self, now_ns: int) -> list:
        return _flat(super().on_tick(now_ns))


class SpecOne(SpecArbiter):
    """The specification trusting one datagram (see :func:`_one_datagram`)."""

    def __init__(self, config: ArbiterConfig | None = None, recovery: Recovery | None = None) -> None:
        super().__init__(_one_datagram(config), recovery)


def _one_datagram(config: ArbiterConfig | None) -> ArbiterConfig:
    """These tests are about the rules once a session is joined: a session and its end are taken from one
    datagram (confirm=False). Their confirmation by a second datagram is tested in test_feed_session_confirm.py."""
    return dataclasses.replace(config or ArbiterConfig(), confirm=False)


Arbiter: type = SpecArbiter  # replaced per test by the fixture below


@pytest.fixture(autouse=True, params=["spec", "native"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(globals(), "Arbiter", SpecOne if request.param == "spec" else NativeFlat)
    return request.param


def msg(seq: int) -> bytes:
    return b"m%d" % seq


def pk(first: int, count: int = 1, session: bytes = S1) -> bytes:
    return m.encode_downstream(session, first, [msg(first + i) for i in range(count)])


def delivered(events: list) -> list[int]:
    return [e.seq for e in events if isinstance(e, Deliver)]


def others(events: list) -> list:
    return [e for e in events if not isinstance(e, Deliver)]


def joined_at(seq: int, **config: object) -> Arbiter:
    """An arbiter that will take everything below ``seq`` as accepted (start_sequence = seq)."""
    return Arbiter(ArbiterConfig(start_sequence=seq, **config))


# -- gap interval --------------------------------------------------------------------------------------------------


def test_worked_example_gap_interval() -> None:
    """Last accepted 1000, queued 1002, 1005, 1007, 1008 -> gap [1001, 1006]; 1007, 1008 delivered; 1002 and
    1005 dropped (recovery off)."""
    arb = joined_at(1000, out_of_order_max_interval=100)  # only the time criterion may fire here
    assert delivered(arb.on_packet(Feed.A, pk(1000), 0)) == [1000]
    for seq in (1002, 1005, 1007, 1008):
        assert arb.on_packet(Feed.A, pk(seq), 10) == []
    assert arb.on_tick(WAIT - 1) == []  # 1 ns before the wait expires: still waiting
    events = arb.on_tick(WAIT + 10)
    assert others(events) == [
        GapDetected(S1, 1001, 1006, GapReason.WAIT_TIMEOUT),
        GapUnrecoverable(S1, 1001, 1006, GapReason.RECOVERY_OFF),
    ]
    assert delivered(events) == [1007, 1008]
    assert events.index(others(events)[1]) < events.index(next(e for e in events if isinstance(e, Deliver)))
    assert arb.counters.dropped_packets == 2  # 1002 and 1005
    assert arb.expected == 1009
    # the dropped messages arriving late are old news now, never delivered out of order
    assert arb.on_packet(Feed.B, pk(1001, 2), WAIT + 20) == []
    assert arb.stats(Feed.B).duplicates == 2


def test_worked_example_with_recovery_declares_and_fills_each_hole() -> None:
    """With recovery on nothing received is dropped: each hole is declared and re-requested."""
    arb = Arbiter(ArbiterConfig(start_sequence=1000, session="S1", out_of_order_max_interval=100),
                  Recovery(RecoveryConfig(initial_backoff_ns=0), rng=Jitter(0)))
    arb.on_packet(Feed.A, pk(1000), 0)
    for seq in (1002, 1005, 1007, 1008):
        arb.on_packet(Feed.A, pk(seq), 10)
    events = arb.on_tick(WAIT + 10)
    assert others(events) == [
        GapDetected(S1, 1001, 1001, GapReason.WAIT_TIMEOUT),
        GapDetected(S1, 1003, 1004, GapReason.WAIT_TIMEOUT),
        GapDetected(S1, 1006, 1006, GapReason.WAIT_TIMEOUT),
        RecoveryRequest(S1, 1001, 1),
        RecoveryRequest(S1, 1003, 2),
        RecoveryRequest(S1, 1006, 1),
    ]
    out = arb.on_packet(Feed.RETRANSMIT, pk(1003, 2), WAIT + 20)  # answers may come in any order
    assert out == []
    out = arb.on_packet(Feed.RETRANSMIT, pk(1001), WAIT + 30)
    assert delivered(out) == [1001, 1002, 1003, 1004, 1005]
    assert others(out) == [GapRecovered(S1, 1001, 1001), GapRecovered(S1, 1003, 1004)]
    out = arb.on_packet(Feed.RETRANSMIT, pk(1006), WAIT + 40)
    assert delivered(out) == [1006, 1007, 1008]
    assert others(out) == [GapRecovered(S1, 1006, 1006)]
    assert not arb.recovering and not arb.holes() and arb.queued_packets == 0
    assert arb.stats(Feed.RETRANSMIT).delivered == 4


# -- catch-up --------------------------------------------------------------------------------------------------


def seed_002_arrivals() -> list[Arrival]:
    return catch_up_scenario(S1)[1]


def per_packet_handler_losses(arrivals: list[Arrival]) -> set[int]:
    """What the handler of the incident lost: it judged a packet by its first sequence only."""
    expected, got = 1, set()
    for a in sorted(arrivals, key=lambda a: a.time_ns):
        p = m.decode(a.data)
        if p.sequence >= expected:  # in order or ahead: taken whole; a packet starting with old data: trashed
            got.update(range(p.sequence, p.next_sequence))
            expected = p.next_sequence
    return set(range(1, max(got) + 1)) - got


def test_catch_up_packets_deliver_their_fresh_tail() -> None:
    arrivals = seed_002_arrivals()
    assert per_packet_handler_losses(arrivals)  # the scenario does reproduce the incident
    arb = Arbiter(ArbiterConfig())
    result = simulate(arb, arrivals)
    assert result.sequences() == list(range(1, 3001))  # every message exactly once, in order
    assert [b"msg %d" % d.seq for d in result.delivered] == [d.message for d in result.delivered]
    assert result.of_type(GapDetected) == [] and result.of_type(GapUnrecoverable) == []
    # B carried the stream during the freeze, then A's catch-up overtook it
    by_feed = [d.feed for d in result.delivered]
    assert by_feed[1100] == Feed.B and by_feed[-1] == Feed.A
    # the incident: an A catch-up packet that starts with already-delivered messages delivers its fresh tail
    straddlers = []
    delivered_before: dict[int, int] = {}  # arrival -> highest delivered before it
    highest = 0
    for d in result.delivered:
        delivered_before.setdefault(d.arrival_ns, highest)
        highest = d.seq
    for a in arrivals:
        p = m.decode(a.data)
        if a.feed == Feed.A and len(p.messages) == 70 and a.time_ns in delivered_before:
            before = delivered_before[a.time_ns]
            if p.sequence <= before < p.next_sequence - 1:
                straddlers.append((p.sequence, before, p.next_sequence - 1, a.time_ns))
    assert straddlers, "the scenario must contain a catch-up packet starting with old messages"
    first, before, last, arrival = straddlers[0]
    fresh = [d for d in result.delivered if before < d.seq <= last]
    assert fresh and all(d.feed == Feed.A and d.arrival_ns == arrival for d in fresh)
    a, b = arb.stats(Feed.A), arb.stats(Feed.B)
    assert a.delivered + b.delivered == 3000
    assert a.messages - a.duplicates == a.delivered and b.messages - b.duplicates == b.delivered


# -- per-feed thresholds and the two independent criteria -----------------------------------------------------


def test_a_alone_past_the_threshold_does_not_declare_a_gap_b_fills_it() -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1), 0)
    for seq in (3, 4, 5, 6, 7):  # A lost 2; five packets past the hole
        assert others(arb.on_packet(Feed.A, pk(seq), seq)) == []
    events = arb.on_packet(Feed.B, pk(1, 2), 100)  # B (slower) had it
    assert delivered(events) == [2, 3, 4, 5, 6, 7]
    assert others(events) == []
    assert arb.stats(Feed.A).out_of_order == 5


def test_gap_declared_when_the_second_feed_also_exceeds_the_threshold() -> None:
    arb = joined_at(1, out_of_order_max_interval=3)
    arb.on_packet(Feed.A, pk(1), 0)
    for seq in (3, 4, 5, 6):
        arb.on_packet(Feed.A, pk(seq), seq)
    assert others(arb.on_packet(Feed.B, pk(3), 10)) == []  # B: 1 packet past the hole
    assert others(arb.on_packet(Feed.B, pk(4), 11)) == []  # 2
    events = arb.on_packet(Feed.B, pk(5), 12)  # 3: both feeds exceed now
    assert others(events) == [GapDetected(S1, 2, 2, GapReason.SEQUENCE_THRESHOLD),
                              GapUnrecoverable(S1, 2, 2, GapReason.RECOVERY_OFF)]
    assert delivered(events) == [3, 4, 5, 6]


def test_single_feed_mode_uses_only_its_own_threshold_and_ignores_the_other_feed() -> None:
    arb = joined_at(1, mode=FeedMode.A_ONLY, out_of_order_max_interval=2)
    arb.on_packet(Feed.A, pk(1), 0)
    assert arb.on_packet(Feed.B, pk(2), 1) == []  # B is not arbitrated: would have filled the hole
    assert arb.stats(Feed.B).ignored == 1 and arb.stats(Feed.B).messages == 0
    assert others(arb.on_packet(Feed.A, pk(3), 2)) == []
    events = arb.on_packet(Feed.A, pk(4), 3)
    assert others(events)[0] == GapDetected(S1, 2, 2, GapReason.SEQUENCE_THRESHOLD)
    assert delivered(events) == [3, 4]


def test_b_only_mode() -> None:
    arb = joined_at(1, mode=FeedMode.B_ONLY)
    assert arb.on_packet(Feed.A, pk(1), 0) == []
    assert delivered(arb.on_packet(Feed.B, pk(1, 3), 1)) == [1, 2, 3]
    assert arb.stats(Feed.A).ignored == 1


def test_time_criterion_alone_declares_when_the_threshold_is_not_reached() -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1), 0)
    arb.on_packet(Feed.A, pk(3), 1_000)  # one packet past the hole: far from the threshold
    arb.on_packet(Feed.A, m.encode_heartbeat(S1, 4), 1_000)  # A continuing after it confirms the jump to 3
    assert arb.next_deadline_ns() == 1_000 + WAIT
    assert arb.on_tick(1_000 + WAIT - 1) == []
    events = arb.on_tick(1_000 + WAIT)
    assert others(events)[0] == GapDetected(S1, 2, 2, GapReason.WAIT_TIMEOUT)
    assert delivered(events) == [3]


def test_threshold_alone_declares_without_waiting() -> None:
    arb = joined_at(1, out_of_order_max_interval=2)
    arb.on_packet(Feed.A, pk(1), 0)
    out = []
    for t, (feed, seq) in enumerate([(Feed.A, 3), (Feed.B, 3), (Feed.A, 4), (Feed.B, 4)]):
        out += arb.on_packet(feed, pk(seq), 10 + t)  # all within 13 ns
    assert others(out)[0].reason == GapReason.SEQUENCE_THRESHOLD
    assert delivered(out) == [3, 4]


def test_the_wait_restarts_when_the_hole_is_partly_filled() -> None:
    arb = joined_at(1, out_of_order_max_interval=100)
    arb.on_packet(Feed.A, pk(1), 0)
    arb.on_packet(Feed.A, pk(5), 0)  # hole 2..4
    arb.on_packet(Feed.A, m.encode_heartbeat(S1, 6), 0)  # A continuing after it confirms the jump
    assert delivered(arb.on_packet(Feed.B, pk(2), 60 * MS)) == [2]  # partly filled at 60 ms: hole 3..4
    assert arb.on_tick(WAIT + 1) == []  # 100 ms after the first wait began, but only 40 ms into the new one
    events = arb.on_tick(60 * MS + WAIT)
    assert others(events)[0] == GapDetected(S1, 3, 4, GapReason.WAIT_TIMEOUT)


# -- heartbeats and end of session -----------------------------------------------------------------------------


def test_heartbeat_reveals_tail_loss_and_never_advances_expected() -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1, 3), 0)
    assert arb.on_packet(Feed.A, m.encode_heartbeat(S1, 4), 1) == []  # nothing missing
    assert not arb.holes()
    assert arb.on_packet(Feed.A, m.encode_heartbeat(S1, 7), 2) == []  # 4..6 exist and were lost
    assert not arb.holes()  # ... or one forged heartbeat says so: held until confirmed
    assert arb.on_packet(Feed.A, m.encode_heartbeat(S1, 7), 2) == []  # repeated: A continues after it
    assert arb.expected == 4 and arb.holes()
    events = arb.on_tick(2 + WAIT)
    assert others(events) == [GapDetected(S1, 4, 6, GapReason.WAIT_TIMEOUT),
                              GapUnrecoverable(S1, 4, 6, GapReason.RECOVERY_OFF)]
    assert arb.expected == 7
    assert arb.stats(Feed.A).heartbeats == 3


def test_heartbeats_count_toward_the_threshold_and_are_re_requested() -> None:
    arb = Arbiter(ArbiterConfig(session="S1", out_of_order_max_interval=2),
                  Recovery(RecoveryConfig(initial_backoff_ns=0), rng=Jitter(0)))
    arb.on_packet(Feed.A, pk(1), 0)
    for t, feed in enumerate((Feed.A, Feed.B, Feed.A, Feed.B)):
        events = arb.on_packet(feed, m.encode_heartbeat(S1, 5), 10 + t)
    assert others(events) == [GapDetected(S1, 2, 4, GapReason.SEQUENCE_THRESHOLD), RecoveryRequest(S1, 2, 3)]


def test_end_of_session_waits_for_the_last_messages() -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1, 2), 0)
    assert arb.on_packet(Feed.A, m.encode_end_of_session(S1, 5), 1) == []  # 3, 4 still to come
    assert arb.expected == 3
    events = arb.on_packet(Feed.B, pk(2, 3), 2)  # B (late) brings them
    assert delivered(events) == [3, 4] and others(events) == [EndOfSession(S1, 5)]
    assert arb.on_packet(Feed.B, m.encode_end_of_session(S1, 5), 3) == []  # repeated: no second event
    assert arb.stats(Feed.A).end_of_session == 1 and arb.stats(Feed.B).end_of_session == 1


def test_end_of_session_after_an_unrecoverable_tail() -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1, 2), 0)
    arb.on_packet(Feed.A, m.encode_end_of_session(S1, 5), 1)
    arb.on_packet(Feed.A, m.encode_end_of_session(S1, 5), 1)  # repeated: confirms the jump it announces
    events = arb.on_tick(1 + WAIT)
    assert others(events) == [GapDetected(S1, 3, 4, GapReason.WAIT_TIMEOUT),
                              GapUnrecoverable(S1, 3, 4, GapReason.RECOVERY_OFF), EndOfSession(S1, 5)]


# -- sessions ---------------------------------------------------------------------------------------------------


def test_join_and_start_sequence() -> None:
    arb = Arbiter(ArbiterConfig(start_sequence=None))
    events = arb.on_packet(Feed.A, pk(500, 2), 0)
    assert events == [SessionChanged(None, S1, 500), Deliver(500, msg(500), Feed.A, 0),
                      Deliver(501, msg(501), Feed.A, 0)]
    arb = Arbiter(ArbiterConfig())  # start_sequence=1: a late joiner sees the missing head as a gap
    events = arb.on_packet(Feed.A, pk(500, 2), 0)
    assert events == [SessionChanged(None, S1, 1)]
    assert arb.holes() == [(1, 499)]


def test_foreign_session_is_ignored_while_the_current_one_is_live() -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1), 0)
    assert arb.on_packet(Feed.A, pk(1, 1, S2), 1) == []
    assert arb.stats(Feed.A).foreign_session == 1 and arb.session == S1


def test_session_change_after_end_of_session_and_old_packets_ignored_after() -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1, 3), 0)
    assert arb.on_packet(Feed.A, m.encode_end_of_session(S1, 4), 1) == [EndOfSession(S1, 4)]
    events = arb.on_packet(Feed.A, pk(1, 2, S2), 2)
    assert events == [SessionChanged(S1, S2, 1), Deliver(1, msg(1), Feed.A, 2), Deliver(2, msg(2), Feed.A, 2)]
    assert arb.on_packet(Feed.B, pk(3, 1, S1), 3) == []  # B, late, still on the retired session
    assert arb.stats(Feed.B).foreign_session == 1
    assert arb.counters.session_changes == 2


def test_session_change_after_silence_gives_up_the_old_holes() -> None:
    idle = ArbiterConfig().session_change_idle_ns
    arb = joined_at(1, lost_packet_wait_time_ns=10 * idle)  # the hole is still being waited for
    arb.on_packet(Feed.A, pk(1), 0)
    arb.on_packet(Feed.A, pk(3), 10)  # 2 missing, no end of session
    arb.on_packet(Feed.A, m.encode_heartbeat(S1, 4), 10)  # confirms the jump to 3
    assert arb.on_packet(Feed.A, pk(1, 1, S2), 10 + idle - 1) == []  # not silent long enough
    events = arb.on_packet(Feed.A, pk(1, 1, S2), 10 + idle)
    assert others(events) == [GapDetected(S1, 2, 2, GapReason.SESSION_CHANGE),
                              GapUnrecoverable(S1, 2, 2, GapReason.SESSION_CHANGE), SessionChanged(S1, S2, 1)]
    assert delivered(events) == [3, 1]  # S1's queued 3 first, then S2 from 1


def test_pinned_session_never_switches() -> None:
    arb = Arbiter(ArbiterConfig(session="S1", session_change_idle_ns=1))
    arb.on_packet(Feed.A, pk(1), 0)
    arb.on_packet(Feed.A, m.encode_end_of_session(S1, 2), 1)
    assert arb.on_packet(Feed.A, pk(1, 1, S2), 10**12) == []
    assert arb.session == S1


# -- bounded queue ------------------------------------------------------------------------------------------------


def test_queue_overflow_with_recovery_off_gives_up_the_oldest_holes() -> None:
    arb = Arbiter(ArbiterConfig(session="S1", max_queue_packets=4, out_of_order_max_interval=100))
    # holes 1..2, 4, 6, 8, 10; each jump is held until the next packet confirms it: 3, 5, 7, 9 queued, 11 held
    for seq in (3, 5, 7, 9, 11):
        assert arb.on_packet(Feed.A, pk(seq), seq) == [SessionChanged(None, S1, 1)] * (seq == 3)
    events = arb.on_packet(Feed.A, pk(13), 13)  # confirms 11, which does not fit
    assert events == [
        QueueOverflow(S1, 4, 4),
        GapDetected(S1, 1, 2, GapReason.QUEUE_OVERFLOW), GapUnrecoverable(S1, 1, 2, GapReason.QUEUE_OVERFLOW),
        Deliver(3, msg(3), Feed.A, 3),
        GapDetected(S1, 4, 4, GapReason.QUEUE_OVERFLOW), GapUnrecoverable(S1, 4, 4, GapReason.QUEUE_OVERFLOW),
        Deliver(5, msg(5), Feed.A, 5),
    ]
    assert arb.queued_packets == 3  # 7, 9 and 11
    assert arb.counters.queue_overflows == 1


# -- decode errors and statistics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("packet", [
    b"",
    b"S1        " + (1).to_bytes(8, "big"),  # short header
    pk(1, 2)[:-1],  # last block runs past the end
    pk(1, 2) + b"x",  # bytes left over
    m.encode_header(S1, 1, 3) + pk(1, 2)[20:],  # fewer blocks than announced
    m.encode_heartbeat(S1, 1) + b"\x00",  # heartbeat with a body
    m.encode_header(S1, 0, 1) + b"\x00\x01z",  # sequence 0
    m.encode_header(S1, 2**64 - 1, 1) + b"\x00\x01z",  # next sequence would not fit in 64 bits
])
def test_malformed_packets_are_counted_and_change_nothing(packet: bytes) -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1), 0)
    assert arb.on_packet(Feed.A, packet, 1) == []
    assert arb.stats(Feed.A).decode_errors == 1
    assert arb.expected == 2 and not arb.holes()


def test_truncated_datagram_is_a_decode_error() -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1), 0)
    assert arb.on_packet(Feed.A, pk(2), 1, truncated=True) == []
    assert arb.stats(Feed.A).decode_errors == 1 and arb.expected == 2


def test_per_feed_statistics_and_b_minus_a_delay() -> None:
    arb = joined_at(1)
    arb.on_packet(Feed.A, pk(1, 4), 1_000)
    arb.on_packet(Feed.B, pk(1, 2), 1_700)  # B 700 ns later
    arb.on_packet(Feed.B, pk(3, 4), 1_900)  # 3, 4 are duplicates (B 900 ns later); 5, 6 fresh
    arb.on_packet(Feed.A, pk(5, 2), 2_000)  # A 100 ns later than B
    arb.on_packet(Feed.A, pk(5, 1), 2_500)  # a second duplicate of 5 on A: not paired again
    a, b = arb.stats(Feed.A), arb.stats(Feed.B)
    assert (a.packets, a.messages, a.delivered, a.duplicates) == (3, 7, 4, 3)
    assert (b.packets, b.messages, b.delivered, b.duplicates) == (2, 6, 2, 4)
    assert a.bytes == len(pk(1, 4)) + len(pk(5, 2)) + len(pk(5, 1))
    values = arb.counter_values()
    assert values["ab_delay_count"] == 6
    assert values["ab_delay_sum_ns"] == 700 * 2 + 900 * 2 - 100 * 2  # B - A: positive when A came first
    assert (values["ab_delay_min_ns"], values["ab_delay_max_ns"]) == (-100, 900)


def test_decoded_packets_are_accepted_too() -> None:
    arb = joined_at(1)
    assert delivered(arb.on_packet(Feed.A, m.decode(pk(1, 2)), 0)) == [1, 2]
    assert arb.on_packet(Feed.A, m.Heartbeat(S1, 3), 1) == []


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        ArbiterConfig(out_of_order_max_interval=0)
    with pytest.raises(ValueError):
        ArbiterConfig(lost_packet_wait_time_ns=0)
    with pytest.raises(ValueError):
        ArbiterConfig(start_sequence=0)
    with pytest.raises(ValueError):
        ArbiterConfig(session="ELEVEN_CHRS")
    with pytest.raises(ValueError):
        Arbiter().on_packet(7, pk(1), 0)


# -- Coverage (the queued-interval set behind the holes) -------------------------------------------------------


def test_coverage_merges_and_reports_holes() -> None:
    rng = random.Random(3)
    for _ in range(200):
        cov, present = Coverage(), set()
        for _ in range(rng.randrange(1, 12)):
            first = rng.randrange(1, 60)
            last = first + rng.randrange(0, 5)
            cov.add(first, last)
            present.update(range(first, last + 1))
        lo = rng.randrange(1, 30)
        cov.trim_below(lo)
        present = {s for s in present if s >= lo}
        assert all(e + 1 < s for e, s in zip(cov.ends, cov.starts[1:], strict=False))  # disjoint, not adjacent
        assert {s for a, b in zip(cov.starts, cov.ends, strict=True) for s in range(a, b + 1)} == present
        missing = [s for s in range(lo, 70) if s not in present]
        holes = cov.holes(lo, 69, 1000)
        assert [s for a, b in holes for s in range(a, b + 1)] == missing


# -- recovery through the arbiter (the retransmission stub answers like RetransmitCore) --------------------------


def test_recovery_fills_a_double_loss_and_reports_it_recovered() -> None:
    messages = [msg(i) for i in range(1, 201)]
    arrivals = []
    for k, (_, _, data) in enumerate(packetise(S1, 1, messages, iter(lambda: 4, None))):
        if k not in (10, 11):  # lost on both feeds
            arrivals += [Arrival(k * 10_000, Feed.A, data), Arrival(k * 10_000 + 2_000, Feed.B, data)]
    server = RetransmitStub(S1, messages, budget=m.HEADER_LENGTH + 5 * (2 + 3))  # 5 messages per answer
    arb = Arbiter(ArbiterConfig(), Recovery(rng=Jitter(9)))
    result = simulate(arb, arrivals, server)
    assert result.sequences() == list(range(1, 201))
    assert result.of_type(GapDetected) == [GapDetected(S1, 41, 48, GapReason.SEQUENCE_THRESHOLD)]
    assert result.of_type(GapRecovered) == [GapRecovered(S1, 41, 48)]
    assert server.requests == [(41, 8), (46, 3)]  # the answer carried 5: the rest is asked for at once
    assert arb.stats(Feed.RETRANSMIT).delivered == 8


def test_queue_pressure_sheds_packets_and_recovery_fetches_them_again() -> None:
    """A full queue never makes a recoverable message unrecoverable: what does not fit is not queued, its range
    stays a hole, and the server's answers fill it."""
    arb = Arbiter(ArbiterConfig(session="S1", max_queue_packets=4, out_of_order_max_interval=100),
                  Recovery(RecoveryConfig(initial_backoff_ns=0), rng=Jitter(1)))
    arb.on_packet(Feed.A, pk(1), 0)
    for seq in (4, 5, 6):
        arb.on_packet(Feed.A, pk(seq), 1)  # hole [2, 3]
    assert others(arb.on_tick(WAIT + 1)) == [GapDetected(S1, 2, 3, GapReason.WAIT_TIMEOUT),
                                             RecoveryRequest(S1, 2, 2)]
    events = []
    for seq in (7, 8, 9, 10):  # 7 fills the queue; 8, 9, 10 are shed
        events += arb.on_packet(Feed.A, pk(seq), WAIT + 2)
    assert events == [QueueOverflow(S1, 4, 4)]  # one per episode of a full queue, and nothing given up
    assert (arb.queued_packets, arb.counters.shed_packets, arb.counters.queue_overflows) == (4, 3, 1)
    assert arb.holes() == [(2, 3), (8, 10)]
    events = arb.on_packet(Feed.RETRANSMIT, pk(2, 2), WAIT + 3)
    assert delivered(events) == [2, 3, 4, 5, 6, 7]
    assert GapRecovered(S1, 2, 3) in events
    # the shed range is a hole like any other: declared after the wait and re-requested
    assert others(arb.on_tick(2 * WAIT + 2)) == [GapDetected(S1, 8, 10, GapReason.WAIT_TIMEOUT),
                                                 RecoveryRequest(S1, 8, 3)]
    events = arb.on_packet(Feed.RETRANSMIT, pk(8, 3), 2 * WAIT + 3)
    assert delivered(events) == [8, 9, 10]
    assert GapRecovered(S1, 8, 10) in events
    assert arb.counters.gaps_unrecoverable == 0 and arb.holes() == []


def test_an_older_shorter_request_does_not_cut_the_answer_to_a_newer_one() -> None:
    """The hole's front was filled by a late live packet: a request from the hole's new start would reach over
    the start of the next request in flight, not answered yet, so it waits for that one (a packet the server
    sent for it could start where the new one starts). Once those are due, the next request starts inside the
    older one: its answer is accepted up to the newer request's end (cut at the older one's, it would look like a
    full packet of 5 and every later request would ask for 5)."""
    arb = Arbiter(ArbiterConfig(session="S1", out_of_order_max_interval=100),
                  Recovery(RecoveryConfig(initial_backoff_ns=0, max_request_count=10), rng=Jitter(0)))
    arb.on_packet(Feed.A, pk(1), 0)
    arb.on_packet(Feed.A, pk(82), 10)  # hole [2, 81]
    arb.on_packet(Feed.A, m.encode_heartbeat(S1, 83), 10)  # A continuing after it confirms the jump
    requests = [e for e in arb.on_tick(WAIT + 10) if isinstance(e, RecoveryRequest)]
    assert [(r.seq, r.count) for r in requests] == [(s, 10) for s in range(2, 82, 10)]
    events = arb.on_packet(Feed.B, pk(2, 5), WAIT + 20)  # B's copy of the front arrives late: the hole is [7, 81]
    assert delivered(events) == [2, 3, 4, 5, 6]
    assert others(events) == []  # [7, 16] would reach over [12, 21] in flight
    retry = RecoveryConfig().retry_interval_ns
    assert RecoveryRequest(S1, 7, 10) in arb.on_tick(WAIT + 10 + retry)  # due again: from the hole's start
    events = arb.on_packet(Feed.RETRANSMIT, pk(7, 10), WAIT + 30 + retry)  # inside the older request [2, 11]
    assert delivered(events) == list(range(7, 17))
    assert arb.stats(Feed.RETRANSMIT).delivered == 10
