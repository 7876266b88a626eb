"""Per-client rate limits: a token bucket per client address (sans-IO: the clock is an argument).

The specification of the buckets in ``native/rtx_fair.c`` (the same arithmetic, in the same order)."""

from __future__ import annotations

from collections import OrderedDict

from logbuf.exchange.retransmit.ring import RetransmitError
from logbuf.units import NANOS_PER_SECOND

DEFAULT_RATE = 1_000.0  # answers per second per client
DEFAULT_BURST = 100.0


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; a request costs one token."""

    __slots__ = ("rate", "burst", "tokens", "updated_ns")

    def __init__(self, rate: float, burst: float, now_ns: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated_ns = now_ns

    def take(self, now_ns: int) -> bool:
        elapsed = max(0, now_ns - self.updated_ns)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate / NANOS_PER_SECOND)
        self.updated_ns = now_ns
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class RateLimiter:
    """A token bucket per client address, at most ``max_clients`` remembered (least recently seen evicted)."""

    def __init__(self, rate: float = DEFAULT_RATE, burst: float = DEFAULT_BURST, max_clients: int = 4_096) -> None:
        if not rate > 0 or not burst >= 1 or max_clients < 1:
            raise RetransmitError("rate must be > 0, burst >= 1 and max_clients >= 1")
        self.rate = rate
        self.burst = burst
        self.max_clients = max_clients
        self._buckets: OrderedDict[object, TokenBucket] = OrderedDict()

    def allow(self, client: object, now_ns: int) -> bool:
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, now_ns)
            self._buckets[client] = bucket
            if len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(client)
        return bucket.take(now_ns)
