"""Sessions, the --join live start point and END_OF_SESSION act only when a second datagram confirms them.

One valid datagram of another session, one forged END_OF_SESSION, or one forged packet far ahead as the first
thing a live join sees must never be published; honest traffic is held at most one datagram at the start.
Every test runs against the executable specification and against the C engine (the same events)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logbuf.feed import arbiter as native
from logbuf.feed.arbiter import ArbiterConfig
from logbuf.feed.events import Deliver, DeliverBatch, EndOfSession, Feed, FeedMode, SessionChanged
from logbuf.feed.spec import SpecArbiter
from logbuf.marketdata import moldudp64 as m

TRUE = m.encode_session("TRUESESS01")
EVIL = m.encode_session("EVILSESS01")
NEXT = m.encode_session("NEXTSESS02")
MS = 1_000_000
QUIET = ArbiterConfig().end_of_session_quiet_ns


class NativeFlat(native.Arbiter):
    """The C engine with its delivery batches flattened into Deliver events (as the specification emits)."""

    def on_packet(self, *args: object, **kwargs: object) -> list:
        return _flat(super().on_packet(*args, **kwargs))

    def on_tick(self, now_ns: int) -> list:
        return _flat(super().on_tick(now_ns))


def _flat(events: list) -> list:
    out = []
    for event in events:
        out.extend(event.delivers() if isinstance(event, DeliverBatch) else [event])
    return out


@pytest.fixture(params=["spec", "native"])
def make(request: pytest.FixtureRequest) -> type:
    return SpecArbiter if request.param == "spec" else NativeFlat


def pk(first: int, count: int = 1, session: bytes = TRUE, tag: bytes = b"T") -> bytes:
    return m.encode_downstream(session, first, [tag + b"%d" % (first + i) for i in range(count)])


def hb(next_sequence: int, session: bytes = TRUE) -> bytes:
    return m.encode_heartbeat(session, next_sequence)


def eos(next_sequence: int, session: bytes = TRUE) -> bytes:
    return m.encode_end_of_session(session, next_sequence)


def delivered(events: list) -> list[tuple[int, bytes]]:
    return [(e.seq, bytes(e.message)) for e in events if isinstance(e, Deliver)]


def kinds(events: list, kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def run(arb: object, traffic: list[tuple[Feed, bytes]], start_ns: int = 0, step_ns: int = MS) -> list:
    out: list = []
    for i, (feed, data) in enumerate(traffic):
        out += arb.on_packet(feed, data, start_ns + i * step_ns)  # type: ignore[attr-defined]
    return out


# -- forged datagrams ------------------------------------------------------------------------------------------


def test_one_datagram_of_another_session_first_never_chooses_the_session(make: type) -> None:
    arb = make(ArbiterConfig())
    events = run(arb, [(Feed.A, pk(1, 2, EVIL, b"EVIL-"))])
    assert events == []  # held: nothing joined, nothing published
    events += run(arb, [(f, pk(s, 10)) for s in range(1, 41, 10) for f in (Feed.A, Feed.B)], start_ns=MS)
    assert [s.session for s in kinds(events, SessionChanged)] == [TRUE]
    assert delivered(events) == [(s, b"T%d" % s) for s in range(1, 41)]
    assert arb.counters.sessions_forged == 1 and arb.counters.session_changes == 1


def test_a_forged_session_between_sessions_is_never_switched_to(make: type) -> None:
    arb = make(ArbiterConfig())
    events = run(arb, [(Feed.A, pk(1, 5)), (Feed.B, pk(1, 5)), (Feed.A, eos(6)), (Feed.B, eos(6))])
    assert kinds(events, EndOfSession) == []  # not before the quiet period, or the feeds moving on
    events = run(arb, [(Feed.A, pk(1, 2, EVIL, b"EVIL-")), (Feed.A, pk(1, 5, NEXT)), (Feed.B, pk(1, 5, NEXT))],
                 start_ns=10 * MS)
    assert kinds(events, EndOfSession) == [EndOfSession(TRUE, 6)]  # the feeds moved to a confirmed session
    assert [(s.previous, s.session) for s in kinds(events, SessionChanged)] == [(TRUE, NEXT)]
    assert delivered(events) == [(s, b"T%d" % s) for s in range(1, 6)]
    assert arb.counters.sessions_forged == 1


@pytest.mark.parametrize("ahead", [0, 500])
def test_a_forged_end_of_session_is_revealed_by_the_traffic_past_it(make: type, ahead: int) -> None:
    arb = make(ArbiterConfig())
    events = run(arb, [(f, pk(s, 10)) for s in range(1, 101, 10) for f in (Feed.A, Feed.B)])
    events += arb.on_packet(Feed.A, eos(101 + ahead), 30 * MS)
    # the true stream goes on on both feeds (every 5 ms a datagram)
    events += run(arb, [(f, pk(s, 10)) for s in range(101, 701, 10) for f in (Feed.A, Feed.B)],
                  start_ns=31 * MS, step_ns=5 * MS)
    assert kinds(events, EndOfSession) == []
    # at the next sequence it waits as an end to confirm; ahead, its feed skipped sequences to announce it, so it
    # is held as a jump: either way the traffic past (or below) it reveals it
    revealed = arb.counters.ends_forged if ahead == 0 else arb.counters.jumps_forged
    assert revealed == 1
    assert [s for s, _ in delivered(events)] == list(range(1, 701))
    # the true end, on both feeds, acts once the quiet period passed without traffic past it
    assert run(arb, [(Feed.A, eos(701)), (Feed.B, eos(701))], start_ns=10_000 * MS) == []
    assert arb.on_tick(10_000 * MS + QUIET) == [EndOfSession(TRUE, 701)]


def test_a_forged_end_of_session_on_both_feeds_is_revealed_by_the_traffic_past_it(make: type) -> None:
    """The same forged END_OF_SESSION on A and on B: two copies are no confirmation; the true stream going on
    reveals both, and only the true end is published."""
    arb = make(ArbiterConfig())
    events = run(arb, [(f, pk(s, 10)) for s in range(1, 101, 10) for f in (Feed.A, Feed.B)])
    events += run(arb, [(Feed.A, eos(101)), (Feed.B, eos(101)), (Feed.A, eos(101))], start_ns=30 * MS)
    events += run(arb, [(f, pk(s, 10)) for s in range(101, 301, 10) for f in (Feed.A, Feed.B)],
                  start_ns=40 * MS, step_ns=5 * MS)
    assert kinds(events, EndOfSession) == [] and arb.counters.ends_forged == 2
    assert [s for s, _ in delivered(events)] == list(range(1, 301))
    events = run(arb, [(Feed.A, eos(301)), (Feed.B, eos(301))], start_ns=5_000 * MS)
    events += arb.on_tick(5_000 * MS + QUIET)
    assert kinds(events, EndOfSession) == [EndOfSession(TRUE, 301)]


def test_an_end_of_session_below_what_was_published_is_revealed_by_the_stream_going_on(make: type) -> None:
    """An END_OF_SESSION on both feeds 50 below what was published: the true stream going on past it reveals it."""
    arb = make(ArbiterConfig())
    run(arb, [(f, pk(s, 10)) for s in range(1, 101, 10) for f in (Feed.A, Feed.B)])
    assert run(arb, [(Feed.A, eos(50)), (Feed.B, eos(50))], start_ns=300 * MS) == []
    events = run(arb, [(f, pk(s, 10)) for s in range(101, 121, 10) for f in (Feed.A, Feed.B)], start_ns=302 * MS)
    events += arb.on_tick(300 * MS + 10 * QUIET)
    assert kinds(events, EndOfSession) == [] and arb.counters.ends_forged == 2
    assert [s for s, _ in delivered(events)] == list(range(101, 121))


def test_a_forged_end_of_session_while_its_feed_is_silent_is_revealed_by_the_other_feed(make: type) -> None:
    """A forged END_OF_SESSION on A, then A freezes while B carries the session on past it: B's traffic past
    the end reveals it; nothing ends."""
    arb = make(ArbiterConfig())
    run(arb, [(f, pk(s, 10)) for s in range(1, 101, 10) for f in (Feed.A, Feed.B)])
    events = arb.on_packet(Feed.A, eos(101), 300 * MS)
    events += run(arb, [(Feed.B, pk(s, 10)) for s in range(101, 201, 10)], start_ns=301 * MS, step_ns=200 * MS)
    events += arb.on_tick(300 * MS + 10 * QUIET)
    assert kinds(events, EndOfSession) == [] and arb.counters.ends_forged == 1
    assert [s for s, _ in delivered(events)] == list(range(101, 201))


def test_a_forged_end_of_session_on_a_quiet_feed_waits_for_the_quiet_period(make: type) -> None:
    """A lone END_OF_SESSION acts only after end_of_session_quiet_ns without traffic past it on its feed."""
    arb = make(ArbiterConfig())
    run(arb, [(Feed.A, pk(1, 10)), (Feed.B, pk(1, 10))])
    assert arb.on_packet(Feed.A, eos(11), 10 * MS) == []
    assert arb.next_deadline_ns() == 10 * MS + QUIET
    assert arb.on_tick(10 * MS + QUIET - 1) == []
    events = arb.on_packet(Feed.A, pk(11, 10), 10 * MS + QUIET - 1)  # the true stream goes on: revealed
    assert [s for s, _ in delivered(events)] == list(range(11, 21))
    assert arb.on_tick(10 * MS + 10 * QUIET) == [] and arb.counters.ends_forged == 1


def test_join_live_never_starts_at_one_forged_datagram_far_ahead(make: type) -> None:
    arb = make(ArbiterConfig(start_sequence=None))
    assert arb.on_packet(Feed.A, pk(10**9, 1, tag=b"EVIL-"), 0) == []
    events = run(arb, [(f, pk(s, 10)) for s in range(5001, 5101, 10) for f in (Feed.A, Feed.B)], start_ns=MS)
    assert kinds(events, SessionChanged) == [SessionChanged(None, TRUE, 5001)]
    assert delivered(events) == [(s, b"T%d" % s) for s in range(5001, 5101)]
    assert arb.expected == 5101 and arb.counters.sessions_forged == 1


def test_join_from_start_holds_one_forged_datagram_far_ahead(make: type) -> None:
    arb = make(ArbiterConfig())
    assert arb.on_packet(Feed.A, pk(10**9, 1, tag=b"EVIL-"), 0) == []
    events = run(arb, [(f, pk(s, 10)) for s in range(1, 101, 10) for f in (Feed.A, Feed.B)], start_ns=MS)
    assert kinds(events, SessionChanged) == [SessionChanged(None, TRUE, 1)]
    assert [s for s, _ in delivered(events)] == list(range(1, 101))


# -- honest traffic --------------------------------------------------------------------------------------------


def test_a_session_starts_with_the_other_feeds_copy(make: type) -> None:
    arb = make(ArbiterConfig())
    assert arb.on_packet(Feed.A, pk(1, 10), 0) == []  # one datagram: held
    events = arb.on_packet(Feed.B, pk(1, 10), 100_000)
    assert events[0] == SessionChanged(None, TRUE, 1)
    assert [s for s, _ in delivered(events)] == list(range(1, 11))
    assert arb.stats(Feed.A).delivered == 10 and arb.stats(Feed.B).duplicates == 10
    assert arb.stats(Feed.A).packets == 1 and arb.stats(Feed.A).foreign_session == 0
    assert arb.counters.sessions_forged == 0


def test_a_session_starts_with_the_same_feeds_next_datagram_once_the_other_feed_is_silent(make: type) -> None:
    """Feed B lost: two datagrams of one feed are one source, so A's datagrams are held until B has been silent
    for the quiet period; then A's next one confirms them and nothing A carried is lost."""
    arb = make(ArbiterConfig())
    assert arb.on_packet(Feed.A, pk(1, 10), 0) == []
    assert arb.on_packet(Feed.A, pk(11, 10), MS) == []  # B may still send its copy: held behind the first
    assert arb.on_packet(Feed.A, pk(11, 10), 2 * MS) == []  # a repeat: nothing new
    events = arb.on_packet(Feed.A, pk(21, 10), QUIET)
    assert [s for s, _ in delivered(events)] == list(range(1, 31))
    assert arb.counters.sessions_forged == 0


def test_a_single_feed_session_starts_with_its_next_datagram(make: type) -> None:
    arb = make(ArbiterConfig(mode=FeedMode.A_ONLY))
    assert arb.on_packet(Feed.A, pk(1, 10), 0) == []
    events = arb.on_packet(Feed.A, pk(11, 10), MS)
    assert [s for s, _ in delivered(events)] == list(range(1, 21))


def test_a_session_starts_with_the_other_feeds_copy_and_what_the_first_feed_held(make: type) -> None:
    """B lags: A's first datagrams wait for B's copy of the first, then all of A's go out (A's copies win)."""
    arb = make(ArbiterConfig())
    run(arb, [(Feed.A, pk(s, 10)) for s in range(1, 41, 10)])
    events = arb.on_packet(Feed.B, pk(1, 10), 5 * MS)
    assert [(e.seq, e.feed) for e in events if isinstance(e, Deliver)] == [(s, Feed.A) for s in range(1, 41)]


def test_a_heartbeat_first_then_data_joins_live_at_its_next_sequence(make: type) -> None:
    arb = make(ArbiterConfig(start_sequence=None))
    assert arb.on_packet(Feed.A, hb(5001), 0) == []
    events = arb.on_packet(Feed.B, pk(5001, 5), MS)
    assert kinds(events, SessionChanged) == [SessionChanged(None, TRUE, 5001)]
    assert [s for s, _ in delivered(events)] == list(range(5001, 5006))


def test_join_live_starts_at_the_first_datagram_seen_once_confirmed(make: type) -> None:
    arb = make(ArbiterConfig(start_sequence=None))
    assert arb.on_packet(Feed.A, pk(5011, 10), 0) == []
    events = arb.on_packet(Feed.B, pk(5001, 10), MS)  # B lags: confirms A's (within max_jump), is older
    assert kinds(events, SessionChanged) == [SessionChanged(None, TRUE, 5011)]
    assert [s for s, _ in delivered(events)] == list(range(5011, 5021))


def test_a_single_feed_session_ends_after_the_quiet_period(make: type) -> None:
    arb = make(ArbiterConfig(mode=FeedMode.A_ONLY))
    events = run(arb, [(Feed.A, pk(s, 10)) for s in range(1, 31, 10)])
    assert [s for s, _ in delivered(events)] == list(range(1, 31))
    assert arb.on_packet(Feed.A, eos(31), 10 * MS) == []
    assert arb.on_tick(10 * MS + QUIET - 1) == []
    assert arb.on_tick(10 * MS + QUIET) == [EndOfSession(TRUE, 31)]
    assert arb.counters.ends_forged == 0


def test_an_end_of_session_repeated_on_the_same_feed_still_waits_for_the_quiet_period(make: type) -> None:
    """A forger can repeat a datagram as easily as a server: the quiet period counts from the first copy."""
    arb = make(ArbiterConfig(mode=FeedMode.A_ONLY))
    run(arb, [(Feed.A, pk(1, 10)), (Feed.A, pk(11, 10))])
    assert arb.on_packet(Feed.A, eos(21), 10 * MS) == []
    assert arb.on_packet(Feed.A, eos(21), 11 * MS) == []
    assert arb.on_tick(10 * MS + QUIET - 1) == []
    assert arb.on_tick(10 * MS + QUIET) == [EndOfSession(TRUE, 21)]


def test_an_end_of_session_with_its_tail_lost_acts_once_the_tail_is_in(make: type) -> None:
    arb = make(ArbiterConfig())
    run(arb, [(Feed.A, pk(1, 10)), (Feed.B, pk(1, 10))])
    assert kinds(run(arb, [(Feed.A, eos(21)), (Feed.B, eos(21))], start_ns=5 * MS), EndOfSession) == []
    events = arb.on_packet(Feed.B, pk(11, 10), 8 * MS)
    assert [s for s, _ in delivered(events)] == list(range(11, 21))
    assert kinds(events, EndOfSession) == []  # the tail is not past the end: the quiet period goes on
    assert arb.on_tick(5 * MS + QUIET) == [EndOfSession(TRUE, 21)]


def test_a_session_switch_after_the_end_is_confirmed_by_the_other_feed(make: type) -> None:
    arb = make(ArbiterConfig())
    run(arb, [(Feed.A, pk(1, 5)), (Feed.B, pk(1, 5)), (Feed.A, eos(6)), (Feed.B, eos(6))])
    assert arb.on_packet(Feed.A, pk(1, 3, NEXT), 10 * MS) == []  # held
    events = arb.on_packet(Feed.B, pk(1, 3, NEXT), 11 * MS)
    assert kinds(events, SessionChanged) == [SessionChanged(TRUE, NEXT, 1)]
    assert [s for s, _ in delivered(events)] == [1, 2, 3]


def test_a_single_feed_moving_to_a_new_session_confirms_its_end(make: type) -> None:
    """One feed: END_OF_SESSION, then at once the next session's datagrams on that feed — the new session,
    confirmed by its second datagram, confirms the end (no wait for the quiet period)."""
    arb = make(ArbiterConfig(mode=FeedMode.A_ONLY))
    run(arb, [(Feed.A, pk(1, 5)), (Feed.A, pk(6, 5))])
    assert arb.on_packet(Feed.A, eos(11), 10 * MS) == []
    assert arb.on_packet(Feed.A, pk(1, 3, NEXT), 11 * MS) == []  # held
    events = arb.on_packet(Feed.A, pk(4, 3, NEXT), 12 * MS)
    assert [e for e in events if not isinstance(e, Deliver)] == [EndOfSession(TRUE, 11),
                                                                 SessionChanged(TRUE, NEXT, 1)]
    assert [s for s, _ in delivered(events)] == list(range(1, 7))


def test_one_forged_datagram_of_a_new_session_does_not_confirm_a_forged_end(make: type) -> None:
    arb = make(ArbiterConfig(mode=FeedMode.A_ONLY))
    run(arb, [(Feed.A, pk(1, 5)), (Feed.A, pk(6, 5))])
    events = run(arb, [(Feed.A, eos(11)), (Feed.A, pk(1, 2, EVIL, b"EVIL-")), (Feed.A, pk(11, 5))], start_ns=MS)
    assert [s for s, _ in delivered(events)] == list(range(11, 16))
    assert kinds(events, EndOfSession) == [] and kinds(events, SessionChanged) == []
    assert (arb.counters.ends_forged, arb.counters.sessions_forged) == (1, 1)


def test_a_switch_after_silence_still_needs_a_confirmation(make: type) -> None:
    idle = ArbiterConfig().session_change_idle_ns
    arb = make(ArbiterConfig())
    run(arb, [(Feed.A, pk(1, 5)), (Feed.B, pk(1, 5))])
    # the current session silent past the idle time: one forged datagram of another session is held, and the
    # true session resuming on that feed reveals it
    assert arb.on_packet(Feed.A, pk(1, 2, EVIL, b"EVIL-"), idle + 10 * MS) == []
    events = run(arb, [(Feed.A, pk(6, 5)), (Feed.B, pk(6, 5))], start_ns=idle + 11 * MS)
    assert kinds(events, SessionChanged) == [] and [s for s, _ in delivered(events)] == list(range(6, 11))
    assert arb.counters.sessions_forged == 1
    # silent again: a true new session on one feed switches with its second datagram
    later = 2 * idle + 20 * MS
    assert arb.on_packet(Feed.A, pk(1, 3, NEXT), later) == []
    events = arb.on_packet(Feed.A, pk(4, 3, NEXT), later + MS)
    assert kinds(events, SessionChanged) == [SessionChanged(TRUE, NEXT, 1)]
    assert [s for s, _ in delivered(events)] == list(range(1, 7))


def test_trusting_one_datagram_is_a_setting(make: type) -> None:
    """confirm=False: a feed nobody can inject into starts, and ends, on one datagram."""
    arb = make(ArbiterConfig(mode=FeedMode.A_ONLY, confirm=False))
    events = arb.on_packet(Feed.A, pk(1, 3), 0)
    assert [s for s, _ in delivered(events)] == [1, 2, 3]
    assert arb.on_packet(Feed.A, eos(4), MS) == [EndOfSession(TRUE, 4)]


# -- random traffic with forged session and end-of-session datagrams -------------------------------------------


@st.composite
def forged_traffic(draw: st.DrawFn) -> tuple[int, list[tuple[Feed, bytes]], bool, FeedMode]:
    """A true session of n messages on A and B (random packets, each feed losing some, never the final
    END_OF_SESSION, sent twice) with forged datagrams injected anywhere: another session's packet (a new name each time, so
    no two forged datagrams confirm each other), an END_OF_SESSION at the next sequence or ahead (some on both feeds),
    and, for a live join, a packet far ahead as the very first datagram. Arbitrated on A and B, or on A alone."""
    n = draw(st.integers(5, 120))
    live = draw(st.booleans())
    rng = random.Random(draw(st.integers(0, 2**32)))
    packets, seq = [], 1
    while seq <= n:
        count = min(rng.randint(1, 8), n - seq + 1)
        packets.append(pk(seq, count))
        seq += count
    loss = {Feed.A: draw(st.sampled_from([0.0, 0.1, 0.3])), Feed.B: draw(st.sampled_from([0.0, 0.1, 0.3]))}
    traffic: list[tuple[Feed, bytes]] = []
    if live and draw(st.booleans()):
        traffic.append((Feed.A, pk(10**9, 1, tag=b"EVIL-")))
    forged = draw(st.lists(st.tuples(st.integers(0, len(packets)), st.sampled_from(["session", "end"]),
                                     st.sampled_from([Feed.A, Feed.B]), st.integers(0, 600)), max_size=6))
    ends: set[int] = set()
    for i, data in enumerate(packets + [None]):
        for k, (at, kind, feed, ahead) in enumerate(forged):
            if at != i:
                continue
            if kind == "session":
                traffic.append((feed, pk(1 + ahead, 2, m.encode_session(b"EVIL%d" % k), b"EVIL-")))
            else:  # at the next sequence the stream has reached on the wire, or ahead of it
                first = m.decode(data).sequence if data is not None else n + 1
                end = first + ahead if first + ahead != n + 1 else first + ahead + 1
                traffic.append((feed, eos(end)))
                # the same forged end on the other feed too (once the session started: two copies as the very
                # first datagrams choose a live join's start point)
                if end not in ends and i > 0 and draw(st.booleans()):
                    traffic.append((Feed.B if feed == Feed.A else Feed.A, eos(end)))
                ends.add(end)
        if data is None:
            break
        for feed in (Feed.A, Feed.B):
            if rng.random() >= loss[feed]:
                traffic.append((feed, data))
    traffic += [(Feed.A, eos(n + 1)), (Feed.B, eos(n + 1))] * 2  # servers repeat the end
    return n, traffic, live, draw(st.sampled_from([FeedMode.A_AND_B, FeedMode.A_ONLY]))


@given(case=forged_traffic())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_forged_sessions_and_ends_are_never_published_and_c_agrees(case: tuple) -> None:
    n, traffic, live, mode = case
    forged = sum(1 for _, data in traffic if data[:10] != TRUE or b"EVIL-" in data
                 or (data[18:20] == b"\xff\xff" and data != eos(n + 1)))
    config = ArbiterConfig(mode=mode, start_sequence=None if live else 1)
    results = []
    for arb in (SpecArbiter(config), NativeFlat(config)):
        events = run(arb, traffic)
        now = len(traffic) * MS
        for _ in range(len(traffic)):  # let the waits expire (recovery off: each hole lost in its turn)
            deadline = arb.next_deadline_ns()
            if deadline is None:
                break
            now = max(now, deadline)
            events += arb.on_tick(now)
        results.append((events, arb.counter_values()))
        assert all(message == b"T%d" % seq for seq, message in delivered(events)), "a forged message published"
        assert {s.session for s in kinds(events, SessionChanged)} <= {TRUE}
        if forged <= 1:  # one forged datagram never costs the true session (several may delay its start)
            assert kinds(events, EndOfSession) == [EndOfSession(TRUE, n + 1)]
        else:
            assert kinds(events, EndOfSession) in ([], [EndOfSession(TRUE, n + 1)])
    (spec_events, spec_counters), (c_events, c_counters) = results
    assert c_events == spec_events and c_counters == spec_counters
