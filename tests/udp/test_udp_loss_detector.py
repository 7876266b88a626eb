"""LossDetector: the first gap between rebuild position and high-water mark, NAK timers, give-up."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable

import pytest

from logbuf import LogBuffers
from logbuf.driver.udp import Gap, LossDetector, MulticastNakDelay, TermRebuilder, UnicastNakDelay
from logbuf.protocol import encode_data_frame

T = 64 * 1024
US = 1_000
MS = 1_000_000


@pytest.fixture
def log(make_log: Callable[..., LogBuffers]) -> LogBuffers:
    return make_log(term_length=T, initial_term_id=5)


def put(log: LogBuffers, position: int, size: int = 100) -> int:
    """One frame of ``size`` payload bytes at ``position``; returns the position after it."""
    term_offset = position % T
    frame = encode_data_frame(b"p" * size, term_offset=term_offset, session_id=77, stream_id=1001,
                              term_id=5 + position // T)
    TermRebuilder(log).insert((position // T) % 3, term_offset, frame, len(frame))
    return position + len(frame)


def test_no_gap_rebuilds_to_the_high_water_mark(log: LogBuffers) -> None:
    end = put(log, put(log, 0))
    scan = LossDetector(log).scan(0, end, 0)
    assert scan.rebuild_position == end == 2 * 160 and scan.nak is None and scan.give_up is None


def test_unicast_nak_after_the_short_delay_then_retries(log: LogBuffers) -> None:
    put(log, 0)
    end = put(log, 480)  # frames at 160 and 320 lost
    detector = LossDetector(log, UnicastNakDelay(100 * US, 100))
    scan = detector.scan(0, end, 0)
    assert scan.rebuild_position == 160 and scan.nak is None and detector.active == Gap(5, 160, 320)
    assert detector.scan(0, end, 99 * US).nak is None
    assert detector.scan(0, end, 100 * US).nak == Gap(5, 160, 320)
    assert detector.scan(160, end, 5 * MS).nak is None
    assert detector.scan(160, end, 100 * US + 10 * MS).nak == Gap(5, 160, 320)  # retry after 100 x 100 us


def test_filled_gap_clears_the_timer_and_the_next_gap_gets_its_own(log: LogBuffers) -> None:
    put(log, 0)
    put(log, 320)
    end = put(log, 640)  # gaps at 160 and 480
    detector = LossDetector(log, UnicastNakDelay(100 * US, 100))
    assert detector.scan(0, end, 0).rebuild_position == 160
    put(log, 160)
    scan = detector.scan(160, end, 50 * US)
    assert scan.rebuild_position == 480 and detector.active == Gap(5, 480, 160) and scan.nak is None
    assert detector.scan(480, end, 149 * US).nak is None
    assert detector.scan(480, end, 150 * US).nak == Gap(5, 480, 160)
    put(log, 480)
    scan = detector.scan(480, end, 200 * US)
    assert scan.rebuild_position == end and detector.active is None and detector.next_deadline_ns() is None


def test_tail_loss_seen_through_a_heartbeat_high_water_mark(log: LogBuffers) -> None:
    end = put(log, 0)
    detector = LossDetector(log, UnicastNakDelay(0, 100))
    scan = detector.scan(0, end + 640, 0)  # a heartbeat said the sender is 640 bytes further
    assert scan.rebuild_position == end and scan.nak == Gap(5, end, 640)


def test_gap_across_the_term_boundary(log: LogBuffers) -> None:
    position = 0
    while position < T - 256:
        position = put(log, position, 96)  # 128-byte frames fill the term exactly
    end = put(log, T, 96)  # the last two frames of term 0 are missing; term 1 has begun
    detector = LossDetector(log, UnicastNakDelay(0, 100))
    scan = detector.scan(0, end, 0)
    assert scan.rebuild_position == T - 256 and scan.nak == Gap(5, T - 256, 256)
    put(log, put(log, T - 256, 96), 96)
    scan = detector.scan(T - 256, end, 1)
    assert scan.rebuild_position == end and detector.active is None

def test_gap_length_follows_what_arrives_at_its_end(log: LogBuffers) -> None:
    put(log, 0)
    end = put(log, 800)
    detector = LossDetector(log, UnicastNakDelay(0, 100))
    assert detector.scan(0, end, 0).nak == Gap(5, 160, 640)
    put(log, 640)  # the end of the gap arrived, its start did not
    assert detector.scan(160, end, 10 * MS).nak == Gap(5, 160, 480)


def test_give_up_hands_the_gap_back_for_a_fill(log: LogBuffers) -> None:
    put(log, 0)
    end = put(log, 480)
    detector = LossDetector(log, UnicastNakDelay(100 * US, 100), give_up_ns=30 * MS)
    detector.scan(0, end, 0)
    assert detector.next_deadline_ns() == 100 * US
    assert detector.scan(0, end, 30 * MS - 1).give_up is None
    scan = detector.scan(0, end, 30 * MS)
    assert scan.give_up == Gap(5, 160, 320) and scan.nak is None and detector.active is None


def test_give_up_zero_fills_at_once(log: LogBuffers) -> None:
    put(log, 0)
    end = put(log, 480)
    assert LossDetector(log, give_up_ns=0).scan(0, end, 0).give_up == Gap(5, 160, 320)


def test_multicast_delay_is_random_bounded_seeded_and_late_leaning() -> None:
    a = MulticastNakDelay(10 * MS, 10, random.Random(42))
    b = MulticastNakDelay(10 * MS, 10, random.Random(42))
    draws = [a.initial_delay_ns() for _ in range(4000)]
    assert draws[:50] == [b.initial_delay_ns() for _ in range(50)]
    assert all(0 <= x <= 10 * MS for x in draws)
    # truncated exponential with lambda = ln(10) + 1: mean = T * (1 / (1 - e^-lambda) - 1 / lambda) ~ 0.735 T
    assert 0.70 * 10 * MS < statistics.fmean(draws) < 0.77 * 10 * MS
    assert min(draws) < 0.5 * MS  # some receivers do NAK early


def test_multicast_detector_waits_its_random_delay(log: LogBuffers) -> None:
    put(log, 0)
    end = put(log, 480)
    delay = MulticastNakDelay(10 * MS, 10, random.Random(7))
    expected = MulticastNakDelay(10 * MS, 10, random.Random(7)).initial_delay_ns()
    detector = LossDetector(log, delay)
    detector.scan(0, end, 0)
    assert detector.next_deadline_ns() == expected
    assert detector.scan(0, end, expected - 1).nak is None
    assert detector.scan(0, end, expected).nak == Gap(5, 160, 320)


def test_arguments_are_checked(log: LogBuffers) -> None:
    with pytest.raises(ValueError):
        LossDetector(log, give_up_ns=-1)
    with pytest.raises(ValueError):
        UnicastNakDelay(-1)
    with pytest.raises(ValueError):
        MulticastNakDelay(0)
