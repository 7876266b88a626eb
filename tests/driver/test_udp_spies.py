"""``aeron-spy:`` subscriptions on an embedded driver's network publications, as aeronmd has them: the spy reads
the publication's own log (its session, exactly what was committed), its position holds pub-lmt back, ``ssc``
makes a spy alone a connection, ``session-id`` filters, a publication created later is linked, and an
untethered spy that never polls goes resting and rejoins at snd-pos with the same counter."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
from udp_rig import free_udp_port

import logbuf
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.messages import ErrorCode
from support import running_driver, wait_until

pytestmark = pytest.mark.timeout(90)
STREAM = 31
T = 64 * 1024
SEQ = struct.Struct("<Q")


@pytest.fixture
def driver(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield from running_driver(tmp_path / "drv", network_term_length=T, timer_interval_ns=50_000_000,
                              idle_strategy="backoff:1000000", publication_linger_timeout_ns=500_000_000)



def _channel(port: int, extra: str = "") -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}|term-length={T}{extra}"


def _drain(sub: logbuf.Subscription, into: list[bytes]) -> int:
    return sub.poll(lambda buffer, header: into.append(bytes(buffer)), 100)


def _offer(pub: logbuf.Publication, payload: bytes) -> int:
    return pub.offer(payload)


def test_a_spy_reads_exactly_what_the_publisher_committed(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    receiver = client.add_subscription(_channel(port), STREAM)
    spy_images: list[logbuf.Image] = []
    spy = client.add_subscription("aeron-spy:" + _channel(port), STREAM, on_available_image=spy_images.append)
    pub = client.add_publication(_channel(port), STREAM)
    wait_until(lambda: pub.is_connected and receiver.images and spy_images, what="the receiver's and spy's images")
    image = spy_images[0]
    assert image.session_id == pub.session_id and image.source_identity == "aeron:ipc"
    sent = [SEQ.pack(i) + bytes(i % 200) for i in range(3000)]
    spied: list[bytes] = []
    received: list[bytes] = []
    pending = list(sent)

    def step() -> bool:
        while pending and _offer(pub, pending[0]) > 0:
            pending.pop(0)
        _drain(spy, spied)
        _drain(receiver, received)
        return not pending and len(spied) == len(sent) and len(received) == len(sent)

    wait_until(step, timeout=60, what="every message at the spy and the receiver")
    assert spied == sent
    assert received == sent


def test_a_spy_that_does_not_poll_holds_the_publisher_back(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    receiver = client.add_subscription(_channel(port), STREAM)
    spy = client.add_subscription("aeron-spy:" + _channel(port), STREAM)
    pub = client.add_publication(_channel(port, "|pub-wnd=16k"), STREAM)
    wait_until(lambda: pub.is_connected and receiver.images and spy.images, what="both images")
    got: list[bytes] = []
    accepted = 0

    def fill() -> bool:
        nonlocal accepted
        result = _offer(pub, bytes(992))  # a 1 KiB frame
        if result > 0:
            accepted += 1
        _drain(receiver, got)
        return result == logbuf.BACK_PRESSURED and len(got) == accepted

    wait_until(fill, timeout=30, what="back pressure with the receiver caught up")
    assert 14 <= accepted <= 17  # the 16 KiB window from the spy's position, not from snd-pos
    spied: list[bytes] = []
    wait_until(lambda: _drain(spy, spied) == 0 and len(spied) == accepted, what="the spy reading")
    wait_until(lambda: _offer(pub, bytes(992)) > 0, what="the publisher going on once the spy read")


def test_a_spy_alone_connects_only_with_ssc(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    plain = client.add_publication(_channel(port), STREAM)
    plain_spy = client.add_subscription("aeron-spy:" + _channel(port), STREAM)
    wait_until(lambda: plain_spy.images, what="the spy's image")
    assert not plain.is_connected and _offer(plain, b"x") == logbuf.NOT_CONNECTED

    port2 = free_udp_port()
    spy = client.add_subscription("aeron-spy:" + _channel(port2), STREAM)
    pub = client.add_exclusive_publication(_channel(port2, "|ssc=true"), STREAM)
    wait_until(lambda: pub.is_connected and spy.images, what="ssc: connected with only a spy")
    sent = [SEQ.pack(i) for i in range(500)]
    spied: list[bytes] = []
    pending = list(sent)

    def step() -> bool:
        while pending and _offer(pub, pending[0]) > 0:
            pending.pop(0)
        _drain(spy, spied)
        return not pending and len(spied) == len(sent)

    wait_until(step, timeout=30, what="every message at the spy, with no receiver")
    assert spied == sent


def test_the_drivers_default_ssc(tmp_path: Path) -> None:
    with logbuf.MediaDriver.launch(tmp_path / "d", network_term_length=T, spies_simulate_connection=True,
                                   idle_strategy="backoff:1000000") as drv, logbuf.connect(drv.directory) as c:
        port = free_udp_port()
        spy = c.add_subscription("aeron-spy:" + _channel(port), STREAM)
        pub = c.add_publication(_channel(port), STREAM)
        wait_until(lambda: pub.is_connected and spy.images, what="connected by the driver's default")
        off = c.add_publication(_channel(free_udp_port(), "|ssc=false"), STREAM)
        off_spy = c.add_subscription("aeron-spy:" + off.channel, STREAM)
        wait_until(lambda: off_spy.images, what="the other spy's image")
        assert not off.is_connected


def test_spies_link_to_later_publications_of_their_session_only(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    mine: list[logbuf.Image] = []
    any_session: list[logbuf.Image] = []
    client.add_subscription("aeron-spy:" + _channel(port, "|session-id=4242"), STREAM, on_available_image=mine.append)
    client.add_subscription("aeron-spy:" + _channel(port), STREAM, on_available_image=any_session.append)
    other = client.add_exclusive_publication(_channel(port, "|session-id=4343"), STREAM)
    wanted = client.add_exclusive_publication(_channel(port, "|session-id=4242"), STREAM)
    elsewhere = client.add_exclusive_publication(_channel(free_udp_port(), "|session-id=4242"), STREAM)
    wait_until(lambda: len(any_session) == 2 and mine, what="the spies' images")
    assert [i.session_id for i in mine] == [wanted.session_id]
    assert sorted(i.session_id for i in any_session) == sorted([other.session_id, wanted.session_id])
    assert elsewhere.session_id == 4242


def test_a_spy_channel_cannot_publish(client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(logbuf.RegistrationError) as info:
        client.add_publication("aeron-spy:" + _channel(free_udp_port()), STREAM)
    assert info.value.code == ErrorCode.INVALID_CHANNEL


def test_an_untethered_spy_that_never_polls_rests_and_rejoins(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    receiver = client.add_subscription(_channel(port), STREAM)
    comings: list[logbuf.Image] = []
    goings: list[logbuf.Image] = []
    client.add_subscription("aeron-spy:" + _channel(port, "|tether=false"), STREAM,
                            on_available_image=comings.append, on_unavailable_image=goings.append)
    pub = client.add_publication(
        _channel(port, "|untethered-window-limit-timeout=200ms|untethered-resting-timeout=300ms"), STREAM)
    wait_until(lambda: pub.is_connected and receiver.images and comings, what="both images")
    got: list[bytes] = []
    window = T // 2

    def publish_and_read() -> bool:
        _offer(pub, bytes(500))
        _drain(receiver, got)
        return bool(goings)

    # the idle spy holds the publisher only for the window-limit timeout, then lingers, then rests
    wait_until(publish_and_read, timeout=30, what="the untethered spy's image going away")
    wait_until(lambda: publish_and_read() and len(comings) == 2, timeout=30, what="the rejoin")
    assert comings[1].join_position > comings[0].join_position + window  # at snd-pos, well past where it stopped
    assert comings[1].subscriber_position.counter_id == comings[0].subscriber_position.counter_id


def test_a_closed_publication_stays_for_a_spy_until_it_read_to_the_end(client) -> None:  # type: ignore[no-untyped-def]
    """As aeronmd: no linger (500 ms here) cuts off what a spy has not read yet."""
    port = free_udp_port()
    goings: list[logbuf.Image] = []
    spy = client.add_subscription("aeron-spy:" + _channel(port), STREAM, on_unavailable_image=goings.append)
    receiver = client.add_subscription(_channel(port), STREAM)
    pub = client.add_publication(_channel(port), STREAM)
    wait_until(lambda: pub.is_connected and spy.images, what="the publication connected")
    sent = [SEQ.pack(i) for i in range(5)]
    for payload in sent:
        wait_until(lambda payload=payload: _offer(pub, payload) > 0, what="an offer")
    received: list[bytes] = []
    wait_until(lambda: _drain(receiver, received) >= 0 and len(received) == len(sent), what="the receiver's copy")
    pub.close()
    # nothing to await but time: four lingers pass (the driver's timer runs every 50 ms) with the spy unread
    closed = time.monotonic()
    wait_until(lambda: bool(goings) or time.monotonic() > closed + 2.0, what="four lingers")
    assert not goings and spy.images
    spied: list[bytes] = []
    wait_until(lambda: _drain(spy, spied) >= 0 and bool(goings), timeout=30,
               what="the spy reading to the end, then its image going")
    assert spied == sent


def test_seventy_spies_on_one_publication_all_read_it(client) -> None:  # type: ignore[no-untyped-def]
    """aeronmd links any number of spies (the agent once stopped at 64)."""
    port = free_udp_port()
    spies = [client.add_subscription("aeron-spy:" + _channel(port), STREAM) for _ in range(70)]
    pub = client.add_publication(_channel(port, "|ssc=true"), STREAM)
    wait_until(lambda: pub.is_connected and all(spy.images for spy in spies), timeout=30, what="70 spy images")
    wait_until(lambda: _offer(pub, b"to every spy") > 0, what="an offer")
    spied: list[list[bytes]] = [[] for _ in spies]
    wait_until(lambda: all(_drain(spy, into) >= 0 and into for spy, into in zip(spies, spied, strict=True)),
               timeout=30, what="the message at every spy")
    assert all(into == [b"to every spy"] for into in spied)


def test_a_spy_refused_for_want_of_counters_leaves_no_link_holding_a_publisher(tmp_path: Path) -> None:
    """Room for one sub-pos counter, two publications: the spy is refused (STORAGE_SPACE) and its one link made
    before the refusal must not stay behind, unread, holding the first publisher at its window."""
    with logbuf.MediaDriver.launch(tmp_path / "d", network_term_length=T, counters_values_length=64 * 128,
                                   idle_strategy="backoff:1000000") as drv, logbuf.connect(drv.directory) as client:
        port = free_udp_port()
        receiver = client.add_subscription(_channel(port), STREAM)
        first = client.add_exclusive_publication(_channel(port, "|pub-wnd=16k"), STREAM)
        second = client.add_exclusive_publication(_channel(port), STREAM)
        wait_until(lambda: first.is_connected and second.is_connected and len(receiver.images) == 2,
                   what="both publications connected")
        with CncFile.open(Path(drv.directory) / "cnc.dat") as cnc:
            used = sum(1 for _ in cnc.counters_reader())
        fillers = [client.add_counter(1001, "filler") for _ in range(64 - used - 1)]
        with pytest.raises(logbuf.RegistrationError) as refused:
            client.add_subscription("aeron-spy:" + _channel(port), STREAM)
        assert refused.value.code == ErrorCode.STORAGE_SPACE
        got: list[bytes] = []
        accepted = 0

        def publish() -> bool:
            nonlocal accepted
            accepted += _offer(first, bytes(992)) > 0
            _drain(receiver, got)
            return accepted >= 48  # three windows: no spy holds it

        wait_until(publish, timeout=30, what="the first publication going past its window")
        assert len(fillers) > 0
