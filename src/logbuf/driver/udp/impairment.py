"""``Impairment``: a seeded, pure model of a bad network for the datagram path (tests, soak runs).

Feed it datagrams with :meth:`submit` and ask :meth:`poll` which are due at a given time.  Each datagram is
independently

- dropped with probability ``drop``;
- otherwise delivered after ``delay_ns`` plus a uniform jitter in ``[0, jitter_ns]``;
- held back by a further ``reorder_delay_ns`` with probability ``reorder`` (later datagrams overtake it);
- delivered a second time, with its own extra delay up to ``reorder_delay_ns``, with probability
  ``duplicate``.

Datagrams are copied on submit (a sender's buffer is a view into a term that moves on).  The same seed and
the same inputs give the same deliveries.
"""

from __future__ import annotations

import heapq
import random
from typing import Any


class Impairment:
    def __init__(
        self,
        drop: float = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        delay_ns: int = 0,
        seed: int = 0,
        *,
        jitter_ns: int = 0,
        reorder_delay_ns: int | None = None,
    ) -> None:
        for name, p in (("drop", drop), ("duplicate", duplicate), ("reorder", reorder)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} probability {p} is not in [0, 1]")
        if delay_ns < 0 or jitter_ns < 0 or (reorder_delay_ns is not None and reorder_delay_ns < 0):
            raise ValueError("delays must be >= 0")
        self.drop = drop
        self.duplicate = duplicate
        self.reorder = reorder
        self.delay_ns = delay_ns
        self.jitter_ns = jitter_ns
        self.reorder_delay_ns = max(delay_ns, 100_000) if reorder_delay_ns is None else reorder_delay_ns
        self._rng = random.Random(seed)
        self._queue: list[tuple[int, int, bytes]] = []
        self._sequence = 0
        self.submitted = 0
        self.dropped = 0
        self.duplicated = 0
        self.reordered = 0
        self.delivered = 0

    def submit(self, datagram: Any, now_ns: int) -> None:
        self.submitted += 1
        rng = self._rng
        if rng.random() < self.drop:
            self.dropped += 1
            return
        data = bytes(datagram)
        due = now_ns + self.delay_ns + (rng.randint(0, self.jitter_ns) if self.jitter_ns else 0)
        if rng.random() < self.reorder:
            self.reordered += 1
            due += self.reorder_delay_ns
        self._push(due, data)
        if rng.random() < self.duplicate:
            self.duplicated += 1
            self._push(due + rng.randint(0, self.reorder_delay_ns), data)

    def _push(self, due: int, data: bytes) -> None:
        heapq.heappush(self._queue, (due, self._sequence, data))
        self._sequence += 1

    def poll(self, now_ns: int) -> list[bytes]:
        """The datagrams due by ``now_ns``, in delivery order."""
        out: list[bytes] = []
        queue = self._queue
        while queue and queue[0][0] <= now_ns:
            out.append(heapq.heappop(queue)[2])
        self.delivered += len(out)
        return out

    @property
    def pending(self) -> int:
        return len(self._queue)

    def next_due_ns(self) -> int | None:
        return self._queue[0][0] if self._queue else None
