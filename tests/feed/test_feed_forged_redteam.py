"""Forgeries an outside checker tried, each of which once got through (now each must hold, on the executable
specification and the C engine alike):

* the same forged packet on both feeds, or two forged packets in a row on one feed, a few messages ahead: the
  copies (or the same feed continuing) confirm the jump, but it stays provisional and the forging feed going
  back below it undoes it;
* two datagrams of a forger's session on one feed before the true session, or (``--join live``) two forged
  packets far ahead in a row: two datagrams of one feed are one source while the other feed is live;
* one forged END_OF_SESSION sent twice on one feed, or on A followed by a freeze of A while B carries the
  session past it: an end acts only after the quiet period without traffic past it on either feed;
* a session id that is not ASCII (any 10 bytes pass the wire's validation) is resumed after a restart;
* a forged packet from the server's address read late, after a request starting where it starts went out,
  though it arrived before."""

from __future__ import annotations

import pytest
from test_feed_session_confirm import NativeFlat, make  # noqa: F401  (the fixture: the specification, then C)

from logbuf.feed.arbiter import ArbiterConfig
from logbuf.feed.events import Deliver, EndOfSession, Feed, RecoveryRequest
from logbuf.feed.recovery import Jitter, Recovery, RecoveryConfig
from logbuf.feed.spec import SpecArbiter
from logbuf.marketdata import moldudp64 as m

TRUE = m.encode_session("TRUESESS01")
MS = 1_000_000
QUIET = ArbiterConfig().end_of_session_quiet_ns


def pk(first: int, count: int = 10, tag: bytes = b"T") -> bytes:
    return m.encode_downstream(TRUE, first, [tag + b"%d" % (first + i) for i in range(count)])


def forged_messages(events: list) -> list[int]:
    return [e.seq for e in events if isinstance(e, Deliver) and not bytes(e.message).startswith(b"T")]


@pytest.mark.parametrize("ahead", [20, 1000])
def test_the_same_forged_packet_on_both_feeds_is_never_published(make: type, ahead: int) -> None:  # noqa: F811
    arb = make(ArbiterConfig())
    events: list = []
    now = 0
    for feed in (Feed.A, Feed.B):
        events += arb.on_packet(feed, pk(1), now)
    forged = pk(11 + ahead, tag=b"FORGED")
    now += MS
    for feed in (Feed.A, Feed.B):  # one forger, both feeds
        events += arb.on_packet(feed, forged, now)
    for first in range(11, 61 + ahead, 10):  # the true stream goes on below it on both feeds, then past it
        now += MS
        for feed in (Feed.A, Feed.B):
            events += arb.on_packet(feed, pk(first), now)
    assert len([e for e in events if isinstance(e, Deliver)]) == 60 + ahead  # the true stream, all of it
    assert forged_messages(events) == []


@pytest.mark.parametrize("ahead", [20, 1000])
def test_two_forged_packets_in_a_row_on_one_feed_are_never_published(make: type, ahead: int) -> None:  # noqa: F811
    arb = make(ArbiterConfig())
    events: list = []
    now = 0
    for feed in (Feed.A, Feed.B):
        events += arb.on_packet(feed, pk(1), now)
    now += MS
    events += arb.on_packet(Feed.B, pk(11 + ahead, tag=b"FORGED"), now)  # one forger, one feed, two datagrams
    events += arb.on_packet(Feed.B, pk(21 + ahead, tag=b"FORGED"), now)
    for first in range(11, 71 + ahead, 10):  # the true stream goes on below them on both feeds, then past them
        now += MS
        for feed in (Feed.A, Feed.B):
            events += arb.on_packet(feed, pk(first), now)
    assert len([e for e in events if isinstance(e, Deliver)]) == 70 + ahead
    assert forged_messages(events) == []


def test_a_forged_end_on_a_frozen_feed_is_revealed_by_the_other_feeds_traffic(make: type) -> None:  # noqa: F811
    arb = make(ArbiterConfig())
    events: list = []
    now = 0
    for feed in (Feed.A, Feed.B):
        events += arb.on_packet(feed, pk(1), now)
    events += arb.on_packet(Feed.A, m.encode_end_of_session(TRUE, 11), now)  # forged; then A freezes
    step = QUIET // 4
    for first in range(11, 61, 10):  # B alone carries the session past the "end" for longer than the quiet time
        now += step
        events += arb.on_tick(now)
        events += arb.on_packet(Feed.B, pk(first), now)
    now += step
    events += arb.on_tick(now)
    assert [e for e in events if isinstance(e, EndOfSession)] == []
    assert [e.seq for e in events if isinstance(e, Deliver)] == list(range(1, 61))


def test_a_forged_end_sent_twice_on_one_feed_does_not_end_the_session(make: type) -> None:  # noqa: F811
    arb = make(ArbiterConfig())
    events: list = []
    now = 0
    for feed in (Feed.A, Feed.B):
        events += arb.on_packet(feed, pk(1), now)
    for _ in range(2):  # one forger, one feed, the same datagram twice
        events += arb.on_packet(Feed.A, m.encode_end_of_session(TRUE, 11), now)
    for first in range(11, 61, 10):  # the true session goes on on both feeds
        now += MS
        for feed in (Feed.A, Feed.B):
            events += arb.on_packet(feed, pk(first), now)
    for feed in (Feed.A, Feed.B):  # and ends
        events += arb.on_packet(feed, m.encode_end_of_session(TRUE, 61), now)
    events += arb.on_tick(now + ArbiterConfig().end_of_session_quiet_ns)  # an end acts after the quiet period
    assert [e.next_sequence for e in events if isinstance(e, EndOfSession)] == [61]
    assert [e.seq for e in events if isinstance(e, Deliver)] == list(range(1, 61))


def test_two_datagrams_of_another_session_on_one_feed_never_choose_the_session(make: type) -> None:  # noqa: F811
    evil = m.encode_session("EVILSESS01")
    arb = make(ArbiterConfig())
    events: list = []
    events += arb.on_packet(Feed.A, m.encode_downstream(evil, 1, [b"EVIL1", b"EVIL2"]), 0)
    events += arb.on_packet(Feed.A, m.encode_downstream(evil, 3, [b"EVIL3"]), 0)
    now = 0
    for first in range(1, 51, 10):  # then the true session on both feeds
        now += MS
        for feed in (Feed.A, Feed.B):
            events += arb.on_packet(feed, pk(first), now)
    assert forged_messages(events) == []
    assert [e.seq for e in events if isinstance(e, Deliver)] == list(range(1, 51))


def test_join_live_never_starts_at_two_forged_packets_on_one_feed(make: type) -> None:  # noqa: F811
    arb = make(ArbiterConfig(start_sequence=None))
    events: list = []
    events += arb.on_packet(Feed.A, m.encode_downstream(TRUE, 10**9, [b"FORGED1"]), 0)
    events += arb.on_packet(Feed.A, m.encode_downstream(TRUE, 10**9 + 1, [b"FORGED2"]), 0)
    now = 0
    for first in range(5001, 5051, 10):
        now += MS
        for feed in (Feed.A, Feed.B):
            events += arb.on_packet(feed, pk(first), now)
    assert forged_messages(events) == []
    assert [e.seq for e in events if isinstance(e, Deliver)] == list(range(5001, 5051))


def test_a_session_id_the_wire_accepted_can_be_resumed_after_a_restart(make: type) -> None:  # noqa: F811
    raw = b"\xff\x00SES\xe9\n\x01 \x7f"  # a valid datagram's session field: any 10 bytes pass validation
    first_run = make(ArbiterConfig())
    got = _delivered(first_run.on_packet(Feed.A, _packet(raw, 1), 0) + first_run.on_packet(Feed.B, _packet(raw, 1), 0))
    assert got == list(range(1, 11))  # the first run adopts and publishes it
    restarted = make(ArbiterConfig(resume=(raw, 11)))  # what read_checkpoint hands back after a SIGKILL
    events = restarted.on_packet(Feed.A, _packet(raw, 11), 0) + restarted.on_packet(Feed.B, _packet(raw, 11), 0)
    assert _delivered(events) == list(range(11, 21))


def _packet(session: bytes, first: int) -> bytes:
    return m.HEADER.pack(session, first, 10) + b"".join(
        len(b"T%d" % s).to_bytes(2, "big") + b"T%d" % s for s in range(first, first + 10))


def _delivered(events: list) -> list[int]:
    return [e.seq for e in events if isinstance(e, Deliver)]


def test_a_forged_datagram_ahead_held_at_the_session_start_is_revealed_by_its_feed_going_on(
        make: type) -> None:  # noqa: F811
    """Before A's first datagram confirms the session, B sends 1–10, a forged 12 and then its true 11, 12 and 13:
    B's datagrams are held until A confirms, then replayed in the order B sent them, so B's true 11 reveals the
    forged 12. (Held only when past what B held, and replayed by position, the true 11 and 12 were dropped as
    repeats and B's 13 confirmed the forged 12 as B going on after it: it was published.)"""
    arb = make(ArbiterConfig())
    events: list = []
    events += arb.on_packet(Feed.B, pk(1), 0)
    events += arb.on_packet(Feed.B, pk(12, 1, tag=b"FORGED"), 1)
    for t, first in enumerate((11, 12, 13), 2):
        events += arb.on_packet(Feed.B, pk(first, 1), t)
    events += arb.on_packet(Feed.A, pk(1), 5)  # the session is confirmed: B's held datagrams replay
    for first in range(11, 41):
        now = 5 + first * MS
        events += arb.on_packet(Feed.A, pk(first, 1), now)
        events += arb.on_packet(Feed.B, pk(first, 1), now)
    assert [e.seq for e in events if isinstance(e, Deliver)] == list(range(1, 41))
    assert forged_messages(events) == []


@pytest.mark.parametrize("engine", ["spec", "native"])
def test_a_packet_that_arrived_before_a_request_went_out_is_no_answer_to_it(engine: str) -> None:
    """A starved handler reads its answers socket late: a forged packet the server's address sent before a request
    starting at its first sequence went out (the arrival stamp tells) is no answer to it and is never published;
    the true answer, arriving after the request, is."""
    config, pacing = ArbiterConfig(), RecoveryConfig()
    arb = (SpecArbiter(config, Recovery(pacing, rng=Jitter(7))) if engine == "spec"
           else NativeFlat(config, pacing, seed=7))
    events: list = []
    now = 0
    for first in (1, 11, 21, 31):
        if first != 11:  # 11-20 lost on both feeds
            now += MS
            for feed in (Feed.A, Feed.B):
                events += arb.on_packet(feed, pk(first), now)
    requests: list = []
    while not requests:  # detection, then the initial back-off: the request for the hole goes out
        now = arb.next_deadline_ns()
        assert now is not None
        requests = [e for e in arb.on_tick(now) if isinstance(e, RecoveryRequest)]
    assert requests[0].seq == 11
    sent = now
    events += arb.on_packet(Feed.RETRANSMIT, pk(11, tag=b"FORGED"), sent - 1)  # read late: it came before
    events += arb.on_packet(Feed.RETRANSMIT, pk(11), sent + MS)  # the true answer
    for first in range(41, 61, 10):
        now = sent + 2 * MS + first
        for feed in (Feed.A, Feed.B):
            events += arb.on_packet(feed, pk(first), now)
    assert [e.seq for e in events if isinstance(e, Deliver)] == list(range(1, 61))
    assert forged_messages(events) == []
