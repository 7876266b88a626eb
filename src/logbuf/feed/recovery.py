"""Re-request pacing for MoldUDP64 gaps: a sans-IO state machine (no sockets, no clock, an injectable RNG).

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
                       └─ a missing message first requested give_up ago ─► expired() > 0  (default 10 s)
    stop() when caught up (no hole left).

Give-up is per message, by age: ``expired`` counts the leading holes whose first message was first requested
at least ``give_up_ns`` ago. Because requests go out head first, the time a sequence was first requested never
decreases along the stream, so a list of ``(sequence, time)`` breakpoints records it in O(rounds) memory.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass

from logbuf.feed.moldudp64 import MAX_MESSAGE_COUNT

NANOS_PER_MILLI = 1_000_000
NANOS_PER_SECOND = 1_000_000_000
_MILLI = 1_000  # request rates are kept to a thousandth of a request per second
_TOKEN = NANOS_PER_SECOND * _MILLI  # one request in the bucket's units (rate_units are added per ns)

Hole = tuple[int, int]  # inclusive (first, last) sequence range
# Pacing: under the 1,000 requests/s per client a retransmission server typically allows, with room for a burst.
DEFAULT_REQUEST_RATE = 800.0
DEFAULT_REQUEST_BURST = 64


@dataclass(frozen=True)
class RecoveryConfig:
    """Re-request pacing; defaults as in a common NAK scheme (initial back-off 50 ms × 0.5–1.5, retry 200 ms, give up 10 s)."""

    initial_backoff_ns: int = 50 * NANOS_PER_MILLI
    backoff_jitter: tuple[float, float] = (0.5, 1.5)
    retry_interval_ns: int = 200 * NANOS_PER_MILLI
    give_up_ns: int = 10 * NANOS_PER_SECOND
    max_request_count: int = MAX_MESSAGE_COUNT
    max_outstanding: int = 64
    request_rate: float = DEFAULT_REQUEST_RATE  # requests per second (kept under the server's per-client limit)
    request_burst: int = DEFAULT_REQUEST_BURST  # requests that may go out at once after a quiet period

    def __post_init__(self) -> None:
        low, high = self.backoff_jitter
        if not 0.0 <= low <= high:
            raise ValueError(f"backoff_jitter {self.backoff_jitter} must satisfy 0 <= low <= high")
        if self.initial_backoff_ns < 0:
            raise ValueError("initial_backoff_ns must be >= 0")
        if self.retry_interval_ns <= 0 or self.give_up_ns <= 0:
            raise ValueError("retry_interval_ns and give_up_ns must be > 0")
        if not 1 <= self.max_request_count <= MAX_MESSAGE_COUNT:
            raise ValueError(f"max_request_count must be within 1..{MAX_MESSAGE_COUNT} (MoldUDP64 request count)")
        if self.max_outstanding < 1:
            raise ValueError("max_outstanding must be >= 1")
        if self.request_rate <= 0 or self.request_burst < 1:
            raise ValueError("request_rate must be > 0 and request_burst >= 1")


class Recovery:
    """Decides which ``(seq, count)`` re-requests to send and when to give up (pure; see the module doc)."""

    __slots__ = ("config", "_rng", "active", "_ready_ns", "_outstanding", "_bp_seq", "_bp_ns", "_requested_upto",
                 "requests_sent", "answers", "_chunk", "_rate_units", "_tokens", "_tokens_ns", "_paced", "last_answer_ns",
                 "requests_paced", "_asked")

    def __init__(self, config: RecoveryConfig | None = None, rng: random.Random | None = None) -> None:
        self.config = config or RecoveryConfig()
        self._rng = rng if rng is not None else random.Random()
        self.active = False
        self._ready_ns: int | None = None  # end of the initial back-off; None once the first round went out
        self._outstanding: dict[int, int] = {}  # first sequence of an in-flight request -> when it was sent
        self._bp_seq: list[int] = []  # breakpoints: sequences >= _bp_seq[i] were first requested at _bp_ns[i]
        self._bp_ns: list[int] = []
        self._requested_upto = 0  # highest sequence any request has covered
        self.requests_sent = 0
        self.answers = 0
        self._chunk = self.config.max_request_count  # messages per request: learned from the answers' size
        self._asked: dict[int, int] = {}  # first sequence of a request sent -> the count it asked for
        # the token bucket in exact integer units (_TOKEN per request; _rate_units added per ns): where it stands
        # at a given time does not depend on when it was last refilled, so neither does the next deadline
        self._rate_units = max(1, round(self.config.request_rate * _MILLI))
        self._tokens = self.config.request_burst * _TOKEN
        self._tokens_ns: int | None = None
        self._paced = False  # the last poll held requests back for want of tokens
        self.last_answer_ns: int | None = None
        self.requests_paced = 0  # polls that held requests back to stay under request_rate

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
        self._bp_seq.clear()
        self._bp_ns.clear()
        self._requested_upto = 0
        self._asked.clear()
        self._paced = False

    # -- inputs -----------------------------------------------------------------------------------------------

    def on_answer(self, first: int, now_ns: int, count: int | None = None) -> None:
        """A retransmitted packet starting at ``first`` (``count`` messages) arrived: the request it answers is
        no longer in flight (counted in ``answers``; what is still missing is asked for by the next
        :meth:`poll`). An answer is one packet, so its size is what later requests ask for: several answer-sized
        requests go out per hole instead of one request per answer."""
        self.last_answer_ns = now_ns
        if self._outstanding.pop(first, None) is not None:
            self.answers += 1
        asked = self._asked.pop(first, None)
        if asked is not None and count is not None and count >= 1:
            if count < asked:  # the answer packet was full: that is what one request brings back
                self._chunk = count
            elif count == asked == self._chunk:  # maybe more fits: probe upwards
                self._chunk = min(self.config.max_request_count, self._chunk + self._chunk // 4 + 1)

    def poll(self, holes: Sequence[Hole], now_ns: int) -> list[tuple[int, int]]:
        """The ``(seq, count)`` requests to send now for ``holes`` (head first, inclusive ranges)."""
        if not self.active:
            return []
        if self._ready_ns is not None:
            if now_ns < self._ready_ns:
                return []
            self._ready_ns = None
        cfg = self.config
        chunk = self._chunk
        self._refill(now_ns)
        self._paced = False
        old = self._outstanding
        kept: dict[int, int] = {}
        out: list[tuple[int, int]] = []
        for first, last in holes:
            seq = first
            while seq <= last:
                if len(kept) >= cfg.max_outstanding:
                    break
                count = min(chunk, last - seq + 1)
                sent = old.get(seq)
                if sent is None or now_ns - sent >= cfg.retry_interval_ns:
                    if self._tokens < _TOKEN:  # paced: the rest goes out as tokens come back
                        self._paced = True
                        if sent is None:
                            break
                        kept[seq] = sent
                        seq += count
                        continue
                    self._tokens -= _TOKEN
                    self._asked[seq] = count
                    out.append((seq, count))
                    sent = now_ns
                    self._note_requested(seq + count - 1, now_ns)
                kept[seq] = sent
                seq += count
            if self._paced and seq <= last:
                break
            if len(kept) >= cfg.max_outstanding:
                break
        # requests for chunks that no longer start a hole (filled meanwhile) are forgotten: an answer to them
        # still fills the stream, and a retry would only ask for data already here
        self._outstanding = kept
        if len(self._asked) > 4 * cfg.max_outstanding:  # answers that never came: keep the table bounded
            self._asked = {seq: n for seq, n in self._asked.items() if seq in kept}
        self.requests_sent += len(out)
        if self._paced:
            self.requests_paced += 1
        return out

    def _refill(self, now_ns: int) -> None:
        cfg = self.config
        if self._tokens_ns is not None and now_ns > self._tokens_ns:
            self._tokens = min(cfg.request_burst * _TOKEN, self._tokens + (now_ns - self._tokens_ns) * self._rate_units)
        if self._tokens_ns is None or now_ns > self._tokens_ns:
            self._tokens_ns = now_ns

    def expired(self, holes: Sequence[Hole], now_ns: int) -> int:
        """How many of the leading ``holes`` have been requested for ``give_up_ns`` without being filled."""
        if not self.active or not self._bp_seq:
            return 0
        n = 0
        for first, _last in holes:
            requested_ns = self._first_requested_ns(first)
            if requested_ns is None or now_ns - requested_ns < self.config.give_up_ns:
                break
            n += 1
        return n

    def next_deadline_ns(self) -> int | None:
        """The earliest time :meth:`poll` or :meth:`expired` may have something new to say (None: idle)."""
        if not self.active:
            return None
        if self._ready_ns is not None:
            return self._ready_ns
        candidates = []
        if self._outstanding:
            candidates.append(min(self._outstanding.values()) + self.config.retry_interval_ns)
        if self._bp_ns:
            candidates.append(self._bp_ns[0] + self.config.give_up_ns)
        if self._paced and self._tokens_ns is not None:
            # requests are waiting for a token: the moment it is whole is the next thing to happen (nothing due
            # can go out before it; a give-up falls due at most one token interval late)
            return self._tokens_ns + -(-(_TOKEN - self._tokens) // self._rate_units)
        return min(candidates) if candidates else None

    def forget_below(self, seq: int) -> None:
        """The stream has moved to ``seq``: drop breakpoints that can no longer matter (keeps memory bounded)."""
        if seq > self._requested_upto:  # nothing still missing has been asked for yet
            self._bp_seq.clear()
            self._bp_ns.clear()
            return
        i = bisect.bisect_right(self._bp_seq, seq) - 1  # the breakpoint covering seq stays
        if i > 0:
            del self._bp_seq[:i]
            del self._bp_ns[:i]

    # -- internals --------------------------------------------------------------------------------------------

    def _note_requested(self, last: int, now_ns: int) -> None:
        if last > self._requested_upto:
            self._bp_seq.append(self._requested_upto + 1)
            self._bp_ns.append(now_ns)
            self._requested_upto = last

    def _first_requested_ns(self, seq: int) -> int | None:
        if seq > self._requested_upto:
            return None
        i = bisect.bisect_right(self._bp_seq, seq) - 1
        return self._bp_ns[i] if i >= 0 else None
