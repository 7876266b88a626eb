"""offer / try_claim / offer_batch: results, back-pressure, fragmentation, rotation and the end of the log."""

from __future__ import annotations

import numpy as np
import pytest

from logbuf import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    BufferClaim,
    ClaimStateError,
    ConcurrentPublication,
    ExclusivePublication,
    MessageTooLargeError,
    Position,
)
from logbuf.logbuffer import descriptor as d


def test_offer_returns_new_position_and_subscriber_reads_it(pipe) -> None:
    p = pipe()
    assert p.pub.offer(b"x" * 10) == 64
    assert p.pub.offer(bytearray(b"y" * 40), reserved_value=3) == 64 + 96
    assert p.pub.offer(memoryview(b"z" * 100)[::1]) == 160 + 160
    assert p.pub.offer(np.arange(4, dtype=np.int64)) == 320 + 64
    got = p.drain()
    assert [g[0] for g in got] == [b"x" * 10, b"y" * 40, b"z" * 100, np.arange(4, dtype=np.int64).tobytes()]
    assert [g[1] for g in got] == [0, 3, 0, 0]
    assert p.sub_pos.get() == 384


def test_zero_length_message(pipe) -> None:
    p = pipe()
    assert p.pub.offer(b"") == 32
    assert p.drain() == [(b"", 0, 0xC0)]


def test_not_connected_and_back_pressured(pipe) -> None:
    p = pipe()
    p.limit.set(0)
    p.log.is_connected = False
    assert p.pub.offer(b"a") == NOT_CONNECTED
    p.log.is_connected = True
    assert p.pub.offer(b"a") == BACK_PRESSURED
    assert not p.pub.try_claim(8) and p.pub.try_claim(8).result == BACK_PRESSURED
    # a limit one byte ahead admits one message (Aeron checks position < limit)
    p.limit.set(1)
    assert p.pub.offer(b"a") == 64
    assert p.pub.offer(b"a") == BACK_PRESSURED


def test_closed(pipe) -> None:
    p = pipe()
    p.pub.close()
    assert p.pub.offer(b"a") == CLOSED
    assert p.pub.try_claim(1).result == CLOSED
    assert p.pub.offer_batch([b"a"]).result == CLOSED


def test_message_too_large(pipe) -> None:
    p = pipe(term_length=64 * 1024)
    assert p.pub.max_message_length == 8 * 1024
    with pytest.raises(MessageTooLargeError):
        p.pub.offer(b"x" * (8 * 1024 + 1))
    with pytest.raises(MessageTooLargeError):
        p.pub.try_claim(p.pub.max_payload_length + 1)
    assert p.pub.offer(b"x" * 8 * 1024) > 0  # exactly the maximum fragments fine


def test_fragmented_message_reassembled(pipe) -> None:
    from logbuf import FragmentAssembler

    p = pipe(term_length=64 * 1024)
    message = bytes(i % 256 for i in range(8 * 1024))
    p.pub.offer(message, reserved_value=11)
    got = []
    assembler = FragmentAssembler(lambda b, h: got.append((bytes(b), h.reserved_value)))
    while p.image.poll(assembler, 2):
        pass
    assert got == [(message, 11)]


def test_try_claim_commit_abort_and_context_manager(pipe) -> None:
    p = pipe()
    claim = p.pub.try_claim(5)
    assert claim and claim.length == 5 and claim.position == 64
    claim.buffer[:] = b"hello"
    claim.reserved_value = 99
    assert p.drain() == []  # nothing visible before commit
    claim.commit()
    assert p.drain() == [(b"hello", 99, 0xC0)]
    with pytest.raises(ClaimStateError):
        claim.commit()

    aborted = p.pub.try_claim(7)
    aborted.abort()
    with p.pub.try_claim(3) as buf:
        buf[:] = b"abc"
    with pytest.raises(RuntimeError), p.pub.try_claim(3) as buf:
        buf[:] = b"zzz"
        raise RuntimeError("writer failed")
    # the aborted claims became padding: the reader skips them and ends at the tail
    assert p.drain() == [(b"abc", 0, 0xC0)]
    assert p.sub_pos.get() == p.pub.position


def test_try_claim_reuses_a_claim_object(pipe) -> None:
    p = pipe()
    claim = BufferClaim()
    for i in range(3):
        assert p.pub.try_claim(1, claim) is claim
        claim.buffer[0] = i
        claim.commit()
    assert [g[0] for g in p.drain()] == [b"\x00", b"\x01", b"\x02"]


def test_rotation_pads_end_of_term_and_returns_admin_action(pipe) -> None:
    p = pipe(term_length=64 * 1024)
    payload = b"r" * 1000  # 1056 aligned; 62 fit in a term
    results = [p.pub.offer(payload) for _ in range(63)]
    assert results[-1] == ADMIN_ACTION
    assert p.log.active_term_count == 1
    # the pad covers [62 * 1056, 64 KiB): the next offer lands at the start of term 1
    assert p.pub.offer(payload) == 64 * 1024 + 1056
    assert len(p.drain()) == 63


def test_offer_batch_list_and_buffer_forms(pipe) -> None:
    p = pipe()
    r = p.pub.offer_batch([b"a", b"bb", b"ccc"], reserved_values=[1, 2, 3])
    assert r.appended == 3 and r.result == 3 * 64
    data = np.frombuffer(b"0123456789", dtype=np.uint8)
    r = p.pub.offer_batch(data, lengths=np.array([4, 6], dtype=np.int32))
    assert r == (2, 5 * 64)
    assert [(g[0], g[1]) for g in p.drain()] == [(b"a", 1), (b"bb", 2), (b"ccc", 3), (b"0123", 0), (b"456789", 0)]


def test_offer_batch_copies_every_short_length_exactly(pipe) -> None:
    # lengths 0..130 cover every size class of the batch's inline copy (and the library call above 64 bytes);
    # the bytes around each message in the source differ from it, so an over- or under-copy shows
    p = pipe()
    rng = np.random.default_rng(7)
    messages = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in range(131)]
    data = np.frombuffer(b"".join(messages), dtype=np.uint8)
    lengths = np.array([len(m) for m in messages], dtype=np.int32)
    rest = 0
    while rest < len(messages):
        r = p.pub.offer_batch(data[int(lengths[:rest].sum()):], lengths=lengths[rest:],
                              reserved_values=np.arange(rest, len(messages), dtype=np.int64))
        assert r.appended > 0, r
        rest += r.appended
    assert [(g[0], g[1]) for g in p.drain()] == [(m, i) for i, m in enumerate(messages)]


def test_offer_batch_stops_at_window_and_term_end(pipe) -> None:
    p = pipe(term_length=64 * 1024)
    p.limit.set(64 * 10)
    r = p.pub.offer_batch([b"m" * 16] * 50)
    assert r.appended == 10 and r.result == 640  # the window admits 10 frames of 64
    assert p.pub.offer_batch([b"m"]).result == BACK_PRESSURED
    p.limit.set(1 << 40)
    # fill the term to 64 bytes short of its end, then a batch takes only what fits in the term
    big = [b"x" * 992] * 63
    assert p.pub.offer_batch(big).appended == 63  # 640 + 63 * 1024 = 64 KiB - 384
    assert p.pub.offer_batch([b"y" * 16] * 5).appended == 5  # 64 bytes left
    r = p.pub.offer_batch([b"y" * 16, b"y" * 16, b"y" * 16])
    assert r == (1, 64 * 1024)  # only what fits in the term
    r = p.pub.offer_batch([b"z" * 16])
    assert r == (0, ADMIN_ACTION)  # rotation
    assert p.pub.offer_batch([b"z" * 16]).appended == 1


def test_offer_batch_with_a_message_that_needs_fragments(pipe) -> None:
    p = pipe(term_length=64 * 1024)
    big = bytes(3000)
    r1 = p.pub.offer_batch([b"a", big, b"b"])
    assert r1.appended == 1  # stops before the message that must be fragmented
    r2 = p.pub.offer_batch([big, b"b"])
    assert r2.appended == 1  # a fragmented message goes alone
    assert p.pub.offer_batch([b"b"]).appended == 1


def test_offer_batch_rejects_inconsistent_lengths(pipe) -> None:
    p = pipe()
    with pytest.raises(ValueError):
        p.pub.offer_batch(b"abc", lengths=[2, 2])
    with pytest.raises(ValueError):
        p.pub.offer_batch([b"a"], reserved_values=[1, 2])


def test_exclusive_publication_appends_and_rotates(pipe) -> None:
    p = pipe(exclusive=True, term_length=64 * 1024)
    assert isinstance(p.pub, ExclusivePublication)
    positions = [p.pub.offer(b"e" * 1000) for _ in range(63)]
    assert positions[:2] == [1056, 2112] and positions[-1] == ADMIN_ACTION
    assert p.pub.position == 64 * 1024 and p.log.active_term_count == 1
    assert p.pub.offer(b"after") == 64 * 1024 + 64
    assert p.log.producer_position() == 64 * 1024 + 64
    claim = p.pub.try_claim(4)
    claim.buffer[:] = b"excl"
    claim.commit()
    got = p.drain()
    assert len(got) == 64 and got[-2][0] == b"after" and got[-1][0] == b"excl"


def test_exclusive_publication_resumes_from_log_tail(pipe) -> None:
    p = pipe()
    p.pub.offer(b"x" * 10)
    second = ExclusivePublication(p.log, p.limit)
    assert second.position == 64
    assert second.offer(b"y") == 128


@pytest.mark.parametrize("exclusive", [False, True])
def test_max_position_exceeded_never_wraps(make_log, exclusive) -> None:
    T = 64 * 1024
    log = make_log(term_length=T, initial_term_id=2**31 - 5)
    # put the log in its last possible term (term count 2^31 - 1), 2 frames from the end
    last_count = 2**31 - 1
    term_id = d.compute_term_id_from_position(last_count * T, log.position_bits, log.initial_term_id)
    index = last_count % 3
    log.meta.put_i64_release(index * 8, d.pack_tail(term_id, T - 128))
    log.meta.put_i32_release(d.LOG_ACTIVE_TERM_COUNT_OFFSET, last_count)
    log.is_connected = True
    cls = ExclusivePublication if exclusive else ConcurrentPublication
    pub = cls(log, Position.standalone(2**62))
    assert pub.position == d.max_possible_position(T) - 128
    assert pub.offer(b"a") == d.max_possible_position(T) - 64
    assert pub.offer(b"b" * 100) == MAX_POSITION_EXCEEDED  # does not fit: the log is over, no rotation
    assert log.active_term_count == last_count
    assert pub.offer(b"c") == MAX_POSITION_EXCEEDED


def test_back_pressure_at_the_end_of_the_log_reports_max_position(make_log) -> None:
    T = 64 * 1024
    log = make_log(term_length=T, initial_term_id=0)
    last_count = 2**31 - 1
    log.meta.put_i64_release((last_count % 3) * 8, d.pack_tail(last_count, T - 64))
    log.meta.put_i32_release(d.LOG_ACTIVE_TERM_COUNT_OFFSET, last_count)
    log.is_connected = True
    pub = ConcurrentPublication(log, Position.standalone(0))
    assert pub.offer(b"x" * 100) == MAX_POSITION_EXCEEDED
    assert pub.offer(b"x") == BACK_PRESSURED
