"""Two forged datagrams that agree: the same one on both feeds, or two in a row on one feed (the second continuing
the first). Copies are not sources: on feeds that lose nothing and run side by side, nothing forged is ever
published and nothing is given up, whatever the pair announces (data or heartbeats, below or above ``max_jump``),
and the C engine agrees with the executable specification on every event and counter.

The pair lands further ahead than one packet of either feed: a forged packet that the other feed's next packet
makes the stream's next message before the forging feed's own true traffic can reveal it is published (the first
copy of the next sequence wins; docs/feed.md says so)."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import hypothesis
from hypothesis import given
from hypothesis import strategies as st
from test_arbiter_properties import (
    PROFILE,
    S1,
    FeedFaults,
    feed_arrivals,
    feed_faults,
    make_messages,
    next_packets,
    run_spec_and_c,
)

from logbuf.feed.arbiter import ArbiterConfig
from logbuf.feed.events import Feed
from logbuf.marketdata import moldudp64 as m
from support.arbsim import Arrival


@dataclass(frozen=True)
class Pair:
    """Two forged datagrams just before the true packet number ``at`` of ``feed`` (after its first): ``ahead``
    messages past that packet's first sequence, data of ``count`` messages or a heartbeat; the same datagram on
    the other feed too (``both``), or a second one on ``feed`` continuing the first."""

    feed: Feed
    at: int
    ahead: int
    count: int
    heartbeat: bool
    both: bool


pairs = st.lists(st.builds(Pair, feed=st.sampled_from([Feed.A, Feed.B]), at=st.integers(0, 10_000),
                           ahead=st.integers(1, 80), count=st.integers(1, 12), heartbeat=st.booleans(),
                           both=st.booleans()),
                 min_size=1, max_size=2)


def _forged(first: int, count: int, heartbeat: bool) -> bytes:
    if heartbeat:
        return m.encode_heartbeat(S1, first)
    return m.encode_downstream(S1, first, [b"FORGED%d" % (first + i) for i in range(count)])


def forge_pairs(arrivals: list[Arrival], forged: list[Pair], beyond: int) -> list[Arrival]:
    out = list(arrivals)
    for p in forged:
        own = next_packets(arrivals, p.feed)
        if not own:
            continue
        true = own[p.at % len(own)]
        first = int.from_bytes(true.data[10:18], "big") + beyond + p.ahead
        data = _forged(first, p.count, p.heartbeat)
        out.append(Arrival(true.time_ns - 2, p.feed, data))
        if p.both:
            out.append(Arrival(true.time_ns - 1, Feed.B if p.feed == Feed.A else Feed.A, data))
        else:
            out.append(Arrival(true.time_ns - 1, p.feed, _forged(first + (1 if p.heartbeat else p.count),
                                                                 p.count, p.heartbeat)))
    return out


@PROFILE
@given(n=st.integers(30, 300), a=feed_faults, b=feed_faults, forged=pairs, seed=st.integers(0, 2**32),
       rtt_ns=st.integers(10_000, 5_000_000), recovery=st.booleans(), max_jump=st.sampled_from([4_096, 30]))
# (A's own forged jump to 4, below the one B's copy made provisional at 5, was not tied to it: B's true traffic
# undid 5 and A's 4-9 were published)
@hypothesis.example(n=30, a=FeedFaults(0.0, 0.0, 0.0, 0, 0, 1), b=FeedFaults(0.0, 0.0, 0.0, 0, 0, 1),
                    forged=[Pair(Feed.A, at=0, ahead=2, count=1, heartbeat=False, both=True),
                            Pair(Feed.A, at=0, ahead=1, count=3, heartbeat=False, both=False)],
                    seed=0, rtt_ns=10_000, recovery=False, max_jump=4_096)
def test_two_forged_datagrams_that_agree_are_never_published(
        n: int, a: FeedFaults, b: FeedFaults, forged: list[Pair], seed: int, rtt_ns: int, recovery: bool,
        max_jump: int) -> None:
    # feeds that only duplicate, side by side: every true message comes live, so nothing may be lost
    a, b = (dataclasses.replace(f, loss=0.0, reorder=0.0, jitter_ns=0, delay_ns=0) for f in (a, b))
    rng = random.Random(seed)
    messages = make_messages(n, rng)
    arrivals = forge_pairs(feed_arrivals(Feed.A, messages, a, rng) + feed_arrivals(Feed.B, messages, b, rng), forged,
                           max(a.max_packet, b.max_packet))
    arbiter, result = run_spec_and_c(ArbiterConfig(max_jump=max_jump), arrivals, messages, seed, rtt_ns, recovery)
    assert [(d.seq, d.message) for d in result.delivered] == list(enumerate(messages, 1))
    hypothesis.event("forged jumps revealed" if arbiter.counter_values()["jumps_forged"] else "none revealed")
