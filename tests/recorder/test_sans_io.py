"""The recorder's sans-IO parts: the positional DELIVERED join, the session timeline, the gap book."""

from __future__ import annotations

import numpy as np
import pytest

from logbuf.feed import published as out
from logbuf.recorder.columns import IN_FLIGHT
from logbuf.recorder.gaps import GapBook
from logbuf.recorder.join import DeliveryJoin, expand_runs
from logbuf.recorder.sessions import SessionTimeline


def messages(seqs: list[int], start: int = 0) -> np.ndarray:
    rows = np.zeros(len(seqs), dtype=IN_FLIGHT)
    rows["sequence"] = seqs
    rows["start_position"] = start + 64 * np.arange(len(seqs))
    return rows


def runs(*items: tuple[str, int, int, int]) -> np.ndarray:
    """(feed, first, count, arrival) DELIVERED rows."""
    rows = np.zeros(len(items), dtype=out.DELIVERED_ROW)
    for i, (feed, first, count, arrival) in enumerate(items):
        rows[i] = (ord(feed), count, arrival, first)
    return rows


def entries(*items: tuple[str, int, int, int], start: int = 0) -> np.ndarray:
    """The entries of DELIVERED rows carried by one capture frame at ``start``."""
    rows = runs(*items)
    return expand_runs(rows, np.full(rows.size, start, dtype=np.int64))


# -- DeliveryJoin ---------------------------------------------------------------------------------------------


def test_runs_expand_to_one_entry_per_message_in_order() -> None:
    expanded = expand_runs(runs(("A", 5, 3, 100), ("R", 8, 1, 150), ("B", 9, 2, 200)), np.array([4096, 4096, 5120]))
    assert expanded["sequence"].tolist() == [5, 6, 7, 8, 9, 10]
    assert bytes(expanded["feed"]).decode() == "AAARBB"
    assert expanded["arrival_ns"].tolist() == [100, 100, 100, 150, 200, 200]
    assert expanded["frame_start"].tolist() == [4096] * 4 + [5120] * 2
    assert expanded["index"].tolist() == [0, 1, 2, 3, 0, 1]  # numbered within each frame
    with pytest.raises(ValueError, match="count 0"):
        expand_runs(runs(("A", 1, 0, 1)), np.zeros(1))


def test_the_join_pairs_by_position_and_waits_for_missing_rows() -> None:
    join = DeliveryJoin(aligned=True)
    join.add_messages(messages([1, 2, 3, 4, 5], start=1000))
    join.add_entries(entries(("A", 1, 2, 10), ("B", 3, 1, 20)))
    result = join.take()
    joined = np.concatenate(result.joined)
    assert joined["sequence"].tolist() == [1, 2, 3]
    assert bytes(joined["feed"]).decode() == "AAB" and joined["arrival_ns"].tolist() == [10, 10, 20]
    assert join.pending_messages == 2 and join.first_pending_message_position() == 1000 + 3 * 64
    join.add_entries(entries(("R", 4, 2, 30), start=320))
    assert join.first_pending_entry() == (320, 0)
    assert np.concatenate(join.take().joined)["sequence"].tolist() == [4, 5]
    assert join.pending_messages == 0 and join.first_pending_entry() is None and join.mismatches == 0


def test_a_new_session_restarting_sequences_does_not_confuse_the_positional_join() -> None:
    join = DeliveryJoin(aligned=True)
    join.add_messages(messages([9, 10, 1, 2]))
    join.add_entries(entries(("A", 9, 2, 1), ("B", 1, 2, 2)))
    joined = np.concatenate(join.take().joined)
    assert joined["sequence"].tolist() == [9, 10, 1, 2] and bytes(joined["feed"]).decode() == "AABB"


def test_a_fresh_join_skips_older_entries_and_hands_back_orphan_messages() -> None:
    join = DeliveryJoin()
    join.add_messages(messages([5, 6, 7]))
    join.add_entries(entries(("A", 3, 4, 1)))  # 3, 4 belong to messages we never saw
    result = join.take()
    assert np.concatenate(result.joined)["sequence"].tolist() == [5, 6] and join.skipped_entries == 2
    assert not result.orphans
    other = DeliveryJoin()
    other.add_messages(messages([5, 6, 7]))
    other.add_entries(entries(("B", 7, 1, 1)))  # 5, 6's rows were published before we joined
    result = other.take()
    assert np.concatenate(result.orphans)["sequence"].tolist() == [5, 6] and other.orphans == 2
    assert np.concatenate(result.joined)["sequence"].tolist() == [7]


def test_disagreeing_sequences_are_counted_and_realigned() -> None:
    join = DeliveryJoin(aligned=True)
    join.add_messages(messages([1, 2, 3, 4]))
    join.add_entries(entries(("A", 1, 1, 1), ("A", 3, 2, 2)))  # row for 2 missing upstream
    result = join.take()
    assert join.mismatches == 1
    assert np.concatenate(result.joined)["sequence"].tolist() == [1, 3, 4]
    assert np.concatenate(result.orphans)["sequence"].tolist() == [2]


# -- SessionTimeline --------------------------------------------------------------------------------------


def seg(timeline: SessionTimeline, seqs: list[int]) -> list[tuple[str, int, int]]:
    return [(s.session, s.start, s.stop) for s in timeline.split_messages(np.array(seqs, np.int64))]


def test_the_handlers_first_session_applies_from_the_first_message_and_to_earlier_packets() -> None:
    timeline = SessionTimeline("UNKNOWN")
    timeline.on_session_changed("S1", time_ns=1_000)
    assert seg(timeline, [1, 2, 3]) == [("S1", 0, 3)]
    assert timeline.split_packets(np.array([500, 1_500])) == [("S1", None)]


def test_a_session_change_takes_effect_at_the_sequence_reset() -> None:
    timeline = SessionTimeline("UNKNOWN")
    timeline.on_session_changed("S1", 1_000)
    assert seg(timeline, [1, 2]) == [("S1", 0, 2)]
    timeline.on_session_changed("S2", 5_000)  # seen before the rest of S1's messages are assigned
    assert seg(timeline, [3, 4, 1, 2]) == [("S1", 0, 2), ("S2", 2, 4)]
    assert timeline.message_session == "S2" and timeline.last_sequence == 2
    groups = timeline.split_packets(np.array([4_000, 6_000, 4_500]))
    assert [(s, i.tolist()) for s, i in groups] == [("S1", [0, 2]), ("S2", [1])]


def test_a_recorder_started_mid_session_keeps_the_default_until_the_reset() -> None:
    timeline = SessionTimeline("LATE")
    timeline.note_messages()
    assert seg(timeline, [5000, 5001]) == [("LATE", 0, 2)]
    timeline.on_session_changed("S2", 9_000)
    assert seg(timeline, [5002, 1]) == [("LATE", 0, 1), ("S2", 1, 2)]
    assert timeline.split_packets(np.array([8_000]))[0][0] == "LATE"


def test_replayed_sequences_without_a_session_change_are_duplicates() -> None:
    timeline = SessionTimeline.from_state("X", {"message_session": "S1", "last_sequence": 10})
    assert seg(timeline, [9, 10, 11, 12, 12, 13]) == [("S1", 2, 4), ("S1", 5, 6)]
    assert timeline.duplicates == 3 and timeline.last_sequence == 13


def test_the_timeline_survives_a_checkpoint() -> None:
    timeline = SessionTimeline("D")
    timeline.on_session_changed("S1", 10)
    seg(timeline, [1, 2])
    timeline.on_session_changed("S2", 20)
    again = SessionTimeline.from_state("D", timeline.state())
    assert seg(again, [3, 1]) == [("S1", 0, 1), ("S2", 1, 2)]
    assert again.split_packets(np.array([5]))[0][0] == "S1"


# -- GapBook ------------------------------------------------------------------------------------------------


def test_gaps_become_rows_when_settled() -> None:
    book = GapBook()
    assert book.detected("S", 10, 12, 100) == []
    assert book.detected("S", 20, 29, 200) == []
    assert book.recovered("S", 10, 12, 150) == [("S", "both", 10, 12, 100, 150)]
    assert book.unrecoverable("S", 25, 29, 300) == [("S", "both", 20, 29, 200, None)]  # part lost: unrecovered
    assert book.open_gaps == []
    assert book.recovered("S", 40, 41, 400) == [] and book.unmatched_recoveries == 1
    assert book.unrecoverable("S", 50, 51, 500) == [("S", "both", 50, 51, 500, None)]  # never declared to us


def test_open_gaps_survive_a_checkpoint_and_close_as_unrecovered() -> None:
    book = GapBook()
    book.detected("S", 7, 8, 70)
    again = GapBook.from_state(book.state())
    assert again.recovered("S", 7, 8, 90) == [("S", "both", 7, 8, 70, 90)]
    book.detected("T", 1, 1, 5)
    assert book.close_all() == [("T", "both", 1, 1, 5, None), ("S", "both", 7, 8, 70, None)]  # by detection
