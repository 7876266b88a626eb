"""Multi-destination-cast publications, tagged flow control and max-resend through two embedded drivers on
loopback: a publishing driver and a subscribing one (Aeron's setting: ``control-mode=dynamic`` where
receivers' status messages to the control address make them destinations, ``control-mode=manual`` where the
client adds and removes them, ``fc=tagged,g:<tag>[/<min group size>]`` with ``gtag`` subscriptions)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from udp_rig import Received, free_udp_port, message, publish

import logbuf
from logbuf.cnc.messages import ErrorCode
from logbuf.errors import RegistrationError
from support import wait_until

pytestmark = pytest.mark.timeout(90)
STREAM = 1003
T = 64 * 1024


def launch(path: Path) -> logbuf.MediaDriver:
    # images time out 1 s after their last frame: a removed destination's image goes (and its SMs stop) soon
    return logbuf.MediaDriver.launch(path, idle_strategy="backoff:1000000", timer_interval_ns=50_000_000,
                                     publication_linger_timeout_ns=1_000_000_000,
                                     image_liveness_timeout_ns=1_000_000_000)


# Every subscriber must get everything: min flow control (Aeron's MDC default is max, where the fastest receiver
# sets the pace and one that falls a window behind loses data, as on aeronmd); a silent receiver stops holding
# the sender back after 500 ms
RELIABLE = "fc=min,t:500ms|term-length=64k"


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[tuple[logbuf.MediaDriver, logbuf.Client, logbuf.Client]]:
    """(the publishing driver, a client of it, a client of the subscribing driver)."""
    with launch(tmp_path / "pub") as pub_driver, launch(tmp_path / "sub") as sub_driver, \
            logbuf.connect(pub_driver.directory) as pub_client, logbuf.connect(sub_driver.directory) as sub_client:
        yield pub_driver, pub_client, sub_client


def bound_udp_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def destinations(driver: logbuf.MediaDriver, publication: logbuf.Publication) -> int:
    """How many destinations the sender agent sends the publication's frames to now."""
    assert driver.conductor is not None
    network = driver.conductor.network
    found = network.publication(publication.registration_id)
    assert found is not None
    return network.sender.destination_count(found.endpoint_id)


def stream(pub: logbuf.Publication, subs: list[logbuf.Subscription], count: int, start: int = 0,
           receivers: list[Received] | None = None) -> list[Received]:
    """Publishes messages ``start..start+count`` while polling every subscription; returns the receivers."""
    receivers = receivers or [Received() for _ in subs]
    sent = [message(i, 40 + (i * 97) % 1500) for i in range(start, start + count)]

    def poll_all() -> int:
        return sum(r.poll(s) for r, s in zip(receivers, subs, strict=True))

    publish(pub, sent, between=poll_all, timeout=40)
    for r, s in zip(receivers, subs, strict=True):
        wait_until(lambda r=r: len(r.sequences) >= start + count, poll=poll_all, timeout=30,
                   what=f"{count} messages at {s.channel} (received {[len(x.sequences) for x in receivers]})")
    return receivers


def test_dynamic_mdc_every_subscriber_gets_everything_and_a_silent_one_is_dropped(drivers) -> None:  # type: ignore[no-untyped-def]
    pub_driver, pub_client, sub_client = drivers
    control, port1, port2 = free_udp_port(), free_udp_port(), free_udp_port()
    pub = pub_client.add_publication(
        f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic|{RELIABLE}", STREAM)
    subs = [sub_client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|control=127.0.0.1:{control}", STREAM)
            for port in (port1, port2)]
    wait_until(lambda: pub.is_connected and all(s.images for s in subs), timeout=20, what="both images")
    assert destinations(pub_driver, pub) == 2
    receivers = stream(pub, subs, 2000)
    for r in receivers:
        assert r.sequences == list(range(2000)) and r.corrupt == 0
    # the second subscriber goes: no more status messages from it; after Aeron's destination timeout (5 s) the
    # sender drops it and goes on sending to the first only
    subs[1].close()
    wait_until(lambda: destinations(pub_driver, pub) == 1, timeout=20, what="the silent destination dropped")
    stream(pub, subs[:1], 500, start=2000, receivers=receivers[:1])
    assert receivers[0].sequences == list(range(2500))


def test_manual_mdc_sends_to_the_destinations_the_client_adds_and_removes(drivers) -> None:  # type: ignore[no-untyped-def]
    pub_driver, pub_client, sub_client = drivers
    port1, port2 = free_udp_port(), free_udp_port()
    pub = pub_client.add_publication(f"aeron:udp?control-mode=manual|{RELIABLE}", STREAM)
    subs = [sub_client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM) for port in (port1, port2)]
    assert destinations(pub_driver, pub) == 0 and not pub.is_connected
    for port in (port1, port2):
        pub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
    wait_until(lambda: destinations(pub_driver, pub) == 2 and pub.is_connected and all(s.images for s in subs),
               timeout=20, what="both destinations connected")
    receivers = stream(pub, subs, 2000)
    for r in receivers:
        assert r.sequences == list(range(2000)) and r.corrupt == 0

    pub.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{port2}")
    wait_until(lambda: destinations(pub_driver, pub) == 1, what="the destination removed")
    # nothing reaches the removed destination: its image times out (and stops holding the sender back)
    wait_until(lambda: not subs[1].images, poll=lambda: receivers[1].poll(subs[1]), what="its image gone")
    stream(pub, subs[:1], 500, start=2000, receivers=receivers[:1])
    assert receivers[0].sequences == list(range(2500))
    for _ in range(50):  # what was published after the removal never reaches the removed destination
        receivers[1].poll(subs[1])
    assert receivers[1].sequences == list(range(2000))
    pub.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{port2}")  # not there any more: not an error (aeronmd)


def test_destination_commands_are_answered_as_aeronmd_answers(drivers) -> None:  # type: ignore[no-untyped-def]
    _, pub_client, _ = drivers
    port = free_udp_port()
    unicast = pub_client.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k", STREAM)
    with pytest.raises(RegistrationError) as refused:
        unicast.add_destination(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}")
    assert refused.value.code == ErrorCode.GENERIC_ERROR
    assert "does not allow manual control of destinations" in str(refused.value)
    manual = pub_client.add_publication("aeron:udp?control-mode=manual|term-length=64k", STREAM)
    for destination, code, words in (
            (f"aeron:udp?endpoint=127.0.0.1:{port}|mtu=8k", ErrorCode.INVALID_CHANNEL, "must not contain the key: mtu"),
            ("aeron:udp?endpoint=127.0.0.1:0", ErrorCode.GENERIC_ERROR, "port=0"),
            ("aeron:ipc", ErrorCode.GENERIC_ERROR, "incorrect URI format for destination"),
            (f"aeron-spy:aeron:udp?endpoint=127.0.0.1:{port}", ErrorCode.INVALID_CHANNEL, "spies are invalid")):
        with pytest.raises(RegistrationError) as refused:
            manual.add_destination(destination)
        assert refused.value.code == code and words in str(refused.value), destination


def test_manual_destinations_duplicates_and_the_limit_are_what_the_agent_sends_to(drivers) -> None:  # type: ignore[no-untyped-def]
    """A destination added twice is sent to twice (as aeronmd) and one remove takes one of them; beyond the
    agent's 256 destinations ADD_DESTINATION is refused (GENERIC_ERROR naming the limit), never answered
    OPERATION_SUCCESS for a destination nothing is sent to."""
    pub_driver, pub_client, _ = drivers
    pub = pub_client.add_publication("aeron:udp?control-mode=manual|term-length=64k", STREAM)
    twice = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    pub.add_destination(twice)
    pub.add_destination(twice)
    wait_until(lambda: destinations(pub_driver, pub) == 2, what="both copies")
    pub.remove_destination(twice)
    wait_until(lambda: destinations(pub_driver, pub) == 1, what="one copy removed")
    with ExitStack() as stack:  # sockets of our own for the destinations (their datagrams go nowhere else)
        ports = [stack.enter_context(bound_udp_socket()).getsockname()[1] for _ in range(256)]
        for port in ports[:255]:
            pub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
        wait_until(lambda: destinations(pub_driver, pub) == 256, what="256 destinations")
        with pytest.raises(RegistrationError, match="256") as refused:
            pub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{ports[255]}")
        assert refused.value.code == ErrorCode.GENERIC_ERROR
        pub.remove_destination(twice)
        pub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{ports[255]}")  # room again
        wait_until(lambda: destinations(pub_driver, pub) == 256, what="the last one added")


@pytest.mark.parametrize("channel", [
    "aeron:udp?control-mode=response|control=127.0.0.1:40123",
    "aeron:udp?control-mode=other|control=127.0.0.1:40123",
    "aeron:udp?control-mode=dynamic",
    "aeron:udp?control=127.0.0.1:40123|control-mode=dynamic|fc=tagged,g:x",
    "aeron:udp?control=127.0.0.1:40123|control-mode=dynamic|fc=min,g:5",
    "aeron:udp?control=127.0.0.1:40123|control-mode=dynamic|max-resend=0",
    "aeron:udp?control=127.0.0.1:40123|control-mode=dynamic|max-resend=257",
])
def test_unsupported_mdc_values_are_refused_by_name(drivers, channel: str) -> None:  # type: ignore[no-untyped-def]
    _, pub_client, _ = drivers
    with pytest.raises(RegistrationError) as refused:
        pub_client.add_publication(channel, STREAM)
    assert refused.value.code == ErrorCode.INVALID_CHANNEL
    key = "max-resend" if "max-resend" in channel else "fc" if "fc=" in channel else "control"
    assert key in str(refused.value)


def _window_filled(pub: logbuf.Publication, limit: int) -> int:
    """Offers 1 KiB messages without polling until back-pressured (or ``limit`` went); returns how many went."""
    sent = 0
    data = bytes(1000)
    for _ in range(limit):
        if pub.offer(data) < 0:
            break
        sent += 1
    return sent


def test_tagged_flow_control_only_the_tagged_group_holds_the_publisher_back(drivers) -> None:  # type: ignore[no-untyped-def]
    _, pub_client, sub_client = drivers
    control, tagged_port, untagged_port = free_udp_port(), free_udp_port(), free_udp_port()
    pub = pub_client.add_publication(
        f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic|fc=tagged,g:7|term-length=64k", STREAM)
    tagged = sub_client.add_subscription(
        f"aeron:udp?endpoint=127.0.0.1:{tagged_port}|control=127.0.0.1:{control}|gtag=7", STREAM)
    untagged = sub_client.add_subscription(
        f"aeron:udp?endpoint=127.0.0.1:{untagged_port}|control=127.0.0.1:{control}", STREAM)
    wait_until(lambda: pub.is_connected and tagged.images and untagged.images, timeout=20, what="both images")
    # the untagged subscriber never polls: it does not hold the publisher back (4 terms go by)
    received = Received()
    messages = [message(i, 1000) for i in range(4 * T // 1000)]
    publish(pub, messages, between=lambda: received.poll(tagged), timeout=40)
    wait_until(lambda: len(received.sequences) == len(messages), poll=lambda: received.poll(tagged),
               what="the tagged subscriber has everything")
    # the tagged subscriber stops polling: the publisher is held within a window of it
    went = _window_filled(pub, 4 * T // 1000)
    assert 0 < went < 4 * T // 1000


def test_tagged_flow_control_min_group_size_gates_the_connection(drivers) -> None:  # type: ignore[no-untyped-def]
    pub_driver, pub_client, sub_client = drivers
    control, port1, port2, port3 = (free_udp_port() for _ in range(4))
    pub = pub_client.add_publication(
        f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic|fc=tagged,g:9/2|term-length=64k", STREAM)
    first = sub_client.add_subscription(
        f"aeron:udp?endpoint=127.0.0.1:{port1}|control=127.0.0.1:{control}|gtag=9", STREAM)
    untagged = sub_client.add_subscription(
        f"aeron:udp?endpoint=127.0.0.1:{port2}|control=127.0.0.1:{control}", STREAM)
    wait_until(lambda: first.images and untagged.images and destinations(pub_driver, pub) == 2, timeout=20,
               what="images of the first two, their status messages at the sender")
    # one tagged receiver of the two the group needs (the untagged one does not count): not connected, and
    # nothing can be published
    assert not pub.is_connected and pub.offer(b"x" * 100) < 0
    second = sub_client.add_subscription(
        f"aeron:udp?endpoint=127.0.0.1:{port3}|control=127.0.0.1:{control}|gtag=9", STREAM)
    wait_until(lambda: pub.is_connected and second.images, timeout=20, what="the group complete")
    stream(pub, [first, second], 300)  # (the untagged one is not waited for: it may fall behind and lose data)


def test_max_resend_bounds_the_retransmits_and_the_stream_still_completes(tmp_path: Path) -> None:
    """``max-resend=1`` on an MDC publication through a lossy receiving driver: at most one retransmit in flight
    (the rest of the NAKs overflow the pool and are NAKed again), every message arrives once, in order."""
    spec = "drop=0.05,reorder=0.02,seed=21"
    control, port = free_udp_port(), free_udp_port()
    with launch(tmp_path / "pub") as pub_driver, \
            logbuf.MediaDriver.launch(tmp_path / "sub", receive_impairment=spec, idle_strategy="backoff:200000") \
            as sub_driver, logbuf.connect(pub_driver.directory) as pub_client, \
            logbuf.connect(sub_driver.directory) as sub_client:
        pub = pub_client.add_publication(
            f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic|max-resend=1|{RELIABLE}", STREAM)
        assert pub_driver.conductor is not None
        found = pub_driver.conductor.network.publication(pub.registration_id)
        assert found is not None and found.retransmit.max_actions == 1 and found.retransmit.group_semantics
        sub = sub_client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|control=127.0.0.1:{control}",
                                          STREAM)
        wait_until(lambda: pub.is_connected and sub.images, timeout=20, what="connection")
        (received,) = stream(pub, [sub], 1500)
        assert received.sequences == list(range(1500)) and received.corrupt == 0


def test_explicit_control_unicast_the_publication_binds_the_control_address(drivers) -> None:  # type: ignore[no-untyped-def]
    """``endpoint=E|control=C`` without a mode: the publication sends from C to E, the subscription binds E and
    sends its status messages to C."""
    _, pub_client, sub_client = drivers
    port, control = free_udp_port(), free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|control=127.0.0.1:{control}|term-length=64k"
    sub = sub_client.add_subscription(channel, STREAM)
    pub = pub_client.add_publication(channel, STREAM)
    wait_until(lambda: pub.is_connected and sub.images, timeout=20, what="connection")
    assert sub.images[0].source_identity == f"127.0.0.1:{control}"
    (received,) = stream(pub, [sub], 300)
    assert received.sequences == list(range(300))
