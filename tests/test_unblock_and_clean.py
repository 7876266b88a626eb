"""The conductor's duties on one log: pub-lmt with hysteresis, cleaning, and unblocking stuck claims."""

from __future__ import annotations

import struct

from logbuf import Position
from logbuf.driver.ipc_publication import IpcPublicationDuty
from logbuf.logbuffer.term_unblocker import unblock
from logbuf.units import NANOS_PER_SECOND as SECOND


def _duty(p, **kw):
    pub_pos = Position.standalone()
    duty = IpcPublicationDuty(p.log, pub_pos, p.limit, lambda: [p.sub_pos], **kw)
    return duty, pub_pos


def test_publication_limit_follows_slowest_subscriber_with_hysteresis(pipe) -> None:
    p = pipe(term_length=64 * 1024)
    duty, pub_pos = _duty(p, window_length=32 * 1024)
    p.limit.set(0)
    duty.update()
    assert p.limit.get() == 32 * 1024 and p.log.is_connected
    p.pub.offer(b"x" * 992)  # 1024 bytes
    p.drain()
    duty.update()
    assert pub_pos.get() == 1024
    assert p.limit.get() == 32 * 1024  # moved less than window/8: not re-published
    for _ in range(4):
        p.pub.offer(b"x" * 992)
    p.drain()
    duty.update()
    assert p.limit.get() == 5 * 1024 + 32 * 1024


def test_no_subscribers_clamps_limit_and_disconnects(pipe) -> None:
    p = pipe()
    duty = IpcPublicationDuty(p.log, Position.standalone(), p.limit, lambda: [])
    duty.update()
    assert p.limit.get() == 0 and not p.log.is_connected


def test_cleaning_zeroes_behind_the_slowest_subscriber(pipe) -> None:
    p = pipe(term_length=64 * 1024)
    duty, _ = _duty(p)
    for _ in range(10):
        p.pub.offer(b"c" * 200)
    p.drain()
    duty.update()
    term = bytes(p.log.terms.view[:4096])
    assert term[: 10 * 256] == bytes(10 * 256)  # all read, all cleaned


def test_uncommitted_claim_becomes_pad_after_timeout(pipe) -> None:
    p = pipe()
    duty, _ = _duty(p, unblock_timeout_ns=2 * SECOND)
    p.pub.offer(b"before")
    stuck = p.pub.try_claim(200)  # never committed
    p.pub.offer(b"after")
    assert [g[0] for g in p.drain()] == [b"before"]
    duty.update()
    assert not duty.check_for_blocked_publisher(0)
    assert not duty.check_for_blocked_publisher(2 * SECOND)  # not longer than the timeout yet
    assert duty.check_for_blocked_publisher(2 * SECOND + 1)
    assert duty.unblocked_count == 1
    length, _, _, ftype = struct.unpack_from("<iBBH", p.log.terms.view, 64)
    assert (length, ftype) == (232, 0)  # PAD of the claim's own length
    assert [g[0] for g in p.drain()] == [b"after"]
    del stuck


def test_reserved_but_unwritten_gap_padded_up_to_next_frame(pipe) -> None:
    p = pipe()
    p.pub.offer(b"a")  # 0..64
    # a writer reserved 128 bytes and died before writing its header: the tail moved, memory is zero
    p.log.meta.get_and_add_i64(0, 128)
    p.pub.offer(b"b")  # 192..256
    assert [g[0] for g in p.drain()] == [b"a"]
    assert unblock(p.log, 64)
    length, _, _, ftype = struct.unpack_from("<iBBH", p.log.terms.view, 64)
    assert (length, ftype) == (128, 0)
    assert [g[0] for g in p.drain()] == [b"b"]


def test_zero_to_end_of_term_padded_and_log_rotated(pipe) -> None:
    p = pipe(term_length=64 * 1024)
    p.pub.offer(b"a")
    # a writer reserved the rest of the term (overshooting it) and died before padding or rotating
    p.log.meta.get_and_add_i64(0, 64 * 1024)
    assert p.log.active_term_count == 0
    p.drain()
    assert unblock(p.log, 64)
    assert p.log.active_term_count == 1
    assert p.pub.offer(b"next term") == 64 * 1024 + 64
    assert [g[0] for g in p.drain()] == [b"next term"]


def test_nothing_to_unblock_when_frames_are_committed(pipe) -> None:
    p = pipe()
    p.pub.offer(b"a")
    assert not unblock(p.log, 0)
