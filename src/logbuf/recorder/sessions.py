"""``SessionTimeline``: the ``session=`` partition of each message and packet (sans-IO).

The feed handler announces sessions with SESSION_CHANGED events on the events stream; messages and capture
rows travel on other streams, and a subscriber sees no order across streams.  Two rules rebuild it:

- **messages**: a new MoldUDP64 session restarts its sequence numbers, and within a session they strictly
  increase.  So the k-th *reset* on the messages stream (a sequence not above the one before) is where the
  k-th pending session change takes effect.  The recorder processes the events stream after polling the
  messages stream, so a change published before a message is always pending by the time the message is
  assigned (a change published later waits for its reset).  A non-increasing sequence with no change
  pending is a duplicate (a resumed stream replaying what is already recorded): it is skipped and counted.
- **the first session**: a fresh recorder (no checkpoint) that sees a change before any message has seen the
  handler *join* its first session: that session applies from the first message and to the packets that
  arrived before the change (they are what made the handler join).  A change seen after messages means the
  recorder started mid-session: those messages keep the default and the change waits for its reset.
- **packets** (PACKET capture rows): by time - the session of the latest change whose ``time_ns`` is not
  after the packet's ``arrival_ns`` (the handler stamps a change after receiving the packets that caused it).

Before the first change the session is the configured default (``--session``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

_KEEP_CHANGES = 16  # changes remembered for labelling packets (sessions change a few times a day)
_NO_SEQUENCE = -(2**63)


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, stop)`` of a batch belong to ``session``."""

    session: str
    start: int
    stop: int


class SessionTimeline:
    def __init__(self, default: str, *, fresh: bool = True, message_session: str | None = None,
                 last_sequence: int | None = None, initial: str | None = None,
                 pending: list[str] | tuple[str, ...] = (), changes: list | tuple = ()) -> None:
        self.default = default
        self.fresh = fresh  # no message seen and nothing restored: the next change may be the handler's join
        self.message_session = message_session or default
        self.last_sequence = last_sequence  # of the last message assigned (None: no message yet)
        self.initial = initial or default  # the session of packets older than every known change
        self.pending: deque[str] = deque(pending)
        self.changes: list[tuple[int, str]] = [(int(t), str(s)) for t, s in changes]
        self.duplicates = 0

    def note_messages(self) -> None:
        """Messages were seen (before any change was processed): a later change is not the first join."""
        self.fresh = False

    # -- events ----------------------------------------------------------------------------------------

    def on_session_changed(self, session: str, time_ns: int) -> None:
        if self.fresh:
            self.fresh = False
            self.message_session = self.initial = session
        else:
            self.pending.append(session)
        self.changes.append((time_ns, session))
        self.changes.sort(key=lambda c: c[0])
        del self.changes[:-_KEEP_CHANGES]

    # -- messages --------------------------------------------------------------------------------------

    def split_messages(self, sequences: np.ndarray) -> list[Segment]:
        """Assigns a batch of messages (in stream order) to sessions; rows left out of every segment are
        duplicates (see the module doc)."""
        n = int(sequences.size)
        segments: list[Segment] = []
        if n == 0:
            return segments
        self.fresh = False
        i = 0
        while i < n:
            rest = sequences[i:]
            last = _NO_SEQUENCE if self.last_sequence is None else self.last_sequence
            if int(rest[0]) > last and (rest.size == 1 or bool((rest[1:] > rest[:-1]).all())):
                segments.append(Segment(self.message_session, i, n))  # the usual case: one increasing run
                self.last_sequence = int(rest[-1])
                break
            running = np.maximum.accumulate(rest)
            before = np.concatenate(([last], running[:-1]))
            k = int(np.argmax(rest <= before))  # first reset or duplicate
            if k:
                segments.append(Segment(self.message_session, i, i + k))
                self.last_sequence = int(running[k - 1])
            if self.pending:
                self.message_session = self.pending.popleft()
                self.last_sequence = None
                i += k
            else:
                self.duplicates += 1
                i += k + 1
        return segments

    # -- packets ---------------------------------------------------------------------------------------

    def split_packets(self, arrivals_ns: np.ndarray) -> list[tuple[str, np.ndarray | None]]:
        """(session, row indices or None for all rows) groups of a batch of packet arrival times."""
        if not self.changes:
            return [(self.initial, None)]
        times = np.array([t for t, _ in self.changes], dtype=np.int64)
        which = np.searchsorted(times, arrivals_ns, side="right") - 1  # -1: before every known change
        present = np.unique(which).tolist()
        names = {w: self._session_of_change(w) for w in present}
        if len(set(names.values())) <= 1:
            return [(names[present[0]] if present else self.initial, None)]
        groups: dict[str, list[int]] = {}
        for w in present:
            groups.setdefault(names[w], []).append(w)
        return [(name, np.flatnonzero(np.isin(which, ws))) for name, ws in groups.items()]

    def _session_of_change(self, index: int) -> str:
        return self.changes[index][1] if index >= 0 else self.initial

    # -- checkpoint ------------------------------------------------------------------------------------

    def state(self) -> dict:
        return {"message_session": self.message_session, "last_sequence": self.last_sequence,
                "initial": self.initial, "pending": list(self.pending), "changes": [list(c) for c in self.changes]}

    @classmethod
    def from_state(cls, default: str, state: dict) -> SessionTimeline:
        return cls(default, fresh=False, message_session=state.get("message_session"),
                   last_sequence=state.get("last_sequence"), initial=state.get("initial"),
                   pending=state.get("pending", ()), changes=state.get("changes", ()))
