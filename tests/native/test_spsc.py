"""lb_spsc: the bounded single-producer single-consumer record queue between the driver's control plane and
its native agents."""

from __future__ import annotations

import threading

import pytest
from logbuf._native import ffi, lib


@pytest.fixture
def queue():
    q = lib.lb_spsc_new(4, 16)
    assert q != ffi.NULL
    yield q
    lib.lb_spsc_free(q)


def test_bad_shapes_are_refused() -> None:
    for capacity, record_max in ((3, 16), (1, 16), (0, 16), (131072, 16), (4, 0), (4, 65537)):
        assert lib.lb_spsc_new(capacity, record_max) == ffi.NULL


def test_records_come_out_whole_and_in_order_until_full(queue) -> None:
    for i in range(4):
        assert lib.lb_spsc_offer(queue, bytes([i]) * (i + 1), i + 1) == 1
    assert lib.lb_spsc_offer(queue, b"x", 1) == 0  # full
    assert lib.lb_spsc_size(queue) == 4
    out = ffi.new("uint8_t[16]")
    for i in range(4):
        n = lib.lb_spsc_poll(queue, out, 16)
        assert bytes(out[0:n]) == bytes([i]) * (i + 1)
    assert lib.lb_spsc_poll(queue, out, 16) == -1  # empty
    assert lib.lb_spsc_size(queue) == 0


def test_lengths_out_of_range_and_small_buffers(queue) -> None:
    assert lib.lb_spsc_offer(queue, b"x" * 17, 17) == -1
    assert lib.lb_spsc_offer(queue, ffi.NULL, -1) == -1
    assert lib.lb_spsc_offer(queue, b"abcdef", 6) == 1
    out = ffi.new("uint8_t[16]")
    assert lib.lb_spsc_poll(queue, out, 5) == -2  # the record stays
    assert lib.lb_spsc_poll(queue, out, 16) == 6
    assert bytes(out[0:6]) == b"abcdef"
    assert lib.lb_spsc_offer(queue, ffi.NULL, 0) == 1  # an empty record is a record
    assert lib.lb_spsc_poll(queue, out, 16) == 0


def test_two_threads_pass_every_record_once_in_order() -> None:
    count = 20_000
    q = lib.lb_spsc_new(64, 8)
    received: list[int] = []

    def consume() -> None:
        out = ffi.new("int64_t *")
        while len(received) < count:
            if lib.lb_spsc_poll(q, out, 8) == 8:
                received.append(out[0])

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    record = ffi.new("int64_t *")
    sent = 0
    while sent < count:
        record[0] = sent
        if lib.lb_spsc_offer(q, record, 8) == 1:
            sent += 1
    consumer.join(timeout=60)
    assert not consumer.is_alive()
    lib.lb_spsc_free(q)
    assert received == list(range(count))
