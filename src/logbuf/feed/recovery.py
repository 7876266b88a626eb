"""Re-request pacing for MoldUDP64 gaps: a sans-IO state machine (no sockets, no clock, an injectable RNG).

This is the specification of the pacing the C engine runs (``native/feed_recovery.c``, function for function);
:class:`~logbuf.feed.spec.SpecArbiter` drives it, and the property tests require the same requests and give-ups
from both. :class:`Jitter` is the engine's random generator (splitmix64), so both draw the same back-offs.

The arbiter owns the stream and knows which messages are missing; this object decides *when* to ask the
retransmission server for them and when to give up. It is told the current holes (inclusive ``(first, last)``
ranges inside ``[next expected, highest seen]``, head first) and the time, and answers with the requests due::

    gap declared ─► start(now): first round after a randomised back-off
                       │          initial_backoff × U(jitter)         (default 50 ms × 0.5..1.5)
                       ▼
    poll(holes, now) ─► one request per hole chunk without an outstanding request
                       │   chunk = [start, start + max_request_count − 1]   (MoldUDP64 counts ≤ 0xFFFE)
                       │   at most max_outstanding requests in flight
                       ├─ an answer fills the front of a hole ─► the rest starts at a new sequence with
                       │       no request in flight, so the next poll asks for it without waiting
                       │       (an answer is one packet: "clients re-request the rest")
                       ├─ no answer for retry_interval ─► asked again         (default 200 ms)
                       │       (its first time-out while a request sent after it was answered: congestion, the
                       │        rate halves)
                       └─ give_up without an answer nor a congestion cut ─► expired(): the last sequence of
                              the leading run asked and not answered (default 10 s)
    stop() when caught up (no hole left).

**Answer-sized requests.** A MoldUDP64 server answers a request with one packet (as many of the asked messages
as fit); clients re-request the rest. Until the first answer shows how many messages a packet carries, requests
ask for as much as a request may; afterwards each asks for one answer's worth: the count of the last answer
that came back shorter than asked (until one has, the size grows by a quarter whenever an answer brings all it
was asked for), up to ``max_outstanding`` in flight, paced
by a token bucket at ``request_rate`` (under the 1,000 requests/s per client retransmission servers commonly
allow). Recovery then fetches ``request_rate`` packets per second whatever the size of the hole.

**The rate adapts to the server (AIMD).** A server over its capacity drops requests. A request that times out
for the first time while a request sent after it has been answered signals congestion (the server is alive and
skipping ours): the rate halves (at most once per ``retry_interval``, down to a 64th of ``request_rate``). Each answer to a request in flight
raises it by ``request_rate / 16 / (rate now)`` requests/s, i.e. a 16th of ``request_rate`` per second of
answers, up to ``request_rate``. Rates are integers in thousandths of a request per second, as the bucket's.

**An answer holds its request.** An answered request stays in flight until the stream moves (the first hole
starts elsewhere) or ``retry_interval`` has passed since the answer: when its answer could not be kept (the
queue is full behind a hole the stream waits at) the same chunk is not asked again round after round, taking
the tokens the other holes' retries need.

**A stall of the handler is not the server's.** While requests are in flight the pacing asks to be consulted at
least every half ``retry_interval``; when it is not consulted for more than a whole one (a starved machine, time
jumps, answers queue unread), the requests in flight wait a whole retry interval again from then, the silence
and give-up clocks restart then, and the rate is left alone.

**Give-up counts only what was really asked.** A sequence counts as requested only once a request that one
answer would have covered was sent (the answer-sized prefix of a request; before the size is known, its first
sequence).
``expired`` names the last sequence to give up: the leading run (from the first hole on) of sequences still
missing ``give_up_ns`` after the latest of their first request, the last answer to a request for them (an
answer that could not be kept is still the server answering) and the last congestion cut (a dropped request
says nothing about whether the server has the data: a slow server restarts every give-up clock while it
drops). When the server has answered nothing for ``give_up_ns`` while requests were in flight (it stopped
answering), it is also the leading run covered by requests that timed out unanswered (what they asked); the
rest is asked for and given up in turn as its requests time out. A part of a hole no request asked for is never
given up: a hole may go in several parts. (A range the server lacks that is wider than the window fills it
with requests nobody answers, which is what a server that stopped answering looks like: what they asked is
given up after ``give_up``, then the rest of the range a window at a time as it is asked and times out.)
Because requests go out head first, the time a sequence was first requested never decreases along the
stream, so a list of ``(sequence, time)`` breakpoints records it in O(rounds) memory.

**An answer is taken only where a request started.** The arbiter publishes a packet from the server only when
it starts at a request's first sequence (and only what that request asked). One starting inside a request in
flight is not published: it is a hint (:meth:`Recovery.on_hint`) that the server may lack the request's start
and answer from the first sequence it still has. The next poll splits the request there: the part before asks
only up to it (and is given up like any request, once asked, retried and unanswered for ``give_up``), and a
request of its own asks from the hinted sequence, whose answer alone is taken. What the hint claims of the
request's range gets a new give-up clock (the server shows it has it); a hint is no answer and leaves the
silence clock running.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence

from logbuf.feed.config import (  # noqa: F401  (re-exported: the pacing's settings)
    DEFAULT_REQUEST_BURST,
    DEFAULT_REQUEST_RATE,
    NANOS_PER_MILLI,
    NANOS_PER_SECOND,
    RecoveryConfig,
)

_MILLI = 1_000  # request rates are kept to a thousandth of a request per second
_TOKEN = NANOS_PER_SECOND * _MILLI  # one request in the bucket's units (rate_units are added per ns)
_U64 = (1 << 64) - 1

Hole = tuple[int, int]  # inclusive (first, last) sequence range


def _floor_units(cfg: RecoveryConfig) -> int:
    """The lowest rate congestion cuts to: a 64th of ``request_rate`` (thousandths of a request per second)."""
    return max(1, cfg.rate_units // 64)


def _raise_units(cfg: RecoveryConfig) -> int:
    """How much the rate rises per second of answers: a 16th of ``request_rate`` (thousandths per second)."""
    return max(1, cfg.rate_units // 16)


class Jitter:
    """The back-off jitter's generator, the same as the C engine's (splitmix64 seeded with ``seed``):
    ``uniform(low, high)`` is ``low + (high - low) * u`` with ``u`` the top 53 bits of the next output."""

    __slots__ = ("seed", "state")

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed & _U64
        self.state = self.seed

    def random(self) -> float:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _U64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
        z ^= z >> 31
        return (z >> 11) * (1.0 / (1 << 53))

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()


class Recovery:
    """Decides which ``(seq, count)`` re-requests to send and when to give up (pure; see the module doc)."""

    __slots__ = ("config", "_rng", "active", "_ready_ns", "_outstanding", "_req_starts", "_req_ends", "_req_ns",
                 "requests_sent", "answers", "_chunk", "_rate_units", "_tokens", "_tokens_ns", "_paced", "last_answer_ns",
                 "requests_paced", "_asked", "_quiet_ns", "_full_seen", "_shorter", "_head_ns", "_timed_out", "_cut_ns",
                 "_restart_ns", "_answered_sent_ns", "_seen_ns", "_held", "_head_first",
                 "_head_moved_ns", "_splits")

    def __init__(self, config: RecoveryConfig | None = None, rng: random.Random | Jitter | None = None) -> None:
        self.config = config or RecoveryConfig()
        self._rng = rng if rng is not None else random.Random()
        self.active = False
        self._ready_ns: int | None = None  # end of the initial back-off; None once the first round went out
        self._outstanding: dict[int, int] = {}  # first sequence of an in-flight request -> when it was sent
        # sequences requested (answerably) so far: disjoint ranges [_req_starts[i], _req_ends[i]] sorted by start,
        # first requested at _req_ns[i]
        self._req_starts: list[int] = []
        self._req_ends: list[int] = []
        self._req_ns: list[int] = []
        self.requests_sent = 0
        self.answers = 0
        self._chunk: int | None = None  # messages one answer carries: learned from the answers (None: unknown)
        self._full_seen = False  # an answer came back shorter than asked: its packet was full
        self._shorter = False  # the last answer came back shorter than the answer size learned
        self._asked: dict[int, int] = {}  # first sequence of a request sent -> the count it asked for
        # the token bucket in exact integer units (_TOKEN per request; _rate_units added per ns): where it stands
        # at a given time does not depend on when it was last refilled, so neither does the next deadline
        self._rate_units = self.config.rate_units
        self._tokens = self.config.request_burst * _TOKEN
        self._tokens_ns: int | None = None
        self._paced = False  # the last poll held requests back for want of tokens
        self.last_answer_ns: int | None = None
        self.requests_paced = 0  # polls that held requests back to stay under request_rate
        self._quiet_ns: int | None = None  # requests in flight and no answer since then (None: nothing in flight)
        self._head_ns: int | None = None  # when the first hole of the last poll was first requested (None: not)
        self._timed_out: set[int] = set()  # in-flight requests that already timed out once (each signals once)
        # answered requests held in flight (since the answer, in _outstanding) for a retry interval: asked again only
        # then if their chunk still starts a hole (the answer could not be kept); never a congestion signal
        self._held: set[int] = set()
        self._head_first: int | None = None  # the first hole's first sequence at the last poll
        self._head_moved_ns: int | None = None  # when it last changed (the stream moved)
        self._cut_ns: int | None = None  # the last congestion cut of the rate
        self._restart_ns: int | None = None  # the last cut or handler stall: every give-up clock restarts there
        self._answered_sent_ns: int | None = None  # the latest send time of a request answered while in flight
        self._seen_ns: int | None = None  # the latest time the pacing was told (an answer, a poll, an expiry check)
        # where an answer started inside a request in flight (sorted): each starts a request of its own
        self._splits: list[int] = []

    @property
    def rng(self) -> random.Random | Jitter:
        """The back-off jitter's generator."""
        return self._rng

    # -- lifecycle --------------------------------------------------------------------------------------------

    def start(self, now_ns: int) -> None:
        """A gap was declared: schedule the first round after the randomised initial back-off (no-op if active)."""
        if self.active:
            return
        low, high = self.config.backoff_jitter
        self.active = True
        self._ready_ns = now_ns + int(self.config.initial_backoff_ns * self._rng.uniform(low, high))

    def stop(self) -> None:
        """Caught up (or the session changed): forget every request."""
        self.active = False
        self._ready_ns = None
        self._outstanding.clear()
        self._req_starts.clear()
        self._req_ends.clear()
        self._req_ns.clear()
        self._asked.clear()
        self._splits.clear()
        self._paced = False
        self._quiet_ns = None
        self._head_ns = None
        self._timed_out.clear()
        self._held.clear()
        self._cut_ns = None
        self._restart_ns = None

    # -- inputs -----------------------------------------------------------------------------------------------

    def on_answer(self, first: int, now_ns: int, count: int | None = None) -> None:
        """A retransmitted packet starting at ``first`` (``count`` messages) arrived: the request it answers is
        no longer in flight (counted in ``answers``; what is still missing is asked for by the next
        :meth:`poll`). An answer is one packet, so its size is what later requests ask for: several answer-sized
        requests go out per hole instead of one request per answer."""
        self._resume(now_ns, due=False)
        self.last_answer_ns = now_ns
        request = self._answered_request(first)
        sent = None if request is None else self._outstanding[request]
        if request is not None and sent is not None and request not in self._held:
            self.answers += 1
            if self._answered_sent_ns is None or sent > self._answered_sent_ns:
                self._answered_sent_ns = sent
            # held in flight: if the answer was kept the hole moves on and the next poll forgets it; if it could not
            # be (the queue is full behind a hole the stream waits at), the same chunk is asked again only once
            # the stream moved (room may have come free) or a retry interval passed, so the tokens go to the other
            # holes' retries instead of to answers that cannot be kept either
            self._outstanding[request] = now_ns
            self._held.add(request)
            self._timed_out.add(request)  # (its wait after an answer signals nothing)
            # additive increase: back towards request_rate by a sixteenth of it per second of answers. The bucket
            # is filled up to now at the old rate first, so the tokens at any time do not depend on when polls ran
            self._refill(now_ns)
            rate = self._rate_units
            self._rate_units = min(self.config.rate_units, rate + max(1, _raise_units(self.config) * _MILLI // rate))
            # the server answers it: its give-up clock restarts (if the answer could not be kept, e.g. the queue is
            # full behind a hole the server lacks, the hole stays and is asked again; it is not the server's loss)
            self._answered(first, first + (count if count is not None and count >= 1 else 1) - 1, now_ns)
        if self.active:  # the server is answering: the silence clock restarts
            self._quiet_ns = now_ns
        asked = self._asked.pop(first, None)
        if asked is not None and count is not None and count >= 1:
            if count < asked:  # the answer packet was full: that is what one request brings back...
                chunk = self._chunk
                if not self._full_seen or chunk is None or count >= chunk or self._shorter:
                    self._chunk = count
                    self._shorter = False
                else:  # ...or the server's data ended there (it lacks what follows): one such answer sets nothing,
                    self._shorter = True  # a second in a row does (the packets really carry fewer now)
                self._full_seen = True
            else:
                self._shorter = False
                if count == asked == self._chunk and not self._full_seen:  # never full yet: maybe more fits
                    self._chunk = min(self.config.max_request_count, self._chunk + self._chunk // 4 + 1)

    def _answered_request(self, first: int) -> int | None:
        """The request in flight an answer starting at ``first`` answers: the one starting there, else None (the
        arbiter takes only answers starting where a request started)."""
        return first if first in self._outstanding else None

    def on_hint(self, first: int, count: int, now_ns: int) -> bool:
        """A packet from the server that is no answer (it starts where no request started, so it is not
        published) but starts inside a request in flight not answered yet: a server that lacks the start of what
        was asked may answer from the first sequence it still has. That request now asks only up to ``first``; the
        next :meth:`poll` asks from ``first`` on in a request of its own, and only that one's answer is taken. What
        the packet claims of the request's range restarts its give-up clock (the server shows it has it, as an
        answer that could not be kept does); what was asked before ``first`` is given up only as any request is
        (asked, retried, unanswered). Neither an answer nor the server answering: the silence clock runs on.
        Returns whether it was taken as a hint (at most ``4 * max_outstanding`` hinted starts are kept, the
        highest dropped first)."""
        if not self.active:
            return False
        starts = [seq for seq in self._outstanding if seq < first]
        if not starts:
            return False
        seq = max(starts)
        asked = self._asked.get(seq)
        if asked is None or first >= seq + asked or seq in self._held:
            return False
        self._asked[seq] = first - seq
        self._answered(first, min(first + max(1, count), seq + asked) - 1, now_ns)
        i = bisect.bisect_left(self._splits, first)
        if i == len(self._splits) or self._splits[i] != first:
            self._splits.insert(i, first)
            if len(self._splits) > 4 * self.config.max_outstanding:
                del self._splits[-1]
        return True

    def poll(self, holes: Sequence[Hole], now_ns: int) -> list[tuple[int, int]]:
        """The ``(seq, count)`` requests to send now for ``holes`` (head first, inclusive ranges)."""
        if not self.active:
            return []
        self._resume(now_ns, due=True)
        if self._ready_ns is not None:
            if now_ns < self._ready_ns:
                return []
            self._ready_ns = None
        cfg = self.config
        chunk = self._chunk
        if holes and holes[0][0] != self._head_first:  # the stream moved
            self._head_first = holes[0][0]
            self._head_moved_ns = now_ns
        # until an answer shows what one packet carries, requests ask for as much as they may (only their first
        # message counts as requested: one answer surely brings that back)
        window = cfg.max_outstanding
        request = chunk if chunk is not None else cfg.max_request_count
        answerable = chunk if chunk is not None else 1
        self._refill(now_ns)
        self._paced = False
        old = self._outstanding
        old_keys = sorted(old)
        # answered (held) as the poll found them: a hinted start's covering request is judged on what it was before
        # this walk re-sent it (as the time it was sent is), never on its fresh copy asking only up to the hint
        old_held = frozenset(self._held)
        splits = self._splits
        kept: dict[int, int] = {}
        timed_out: set[int] = set()
        held: set[int] = set()
        out: list[tuple[int, int]] = []
        for first, last in holes:
            seq = first
            chunk_end = 0  # where the chunk being walked ends (hinted starts cut it, the chunks after stay put)
            while seq <= last:
                if len(kept) >= window:
                    break
                count = min(request, last - seq + 1)
                s = bisect.bisect_right(splits, seq)  # a hinted start inside it ends it there
                hinted = s > 0 and splits[s - 1] == seq
                cover = None if seq in old or not hinted else self._covering(old, old_keys, old_held, seq, now_ns)
                if chunk_end > seq:  # the rest of a chunk cut at a hinted start: up to its end
                    count = min(count, chunk_end - seq)
                else:
                    chunk_end = seq + count
                if s < len(splits) and splits[s] < seq + count:
                    count = splits[s] - seq
                if cover is not None:  # a hinted start waits while the request it was cut from may be answered:
                    seq += count  # a copy of it still in flight could bring a packet starting here
                    continue
                if seq not in old:
                    j = bisect.bisect_right(old_keys, seq)
                    ahead = old_keys[j] if j < len(old_keys) else None
                    if (ahead is not None and ahead - seq < count and ahead not in self._timed_out
                            and now_ns - old[ahead] < cfg.retry_interval_ns):
                        # a request in flight starts inside this one, sent once and not answered yet: this waits
                        # for it (the server's packet for that one could start here and be taken for this one's
                        # answer); not for its retries (a dropped request would starve this one)
                        seq = ahead
                        chunk_end = 0
                        continue
                sent = old.get(seq)
                # an answered request whose chunk still starts a hole is due again once the stream moved
                moved = (sent is not None and seq in self._held and self._head_moved_ns is not None
                         and self._head_moved_ns >= sent)
                if sent is not None and now_ns - sent >= cfg.retry_interval_ns and seq not in self._timed_out:
                    self._timed_out.add(seq)  # its first time-out: the only one it signals
                    if self._answered_sent_ns is not None and self._answered_sent_ns > sent:
                        self._congested(now_ns)  # unanswered while a request sent after it was answered
                if sent is None or moved or now_ns - sent >= cfg.retry_interval_ns:
                    if self._tokens < _TOKEN:  # paced: the rest goes out as tokens come back
                        self._paced = True
                        if sent is None:
                            break
                        kept[seq] = sent
                        if seq in self._timed_out:
                            timed_out.add(seq)
                        if seq in self._held:
                            held.add(seq)
                        seq += count
                        continue
                    self._tokens -= _TOKEN
                    if seq in self._held:  # asked again after its hold: a fresh request
                        self._held.discard(seq)
                        self._timed_out.discard(seq)
                    self._asked[seq] = count
                    out.append((seq, count))
                    sent = now_ns
                    # requested: what one answer to it would have carried
                    self._note_requested(seq, seq + min(count, answerable) - 1, now_ns)
                kept[seq] = sent
                if seq in self._timed_out:
                    timed_out.add(seq)
                if seq in self._held:
                    held.add(seq)
                seq += count
            if self._paced and seq <= last:
                break
            if len(kept) >= window:
                break
        # requests for chunks that no longer start a hole (filled meanwhile) are forgotten: an answer to them
        # still fills the stream, and a retry would only ask for data already here
        if kept and (not old or self._quiet_ns is None):  # requests went in flight: the silence clock starts
            self._quiet_ns = now_ns
        elif not kept:
            self._quiet_ns = None
        self._outstanding = kept
        self._timed_out = timed_out
        self._held = held
        if len(self._asked) > 4 * cfg.max_outstanding:  # answers that never came: keep the table bounded
            self._asked = {seq: n for seq, n in self._asked.items() if seq in kept}
        self.requests_sent += len(out)
        if self._paced:
            self.requests_paced += 1
        # only the first hole can be given up first (expired counts leading holes): its time is the give-up's
        self._head_ns = self._first_requested_ns(holes[0][0]) if holes else None
        return out

    def _covering(self, old: dict[int, int], old_keys: list[int], old_held: frozenset[int], seq: int,
                  now_ns: int) -> int | None:
        """For a hinted start ``seq``: the request in flight cut there (it asks up to ``seq``), if it was not
        answered yet (``old_held``: answered when the poll began, even if the poll re-sent it since) and is not due
        again; None otherwise."""
        k = bisect.bisect_left(old_keys, seq) - 1
        if k < 0:
            return None
        start = old_keys[k]
        asked = self._asked.get(start)
        if asked is None or seq - start != asked or start in old_held:
            return None
        if now_ns - old[start] >= self.config.retry_interval_ns:
            # due: no longer covering; its first time-out is met here (the walk may not reach its start) and
            # signals as any (unanswered while a request sent after it was answered: congestion)
            if start not in self._timed_out:
                self._timed_out.add(start)
                if self._answered_sent_ns is not None and self._answered_sent_ns > old[start]:
                    self._congested(now_ns)
            return None
        return start

    def _refill(self, now_ns: int) -> None:
        cfg = self.config
        if self._tokens_ns is not None and now_ns > self._tokens_ns:
            self._tokens = min(cfg.request_burst * _TOKEN, self._tokens + (now_ns - self._tokens_ns) * self._rate_units)
        if self._tokens_ns is None or now_ns > self._tokens_ns:
            self._tokens_ns = now_ns

    def expired(self, holes: Sequence[Hole], now_ns: int) -> int:
        """The last sequence to give up (0: none), from the first of the leading ``holes``: the longest run from
        there whose every sequence was requested ``give_up_ns`` ago (since its give-up clock started) without
        being filled; once the server has answered nothing for ``give_up_ns`` while requests were in flight, also
        the longest run covered by requests that timed out unanswered (what was asked; the longer of the two). A
        part of a hole never asked for is never given up: it is asked for first."""
        if not self.active:
            return 0
        self._resume(now_ns, due=True)
        upto = self._clock_upto(holes, now_ns)
        if self._server_silent(now_ns):
            # (also what a give-up clock ran out for: a sequence asked long ago whose request was sent again
            # lately, e.g. once a split pushed it out of the window, is not kept waiting for that one's time-out,
            # and the give-up deadline of the first hole always acts)
            return max(upto, self._silent_upto(holes, now_ns))
        return upto

    def _clock_upto(self, holes: Sequence[Hole], now_ns: int) -> int:
        """The last sequence of the leading run of ``holes`` requested ``give_up_ns`` ago (since its give-up clock
        started) and not filled, 0 if none."""
        starts, ends, times = self._req_starts, self._req_ends, self._req_ns
        give_up = self.config.give_up_ns
        upto = 0
        for first, last in holes:
            cur = first
            while cur <= last:
                i = bisect.bisect_right(starts, cur) - 1
                if i < 0 or ends[i] < cur or now_ns - self._clock_ns(times[i]) < give_up:
                    return upto
                upto = min(ends[i], last)
                cur = upto + 1
        return upto

    def _silent_upto(self, holes: Sequence[Hole], now_ns: int) -> int:
        """The server stopped answering: the last sequence of the leading run of ``holes`` covered by requests in
        flight that timed out unanswered (each counts what it asked for), 0 if none."""
        retry = self.config.retry_interval_ns
        upto = 0
        for first, last in holes:
            cur = first
            while cur <= last:
                sent = self._outstanding.get(cur)
                if (sent is None or cur in self._held
                        or (cur not in self._timed_out and now_ns - sent < retry)):
                    return upto
                upto = min(cur + max(1, self._asked.get(cur, 1)) - 1, last)
                cur = upto + 1
        return upto

    def next_deadline_ns(self) -> int | None:
        """The earliest time :meth:`poll` or :meth:`expired` may have something new to say (None: idle)."""
        if not self.active:
            return None
        if self._ready_ns is not None:
            return self._ready_ns
        candidates = []
        if self._head_ns is not None:
            candidates.append(self._clock_ns(self._head_ns) + self.config.give_up_ns)
        if self._quiet_ns is not None and self._outstanding:
            # the server falls silent then; once a check has seen it silent, what it gives up next falls due as
            # requests time out (their deadlines below)
            silent_ns = self._quiet_ns + self.config.give_up_ns
            if self._seen_ns is None or silent_ns > self._seen_ns:
                candidates.append(silent_ns)
        if self._paced and self._tokens_ns is not None:
            # requests are waiting for a token: nothing due can go out before it is whole (retries included),
            # but a give-up falls due on time
            candidates.append(self._tokens_ns + -(-(_TOKEN - self._tokens) // self._rate_units))
            # but a request's first time-out is due on time: it may signal congestion (a cut of the rate and of
            # every give-up clock), which must not wait for the next token nor depend on when the next poll runs
            fresh = [sent for seq, sent in self._outstanding.items() if seq not in self._timed_out]
            if fresh:
                candidates.append(min(fresh) + self.config.retry_interval_ns)
        elif self._outstanding:
            candidates.append(min(self._outstanding.values()) + self.config.retry_interval_ns)
        if self._outstanding and self._seen_ns is not None:
            # while requests are in flight the pacing is consulted at least every half retry interval, so a gap of
            # more than a whole one is the handler's own stall (see _resume), never the pacing's choice
            candidates.append(self._seen_ns + self.config.retry_interval_ns // 2)
        return min(candidates) if candidates else None

    def forget_below(self, seq: int) -> None:
        """The stream has moved to ``seq``: forget requests it has passed (keeps memory bounded)."""
        i = bisect.bisect_left(self._req_ends, seq)
        if i:
            del self._req_starts[:i]
            del self._req_ends[:i]
            del self._req_ns[:i]
        del self._splits[:bisect.bisect_right(self._splits, seq)]

    # -- internals --------------------------------------------------------------------------------------------

    def _resume(self, now_ns: int, *, due: bool) -> None:
        """The pacing is told the time (by an answer; by a poll or an expiry check only once
        :meth:`next_deadline_ns` has passed or while it has none, so calls made early change nothing): if it was not consulted for
        longer than ``retry_interval`` while requests were in flight, the handler stalled (a starved machine;
        answers may be queued unread), which is not the server's doing. The requests in flight wait a whole retry
        interval again from now, the silence clock and every give-up clock restart now, and the rate is left
        alone."""
        if due and self._outstanding:  # (nothing in flight: nothing can have waited, the time is simply taken)
            deadline = self.next_deadline_ns()
            if deadline is not None and now_ns < deadline:
                return
        seen = self._seen_ns
        if seen is not None and now_ns - seen > self.config.retry_interval_ns and self._outstanding:
            for seq in self._outstanding:
                self._outstanding[seq] = now_ns
            if self._quiet_ns is not None:
                self._quiet_ns = now_ns
            self._restart_ns = now_ns
        if seen is None or now_ns > seen:
            self._seen_ns = now_ns

    def _congested(self, now_ns: int) -> None:
        """A request timed out while one sent after it was answered: the server drops what it cannot serve. The rate
        halves (down to a floor; once per retry interval: one loss shows in every request sent meanwhile) and
        every give-up clock restarts: a request the server dropped says nothing about whether it has the data."""
        cfg = self.config
        if self._cut_ns is None or now_ns - self._cut_ns >= cfg.retry_interval_ns:
            self._rate_units = max(_floor_units(cfg), self._rate_units // 2)
            self._cut_ns = now_ns
            self._restart_ns = now_ns

    def _clock_ns(self, requested_ns: int) -> int:
        """Where a give-up clock started for a sequence first requested at ``requested_ns``: then, or at the last
        congestion cut or handler stall if later."""
        cut = self._restart_ns
        return requested_ns if cut is None or cut < requested_ns else cut

    @property
    def rate_units(self) -> int:
        """The request rate the pacing runs at now, in thousandths of a request per second (AIMD: halved on
        congestion down to ``request_rate / 64``, raised back to ``request_rate`` as answers come)."""
        return self._rate_units

    def _server_silent(self, now_ns: int) -> bool:
        quiet = self._quiet_ns
        return quiet is not None and bool(self._outstanding) and now_ns - quiet >= self.config.give_up_ns

    def _note_requested(self, first: int, last: int, now_ns: int) -> None:
        """[first, last] was asked for at ``now_ns``: the parts never asked for before are requested from now."""
        starts, ends, times = self._req_starts, self._req_ends, self._req_ns
        i = bisect.bisect_left(ends, first)  # the first range that may overlap
        cur = first
        while cur <= last:
            if i < len(starts) and starts[i] <= cur:  # inside a range already requested
                cur = ends[i] + 1
                i += 1
                continue
            end = last if i >= len(starts) else min(last, starts[i] - 1)
            if i > 0 and ends[i - 1] == cur - 1 and times[i - 1] == now_ns:  # extends the range before
                ends[i - 1] = end
            else:
                starts.insert(i, cur)
                ends.insert(i, end)
                times.insert(i, now_ns)
                i += 1
            cur = end + 1

    def _answered(self, first: int, last: int, now_ns: int) -> None:
        """An answer to a request in flight came for [first, last]: what of it was requested counts as requested
        from ``now_ns`` (split out of its range; nothing that was not requested becomes requested)."""
        starts, ends, times = self._req_starts, self._req_ends, self._req_ns
        cur = first
        while cur <= last:
            i = bisect.bisect_left(ends, cur)
            if i >= len(starts) or starts[i] > last:
                break
            lo, hi, ns = starts[i], ends[i], times[i]
            a, b = max(lo, cur), min(hi, last)
            del starts[i], ends[i], times[i]
            if b < hi:
                starts.insert(i, b + 1)
                ends.insert(i, hi)
                times.insert(i, ns)
            if lo < a:
                starts.insert(i, lo)
                ends.insert(i, a - 1)
                times.insert(i, ns)
            self._note_requested(a, b, now_ns)
            cur = b + 1

    def _first_requested_ns(self, seq: int) -> int | None:
        i = bisect.bisect_right(self._req_starts, seq) - 1
        return self._req_ns[i] if i >= 0 and self._req_ends[i] >= seq else None
