"""``Impairment``: a seeded, pure model of a bad network for the datagram path (tests, soak runs).

Feed it datagrams with :meth:`submit` and ask :meth:`poll` which are due at a given time.  Each datagram is
independently

- dropped with probability ``drop``;
- otherwise delivered after ``delay_ns`` plus a uniform jitter in ``[0, jitter_ns]``;
- held back by a further ``reorder_delay_ns`` with probability ``reorder`` (later datagrams overtake it);
- delivered a second time, with its own extra delay up to ``reorder_delay_ns``, with probability
  ``duplicate``.

Datagrams are copied on submit (a sender's buffer is a view into a term that moves on), each with an optional
``tag`` (the driver's: the datagram's source or destination) that :meth:`poll_tagged` hands back.  The same
seed and the same inputs give the same deliveries.

:meth:`Impairment.from_spec` builds one from a driver option such as
``drop=0.05,reorder=0.05,duplicate=0.01,delay=100us,jitter=50us,seed=7``.
"""

from __future__ import annotations

import heapq
import random
import re
from typing import Any

from logbuf.units import NANOS_PER_UNIT

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|ms|s)$")


def _duration_ns(text: str, name: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"impairment {name}={text!r}: a duration such as 250us, 2ms or 0.5s")
    return int(float(match.group(1)) * NANOS_PER_UNIT[match.group(2)])


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
        self.seed = seed  # the native agents seed their own dice with it
        self._rng = random.Random(seed)
        self._queue: list[tuple[int, int, bytes, Any]] = []
        self._sequence = 0
        self.submitted = 0
        self.dropped = 0
        self.duplicated = 0
        self.reordered = 0
        self.delivered = 0

    @classmethod
    def from_spec(cls, spec: str, seed_offset: int = 0) -> Impairment:
        """``key=value`` pairs separated by commas: ``drop``, ``duplicate``, ``reorder`` (probabilities),
        ``delay``, ``jitter``, ``reorder-delay`` (durations with a unit: ns, us, ms, s) and ``seed`` (plus
        ``seed_offset``: several impairments from one spec do not drop in lock-step)."""
        probabilities: dict[str, float] = {}
        durations: dict[str, int] = {}
        seed = 0
        for item in spec.split(","):
            if not item.strip():
                continue
            key, eq, value = item.partition("=")
            key = key.strip().replace("_", "-")
            if not eq:
                raise ValueError(f"impairment {item!r} is not key=value")
            if key in ("drop", "duplicate", "reorder"):
                try:
                    probabilities[key] = float(value)
                except ValueError:
                    raise ValueError(f"impairment {key}={value!r}: a probability in [0, 1]") from None
            elif key in ("delay", "jitter", "reorder-delay"):
                durations[key] = _duration_ns(value, key)
            elif key == "seed":
                if not value.strip().isdigit():
                    raise ValueError(f"impairment seed={value!r}: a non-negative integer")
                seed = int(value)
            else:
                raise ValueError(f"unknown impairment {key!r}: use drop, duplicate, reorder, delay, jitter, "
                                 f"reorder-delay, seed")
        return cls(probabilities.get("drop", 0.0), probabilities.get("duplicate", 0.0),
                   probabilities.get("reorder", 0.0), durations.get("delay", 0), seed + seed_offset,
                   jitter_ns=durations.get("jitter", 0), reorder_delay_ns=durations.get("reorder-delay"))

    def submit(self, datagram: Any, now_ns: int, tag: Any = None) -> None:
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
        self._push(due, data, tag)
        if rng.random() < self.duplicate:
            self.duplicated += 1
            self._push(due + rng.randint(0, self.reorder_delay_ns), data, tag)

    def _push(self, due: int, data: bytes, tag: Any) -> None:
        heapq.heappush(self._queue, (due, self._sequence, data, tag))
        self._sequence += 1

    def poll(self, now_ns: int) -> list[bytes]:
        """The datagrams due by ``now_ns``, in delivery order."""
        return [data for data, _ in self.poll_tagged(now_ns)]

    def poll_tagged(self, now_ns: int) -> list[tuple[bytes, Any]]:
        """As :meth:`poll`, each datagram with the tag it was submitted with."""
        out: list[tuple[bytes, Any]] = []
        queue = self._queue
        while queue and queue[0][0] <= now_ns:
            _, _, data, tag = heapq.heappop(queue)
            out.append((data, tag))
        self.delivered += len(out)
        return out

    @property
    def pending(self) -> int:
        return len(self._queue)

    def next_due_ns(self) -> int | None:
        return self._queue[0][0] if self._queue else None
