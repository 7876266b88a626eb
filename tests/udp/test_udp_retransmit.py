"""RetransmitHandler: NAK validation against the term and the retained window, resend, linger, pool bound."""

from __future__ import annotations

import pytest

from logbuf.driver.udp import Resend, RetransmitHandler, SenderCounters
from logbuf.protocol import Nak

T = 64 * 1024
INITIAL = 10
MS = 1_000_000
SND_POS = 2 * T + 32768  # term 12 (count 2) is inside the retained window


def nak(term_id: int, term_offset: int, length: int) -> Nak:
    return Nak(7, 1001, term_id, term_offset, length)


def handler(**kwargs: object) -> RetransmitHandler:
    return RetransmitHandler(T, INITIAL, counters=SenderCounters(), **kwargs)  # type: ignore[arg-type]


def test_valid_nak_is_resent_at_once_then_lingers() -> None:
    h = handler()
    snd_pos = 2 * T + 8192
    assert h.on_nak(nak(12, 1024, 512), 0, snd_pos) == [Resend(12, 1024, 512)]
    assert h.on_nak(nak(12, 1024, 512), 9 * MS, snd_pos) == []  # lingering: a duplicate NAK is ignored
    assert h.naks_suppressed == 1 and h.active_count == 1
    assert h.on_timer(10 * MS, snd_pos) == [] and h.active_count == 0  # linger over
    assert h.on_nak(nak(12, 1024, 512), 11 * MS, snd_pos) == [Resend(12, 1024, 512)]


def test_other_ranges_are_independent() -> None:
    h = handler()
    assert h.on_nak(nak(12, 1024, 512), 0, SND_POS) == [Resend(12, 1024, 512)]
    assert h.on_nak(nak(12, 2048, 512), 0, SND_POS) == [Resend(12, 2048, 512)]
    assert h.active_count == 2


def test_range_is_clipped_to_snd_pos_and_term_end() -> None:
    h = handler()
    assert h.on_nak(nak(12, 4096, 10_000), 0, 2 * T + 6000) == [Resend(12, 4096, 1904)]
    assert h.on_nak(nak(11, T - 1024, 10_000), 0, 2 * T + 6000) == [Resend(11, T - 1024, 1024)]


def test_nak_outside_the_retained_window_is_ignored() -> None:
    h = handler()
    snd_pos = 4 * T
    assert h.retained_window == T // 2 + T // 8
    assert h.on_nak(nak(INITIAL + 4, 0, 64), 0, snd_pos) == []  # not sent yet
    assert h.on_nak(nak(INITIAL + 2, 0, 64), 0, snd_pos) == []  # older than the window
    oldest = snd_pos - h.retained_window
    assert h.on_nak(nak(INITIAL + 3, oldest - 3 * T, 64), 0, snd_pos) == [Resend(INITIAL + 3, oldest - 3 * T, 64)]
    assert h.naks_out_of_window == 2 and h.counters.invalid_packets == 0


def test_term_offset_outside_the_term_is_an_invalid_packet() -> None:
    h = handler()
    assert h.on_nak(nak(12, T, 64), 0, SND_POS) == []
    assert h.on_nak(nak(12, T - 16, 64), 0, SND_POS) == []
    assert h.counters.invalid_packets == 2


def test_pool_overflow_is_counted() -> None:
    h = handler(max_actions=2)
    assert h.on_nak(nak(12, 0, 64), 0, SND_POS)
    assert h.on_nak(nak(12, 64, 64), 0, SND_POS)
    assert h.on_nak(nak(12, 128, 64), 0, SND_POS) == []
    assert h.counters.retransmit_pool_overflow == 1


def test_delayed_resend_for_multicast_senders() -> None:
    h = handler(delay_ns=2 * MS, linger_ns=5 * MS)
    assert h.on_nak(nak(12, 0, 64), 0, SND_POS) == []
    assert h.next_deadline_ns() == 2 * MS
    assert h.on_nak(nak(12, 0, 64), 1 * MS, SND_POS) == []  # merged with the pending one
    assert h.on_timer(2 * MS - 1, SND_POS) == []
    assert h.on_timer(2 * MS, SND_POS) == [Resend(12, 0, 64)]
    assert h.next_deadline_ns() == 7 * MS
    assert h.on_timer(7 * MS, SND_POS) == [] and h.next_deadline_ns() is None


def test_delayed_resend_is_rechecked_against_the_window() -> None:
    h = handler(delay_ns=2 * MS)
    assert h.on_nak(nak(11, 0, 64), 0, 2 * T) == []
    assert h.on_timer(2 * MS, 10 * T) == [] and h.active_count == 0  # fell out of the window meanwhile


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        RetransmitHandler(1000, 0)
    with pytest.raises(ValueError):
        RetransmitHandler(T, 0, max_actions=0)


def test_a_nak_inside_a_range_being_resent_is_that_range_s() -> None:
    h = handler()
    assert h.on_nak(nak(12, 1024, 512), 0, SND_POS) == [Resend(12, 1024, 512)]
    assert h.on_nak(nak(12, 1024 + 256, 512), 1 * MS, SND_POS) == []  # starts inside the lingering range
    assert h.naks_suppressed == 1 and h.active_count == 1


def test_unicast_has_one_action_that_a_nak_for_another_range_takes_over() -> None:
    h = handler(group_semantics=False, max_actions=16)
    assert h.max_actions == 1  # max-resend is for groups, as Aeron's
    assert h.on_nak(nak(12, 0, 64), 0, SND_POS) == [Resend(12, 0, 64)]
    assert h.on_nak(nak(12, 4096, 64), 1 * MS, SND_POS) == [Resend(12, 4096, 64)]  # takes the lingering one over
    assert h.active_count == 1 and h.counters.retransmit_pool_overflow == 0
    assert h.on_nak(nak(12, 4096, 64), 2 * MS, SND_POS) == []  # lingering


def test_max_resend_bounds_a_group_s_retransmits() -> None:
    h = handler(group_semantics=True, max_actions=3)
    for i in range(3):
        assert h.on_nak(nak(12, i * 1024, 64), 0, SND_POS)
    assert h.on_nak(nak(12, 8192, 64), 0, SND_POS) == [] and h.counters.retransmit_pool_overflow == 1
