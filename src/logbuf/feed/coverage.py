"""Coverage and gaps: which sequences are queued ahead of the stream, which are missing, which were declared.

The arbiter's specification (:mod:`logbuf.feed.spec`) keeps queued sequence numbers as :class:`Coverage`,
sorted disjoint intervals whose complement inside ``[expected, highest]`` is the holes; a declared gap is an
:class:`OpenGap` until the stream passes it. ``native/feed_queue.c`` and ``native/feed_engine.c`` keep the same structures in C.
"""

from __future__ import annotations

import bisect

from logbuf.marketdata.moldudp64 import BLOCK_LENGTH_SIZE, HEADER_LENGTH

Hole = tuple[int, int]  # inclusive (first, last) sequence range


class Coverage:
    """Sorted, disjoint, non-adjacent inclusive intervals of queued sequence numbers (the inverse of the holes)."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __bool__(self) -> bool:
        return bool(self.starts)

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, first: int, last: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_left(ends, first - 1)  # first interval touching from below
        j = bisect.bisect_right(starts, last + 1)  # one past the last interval touching from above
        if i < j:
            first = min(first, starts[i])
            last = max(last, ends[j - 1])
            del starts[i:j]
            del ends[i:j]
        starts.insert(i, first)
        ends.insert(i, last)

    def covers(self, first: int, last: int) -> bool:
        i = bisect.bisect_right(self.starts, first) - 1
        return i >= 0 and self.ends[i] >= last

    def trim_below(self, seq: int) -> None:
        i = bisect.bisect_left(self.ends, seq)
        if i:
            del self.starts[:i]
            del self.ends[:i]
        if self.starts and self.starts[0] < seq:
            self.starts[0] = seq

    def last_start(self) -> int:
        return self.starts[-1]

    def holes(self, first: int, last: int, limit: int) -> list[Hole]:
        """Up to ``limit`` uncovered ranges of ``[first, last]``, lowest first."""
        out: list[Hole] = []
        cur = first
        starts, ends = self.starts, self.ends
        for k in range(bisect.bisect_left(ends, first), len(starts)):
            s = starts[k]
            if s > last:
                break
            if s > cur:
                out.append((cur, s - 1))
                if len(out) >= limit:
                    return out
            cur = max(cur, ends[k] + 1)
        if cur <= last:
            out.append((cur, last))
        return out




class OpenGap:
    """A declared gap the stream has not passed yet."""

    __slots__ = ("first", "last", "lost")

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.last = last
        self.lost = False  # part of it was given up: it closes without GapRecovered




def parse_blocks(buf: memoryview, count: int) -> list[tuple[int, int]] | None:
    """``(offset, length)`` of each of ``count`` message blocks after the header, or None if the packet is
    malformed (a length running past the end, or bytes left over) — the same checks as ``lbf_mold_valid``."""
    end = len(buf)
    off = HEADER_LENGTH
    out: list[tuple[int, int]] = []
    for _ in range(count):
        if off + BLOCK_LENGTH_SIZE > end:
            return None
        length = (buf[off] << 8) | buf[off + 1]
        off += BLOCK_LENGTH_SIZE
        if length > end - off:
            return None
        out.append((off, length))
        off += length
    return out if off == end else None
