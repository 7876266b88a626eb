"""Re-request pacing: randomised initial back-off, retries, chunking, answer-driven continuation, give-up; and
recovery driven through the arbiter (on/off, give-up moves the stream on)."""

from __future__ import annotations

import random

import pytest

from logbuf.feed.arbiter import Arbiter, ArbiterConfig
from logbuf.feed.events import (
    Deliver,
    Feed,
    FeedMode,
    GapDetected,
    GapReason,
    GapRecovered,
    GapUnrecoverable,
    RecoveryRequest,
)
from logbuf.feed.recovery import Jitter, Recovery, RecoveryConfig
from logbuf.marketdata import moldudp64 as m
from support.arbsim import Arrival, RetransmitStub, packetise, simulate

MS = 1_000_000
S1 = m.encode_session("S1")


def started(config: RecoveryConfig | None = None, seed: int = 1, now: int = 0) -> Recovery:
    r = Recovery(config, rng=random.Random(seed))
    r.start(now)
    return r


def first_round_ns(r: Recovery, holes: list[tuple[int, int]], step: int = 100_000) -> int:
    t = 0
    while not r.poll(holes, t):
        t += step
    return t


def follow(r: Recovery, holes: list[tuple[int, int]], until: int) -> list[tuple[int, int]]:
    """Poll at every deadline before ``until``, as the engine does while time passes (a handler that is not
    consulted for longer than a retry interval with requests in flight has stalled). Returns the requests sent."""
    sent: list[tuple[int, int]] = []
    while (due := r.next_deadline_ns()) is not None and due < until:
        sent += r.poll(holes, due)
    return sent


def test_initial_backoff_is_randomised_within_seed_001_bounds_and_seeded() -> None:
    times = [first_round_ns(started(seed=seed), [(10, 12)]) for seed in range(40)]
    assert all(25 * MS <= t <= 75 * MS + 100_000 for t in times)  # 50 ms x U(0.5, 1.5), polled every 0.1 ms
    assert len(set(times)) > 10  # randomised...
    assert times == [first_round_ns(started(seed=seed), [(10, 12)]) for seed in range(40)]  # ...reproducibly


def test_backoff_follows_the_configuration() -> None:
    cfg = RecoveryConfig(initial_backoff_ns=10 * MS, backoff_jitter=(1.0, 1.0))
    r = started(cfg, now=5 * MS)
    assert r.next_deadline_ns() == 15 * MS
    assert r.poll([(1, 1)], 15 * MS - 1) == []
    assert r.poll([(1, 1)], 15 * MS) == [(1, 1)]


def test_retry_after_the_interval_without_an_answer() -> None:
    r = started(RecoveryConfig(initial_backoff_ns=0))
    assert r.poll([(100, 109)], 0) == [(100, 10)]
    assert r.poll([(100, 109)], 200 * MS - 1) == []  # in flight
    assert r.next_deadline_ns() == 200 * MS
    assert r.poll([(100, 109)], 200 * MS) == [(100, 10)]
    assert r.requests_sent == 2


def test_the_rest_of_a_partly_answered_hole_is_asked_for_at_once() -> None:
    r = started(RecoveryConfig(initial_backoff_ns=0))
    assert r.poll([(100, 199)], 0) == [(100, 100)]
    r.on_answer(100, 1 * MS)  # the answer carried 100..139
    assert r.poll([(140, 199)], 1 * MS) == [(140, 60)]
    assert r.answers == 1


def test_requests_are_chunked_to_the_moldudp64_count_limit() -> None:
    r = started(RecoveryConfig(initial_backoff_ns=0))
    assert r.poll([(1, 200_000)], 0) == [(1, 65534), (65535, 65534), (131069, 65534), (196603, 3398)]
    r = started(RecoveryConfig(initial_backoff_ns=0, max_request_count=100, max_outstanding=3))
    assert r.poll([(1, 150), (200, 200), (300, 400)], 0) == [(1, 100), (101, 50), (200, 1)]


def test_before_the_answer_size_is_known_only_the_first_message_of_a_request_counts_as_requested() -> None:
    r = started(RecoveryConfig(initial_backoff_ns=0, give_up_ns=1_000 * MS))
    r.poll([(1, 200_000)], 0)
    follow(r, [(1, 200_000)], 500 * MS)
    r.on_answer(65535, 500 * MS, count=40)  # the server answers (one packet of 40 messages)
    follow(r, [(1, 200_000)], 1_000 * MS)
    # 1 was requested at 0 and is still missing; 2.. were never asked for in a way one answer brings back
    assert r.expired([(1, 1)], 1_000 * MS) == 1  # (the last sequence to give up)
    assert r.expired([(2, 65534)], 1_400 * MS) == 0


def learned(config: RecoveryConfig, chunk: int) -> Recovery:
    """Started, with one answer of ``chunk`` messages seen (to a probe for 1..)."""
    r = started(config)
    assert r.poll([(1, config.max_request_count)], 0) == [(1, config.max_request_count)]
    r.on_answer(1, 0, count=chunk)
    return r


def test_one_answer_cut_short_where_the_server_lacks_what_follows_does_not_shrink_the_requests() -> None:
    """An answer shorter than the size learned may be the server's data ending (it lacks what follows): alone it
    changes nothing; two in a row mean the packets really carry fewer messages now."""
    r = learned(RecoveryConfig(initial_backoff_ns=0), 40)
    assert r.poll([(1001, 1120)], MS) == [(1001, 40), (1041, 40), (1081, 40)]
    r.on_answer(1001, 2 * MS, count=11)  # cut short: the server lacks 1012..
    r.on_answer(1041, 2 * MS, count=40)
    assert r.poll([(5001, 5100)], 3 * MS)[0] == (5001, 40)
    r.on_answer(5001, 4 * MS, count=25)
    r.on_answer(5041, 4 * MS, count=25)  # a second in a row: the packets carry 25 now
    assert r.poll([(6001, 6100)], 5 * MS)[0] == (6001, 25)


def test_an_answer_from_inside_a_request_is_only_a_hint_that_splits_the_request_there() -> None:
    """A server that lacks the start of what was asked may answer from what it has; the arbiter does not take
    such a packet (it starts where no request started) and the pacing takes it as a hint: the request asks only
    up to there, and once it is due again a request of its own asks from there (not before: a copy of the first
    request still in flight could bring a packet starting there); the chunks after it stay put. The hint answers
    nothing: what was asked before it is given up on time; what it claims and the hinted request's answer
    restart their own clocks."""
    cfg = RecoveryConfig(initial_backoff_ns=0, give_up_ns=1_000 * MS)
    r = learned(cfg, 10)
    holes = [(100, 119)]
    assert r.poll(holes, 0) == [(100, 10), (110, 10)]
    follow(r, holes, 500 * MS)  # (retried every 200 ms: last at 400 ms)
    answers = r.answers
    t = 500 * MS
    assert not r.on_hint(99, 5, t) and not r.on_hint(100, 5, t)  # not inside a request in flight
    assert not r.on_hint(120, 5, t)
    assert r.on_hint(105, 5, t)  # 100..104 lacking, says the server
    assert not r.on_hint(105, 5, t)  # (once: the request asks up to it now)
    assert r.answers == answers
    assert r.poll(holes, t) == []  # nothing is due before 600 ms
    assert follow(r, holes, 600 * MS + 1) == [(100, 5), (105, 5), (110, 10)]
    r.on_answer(105, 601 * MS, count=5)
    assert r.answers == answers + 1
    assert not r.on_hint(107, 3, t)  # inside a request already answered: nothing to split
    sent = follow(r, holes, 1_000 * MS)  # (the answer, say, could not be kept)
    assert (100, 5) in sent and (110, 10) in sent  # the part before the hint asks only up to it
    assert r.expired(holes, 1_000 * MS) == 104  # 100..104 was never answered: given up on time
    assert r.expired([(105, 109)], 1_000 * MS) == 0  # 105..109 was: its clock restarted


def test_a_hint_does_not_restart_the_silence_clock() -> None:
    """Hints are all a server that lacks what is asked sends: the server looks silent, and what was asked and
    timed out unanswered is given up after give_up (a hint is not an answer)."""
    cfg = RecoveryConfig(initial_backoff_ns=0, give_up_ns=1_000 * MS, max_outstanding=2)
    r = learned(cfg, 10)
    holes = [(100, 199)]
    answers = r.answers
    assert r.poll(holes, 0) == [(100, 10), (110, 10)]
    for now in range(100 * MS, 1_000 * MS, 100 * MS):
        assert not r.on_hint(200, 10, now)  # past every request in flight: no split
        assert r.on_hint(105, 10, now) == (now == 100 * MS)  # (once)
        assert r.expired(holes, now) == 0
        r.poll(holes, now)
    assert r.answers == answers
    assert r.expired(holes, 1_000 * MS) == 109  # silent: the requests that timed out unanswered are given up


def test_give_up_is_by_age_of_the_first_request_per_hole() -> None:
    cfg = RecoveryConfig(initial_backoff_ns=0, give_up_ns=10_000 * MS)
    r = learned(cfg, 10)
    r.poll([(10, 19)], 0)  # first hole requested at t=0
    follow(r, [(10, 19)], 3_000 * MS)
    r.poll([(10, 19), (30, 39)], 3_000 * MS)  # a later hole first requested at 3 s
    follow(r, [(10, 19), (30, 39)], 5_000 * MS)
    r.on_answer(40, 5_000 * MS, count=10)  # the server answers other requests: it has not stopped
    follow(r, [(10, 19), (30, 39)], 10_000 * MS - 1)
    assert r.expired([(10, 19), (30, 39)], 10_000 * MS - 1) == 0
    assert r.expired([(10, 19), (30, 39)], 10_000 * MS) == 19  # the first hole, up to its last sequence
    r.forget_below(30)  # the stream gave 10..19 up and moved on
    assert r.expired([(30, 39)], 10_000 * MS) == 0
    follow(r, [(30, 39)], 13_000 * MS)
    assert r.expired([(30, 39)], 13_000 * MS) == 39


def test_a_server_silent_for_give_up_loses_what_was_asked_and_then_asks_for_the_rest() -> None:
    """A server silent for give_up while requests were in flight has stopped answering: what those requests
    asked (and timed out) is given up; a hole the window had not reached is never given up with them but asked
    for next, and given up once its own request timed out unanswered (a retry interval later)."""
    cfg = RecoveryConfig(initial_backoff_ns=0, give_up_ns=1_000 * MS, max_outstanding=2)
    r = learned(cfg, 10)
    holes = [(100, 109), (200, 209), (300, 309)]
    assert r.poll(holes, 0) == [(100, 10), (200, 10)]  # two in flight; the third waits
    assert r.next_deadline_ns() == 100 * MS  # (consulted every half retry interval while requests fly)
    assert follow(r, holes, 999 * MS) == [(100, 10), (200, 10)] * 4  # retried every 200 ms, still nothing
    assert r.expired(holes, 999 * MS) == 0
    assert r.expired(holes, 1_000 * MS) == 209  # what was asked: 100.. and 200.., not 300..
    assert r.poll([(300, 309)], 1_000 * MS) == [(300, 10)]  # the rest is asked for...
    assert r.expired([(300, 309)], 1_199 * MS) == 0  # ...and not given up before its request timed out
    assert r.poll([(300, 309)], 1_200 * MS) == [(300, 10)]
    assert r.expired([(300, 309)], 1_200 * MS) == 309  # the server is still silent: given up


def test_a_hole_the_pacing_has_not_reached_is_never_given_up_while_the_server_answers() -> None:
    """A late start: a hole of 100,000 messages, answers of 40 messages each at once, 800 requests/s, give-up
    1 s: fetching it takes ~3 s, and nothing is given up (a probe or a request counts only what one answer
    brings back as requested)."""
    cfg = RecoveryConfig(initial_backoff_ns=0, give_up_ns=1_000 * MS)
    r = started(cfg)
    expected, last, now, polls = 1, 100_000, 0, 0
    answered: set[int] = set()
    while expected <= last:
        assert r.expired([(expected, last)], now) == 0, f"gave up at {expected} after {now / MS:.0f} ms"
        for seq, count in r.poll([(expected, last)], now):
            answered.add(seq)
            r.on_answer(seq, now + MS, count=min(count, 40))
            if seq == expected:  # answers fill the front of the hole
                expected = seq + min(count, 40)
                while expected in answered:
                    expected += 40
        now += MS
        polls += 1
    assert now < 10_000 * MS
    assert r.requests_sent >= 100_000 // 40


def test_never_requested_holes_do_not_expire_and_stop_resets() -> None:
    r = started(RecoveryConfig(initial_backoff_ns=0, give_up_ns=MS))
    assert r.expired([(1, 5)], 10**12) == 0
    r.poll([(1, 5)], 0)
    r.stop()
    assert not r.active and r.next_deadline_ns() is None and r.poll([(1, 5)], 10**12) == []


def test_config_validation() -> None:
    for bad in (dict(backoff_jitter=(1.5, 0.5)), dict(initial_backoff_ns=-1), dict(retry_interval_ns=0),
                dict(give_up_ns=0), dict(max_request_count=0), dict(max_request_count=0x10000),
                dict(max_outstanding=0)):
        with pytest.raises(ValueError):
            RecoveryConfig(**bad)


# -- through the arbiter ------------------------------------------------------------------------------------------


def double_loss(lost_packets: set[int], n: int = 400) -> tuple[list[bytes], list[Arrival]]:
    messages = [b"msg-%05d" % i for i in range(1, n + 1)]
    arrivals = []
    for k, (_, _, data) in enumerate(packetise(S1, 1, messages, iter(lambda: 4, None))):
        if k not in lost_packets:
            arrivals += [Arrival(k * 20_000, Feed.A, data), Arrival(k * 20_000 + 5_000, Feed.B, data)]
    return messages, arrivals


def test_give_up_reports_the_unrecoverable_gap_and_the_stream_moves_on() -> None:
    messages, arrivals = double_loss({20})  # messages 81..84 lost on both feeds
    server = RetransmitStub(S1, messages, missing=range(81, 85))
    arb = Arbiter(ArbiterConfig(), RecoveryConfig(), seed=5)
    result = simulate(arb, arrivals, server)
    assert result.of_type(GapDetected) == [GapDetected(S1, 81, 84, GapReason.SEQUENCE_THRESHOLD)]
    assert result.of_type(GapUnrecoverable) == [GapUnrecoverable(S1, 81, 84, GapReason.GIVE_UP)]
    assert result.of_type(GapRecovered) == []
    assert result.sequences() == [s for s in range(1, 401) if not 81 <= s <= 84]
    detected_at = next(d.arrival_ns for d in result.delivered if d.seq == 80)
    requests = result.of_type(RecoveryRequest)
    assert {(r.seq, r.count) for r in requests} == {(81, 4)}
    # first after the 25..75 ms back-off, then every 200 ms until the 10 s give-up
    assert 49 <= len(requests) <= 51
    assert result.end_ns - detected_at >= 10_000 * MS


def test_recovery_off_declares_the_double_loss_lost_at_once() -> None:
    messages, arrivals = double_loss({20})
    arb = Arbiter(ArbiterConfig())
    result = simulate(arb, arrivals)
    assert result.of_type(GapUnrecoverable) == [GapUnrecoverable(S1, 81, 84, GapReason.RECOVERY_OFF)]
    assert result.of_type(RecoveryRequest) == []
    assert len(result.sequences()) == 396


def test_recovery_on_delivers_everything_in_order_with_the_answers() -> None:
    messages, arrivals = double_loss({3, 4, 50, 97})
    server = RetransmitStub(S1, messages)
    arb = Arbiter(ArbiterConfig(), RecoveryConfig(), seed=5)
    result = simulate(arb, arrivals, server)
    assert result.sequences() == list(range(1, 401))
    assert [(g.first, g.last) for g in result.of_type(GapRecovered)] == [(13, 20), (201, 204), (389, 392)]
    recovered = [d for d in result.delivered if d.feed == Feed.RETRANSMIT]
    assert [d.seq for d in recovered] == [*range(13, 21), *range(201, 205), *range(389, 393)]
    assert all(isinstance(d, Deliver) and d.message == messages[d.seq - 1] for d in result.delivered)
    assert arb.counters.gaps_detected == 3 and arb.counters.gaps_recovered == 3


def test_the_injected_rng_makes_runs_reproducible() -> None:
    messages, arrivals = double_loss({7})
    runs = []
    for _ in range(2):
        arb = Arbiter(ArbiterConfig(), RecoveryConfig(), seed=42)
        runs.append([(d.seq, d.arrival_ns) for d in simulate(arb, arrivals, RetransmitStub(S1, messages)).delivered])
    assert runs[0] == runs[1]


# -- recovery that outpaces loss: answer-sized chunks, several in flight, paced -------------------------------


def test_answers_set_the_request_size_and_several_chunks_of_a_hole_fly_at_once() -> None:
    r = started(RecoveryConfig(initial_backoff_ns=0, max_outstanding=8))
    assert r.poll([(1, 1000)], 0) == [(1, 1000)]  # nothing known yet: the whole hole
    r.on_answer(1, MS, count=40)  # one answer packet carries 40 messages: that is what a request brings back
    requests = r.poll([(41, 1000)], MS)
    assert requests == [(41 + 40 * k, 40) for k in range(8)]  # eight answer-sized chunks in flight


def test_once_an_answer_came_back_short_requests_keep_its_size() -> None:
    """Growing past a size the server already cut would leave a remainder to ask for again after every answer."""
    r = started(RecoveryConfig(initial_backoff_ns=0, max_outstanding=1))
    assert r.poll([(1, 1000)], 0) == [(1, 1000)]
    r.on_answer(1, MS, count=40)  # full at 40
    for k in range(1, 6):
        first = 1 + 40 * k
        assert r.poll([(first, 1000)], k * MS) == [(first, 40)]
        r.on_answer(first, k * MS, count=40)  # everything asked came: still 40, no probing upwards


def test_requests_stay_under_the_rate_and_resume_as_tokens_come_back() -> None:
    config = RecoveryConfig(initial_backoff_ns=0, max_request_count=10, max_outstanding=1000, request_rate=1000.0,
                            request_burst=5)
    r = started(config)
    holes = [(s, s + 4) for s in range(1, 10_000, 10)]  # a thousand holes
    assert len(r.poll(holes, 0)) == 5  # the burst
    assert r.next_deadline_ns() == 1 * MS  # the next token, whole at exactly 1 ms
    assert len(r.poll(holes, 1 * MS + 1)) == 1
    assert len(r.poll(holes, 11 * MS + 1)) == 5  # 10 ms later: refilled up to the burst, no more
    assert r.requests_sent == 11 and r.requests_paced >= 3


# -- the operator's cases at full rate, in simulated time (the engine and the pacing with their defaults) ------


def session(rate: int, seconds: float, first_s: float = 0.0, dark: tuple[float, float] | None = None
            ) -> tuple[list[bytes], list[Arrival]]:
    """``rate`` packets/s per feed of 10 messages for ``seconds``; A and B (B 1 ms later) from ``first_s`` on
    (a late start), both silent during ``dark``."""
    packets = int(rate * seconds)
    messages = [b"m%011d" % s for s in range(1, packets * 10 + 1)]
    arrivals = []
    for k, (_, _, data) in enumerate(packetise(S1, 1, messages, iter(lambda: 10, None))):
        t = k / rate
        if t < first_s or (dark is not None and dark[0] <= t < dark[1]):
            continue
        arrivals += [Arrival(int(t * 1e9), Feed.A, data), Arrival(int(t * 1e9) + MS, Feed.B, data)]
    return messages, arrivals


ONE_PACKET = m.HEADER_LENGTH + 10 * (2 + 12)  # the server answers one packet's worth per request


def test_a_late_start_10_s_into_a_2k_packets_per_s_session_gives_up_nothing_the_server_answers() -> None:
    """20,000 packets to fetch, one per answer, at 800 requests/s: 25 s, longer than the 10 s give-up."""
    messages, arrivals = session(2_000, 20, first_s=10)
    server = RetransmitStub(S1, messages, budget=ONE_PACKET)
    arb = Arbiter(ArbiterConfig(), RecoveryConfig(), seed=3)
    result = simulate(arb, arrivals, server, rtt_ns=MS)
    assert arb.counters.messages_unrecoverable == 0 and result.of_type(GapUnrecoverable) == []
    assert len(result.delivered) == len(messages) and result.sequences() == list(range(1, len(messages) + 1))
    assert 20_000 <= len(server.requests) < 25_000
    assert result.end_ns < 40 * 1_000 * MS  # at the pacing's 800 requests/s: ~25 s after the start at 10 s


def test_both_feeds_dark_half_a_second_at_10k_packets_per_s_with_the_defaults_loses_nothing() -> None:
    messages, arrivals = session(10_000, 4, dark=(1.5, 2.0))
    server = RetransmitStub(S1, messages, budget=ONE_PACKET)
    arb = Arbiter(ArbiterConfig(), RecoveryConfig(), seed=4)
    result = simulate(arb, arrivals, server, rtt_ns=MS)
    assert arb.counters.messages_unrecoverable == 0 and arb.counters.shed_packets == 0
    assert result.sequences() == list(range(1, len(messages) + 1))


def test_settings_outside_the_engines_exact_token_bucket_are_refused() -> None:
    """The engine's bucket is integer arithmetic that stays exact up to 1e6 requests/s and bursts of 1e6."""
    for bad in ({"request_rate": 2e6}, {"request_burst": 2_000_000}, {"request_rate": 0.0}):
        with pytest.raises(ValueError):
            RecoveryConfig(**bad)  # type: ignore[arg-type]
    assert RecoveryConfig(request_rate=1e6, request_burst=1_000_000).rate_units == 1_000_000_000


def test_the_engine_runs_the_same_pacing_with_the_same_seed() -> None:
    """The jitter comes from the seed: the same seed, the same first request time; another seed, another."""
    def first_request_at(seed: int) -> int:
        arb = Arbiter(ArbiterConfig(mode=FeedMode.A_ONLY, out_of_order_max_interval=100), RecoveryConfig(), seed=seed)
        arb.on_packet(Feed.A, m.encode_downstream(S1, 1, [b"x"]), 0)
        arb.on_packet(Feed.A, m.encode_downstream(S1, 3, [b"x"]), 0)
        arb.on_packet(Feed.A, m.encode_heartbeat(S1, 4), 0)  # A continuing after 3 confirms the jump to it
        arb.on_tick(100 * MS)  # the gap is declared; the first request waits out the jittered back-off
        deadline = arb.next_deadline_ns()
        assert deadline is not None
        events = arb.on_tick(deadline)
        assert events == [RecoveryRequest(S1, 2, 1)]
        return deadline

    reference = Recovery(RecoveryConfig(), rng=Jitter(7))
    reference.start(100 * MS)
    assert first_request_at(7) == first_request_at(7) == reference.next_deadline_ns()
    assert first_request_at(8) != first_request_at(7)


# -- a server slower than the pacing, and a server that lacks old data (AIMD and the give-up clock) ---------------


def test_a_timeout_while_a_later_request_was_answered_halves_the_rate_once_per_retry_interval_down_to_a_floor(
) -> None:
    cfg = RecoveryConfig(initial_backoff_ns=0, request_rate=6_400.0)
    r = learned(cfg, 10)
    assert r.rate_units == 6_400_000
    assert r.poll([(100, 109), (300, 309)], 0) == [(100, 10), (300, 10)]
    assert r.poll([(100, 109), (200, 209), (300, 309)], MS) == [(200, 10)]  # a hole found later
    r.on_answer(200, 2 * MS)  # the server answers a request sent after them: they were dropped
    rate = r.rate_units  # (the answer raised it: it was at request_rate already)
    r.poll([(100, 109), (300, 309)], 100 * MS)  # (consulted on time)
    r.poll([(100, 109), (300, 309)], 200 * MS)  # they time out: congestion, one cut for both
    assert r.rate_units == rate // 2
    r.poll([(100, 109), (300, 309), (500, 509)], 201 * MS)  # a request sent after the retries...
    r.on_answer(500, 250 * MS)  # ...is answered
    rate = r.rate_units  # (raised a little by that answer)
    r.poll([(100, 109), (300, 309)], 300 * MS)
    r.poll([(100, 109), (300, 309)], 400 * MS)  # the retries time out: a request signals once only
    assert r.rate_units == rate
    rates = []
    for k in range(1, 12):  # a new request each round, dropped while one sent after it is answered
        hole, t = (1_000 * k, 1_000 * k + 9), 400 * MS + 200 * MS * k
        prev = (1_000 * (k - 1), 1_000 * (k - 1) + 9)
        before = r.rate_units
        r.poll([prev, hole], t)  # (the round before's times out)
        rates.append((before, r.rate_units))
        r.poll([prev, hole, (10**9 + k, 10**9 + k)], t + MS)
        r.on_answer(10**9 + k, t + 2 * MS)  # (an answer raises the rate a little)
        r.poll([hole], t + 100 * MS)
    assert all(after == max(6_400_000 // 64, before // 2) for before, after in rates[1:])  # halved each interval
    assert rates[-1][1] == 6_400_000 // 64  # ...down to the floor, a 64th of request_rate


def test_answers_raise_the_rate_back_to_request_rate_by_a_sixteenth_of_it_per_second() -> None:
    cfg = RecoveryConfig(initial_backoff_ns=0, request_rate=1_600.0, request_burst=1_000, max_outstanding=1_000)
    r = learned(cfg, 10)
    holes = [(s, s + 9) for s in range(100, 10_000_000, 100)]
    r.poll(holes[1:10], 0)
    r.poll(holes[:10], MS)  # a request sent after them...
    r.on_answer(100, 2 * MS, count=10)  # ...is answered
    r.poll(holes[1:10], 100 * MS)
    r.poll(holes[1:10], 200 * MS)  # they timed out while a later one was answered: halved
    assert r.rate_units == 800_000
    now, answered = 200 * MS, 0
    while r.rate_units < 1_600_000:  # answer everything asked, 1 ms later
        for seq, count in r.poll(holes[10 + answered:], now):
            r.on_answer(seq, now + MS // 2, count=count)
            answered += 1
        now += MS
    # 800 requests/s back at 100 requests/s per second of answers: about 8 s (the answers come at the rate)
    assert 6_000 * MS <= now - 200 * MS <= 9_000 * MS


def test_a_request_that_was_dropped_restarts_every_give_up_clock_and_a_retry_signals_nothing() -> None:
    cfg = RecoveryConfig(initial_backoff_ns=0, give_up_ns=1_000 * MS)
    r = learned(cfg, 10)
    assert r.poll([(10, 19)], 0) == [(10, 10)]
    assert r.poll([(10, 19), (30, 39)], MS) == [(30, 10)]
    r.on_answer(30, 2 * MS, count=10)  # answered the later, not the first (dropped, or the server lacks it)
    r.poll([(10, 19)], 100 * MS)
    r.poll([(10, 19)], 200 * MS)  # its first time-out: a congestion cut restarts the clock at 200 ms
    assert r.expired([(10, 19)], 200 * MS) == 0
    assert r.poll([(10, 19), (50, 59)], 201 * MS) == [(50, 10)]  # a request sent after the retry...
    r.on_answer(50, 300 * MS)  # ...is answered
    follow(r, [(10, 19)], 1_000 * MS)  # the retries time out: no new signal, the clock keeps running
    assert r.expired([(10, 19)], 1_000 * MS) == 0
    follow(r, [(10, 19)], 1_200 * MS - 1)
    assert r.expired([(10, 19)], 1_200 * MS - 1) == 0
    assert r.expired([(10, 19)], 1_200 * MS) == 19


def test_a_server_slower_than_the_pacing_loses_nothing_while_it_answers() -> None:
    """A late start 4 s into 2,000 packets/s: 8,000 packets to fetch from a server that answers 500 per second
    (it drops what is past that) while the pacing may ask 8,000/s with 256 in flight, give-up 2 s. A fixed rate
    had the head's requests dropped again and again and gave 12,370 messages up; AIMD halves the rate on each
    congestion signal, and a dropped request restarts the give-up clock: nothing is given up."""
    messages, arrivals = session(2_000, 8, first_s=4)
    server = RetransmitStub(S1, messages, budget=ONE_PACKET, rate=500.0)
    config = RecoveryConfig(give_up_ns=2_000 * MS, request_rate=8_000.0, max_outstanding=256)
    arb = Arbiter(ArbiterConfig(), config, seed=5)
    result = simulate(arb, arrivals, server, rtt_ns=MS)
    assert server.dropped > 100  # the server really was over its limit
    assert arb.counters.messages_unrecoverable == 0 and result.of_type(GapUnrecoverable) == []
    assert result.sequences() == list(range(1, len(messages) + 1))


class Timed:
    """The arbiter, noting when each request and give-up came out (simulated time)."""

    def __init__(self, arb: Arbiter) -> None:
        self.arb = arb
        self.requests: list[tuple[int, RecoveryRequest]] = []
        self.give_ups: list[tuple[int, GapUnrecoverable]] = []

    def _note(self, events: list, now: int) -> list:
        self.requests += [(now, e) for e in events if isinstance(e, RecoveryRequest)]
        self.give_ups += [(now, e) for e in events if isinstance(e, GapUnrecoverable)]
        return events

    def next_deadline_ns(self) -> int | None:
        return self.arb.next_deadline_ns()

    def on_tick(self, now: int) -> list:
        return self._note(self.arb.on_tick(now), now)

    def on_packet(self, feed: Feed, data: bytes, now: int) -> list:
        return self._note(self.arb.on_packet(feed, data, now), now)


def test_a_server_that_lacks_old_data_leads_to_a_give_up_of_exactly_that_after_give_up() -> None:
    """Both feeds dark twice, for 100 ms at 1.0 s and again at 1.5 s (2,000 packets/s of 10 messages): the server
    no longer has the first hole (20,001..22,000) but answers for the second. Exactly the first hole is given
    up, each part no earlier than give_up (2 s) after a request first asked for it, and all of it within a few
    give_ups (a congestion cut restarts the clocks); all else is delivered."""
    messages, arrivals = session(2_000, 3)
    arrivals = [a for a in arrivals if not (1.0 <= a.time_ns / 1e9 < 1.1 or 1.5 <= a.time_ns / 1e9 < 1.6)]
    server = RetransmitStub(S1, messages, missing=range(20_001, 22_001), budget=ONE_PACKET)
    timed = Timed(Arbiter(ArbiterConfig(), RecoveryConfig(give_up_ns=2_000 * MS), seed=6))
    result = simulate(timed, arrivals, server, rtt_ns=MS, process=lambda t, a: t.on_packet(a.feed, a.data,
                                                                                           a.time_ns))
    first_asked = min(t for t, r in timed.requests if r.seq == 20_001)
    lost = [s for _, g in timed.give_ups for s in range(g.first, g.last + 1)]
    # the hole both feeds missed (B runs 1 ms late), all of it lacking, given up in order and once
    assert lost == list(range(20_001, lost[-1] + 1)) and 21_900 < lost[-1] <= 22_000
    for at, g in timed.give_ups:  # each part was asked for give_up before (by a request starting in it or before)
        asked = min(t for t, r in timed.requests if r.seq <= g.first < r.seq + r.count)
        assert at - asked >= 2_000 * MS
    assert timed.give_ups[-1][0] - first_asked <= 3 * 2_000 * MS
    assert server.requests and any(seq > 30_000 for seq, _ in server.requests)  # the other hole was asked for
    assert result.sequences() == [s for s in range(1, len(messages) + 1) if s not in set(lost)]


def test_a_paced_requests_first_time_out_is_a_deadline_and_cuts_the_rate_on_time() -> None:
    """Requests wait for tokens, so the next deadline is the next token; a request in flight times out before
    that while one sent after it was answered. Its time-out is congestion: the deadline is the time-out (not
    the token), so the rate and every give-up clock are cut then, whenever the next input comes."""
    cfg = RecoveryConfig(initial_backoff_ns=0, request_rate=4.0, request_burst=2, retry_interval_ns=200 * MS)
    r = learned(cfg, 10)  # (the probe took one of the two tokens at 0)
    holes = [(100, 109), (200, 209), (300, 309)]
    assert r.poll(holes[:1], 250 * MS) == [(100, 10)]  # the bucket was full again: one token left
    assert r.poll(holes, 260 * MS) == [(200, 10)]  # the last token; 300.. waits for the next
    r.on_answer(200, 300 * MS)  # the server answers the later request
    assert r.next_deadline_ns() == 400 * MS  # (consulted every half retry interval while requests fly)
    assert r.poll(holes, 400 * MS) == []
    assert r.next_deadline_ns() == 450 * MS  # 100's first time-out, before the next token (500 ms)
    assert r.poll(holes, 450 * MS) == []  # no token yet (0.8 of one)
    assert r.rate_units == 2_000  # halved at the time-out
    assert r.next_deadline_ns() == 550 * MS  # the rest of the token at 2 requests/s


def drive(config: RecoveryConfig, poll_every_ms: bool) -> list[tuple[int, int, int]]:
    """Recovery of 300 packets of 10 from a server that answers one request per 10 ms (5 ms later) and drops the
    rest: polled as the engine polls it (an answer came or a deadline passed), or also every millisecond.
    Returns (time, request, rate) for every request sent."""
    r = learned(config, 10)
    missing = set(range(100, 3_100, 10))
    answers: list[tuple[int, int]] = []
    sent: list[tuple[int, int, int]] = []
    server_free_ns, deadline = 0, 0
    for t in range(0, 4_000 * MS, MS):
        dirty = False
        for due, seq in [a for a in answers if a[0] <= t]:
            answers.remove((due, seq))
            missing.discard(seq)
            r.on_answer(seq, t, count=10)
            dirty = True
        if not (dirty or poll_every_ms or deadline is not None and t >= deadline):
            continue
        holes = [(s, s + 9) for s in sorted(missing)]
        for seq, _count in r.poll(holes, t):
            sent.append((t, seq, r.rate_units))
            if t >= server_free_ns:  # the server's limit: the rest is dropped
                server_free_ns = t + 10 * MS
                answers.append((t + 5 * MS, seq))
        deadline = r.next_deadline_ns()
    assert not missing
    return sent


def test_polls_between_deadlines_change_nothing() -> None:
    """The engine runs the pacing only when an answer came, the holes changed or its deadline passed; the
    specification polls at every input. Both must send the same requests at the same rates: time-outs fall due
    on deadlines, and an answer's rate increase applies from the answer on, whenever the bucket is refilled."""
    config = RecoveryConfig(initial_backoff_ns=0, request_rate=400.0, request_burst=4, max_outstanding=8,
                            retry_interval_ns=30 * MS, give_up_ns=10_000 * MS)
    engine_like = drive(config, poll_every_ms=False)
    assert len({rate for _, _, rate in engine_like}) > 3  # the rate adapted both ways
    assert engine_like == drive(config, poll_every_ms=True)


def test_an_answer_the_handler_could_not_keep_restarts_the_give_up_clock_of_what_it_answered() -> None:
    """The server answered, but the hole stays (the answer was shed: the queue is full behind a hole the server
    lacks): that is the server answering, so the answered part's clock restarts; what it did not answer keeps
    its clock."""
    cfg = RecoveryConfig(initial_backoff_ns=0, give_up_ns=1_000 * MS)
    r = learned(cfg, 10)
    holes = [(10, 19), (30, 39)]
    assert r.poll(holes, 0) == [(10, 10), (30, 10)]
    follow(r, holes, 900 * MS)
    r.on_answer(30, 900 * MS, count=10)  # answered; the hole stays
    follow(r, holes, 1_000 * MS)
    assert r.expired(holes, 1_000 * MS) == 19  # 10..19 was never answered: given up on time
    assert r.expired([(30, 39)], 1_000 * MS) == 0  # 30..39 was: its clock restarted at 900 ms
    follow(r, [(30, 39)], 1_900 * MS)
    assert r.expired([(30, 39)], 1_900 * MS) == 39


def test_a_stall_of_the_handler_with_answers_queued_is_not_the_servers_time_out() -> None:
    """The handler is not consulted for twice the retry interval (a starved machine) while the answers to its
    requests wait unread: when it runs again nothing has timed out, nothing is asked again, the rate is not cut,
    and the answers it then reads count as answers."""
    cfg = RecoveryConfig(initial_backoff_ns=0, request_rate=6_400.0, give_up_ns=1_000 * MS)
    r = learned(cfg, 10)
    rate = r.rate_units
    holes = [(100, 109), (200, 209), (300, 309)]
    assert r.poll([holes[0], holes[2]], 0) == [(100, 10), (300, 10)]
    assert r.poll(holes, MS) == [(200, 10)]  # sent after the two others
    stall_end = MS + 2 * cfg.retry_interval_ns
    assert r.poll(holes, stall_end) == []  # the handler runs again before reading the answers: no retry
    assert r.rate_units == rate
    r.on_answer(200, stall_end + MS, count=10)  # the queued answers, the later request's first
    r.on_answer(100, stall_end + MS, count=10)
    assert r.poll([holes[2]], stall_end + 2 * MS) == []  # 300's answer is still queued: not a time-out
    assert r.rate_units >= rate  # not cut (the answers raised it, up to request_rate)
    assert r.answers == 3  # (the probe's and two)
    r.on_answer(300, stall_end + 3 * MS, count=10)
    assert r.answers == 4


def test_a_stall_of_the_handler_longer_than_give_up_gives_nothing_up() -> None:
    """A stall past give_up is not the server's silence: every clock restarts when the handler runs again."""
    cfg = RecoveryConfig(initial_backoff_ns=0, give_up_ns=1_000 * MS)
    r = learned(cfg, 10)
    holes = [(100, 109), (200, 209)]
    assert r.poll(holes, 0) == [(100, 10), (200, 10)]
    follow(r, holes, 500 * MS)
    stall_end = 500 * MS + 2 * cfg.give_up_ns
    assert r.expired(holes, stall_end) == 0
    assert r.poll(holes, stall_end) == []  # the requests in flight wait a whole retry interval again
    assert follow(r, holes, stall_end + cfg.give_up_ns) == [(100, 10), (200, 10)] * 4
    assert r.expired(holes, stall_end + cfg.give_up_ns - 1) == 0
    assert r.expired(holes, stall_end + cfg.give_up_ns) == 209  # the server stays silent: given up then


def test_an_answer_that_could_not_be_kept_is_not_asked_again_for_a_retry_interval() -> None:
    """The queue is full behind a hole: an answer cannot be kept and its hole still starts where it did. Asking
    again at once would spend the tokens on answers that cannot be kept either; the answered request stays in
    flight for a retry interval (the tokens go to other holes), and a second copy of its answer counts nothing."""
    cfg = RecoveryConfig(initial_backoff_ns=0, max_outstanding=3)
    r = learned(cfg, 10)
    holes = [(10, 19), (30, 39), (50, 59)]
    assert r.poll(holes[:2], 0) == [(10, 10), (30, 10)]
    r.on_answer(30, 5 * MS, count=10)  # answered, not kept: the hole stays
    answers = r.answers
    assert r.poll(holes, 6 * MS) == [(50, 10)]  # the next hole, not 30 again
    r.on_answer(30, 7 * MS, count=10)  # a duplicate of the answer
    assert r.answers == answers
    assert follow(r, holes, 205 * MS) == [(10, 10)]  # 10's retry; 30 is held
    assert r.poll(holes, 205 * MS) == [(30, 10)]  # a retry interval after its answer: asked again
    rate = r.rate_units
    r.poll(holes, 300 * MS)
    assert r.rate_units == rate  # its hold signals no congestion


def test_an_answer_that_could_not_be_kept_is_asked_again_once_the_stream_moves() -> None:
    """Room may have come free behind the head once the stream moved: the held chunk is asked again at once."""
    cfg = RecoveryConfig(initial_backoff_ns=0, max_outstanding=3)
    r = learned(cfg, 10)
    holes = [(10, 19), (30, 39), (50, 59)]
    assert r.poll(holes, 0) == [(10, 10), (30, 10), (50, 10)]
    r.on_answer(30, 5 * MS, count=10)  # answered, not kept: the hole stays
    assert r.poll(holes, 6 * MS) == []  # held: the stream waits at 10
    r.on_answer(10, 7 * MS, count=10)  # the head is filled: the stream moves to 30
    assert r.poll(holes[1:], 8 * MS) == [(30, 10)]


def test_an_answer_that_was_kept_lets_the_rest_of_its_hole_be_asked_at_once() -> None:
    cfg = RecoveryConfig(initial_backoff_ns=0, max_outstanding=2)
    r = learned(cfg, 10)
    assert r.poll([(10, 29)], 0) == [(10, 10), (20, 10)]
    r.on_answer(10, 5 * MS, count=10)  # kept: the hole now starts at 20
    assert r.poll([(20, 29), (40, 49)], 6 * MS) == [(40, 10)]  # the window's freed slot goes out at once


class FlakyServer(RetransmitStub):
    """A retransmission server that answers nothing during ``silent`` (from, until) and only every ``every``-th
    request it receives."""

    def __init__(self, *args: object, silent: tuple[int, int] = (0, 0), every: int = 1, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.silent = silent
        self.every = every
        self.received = 0
        self.ignored = 0

    def answer(self, request: bytes, now_ns: int = 0) -> bytes | None:
        self.received += 1
        if self.silent[0] <= now_ns < self.silent[1] or self.received % self.every:
            req = m.decode_request(request)
            self.requests.append((req.sequence, req.count))
            self.ignored += 1
            return None
        return super().answer(request, now_ns)


def test_a_server_silent_for_less_than_give_up_then_back_loses_nothing() -> None:
    """A late start 2 s into 2,000 packets/s: the server goes silent 0.5 s into the recovery for 2 s, under the
    3 s give-up. Requests time out meanwhile (asked again every 200 ms), the server answers them when it is back,
    and nothing is given up."""
    messages, arrivals = session(2_000, 5, first_s=2)
    start = arrivals[0].time_ns
    server = FlakyServer(S1, messages, budget=ONE_PACKET, silent=(start + 500 * MS, start + 2_500 * MS))
    arb = Arbiter(ArbiterConfig(), RecoveryConfig(give_up_ns=3_000 * MS), seed=3)
    result = simulate(arb, arrivals, server, rtt_ns=MS)
    assert server.ignored > 0  # the server really was silent while requests were in flight
    assert arb.counters.messages_unrecoverable == 0 and result.of_type(GapUnrecoverable) == []
    assert result.sequences() == list(range(1, len(messages) + 1))


def test_a_server_that_answers_every_other_request_loses_nothing() -> None:
    """Half of the requests are dropped (every other one the server receives): the pacing asks again, the server
    is answering, and nothing is given up (slowly: each drop of a request sent before an answered one reads as
    congestion, so the rate stays near its floor)."""
    messages, arrivals = session(2_000, 4, first_s=1)
    server = FlakyServer(S1, messages, budget=ONE_PACKET, every=2)
    arb = Arbiter(ArbiterConfig(), RecoveryConfig(give_up_ns=2_000 * MS), seed=4)
    result = simulate(arb, arrivals, server, rtt_ns=MS)
    assert server.ignored > 1_000
    assert arb.counters.messages_unrecoverable == 0 and result.of_type(GapUnrecoverable) == []
    assert result.sequences() == list(range(1, len(messages) + 1))


def test_a_server_that_stops_answering_loses_only_what_was_asked_and_the_give_up_stays_bounded() -> None:
    """A late start 1 s into 2,000 packets/s (2,000 packets of the past), the server silent for good 0.3 s into
    the recovery, give-up 1 s: each part is given up only after a request asked for it and timed out
    unanswered (never a part no request asked for), and the whole past is given up within seconds."""
    messages, arrivals = session(2_000, 2, first_s=1)
    start = arrivals[0].time_ns
    server = FlakyServer(S1, messages, budget=ONE_PACKET, silent=(start + 300 * MS, 10**15))
    timed = Timed(Arbiter(ArbiterConfig(), RecoveryConfig(give_up_ns=1_000 * MS), seed=5))
    result = simulate(timed, arrivals, server, rtt_ns=MS, process=lambda t, a: t.on_packet(a.feed, a.data,
                                                                                           a.time_ns))
    assert timed.give_ups
    for at, g in timed.give_ups:  # every part was asked by a request that timed out before the give-up
        for s in (g.first, g.last):
            assert any(r.seq <= s < r.seq + r.count and t + 200 * MS <= at for t, r in timed.requests)
    lost = {s for _, g in timed.give_ups for s in range(g.first, g.last + 1)}
    assert result.sequences() == [s for s in range(1, len(messages) + 1) if s not in lost]
    assert timed.give_ups[-1][0] - start < 10_000 * MS  # bounded: the window's worth each retry interval
