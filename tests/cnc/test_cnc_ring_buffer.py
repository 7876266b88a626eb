"""ManyToOneRingBuffer (to-driver commands): record format decoded independently, full/wrap/padding,
unblocking a dead producer's record, hostile lengths, and many producer processes into one mmap."""

from __future__ import annotations

import multiprocessing
import os
import struct
import time

import pytest

from logbuf.cnc import ring_buffer as rb
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.errors import CncFileError, RingBufferCorruptedError
from logbuf.native import AtomicBuffer
from support import stop_process

pytestmark = pytest.mark.timeout(60)

CAPACITY = 1024


def make_ring(capacity: int = CAPACITY) -> tuple[bytearray, rb.ManyToOneRingBuffer]:
    raw = bytearray(capacity + 768)
    return raw, rb.ManyToOneRingBuffer(AtomicBuffer(raw))


def trailer(raw: bytes, capacity: int = CAPACITY) -> dict[str, int]:
    """Independent decoding of the trailer at the reference offsets."""
    names = {"tail": 128, "head_cache": 256, "head": 384, "correlation": 512, "heartbeat": 640}
    return {name: struct.unpack_from("<q", raw, capacity + off)[0] for name, off in names.items()}


def records(raw: bytes, start: int, end: int) -> list[tuple[int, int, bytes]]:
    """Independent decoding of records between two indices: (length, type, body)."""
    out = []
    index = start
    while index < end:
        length, type_id = struct.unpack_from("<ii", raw, index)
        if length <= 0:
            break
        out.append((length, type_id, bytes(raw[index + 8 : index + length])))
        index += (length + 7) & ~7
    return out


def drain(ring: rb.ManyToOneRingBuffer) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    while True:
        head = ring.consumer_position()
        # a read that only skipped padding returns 0 but moves the head: keep going until nothing moves
        if ring.read(lambda t, body: got.append((t, bytes(body)))) == 0 and ring.consumer_position() == head:
            return got


def test_trailer_and_record_constants_match_reference():
    assert (rb.TAIL_POSITION_OFFSET, rb.HEAD_CACHE_POSITION_OFFSET, rb.HEAD_POSITION_OFFSET) == (
        128,
        256,
        384,
    )
    assert (rb.CORRELATION_COUNTER_OFFSET, rb.CONSUMER_HEARTBEAT_OFFSET, rb.TRAILER_LENGTH) == (512, 640, 768)
    assert (rb.LENGTH_OFFSET, rb.TYPE_OFFSET, rb.HEADER_LENGTH, rb.ALIGNMENT) == (0, 4, 8, 8)
    assert rb.PADDING_MSG_TYPE_ID == -1
    _, ring = make_ring()
    assert ring.max_msg_length == CAPACITY // 8


def test_written_record_decoded_by_independent_struct_decoder():
    raw, ring = make_ring()
    assert ring.write(4, b"abcde")
    assert ring.write(9, b"")
    assert records(raw, 0, CAPACITY) == [(13, 4, b"abcde"), (8, 9, b"")]
    assert trailer(raw)["tail"] == 16 + 8  # aligned 13 -> 16, then 8
    assert trailer(raw)["head"] == 0


def test_read_delivers_in_order_zeroes_space_and_moves_head():
    raw, ring = make_ring()
    for i in range(5):
        assert ring.write(1 + i, bytes([i]) * i)
    got = []
    assert ring.read(lambda t, body: got.append((t, bytes(body))), limit=3) == 3
    assert got == [(1, b""), (2, b"\x01"), (3, b"\x02\x02")]
    head = trailer(raw)["head"]
    assert head == 8 + 16 + 16
    assert raw[:head] == bytes(head)  # consumed space is zeroed for the next lap
    assert drain(ring) == [(4, b"\x03" * 3), (5, b"\x04" * 4)]
    assert ring.size() == 0


def test_full_returns_false_and_wrap_writes_padding_record():
    raw, ring = make_ring()
    body = b"x" * 120  # record 128 bytes
    writes = 0
    while ring.write(1, body):
        writes += 1
    assert writes == 7  # 8 x 128 would leave no spare header: Aeron keeps one
    assert len(drain(ring)) == 7
    # the tail is at 896: a 136-byte record does not fit before the end -> padding of 128 at 896, record at 0
    big = b"y" * 128
    assert ring.write(2, big)
    t = trailer(raw)
    assert t["tail"] == 896 + 128 + 136
    length, type_id = struct.unpack_from("<ii", raw, 896)
    assert (length, type_id) == (128, -1)
    assert records(raw, 0, 136) == [(136, 2, big)]
    assert drain(ring) == [(2, big)]  # padding is skipped, not delivered
    assert trailer(raw)["head"] == t["tail"]


def test_invalid_type_and_length_rejected():
    _, ring = make_ring()
    with pytest.raises(ValueError):
        ring.write(0, b"")
    with pytest.raises(ValueError):
        ring.write(-1, b"")
    with pytest.raises(ValueError):
        ring.write(1, b"x" * (ring.max_msg_length + 1))
    assert ring.write(1, b"x" * ring.max_msg_length)


def test_capacity_must_be_power_of_two():
    with pytest.raises(CncFileError, match="power of two"):
        rb.ManyToOneRingBuffer(AtomicBuffer(bytearray(1000 + 768)))


def test_correlation_ids_and_heartbeat():
    raw, ring = make_ring()
    assert [ring.next_correlation_id() for _ in range(3)] == [0, 1, 2]
    assert trailer(raw)["correlation"] == 3
    ring.consumer_heartbeat_time = 1_700_000_000_000
    assert ring.consumer_heartbeat_time == 1_700_000_000_000
    assert trailer(raw)["heartbeat"] == 1_700_000_000_000


def test_handler_exception_still_consumes_the_record():
    _, ring = make_ring()
    ring.write(1, b"poison")
    ring.write(2, b"fine")

    def handler(t: int, body: memoryview) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        ring.read(handler)
    assert drain(ring) == [(2, b"fine")]


def test_unblock_turns_uncommitted_negative_record_into_padding():
    raw, ring = make_ring()
    index = ring._claim_capacity(8 + 20)  # a producer claims...
    ring.buffer.put_i32_release(index, -(8 + 20))  # ...marks the record in progress, then dies
    assert ring.write(3, b"after")
    assert drain(ring) == []  # the consumer is stuck behind the dead record
    assert ring.unblock()
    assert struct.unpack_from("<ii", raw, 0) == (28, -1)
    assert drain(ring) == [(3, b"after")]
    assert not ring.unblock()  # empty now


def test_unblock_zero_length_record_up_to_next_header():
    raw, ring = make_ring()
    ring._claim_capacity(8 + 40)  # claimed, the producer died before writing anything
    assert ring.write(3, b"after")
    assert drain(ring) == []
    assert ring.unblock()
    assert struct.unpack_from("<ii", raw, 0) == (48, -1)
    assert drain(ring) == [(3, b"after")]


def test_unblock_leaves_committed_records_alone():
    _, ring = make_ring()
    assert not ring.unblock()
    ring.write(1, b"ok")
    assert not ring.unblock()
    assert drain(ring) == [(1, b"ok")]


@pytest.mark.parametrize("length", [3, CAPACITY + 8, 2**31 - 1])
def test_hostile_length_raises_instead_of_reading_outside(length):
    raw, ring = make_ring()
    ring.write(1, b"x")
    struct.pack_into("<i", raw, 0, length)
    with pytest.raises(RingBufferCorruptedError) as info:
        ring.read(lambda t, body: None)
    assert info.value.index == 0


# -- many producer processes ------------------------------------------------------------------------

PRODUCERS = 3
MESSAGES = 20_000


def _producer(path: str, producer: int, count: int) -> None:
    cnc = CncFile.open(path)
    ring = cnc.to_driver
    try:
        for seq in range(count):
            body = struct.pack("<ii", producer, seq) + bytes([seq & 0xFF]) * (seq % 37)
            while not ring.write(1 + producer, body):
                os.sched_yield()  # full: let the consumer run (2 cores)
    finally:
        cnc.close()


def test_many_producer_processes_exactly_once_in_order(tmp_path):
    path = str(tmp_path / "cnc.dat")
    cnc = CncFile.create(path, 1024, 1024, 1024, 1024, 10**10, os.getpid(), 0)
    ring = cnc.to_driver
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_producer, args=(path, p, MESSAGES), daemon=True) for p in range(PRODUCERS)]
    next_seq = [0] * PRODUCERS
    errors: list[str] = []

    def handler(msg_type: int, body: memoryview) -> None:
        producer, seq = struct.unpack_from("<ii", body)
        if msg_type != 1 + producer or seq != next_seq[producer]:
            errors.append(f"type {msg_type} producer {producer} seq {seq}, expected {next_seq[producer]}")
        elif bytes(body[8:]) != bytes([seq & 0xFF]) * (seq % 37):
            errors.append(f"producer {producer} seq {seq}: body corrupted")
        next_seq[producer] = seq + 1

    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 40
        while sum(next_seq) < PRODUCERS * MESSAGES and time.monotonic() < deadline and not errors:
            if ring.read(handler, limit=50) == 0:
                os.sched_yield()
    finally:
        for p in procs:
            stop_process(p, grace=10)
    assert not errors, errors[:5]
    assert next_seq == [MESSAGES] * PRODUCERS
    assert all(p.exitcode == 0 for p in procs)
    assert ring.read(handler) == 0  # nothing extra (exactly once)
    assert ring.size() == 0
    assert ring.producer_position() > 100 * ring.capacity  # the ring wrapped many times under contention
    cnc.close()


def _dying_producer(path: str) -> None:
    cnc = CncFile.open(path)
    ring = cnc.to_driver
    index = ring._claim_capacity(8 + 16)
    ring.buffer.put_i32_release(index, -(8 + 16))
    os._exit(0)  # killed between claiming and committing: no cleanup of any kind


def test_dead_client_process_cannot_wedge_the_consumer(tmp_path):
    path = str(tmp_path / "cnc.dat")
    cnc = CncFile.create(path, 1024, 1024, 1024, 1024, 10**10, os.getpid(), 0)
    ctx = multiprocessing.get_context("fork")
    dying = ctx.Process(target=_dying_producer, args=(path,), daemon=True)
    dying.start()
    dying.join(timeout=10)
    assert dying.exitcode == 0
    live = ctx.Process(target=_producer, args=(path, 0, 5), daemon=True)
    live.start()
    live.join(timeout=10)
    assert live.exitcode == 0
    ring = cnc.to_driver
    assert drain(ring) == [] and ring.size() > 0  # stuck behind the dead client's record
    assert ring.unblock()
    got = drain(ring)
    assert [struct.unpack_from("<ii", body) for _, body in got] == [(0, seq) for seq in range(5)]
    assert ring.size() == 0
    cnc.close()
