"""A discrete-event simulation around the arbiter: A/B packet arrivals, a retransmission server, a clock.

For the tests and what-if tuning of the gap-detection and recovery settings without sockets: build
packets with :func:`packetise`, give them arrival times and feeds (:class:`Arrival`), and :func:`simulate` feeds
them to an :class:`~logbuf.feed.arbiter.Arbiter` (or its specification) in time order,
ticks it at its deadlines, and answers its ``RecoveryRequest`` s from a :class:`RetransmitStub` after a
round-trip time. The stub answers the way ``logbuf.exchange.retransmit.core.RetransmitCore`` does: one packet from the
requested first sequence, as many messages as fit the budget, nothing at all when that first sequence is not
held.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from logbuf.feed.arbiter import Arbiter
from logbuf.feed.events import Deliver, DeliverBatch, Event, Feed, RecoveryRequest
from logbuf.feed.spec import SpecArbiter
from logbuf.marketdata import moldudp64
from logbuf.marketdata.moldudp64 import BLOCK_LENGTH_SIZE, DEFAULT_PAYLOAD_BUDGET, HEADER_LENGTH


@dataclass(frozen=True)
class Arrival:
    """Datagram ``data`` arriving on ``feed`` at ``time_ns``."""

    time_ns: int
    feed: Feed
    data: bytes


def catch_up_scenario(session: str | bytes = "CATCHUP", n: int = 3000, freeze_after: int = 1000,
                      freeze_ns: int = 30_000_000, interval_ns: int = 20_000, b_delay_ns: int = 3_000_000
                      ) -> tuple[list[bytes], list[Arrival]]:
    """The catch-up incident: A and B carry the same ``n`` messages (one every ``interval_ns``) packed differently
    (A ~5 per packet, B 3/4/6), B ``b_delay_ns`` behind A. A's head end freezes after message ``freeze_after``
    for ``freeze_ns`` and then catches up with ~70-message packets sent 1 us apart, overtaking B: one of them
    starts with messages B already delivered and carries fresh ones. Returns (messages, arrivals)."""
    messages = [b"msg %d" % i for i in range(1, n + 1)]
    t = [i * interval_ns for i in range(n + 2)]  # source time of message i
    arrivals = []
    for first, count, data in packetise(session, 1, messages, itertools.repeat(5)):
        if first <= freeze_after:
            arrivals.append(Arrival(t[first + count - 1] + 10_000, Feed.A, data))
    resume = t[freeze_after] + freeze_ns
    held = [i for i in range(freeze_after + 1, n + 1) if t[i] <= resume]
    burst = packetise(session, held[0], messages[held[0] - 1 : held[-1]], itertools.repeat(70))
    for k, (_, _, data) in enumerate(burst):
        arrivals.append(Arrival(resume + k * 1_000, Feed.A, data))
    after = held[-1] + 1
    for first, count, data in packetise(session, after, messages[after - 1 :], itertools.repeat(5)):
        arrivals.append(Arrival(max(t[first + count - 1], resume + len(burst) * 1_000) + 10_000, Feed.A, data))
    for first, count, data in packetise(session, 1, messages, itertools.cycle([3, 4, 6])):
        arrivals.append(Arrival(t[first + count - 1] + b_delay_ns, Feed.B, data))
    return messages, arrivals


def packetise(session: str | bytes, first_sequence: int, messages: Sequence[bytes],
              sizes: Iterable[int]) -> list[tuple[int, int, bytes]]:
    """Cut ``messages`` (sequence ``first_sequence`` onwards) into packets of ``sizes`` messages each (the last
    takes what is left); returns ``(first sequence, count, packet bytes)`` per packet."""
    out: list[tuple[int, int, bytes]] = []
    i = 0
    sizes_iter = iter(sizes)
    while i < len(messages):
        n = max(1, min(next(sizes_iter, len(messages) - i), len(messages) - i))
        out.append((first_sequence + i, n,
                    moldudp64.encode_downstream(session, first_sequence + i, messages[i : i + n])))
        i += n
    return out


class RetransmitStub:
    """Answers MoldUDP64 re-requests from ``messages`` (sequence 1 onwards) except the ``missing`` sequences;
    with ``rate`` (answers per second), requests past a token bucket of that rate (a tenth of a second's burst,
    at least one) are dropped, as a rate-limited server does."""

    def __init__(self, session: str | bytes, messages: Sequence[bytes], missing: Iterable[int] = (),
                 budget: int = DEFAULT_PAYLOAD_BUDGET, rate: float | None = None) -> None:
        self.session = moldudp64.encode_session(session)
        self.messages = messages
        self.missing = set(missing)
        self.budget = budget
        self.requests: list[tuple[int, int]] = []
        self.rate = rate
        self.dropped = 0
        self._burst = 0.0 if rate is None else max(1.0, rate / 10)
        self._tokens = self._burst
        self._tokens_ns = 0

    def answer(self, request: bytes, now_ns: int = 0) -> bytes | None:
        req = moldudp64.decode_request(request)
        self.requests.append((req.sequence, req.count))
        if self.rate is not None:
            self._tokens = min(self._burst, self._tokens + (now_ns - self._tokens_ns) * self.rate / 1e9)
            self._tokens_ns = max(self._tokens_ns, now_ns)
            if self._tokens < 1:
                self.dropped += 1
                return None
            self._tokens -= 1
        first = req.sequence
        if req.session != self.session or first in self.missing or first > len(self.messages):
            return None
        out: list[bytes] = []
        size = HEADER_LENGTH
        seq = first
        while seq < first + req.count and seq <= len(self.messages) and seq not in self.missing:
            framed = BLOCK_LENGTH_SIZE + len(self.messages[seq - 1])
            if out and size + framed > self.budget:
                break
            out.append(self.messages[seq - 1])
            size += framed
            seq += 1
        return moldudp64.encode_downstream(self.session, first, out)


@dataclass
class SimResult:
    delivered: list[Deliver] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)  # everything but deliveries, in order
    ordered: list[Event] = field(default_factory=list)  # everything, deliveries as Deliver, in order
    end_ns: int = 0

    def sequences(self) -> list[int]:
        return [d.seq for d in self.delivered]

    def of_type(self, kind: type) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]


def simulate(arbiter: Arbiter | SpecArbiter, arrivals: Iterable[Arrival], server: RetransmitStub | None = None,
             rtt_ns: int = 200_000, until_ns: int | None = None,
             process: Callable[[Arbiter | SpecArbiter, Arrival], list[Event]] | None = None,
             stalls: Sequence[tuple[int, int]] = ()) -> SimResult:
    """Run ``arrivals`` (any order; sorted by time, ties in the given order) through ``arbiter``.

    Between arrivals the arbiter is ticked at its ``next_deadline_ns``; requests it emits are answered by
    ``server`` ``rtt_ns`` later (as feed RETRANSMIT). Stops when nothing is left to happen or at ``until_ns``.
    ``process`` replaces ``arbiter.on_packet`` (e.g. to go through a receive ring). ``stalls`` are
    ``[start, end)`` windows in which the handler does not run (a starved machine): what falls due or arrives
    inside one is handled at its end, datagrams first and stamped with that time (read late, no kernel stamps)."""
    order = itertools.count()
    queue: list[tuple[int, int, Arrival]] = [(a.time_ns, next(order), a) for a in arrivals]
    heapq.heapify(queue)
    result = SimResult()
    handle = process or (lambda arb, a: arb.on_packet(a.feed, a.data, a.time_ns))

    def collect(events: list[Event], now: int) -> None:
        for event in events:
            if isinstance(event, Deliver):
                result.delivered.append(event)
                result.ordered.append(event)
            elif isinstance(event, DeliverBatch):
                delivers = event.delivers()
                result.delivered.extend(delivers)
                result.ordered.extend(delivers)
            else:
                result.ordered.append(event)
                result.events.append(event)
                if isinstance(event, RecoveryRequest) and server is not None:
                    answer = server.answer(event.encode(), now)
                    for datagram in [] if answer is None else answer if isinstance(answer, list) else [answer]:
                        # (a server may send several datagrams per request: they arrive in that order)
                        heapq.heappush(queue, (now + rtt_ns, next(order), Arrival(now + rtt_ns, Feed.RETRANSMIT,
                                                                                  datagram)))

    def awake(t: int) -> int:
        """When the handler runs for something due at ``t``."""
        for start, end in stalls:
            if start <= t < end:
                return end
        return t

    now = 0
    last_tick: int | None = None
    while True:
        deadline = arbiter.next_deadline_ns()
        next_arrival = queue[0][0] if queue else None
        if next_arrival is None and deadline is None:
            break
        if deadline is not None and (next_arrival is None or awake(deadline) < awake(next_arrival)):
            deadline = awake(deadline)
            if last_tick is not None and deadline <= last_tick:
                raise RuntimeError(f"arbiter deadline {deadline} does not advance past its tick at {last_tick}")
            now = max(now, deadline)
            if until_ns is not None and now > until_ns:
                break
            collect(arbiter.on_tick(now), now)
            last_tick = now
            continue
        assert next_arrival is not None  # with no arrival queued, the deadline branch above ran
        now = max(now, awake(next_arrival))
        if until_ns is not None and now > until_ns:
            break
        _, _, arrival = heapq.heappop(queue)
        if arrival.time_ns != now:  # read late, after a stall
            arrival = dataclasses.replace(arrival, time_ns=now)
        collect(handle(arbiter, arrival), now)
    result.end_ns = now
    return result
