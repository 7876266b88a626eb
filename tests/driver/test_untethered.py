"""The untethered subscriber state machine of an IPC publication, sans-IO (a fake clock, no driver): active ->
linger -> resting -> active, and which links hold the publication back."""

from __future__ import annotations

from pathlib import Path

import pytest

from logbuf.driver.ipc_publication import IpcPublication, SubscriberLink, TetherState
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.position import Position

T = 64 * 1024
WINDOW = T // 2
MS = 1_000_000
LIMIT_TIMEOUT = 200 * MS
RESTING_TIMEOUT = 300 * MS


@pytest.fixture
def publication(tmp_path: Path):  # type: ignore[no-untyped-def]
    log = LogBuffers.create(tmp_path / "p.logbuffer", term_length=T, initial_term_id=0, session_id=5)
    pub = IpcPublication(registration_id=1, channel="aeron:ipc", is_exclusive=True, log=log,
                         publisher_position=Position.standalone(), publisher_limit=Position.standalone(),
                         pub_pos_counter_id=0, pub_lmt_counter_id=1, window_length=WINDOW,
                         unblock_timeout_ns=10**10, on_unblocked=lambda: None,
                         untethered_window_limit_timeout_ns=LIMIT_TIMEOUT,
                         untethered_resting_timeout_ns=RESTING_TIMEOUT)
    try:
        yield pub
    finally:
        log.close()


def _link(pub: IpcPublication, subscription_id: int, tether: bool) -> SubscriberLink:
    link = SubscriberLink(subscription_id, 9, subscription_id, Position.standalone(0), 0, is_tether=tether, now_ns=0)
    pub.add_subscriber(link)
    return link


def test_an_idle_untethered_subscriber_lingers_rests_and_rejoins(publication: IpcPublication) -> None:
    fast = _link(publication, 10, tether=True)
    idle = _link(publication, 11, tether=False)
    publication.update()
    assert publication.duty.publisher_limit.get() == WINDOW  # both hold it: min(sub-pos) + window

    fast.position.set(WINDOW)  # the idle one is now a whole window behind the consumers
    assert publication.check_untethered(LIMIT_TIMEOUT - 1) == []  # not yet for the timeout
    events = publication.check_untethered(LIMIT_TIMEOUT)
    assert [(e.link, e.available) for e in events] == [(idle, False)]
    assert idle.tether_state == TetherState.LINGER and idle.included_in_limit  # lingering still holds it
    publication.update()
    assert publication.duty.publisher_limit.get() == WINDOW

    events = publication.check_untethered(2 * LIMIT_TIMEOUT)  # no image change, only the limit's inclusion
    assert [(e.link, e.available) for e in events] == [(idle, None)]
    assert idle.tether_state == TetherState.RESTING and not idle.included_in_limit
    publication.update()
    assert publication.duty.publisher_limit.get() == 2 * WINDOW  # only the tethered one counts now

    publication.log.meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET, d.pack_tail(0, 2 * WINDOW))  # written
    fast.position.set(WINDOW + 4096)
    events = publication.check_untethered(2 * LIMIT_TIMEOUT + RESTING_TIMEOUT)
    assert [(e.link, e.available) for e in events] == [(idle, True)]
    # where a new subscriber would join: beside the slowest one that holds the publication back
    assert idle.tether_state == TetherState.ACTIVE and idle.position.get() == WINDOW + 4096
    assert idle.join_position == WINDOW + 4096


def test_an_untethered_subscriber_that_keeps_up_stays_active(publication: IpcPublication) -> None:
    fast = _link(publication, 10, tether=True)
    reader = _link(publication, 11, tether=False)
    for step in range(1, 20):
        fast.position.set(step * 1024)
        reader.position.set(step * 1024 - 512)  # within the window of the consumers
        assert publication.check_untethered(step * LIMIT_TIMEOUT) == []
    assert reader.tether_state == TetherState.ACTIVE


def test_a_tethered_subscriber_is_never_dropped(publication: IpcPublication) -> None:
    fast = _link(publication, 10, tether=True)
    slow = _link(publication, 11, tether=True)
    fast.position.set(WINDOW)
    assert publication.check_untethered(100 * LIMIT_TIMEOUT) == []
    assert slow.tether_state == TetherState.ACTIVE and slow.included_in_limit


def test_a_new_subscriber_joins_beside_the_slowest_one_and_only_where_the_log_holds_frames(
        publication: IpcPublication) -> None:
    """Aeron's IPC join position: the slowest subscriber that holds the publication back, or with none left
    the furthest one that left; a sub-pos a client wrote beyond the producer, or off a frame boundary, is no
    place to join (the producer position instead)."""
    publication.log.meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET, d.pack_tail(0, 4096))  # 4 KiB written
    slow, fast = _link(publication, 10, tether=True), _link(publication, 11, tether=True)
    slow.position.set(1024)
    fast.position.set(2048)
    assert publication.join_position() == 1024
    slow.position.set(1000)  # not a frame boundary
    assert publication.join_position() == 4096
    slow.position.set(8192)  # beyond what was written
    fast.position.set(8192)
    assert publication.join_position() == 4096
    slow.position.set(1024)
    fast.position.set(2048)
    publication.remove_subscriber(fast.subscription_id)
    publication.remove_subscriber(slow.subscription_id)
    assert publication.join_position() == 2048  # none left: where the furthest got to
