"""Freeze characterisation on hand-made packet streams: what counts as a head-end freeze and what does not."""

from __future__ import annotations

import numpy as np

from logbuf.pipeline.freezes import FeedPackets, FreezeParams, characterize

MS = 1_000_000
PARAMS = FreezeParams()


def _live(start_seq, n, t0, spacing, per_packet=2):
    """n packets of per_packet messages, one every `spacing` ns from t0."""
    first = start_seq + per_packet * np.arange(n)
    return np.arange(n) * spacing + t0, first, np.full(n, per_packet)


def _feeds(a_parts, b_parts):
    def join(parts):
        arrival, first, count = (np.concatenate(c) for c in zip(*parts, strict=True))
        return FeedPackets.of(arrival, first, count)

    return join(a_parts), join(b_parts)


def test_a_freeze_with_catch_up_is_found_and_measured():
    # 1 packet / ms of 2 messages on both feeds; B 5 ms behind. A stops at t=100 ms (next expected 201),
    # resumes at 250 ms with 10 catch-up packets of 30 messages (0.1 ms apart), then live again.
    a_before = _live(1, 100, 0, MS)  # seq 1..200, last at 99 ms
    catch = (250 * MS + np.arange(10) * 100_000, 201 + 30 * np.arange(10), np.full(10, 30))  # 201..500
    a_after = _live(501, 100, 251 * MS, MS)
    b = _live(1, 400, 5 * MS, MS)  # B delivers 1..800, 5 ms after "real time"
    a, b = _feeds([a_before, catch, a_after], [b])
    f = characterize("A", a, b, 99 * MS, 250 * MS, 201, PARAMS)
    assert f is not None
    assert (f.silence_start_ns, f.resume_ns, f.next_expected) == (99 * MS, 250 * MS, 201)
    assert f.burst_packets == 10 and f.burst_messages == 300 and f.burst_messages_per_packet == 30
    assert f.baseline_messages_per_packet == 2
    assert f.held_first == 201 and f.held_last == 500
    assert abs(f.baseline_lateness_ms + 5) < 0.01  # A normally 5 ms ahead
    assert f.settled and f.catch_up_end_ns == 250 * MS + 9 * 100_000
    assert f.stale_messages > 0 and f.other_new_messages > 0


def test_a_quiet_market_is_not_a_freeze():
    # both feeds silent 200 ms (nothing to send); B's copy of A's last packet lands inside A's silence
    a = FeedPackets.of(np.array([0, 200 * MS]), np.array([1, 3]), np.array([2, 2]))
    b = FeedPackets.of(np.array([5 * MS, 205 * MS]), np.array([1, 3]), np.array([2, 2]))
    assert characterize("A", a, b, 0, 200 * MS, 3, PARAMS) is None
    # B's silence ends 5 ms after A's: A's new packet came too late to count as "carried on"
    assert characterize("B", b, a, 5 * MS, 205 * MS, 3, PARAMS) is None


def test_a_feed_that_skips_ahead_lost_data_and_is_not_a_freeze():
    a_before = _live(1, 100, 0, MS)
    a_after = _live(401, 100, 250 * MS, MS)  # resumes at 401: 201..400 never sent on A
    b = _live(1, 400, 5 * MS, MS)
    a, b = _feeds([a_before, a_after], [b])
    assert characterize("A", a, b, 99 * MS, 250 * MS, 201, PARAMS) is None


def test_packets_sharing_an_arrival_stamp_are_ordered_by_sequence_whatever_the_input_order():
    arrival = np.array([7, 5, 5, 5, 3])
    first = np.array([50, 30, 10, 20, 1])
    packets = FeedPackets.of(arrival, first, np.ones(5, np.int64))
    assert packets.first.tolist() == [1, 10, 20, 30, 50]
    assert packets.arrival.tolist() == [3, 5, 5, 5, 7]
