"""``GapBook``: feed-handler gap events -> ``gaps`` rows (sans-IO).

A gap row is final only once the gap is settled, so detected gaps wait here (and in the checkpoint, so a
crash loses none) until one of:

- GAP_RECOVERED for exactly the detected range -> a row with ``recovered_ns`` = the event time;
- GAP_UNRECOVERABLE overlapping it (all or part of the range is given up) -> a row with ``recovered_ns`` null.
  An unrecoverable range that no open gap covers (the handler always declares first, but a recorder that
  joined late may have missed the declaration) gets a row of its own, detected at the same time.

A recording that stops while gaps are open writes them as unrecovered (:meth:`GapBook.close_all`): that is
what the recording knows at its end.  All rows are ``feed='both'`` (the handler's gaps are ranges missing on
every live feed it arbitrates).
"""

from __future__ import annotations

from dataclasses import dataclass

from logbuf.recording.schema import GAP_BOTH

GapRow = tuple[str, str, int, int, int, "int | None"]  # session, feed, first, last, detected_ns, recovered_ns


@dataclass(frozen=True)
class OpenGap:
    session: str
    first: int
    last: int
    detected_ns: int


class GapBook:
    def __init__(self, open_gaps: list[OpenGap] | None = None) -> None:
        self._open: dict[tuple[str, int, int], OpenGap] = {(g.session, g.first, g.last): g for g in open_gaps or ()}
        self.unmatched_recoveries = 0  # GAP_RECOVERED for a gap we never saw detected (joined late)

    @property
    def open_gaps(self) -> list[OpenGap]:
        return sorted(self._open.values(), key=lambda g: (g.detected_ns, g.first))

    def detected(self, session: str, first: int, last: int, time_ns: int) -> list[GapRow]:
        self._open.setdefault((session, first, last), OpenGap(session, first, last, time_ns))
        return []

    def recovered(self, session: str, first: int, last: int, time_ns: int) -> list[GapRow]:
        gap = self._open.pop((session, first, last), None)
        if gap is None:
            self.unmatched_recoveries += 1
            return []
        return [(session, GAP_BOTH, first, last, gap.detected_ns, time_ns)]

    def unrecoverable(self, session: str, first: int, last: int, time_ns: int) -> list[GapRow]:
        hit = [g for g in self._open.values() if g.session == session and g.first <= last and first <= g.last]
        rows: list[GapRow] = []
        for gap in sorted(hit, key=lambda g: g.first):
            del self._open[(gap.session, gap.first, gap.last)]
            rows.append((session, GAP_BOTH, gap.first, gap.last, gap.detected_ns, None))
        if not hit:
            rows.append((session, GAP_BOTH, first, last, time_ns, None))
        return rows

    def close_all(self) -> list[GapRow]:
        rows: list[GapRow] = [(g.session, GAP_BOTH, g.first, g.last, g.detected_ns, None) for g in self.open_gaps]
        self._open.clear()
        return rows

    def state(self) -> list[dict]:
        return [{"session": g.session, "first": g.first, "last": g.last, "detected_ns": g.detected_ns}
                for g in self.open_gaps]

    @classmethod
    def from_state(cls, state: list[dict]) -> GapBook:
        return cls([OpenGap(str(g["session"]), int(g["first"]), int(g["last"]), int(g["detected_ns"]))
                    for g in state])
