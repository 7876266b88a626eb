"""Position arithmetic of the descriptor, including term-id wrap and the maximum position."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from logbuf.logbuffer import descriptor as d

I32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


def test_position_wraps_term_ids_as_int32() -> None:
    bits = 16
    # term id wrapped from INT32_MAX to INT32_MIN: still one term after the initial one
    assert d.compute_position(-(2**31), 64, bits, 2**31 - 1) == (1 << bits) + 64
    assert d.compute_term_id_from_position(1 << bits, bits, 2**31 - 1) == -(2**31)


@given(initial=I32, term_count=st.integers(min_value=0, max_value=2**31 - 1),
       offset=st.integers(min_value=0, max_value=(1 << 16) - 1))
def test_position_round_trips(initial: int, term_count: int, offset: int) -> None:
    bits = 16
    position = (term_count << bits) + offset
    term_id = d.compute_term_id_from_position(position, bits, initial)
    assert d.compute_position(term_id, offset, bits, initial) == position
    assert d.compute_term_offset_from_position(position, bits) == offset
    assert d.index_by_position(position, bits) == term_count % 3


@given(term_id=I32, offset=st.integers(min_value=0, max_value=2**32 - 1))
def test_tail_packing(term_id: int, offset: int) -> None:
    raw = d.pack_tail(term_id, offset)
    assert -(2**63) <= raw < 2**63
    assert d.tail_term_id(raw) == term_id
    assert d.tail_term_offset(raw, 1 << 20) == min(offset, 1 << 20)


def test_max_position_and_message_length() -> None:
    assert d.max_possible_position(64 * 1024) == 64 * 1024 * 2**31
    assert d.compute_max_message_length(64 * 1024) == 8 * 1024
    assert d.compute_max_message_length(1 << 30) == 16 * 1024 * 1024
