"""The send plan: whole committed frames from snd-pos up to min(snd-lmt, MTU, end of term)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from logbuf import ExclusivePublication, LogBuffers, Position
from logbuf.driver.udp import SenderCounters, SendPlanner
from logbuf.protocol import DataPacket, PacketKind, classify

T = 64 * 1024


@pytest.fixture
def setup(make_log: Callable[..., LogBuffers]) -> tuple[LogBuffers, ExclusivePublication, SendPlanner]:
    log = make_log(term_length=T, mtu=1408, initial_term_id=5)
    publication = ExclusivePublication(log, Position.standalone(1 << 40))
    return log, publication, SendPlanner(log, counters=SenderCounters())


def frames_of(plan: object) -> DataPacket:
    packet = classify(bytes(plan.buffer))  # type: ignore[attr-defined]
    assert isinstance(packet, DataPacket)
    return packet


def test_nothing_committed_means_nothing_to_send(setup: tuple) -> None:
    _, _, planner = setup
    assert planner.plan(1 << 20) is None and planner.snd_bpe == 0


def test_small_frames_go_in_one_datagram(setup: tuple) -> None:
    log, publication, planner = setup
    for size in (1, 50, 100):
        publication.offer(bytes([size]) * size)
    plan = planner.plan(1 << 20)
    assert plan is not None and (plan.position, plan.term_id, plan.term_offset) == (0, 5, 0)
    assert plan.length == 64 + 96 + 160 and plan.padding == 0
    assert bytes(plan.buffer) == log.terms.get_bytes(0, plan.length)
    assert frames_of(plan).frame_count == 3


def test_mtu_limits_the_datagram_to_whole_frames(setup: tuple) -> None:
    _, publication, planner = setup
    for _ in range(5):
        publication.offer(b"x" * 400)  # 432 -> 448 bytes per frame: 3 fit in 1408
    plan = planner.plan(1 << 20)
    assert plan.length == 3 * 448 and frames_of(plan).frame_count == 3
    assert planner.on_sent(plan, plan.length)
    plan = planner.plan(1 << 20)
    assert plan.position == 3 * 448 and plan.length == 2 * 448


def test_sender_limit_bounds_the_datagram_to_whole_frames(setup: tuple) -> None:
    _, publication, planner = setup
    for _ in range(3):
        publication.offer(b"x" * 100)  # 160 bytes each
    plan = planner.plan(400)
    assert plan.length == 320 and planner.snd_bpe == 0  # a third frame would pass snd-lmt


def test_flow_control_limits_count_data_held_back_once_per_episode(setup: tuple) -> None:
    _, publication, planner = setup
    assert planner.plan(0) is None and planner.snd_bpe == 0  # nothing waiting: not a limit
    publication.offer(b"x" * 100)
    assert planner.plan(0) is None and planner.plan(0) is None
    assert planner.snd_bpe == 1 and planner.counters.flow_control_limits == 1
    plan = planner.plan(160)
    assert planner.on_sent(plan, 160) and planner.position == 160
    publication.offer(b"y" * 100)
    assert planner.plan(200) is None  # 40 bytes of window: the next 160-byte frame does not fit
    assert planner.snd_bpe == 2 and planner.counters.flow_control_limits == 2
    assert planner.plan(1 << 20) is not None and planner.snd_bpe == 2


def test_short_send_keeps_the_position(setup: tuple) -> None:
    _, publication, planner = setup
    publication.offer(b"x" * 100)
    plan = planner.plan(1 << 20)
    assert not planner.on_sent(plan, 10)
    assert planner.position == 0 and planner.counters.short_sends == 1 and planner.counters.bytes_sent == 0
    assert planner.on_sent(planner.plan(1 << 20), 160) and planner.counters.bytes_sent == 160


def test_batch_planning_and_a_failure_in_the_middle(setup: tuple) -> None:
    _, publication, planner = setup
    for _ in range(6):
        publication.offer(b"x" * 1000)  # one frame per datagram
    plans, position = [], None
    for _ in range(4):
        plan = planner.plan(1 << 20, position)
        plans.append(plan)
        position = plan.next_position
    assert [p.position for p in plans] == [0, 1056, 2112, 3168]
    assert planner.on_sent(plans[0], plans[0].length)
    assert not planner.on_sent(plans[1], 0)  # short send
    assert not planner.on_sent(plans[2], plans[2].length)  # after the failure: ignored, re-planned later
    assert planner.position == 1056 and planner.plan(1 << 20).position == 1056


def test_end_of_term_sends_the_pad_header_and_skips_its_body(setup: tuple) -> None:
    _, publication, planner = setup
    while publication.position < T - 2048:
        publication.offer(b"y" * 1000)
    publication.offer(b"z" * 1500)  # does not fit: the publication pads the term and rotates
    publication.offer(b"z" * 1500)
    while True:
        plan = planner.plan(1 << 30)
        if plan.padding:
            break
        assert planner.on_sent(plan, plan.length)
    pad = frames_of(plan)
    assert pad.kind is PacketKind.PAD and plan.length == 32 and plan.next_position == T
    assert pad.term_span == plan.length + plan.padding
    assert planner.on_sent(plan, 32) and planner.position == T
    plan = planner.plan(1 << 30)
    assert (plan.term_id, plan.term_offset, plan.position) == (6, 0, T)


def test_an_uncommitted_claim_stops_the_scan(setup: tuple) -> None:
    _, publication, planner = setup
    publication.offer(b"a" * 10)
    claim = publication.try_claim(10)
    publication.offer(b"b" * 10)
    plan = planner.plan(1 << 20)
    assert plan.length == 64  # only the frame before the claim
    claim.commit()
    assert planner.on_sent(plan, 64)
    assert planner.plan(1 << 20).length == 128


def test_resend_plans_cover_the_range_within_snd_pos(setup: tuple) -> None:
    _, publication, planner = setup
    for _ in range(10):
        publication.offer(b"r" * 600)  # 632 -> 640 bytes; 2 per datagram
    while (plan := planner.plan(3 * 1280)) is not None:
        planner.on_sent(plan, plan.length)
    assert planner.position == 3 * 1280
    plans = planner.resend_plans(5, 640, 100_000)
    assert [(p.term_offset, p.length) for p in plans] == [(640, 1280), (1920, 1280), (3200, 640)]
    assert planner.resend_plans(5, 3 * 1280, 640) == []  # not sent yet: nothing to resend
    assert [p.length for p in planner.resend_plans(5, 0, 640)] == [640]


def test_mtu_must_fit_the_log(setup: tuple) -> None:
    log, _, _ = setup
    with pytest.raises(ValueError):
        SendPlanner(log, mtu=4096)
