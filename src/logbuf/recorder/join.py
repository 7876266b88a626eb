"""``DeliveryJoin``: gives each delivered message the feed and arrival time of the copy that was delivered.

The feed handler publishes every delivered message on the messages stream and, on the capture stream,
DELIVERED rows: runs ``(feed, count, arrival_ns, first sequence)`` of the same deliveries, in the same
order.  Expanded to one entry per message, the two streams are the same list of sequences, so the join is
positional: the i-th message pairs with the i-th entry.  Sequences are compared as a check, never used as
a key (a new MoldUDP64 session restarts them, so a sequence alone is ambiguous).

Sans-IO: the recorder feeds decoded messages and expanded entries in stream order and takes joined rows.

Alignment.  A fresh recorder joins the two streams at slightly different points; until the heads agree,
entries older than the first message are skipped (their messages were published before we joined) and
messages older than the first entry are *orphans* (their DELIVERED rows were published before we joined
the capture stream): they are handed back so the recorder can report them, never dropped silently.  A
resumed recorder starts aligned (its checkpoint says exactly which entries were already used).  Should the
sequences of an aligned pair ever disagree, the join counts a mismatch and re-aligns the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from logbuf.recorder.columns import MessageDecodeError, concat_rows

# One expanded DELIVERED entry; frame_start/index locate it in the capture stream (for the checkpoint): the
# start position of the frame (fragment) that carried it and its number among that frame's entries.
DELIVERY = np.dtype([
    ("sequence", "<i8"),
    ("arrival_ns", "<i8"),
    ("frame_start", "<i8"),
    ("index", "<i4"),
    ("feed", "u1"),
])


def expand_runs(runs: np.ndarray, frame_starts: np.ndarray) -> np.ndarray:
    """DELIVERED rows in stream order, with the start position of the capture frame (fragment) that carried
    each -> one :data:`DELIVERY` entry per message, numbered from 0 within each frame (one vectorised pass)."""
    counts = runs["count"].astype(np.int64)
    if counts.size and int(counts.min()) < 1:
        raise MessageDecodeError(f"DELIVERED row with count {int(counts.min())} (must be >= 1)")
    total = int(counts.sum())
    entries = np.empty(total, dtype=DELIVERY)
    if total == 0:
        return entries
    run_of = np.repeat(np.arange(runs.size), counts)
    first_entry_of_run = np.cumsum(counts) - counts
    number = np.arange(total, dtype=np.int64)
    entries["sequence"] = runs["first"][run_of] + (number - first_entry_of_run[run_of])
    entries["arrival_ns"] = runs["arrival_ns"][run_of]
    entries["feed"] = runs["feed"][run_of]
    starts = np.asarray(frame_starts, dtype=np.int64)[run_of]
    entries["frame_start"] = starts
    # number within the frame: distance to the frame's first entry (frames are contiguous in stream order)
    new_frame = np.ones(total, dtype=bool)
    new_frame[1:] = starts[1:] != starts[:-1]
    entries["index"] = number - np.maximum.accumulate(np.where(new_frame, number, 0))
    return entries


@dataclass
class JoinResult:
    joined: list[np.ndarray] = field(default_factory=list)  # IN_FLIGHT chunks with feed and arrival_ns set
    orphans: list[np.ndarray] = field(default_factory=list)  # messages whose DELIVERED entry was never seen

    @property
    def count(self) -> int:
        return sum(int(c.size) for c in self.joined)


def _first_at_or_above(values: np.ndarray, threshold: int) -> int:
    hits = np.flatnonzero(values >= threshold)
    return int(hits[0]) if hits.size else int(values.size)


class DeliveryJoin:
    def __init__(self, aligned: bool = False) -> None:
        self.aligned = aligned
        self._messages: list[np.ndarray] = []
        self._entries: list[np.ndarray] = []
        self.skipped_entries = 0  # entries of messages published before the recorder joined
        self.orphans = 0  # messages published before their DELIVERED rows could be seen
        self.mismatches = 0  # aligned pairs whose sequences disagreed (a contract violation upstream)

    def add_messages(self, rows: np.ndarray) -> None:
        if rows.size:
            self._messages.append(rows)

    def add_entries(self, entries: np.ndarray) -> None:
        if entries.size:
            self._entries.append(entries)

    @property
    def pending_messages(self) -> int:
        return sum(int(c.size) for c in self._messages)

    @property
    def pending_entries(self) -> int:
        return sum(int(c.size) for c in self._entries)

    def first_pending_message_position(self) -> int | None:
        """Stream position of the oldest message not joined yet (where a restart must resume)."""
        return int(self._messages[0]["start_position"][0]) if self._messages else None

    def first_pending_entry(self) -> tuple[int, int] | None:
        """(capture frame start, index in that frame) of the oldest entry not used yet."""
        if not self._entries:
            return None
        head = self._entries[0][0]
        return int(head["frame_start"]), int(head["index"])

    def take(self) -> JoinResult:
        """Every message that can be paired now, in order (plus any orphans found while aligning).

        The (small) entries are concatenated; the message chunks are paired in place, never copied."""
        result = JoinResult()
        if not self._messages or not self._entries:
            return result
        ents = concat_rows(self._entries, DELIVERY)
        eseq = ents["sequence"]
        j = 0
        while self._messages and j < ents.size:
            msgs = self._messages[0]
            mseq = msgs["sequence"]
            i = 0
            if not self.aligned:
                m, e = int(mseq[0]), int(eseq[j])
                if e < m:
                    step = _first_at_or_above(eseq[j:], m)
                    self.skipped_entries += step
                    j += step
                    continue
                if m < e:
                    i = _first_at_or_above(mseq, e)
                    result.orphans.append(msgs[:i])
                    self.orphans += i
                else:
                    self.aligned = True
            k = min(msgs.size - i, ents.size - j)
            if self.aligned and k:
                same = mseq[i : i + k] == eseq[j : j + k]
                good = k if same.all() else int(np.argmin(same))
                if good < k:
                    self.mismatches += 1
                    self.aligned = False
                if good:
                    block = msgs[i : i + good]  # a view: the rows are ours, filled in place
                    block["feed"] = ents["feed"][j : j + good]
                    block["arrival_ns"] = ents["arrival_ns"][j : j + good]
                    result.joined.append(block)
                    i += good
                    j += good
            if i >= msgs.size:
                self._messages.pop(0)
            else:
                self._messages[0] = msgs[i:]
        self._entries = [ents[j:]] if j < ents.size else []
        return result
