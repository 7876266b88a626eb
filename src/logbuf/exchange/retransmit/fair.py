"""Fair service (sans-IO): admitted requests in one bounded queue per client, answered round-robin.

The specification of the server's C service (:class:`~.service.NativeFairService`, ``native/rtx_fair.c``): a
property test drives both with the same requests, clients and clock readings and compares every outcome."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from logbuf.exchange.retransmit.core import RetransmitCore
from logbuf.exchange.retransmit.rate import RateLimiter
from logbuf.exchange.retransmit.ring import RetransmitError

DEFAULT_QUEUE = 64  # admitted, unanswered requests per client

#: who asked, as far as the sans-IO classes care: any hashable key (the server's is the socket address)
ClientT = TypeVar("ClientT", bound=Hashable)


class FairService(Generic[ClientT]):
    """Admitted requests in one bounded queue per client, answered round-robin (sans-IO).

    ``receive`` checks a request and takes a token from the client's bucket before queueing it; ``next_answer``
    answers the oldest request of the next client in turn. A client with many requests queued is served once
    per turn like every other, so a flood delays only the flooder.
    """

    def __init__(self, core: RetransmitCore, limiter: RateLimiter | None = None, queue: int = DEFAULT_QUEUE,
                 max_clients: int = 4_096) -> None:
        if queue < 1 or max_clients < 1:
            raise RetransmitError("the per-client queue and max_clients must be >= 1")
        self.core = core
        self.stats = core.stats
        self.limiter = limiter if limiter is not None else core.limiter
        self.queue = queue
        self.max_clients = max_clients
        self._queues: dict[ClientT, deque[tuple[int, int]]] = {}
        self._turns: deque[ClientT] = deque()  # clients with something queued, in serving order
        self.over_rate = False  # set by the last receive(): the client asks faster than it may

    @property
    def pending(self) -> int:
        """Clients waiting for an answer."""
        return len(self._turns)

    def receive(self, request: bytes | memoryview, client: ClientT, now_ns: int) -> bool:
        """Queue one request; False when it was dropped (the reason is counted). :attr:`over_rate` tells
        whether the client was over its rate or its queue (the server isolates such clients)."""
        self.over_rate = False
        self.stats.requests += 1
        checked = self.core.check(request)
        if checked is None:
            return False
        if self.limiter is not None and not self.limiter.allow(client, now_ns):
            self.stats.rate_limited += 1
            self.over_rate = True
            return False
        queue = self._queues.get(client)
        if queue is None:
            if len(self._queues) >= self.max_clients:
                self.stats.queue_full += 1
                return False
            queue = self._queues[client] = deque()
        if len(queue) >= self.queue:
            self.stats.queue_full += 1
            self.over_rate = True
            return False
        if not queue:
            self._turns.append(client)
        queue.append(checked)
        return True

    def next_request(self) -> tuple[ClientT, int, int] | None:
        """(client, first sequence, count) of the next client's oldest admitted request, in turn; the caller
        answers it (the server does so in batches, in C)."""
        if not self._turns:
            return None
        client = self._turns.popleft()
        queue = self._queues[client]
        first, count = queue.popleft()
        if queue:
            self._turns.append(client)
        else:
            del self._queues[client]
        return client, first, count

    def next_answer(self) -> tuple[ClientT, bytes | None] | None:
        """(client, answer or None when the request turned out unanswerable) of the next client in turn."""
        turn = self.next_request()
        if turn is None:
            return None
        client, first, count = turn
        return client, self.core.answer(first, count)
