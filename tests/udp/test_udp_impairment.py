"""Impairment: seeded drop / duplicate / reorder / delay of datagrams."""

from __future__ import annotations

import pytest

from logbuf.driver.udp import Impairment

US = 1_000


def run(impairment: Impairment, count: int, step: int = 10 * US) -> list[bytes]:
    out: list[bytes] = []
    for i in range(count):
        impairment.submit(i.to_bytes(4, "little"), i * step)
        out += impairment.poll(i * step)
    return out + impairment.poll(1 << 62)


def seqs(datagrams: list[bytes]) -> list[int]:
    return [int.from_bytes(d, "little") for d in datagrams]


def test_clean_path_delivers_everything_in_order_after_the_delay() -> None:
    imp = Impairment(delay_ns=50 * US)
    imp.submit(b"a", 0)
    imp.submit(b"b", 10 * US)
    assert imp.next_due_ns() == 50 * US and imp.pending == 2
    assert imp.poll(49 * US) == [] and imp.poll(50 * US) == [b"a"] and imp.poll(60 * US) == [b"b"]
    assert imp.delivered == 2 and imp.next_due_ns() is None


def test_rates_follow_the_probabilities() -> None:
    imp = Impairment(drop=0.05, duplicate=0.05, reorder=0.1, delay_ns=20 * US, seed=3)
    got = run(imp, 20_000)
    assert 0.04 < imp.dropped / 20_000 < 0.06
    assert 0.04 < imp.duplicated / (20_000 - imp.dropped) < 0.06
    assert 0.09 < imp.reordered / (20_000 - imp.dropped) < 0.11
    assert len(got) == 20_000 - imp.dropped + imp.duplicated == imp.delivered
    order = seqs(got)
    assert order != sorted(order)  # reordered
    assert len(set(order)) == 20_000 - imp.dropped  # each survivor at least once


def test_same_seed_same_deliveries() -> None:
    a = run(Impairment(0.1, 0.1, 0.1, 10 * US, seed=9, jitter_ns=30 * US), 2000)
    b = run(Impairment(0.1, 0.1, 0.1, 10 * US, seed=9, jitter_ns=30 * US), 2000)
    c = run(Impairment(0.1, 0.1, 0.1, 10 * US, seed=10, jitter_ns=30 * US), 2000)
    assert a == b and a != c


def test_reordered_datagrams_are_held_back_and_overtaken() -> None:
    imp = Impairment(reorder=0.3, delay_ns=10 * US, reorder_delay_ns=100 * US, seed=1)
    arrivals: dict[int, int] = {}
    order: list[int] = []
    for t in range(400):
        if t < 200:
            imp.submit(t.to_bytes(4, "little"), t * US)
        for d in imp.poll(t * US):
            arrivals[int.from_bytes(d, "little")] = t
            order.append(int.from_bytes(d, "little"))
    lateness = {seq: arrivals[seq] - seq for seq in range(200)}
    assert set(lateness.values()) == {10, 110}  # on time, or held back by the reorder delay
    held = sum(v == 110 for v in lateness.values())
    assert held == imp.reordered and 40 < held < 80
    assert order != sorted(order)

def test_datagrams_are_copied_on_submit() -> None:
    imp = Impairment()
    buffer = bytearray(b"abcd")
    imp.submit(memoryview(buffer), 0)
    buffer[:] = b"XXXX"
    assert imp.poll(0) == [b"abcd"]


def test_probabilities_and_delays_are_checked() -> None:
    with pytest.raises(ValueError):
        Impairment(drop=1.5)
    with pytest.raises(ValueError):
        Impairment(delay_ns=-1)
