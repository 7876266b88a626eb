"""Channel settings an embedded driver honours as aeronmd does: session-id on publications and subscriptions
(IPC and UDP), an exclusive publication's initial position, pub-wnd, tether=false, and strict keys."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from udp_rig import free_udp_port

import logbuf
from logbuf.cnc.messages import ErrorCode
from support import running_driver, wait_until

pytestmark = pytest.mark.timeout(60)
STREAM = 9


@pytest.fixture
def driver(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield from running_driver(tmp_path / "drv", ipc_term_length=64 * 1024, timer_interval_ns=50_000_000,
                              idle_strategy="backoff:1000000", publication_linger_timeout_ns=1_000_000_000)



def _poll_all(sub: logbuf.Subscription, into: list[bytes]) -> int:
    return sub.poll(lambda buffer, header: into.append(bytes(buffer)), 100)


@pytest.mark.parametrize("key", ["foo", "term-lenght", "ats", "media-rcv-ts-offset", "tags", "channel-snd-ts-offset"])
@pytest.mark.parametrize("base", ["aeron:ipc", "aeron:udp?endpoint=127.0.0.1:40999"])
def test_keys_not_honoured_are_refused_by_the_driver_naming_the_key(client, base: str, key: str) -> None:  # type: ignore[no-untyped-def]
    channel = f"{base}{'|' if '?' in base else '?'}{key}=1"
    for add in (client.add_publication, client.add_exclusive_publication, client.add_subscription):
        with pytest.raises(logbuf.RegistrationError) as info:
            add(channel, STREAM)
        assert info.value.code == ErrorCode.INVALID_CHANNEL
        assert repr(key) in str(info.value)


def test_ipc_mtu_beyond_the_drivers_ipc_term_is_an_invalid_channel(client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(logbuf.RegistrationError) as info:
        client.add_publication("aeron:ipc?mtu=16384", STREAM)  # T/8 of the driver's 64 KiB term is 8 KiB
    assert info.value.code == ErrorCode.INVALID_CHANNEL


@pytest.mark.parametrize("medium", ["ipc", "udp"])
def test_a_session_specific_subscription_sees_only_its_session(client, medium: str) -> None:  # type: ignore[no-untyped-def]
    base = "aeron:ipc?" if medium == "ipc" else f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k|"
    other = client.add_subscription(base + "session-id=779", STREAM)
    mine = client.add_subscription(base + "session-id=778", STREAM)
    every = client.add_subscription(base.rstrip("?|"), STREAM)
    pub = client.add_publication(base + "session-id=778", STREAM)
    assert pub.session_id == 778
    wait_until(lambda: pub.is_connected and mine.images and every.images, what="images of session 778")
    got_mine: list[bytes] = []
    got_every: list[bytes] = []
    got_other: list[bytes] = []
    for i in range(10):
        wait_until(lambda i=i: pub.offer(b"m%d" % i) > 0, what="offer")
    wait_until(lambda: (_poll_all(mine, got_mine), _poll_all(every, got_every)) and len(got_mine) == 10
               and len(got_every) == 10, what="10 messages on the matching subscriptions")
    _poll_all(other, got_other)
    assert got_mine == got_every == [b"m%d" % i for i in range(10)]
    assert got_other == [] and other.images == ()
    assert [image.session_id for image in mine.images] == [778]


def test_publication_session_ids_clash_as_aeron_refuses_them(client) -> None:  # type: ignore[no-untyped-def]
    shared = client.add_publication("aeron:ipc?session-id=778", STREAM)
    assert client.add_publication("aeron:ipc?session-id=778", STREAM).session_id == 778  # the same log
    assert client.add_publication("aeron:ipc", STREAM).session_id == shared.session_id
    with pytest.raises(logbuf.RegistrationError, match="different 'session-id'") as info:
        client.add_publication("aeron:ipc?session-id=779", STREAM)
    assert info.value.code == ErrorCode.GENERIC_ERROR  # aeronmd's code for these conflicts
    with pytest.raises(logbuf.RegistrationError, match="clashing session-id") as info:
        client.add_exclusive_publication("aeron:ipc?session-id=778", STREAM)
    assert info.value.code == ErrorCode.GENERIC_ERROR
    assert client.add_exclusive_publication("aeron:ipc?session-id=778", STREAM + 1).session_id == 778
    # generated session ids stay out of Aeron's reserved range, so they never clash with chosen ones
    for _ in range(5):
        assert not -1 <= client.add_exclusive_publication("aeron:ipc", STREAM).session_id <= 1000


def test_an_exclusive_publication_starts_at_the_channels_position(client) -> None:  # type: ignore[no-untyped-def]
    pub = client.add_exclusive_publication("aeron:ipc?init-term-id=5|term-id=7|term-offset=1024", STREAM)
    assert pub.initial_term_id == 5 and pub.position == 2 * 64 * 1024 + 1024
    images: list[logbuf.Image] = []
    sub = client.add_subscription("aeron:ipc", STREAM, on_available_image=images.append)
    wait_until(lambda: pub.is_connected and images, what="image")
    assert images[0].join_position == pub.position
    wait_until(lambda: pub.offer(b"first") > 0, what="offer")
    got: list[bytes] = []
    wait_until(lambda: _poll_all(sub, got) or got, what="message")
    assert got == [b"first"]


def test_pub_wnd_sets_the_publication_window(client) -> None:  # type: ignore[no-untyped-def]
    sub = client.add_subscription("aeron:ipc", STREAM)
    pub = client.add_publication("aeron:ipc?pub-wnd=16k", STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connected")
    wait_until(lambda: pub.position_limit_value == 16 * 1024, what="pub-lmt = sub-pos + 16 KiB")
    sent = 0
    while pub.offer(bytes(1000)) > 0:
        sent += 1
    assert 14 <= sent <= 16  # the window, not half the term (32 KiB), holds the publisher back


def test_an_untethered_subscriber_that_never_polls_rests_and_rejoins(client) -> None:  # type: ignore[no-untyped-def]
    pub = client.add_publication(
        "aeron:ipc?untethered-window-limit-timeout=200ms|untethered-resting-timeout=300ms", STREAM)
    tethered = client.add_subscription("aeron:ipc", STREAM)
    comings: list[logbuf.Image] = []
    goings: list[logbuf.Image] = []
    idle = client.add_subscription("aeron:ipc?tether=false", STREAM, on_available_image=comings.append,
                                   on_unavailable_image=goings.append)
    wait_until(lambda: pub.is_connected and tethered.images and comings, what="both images")
    got: list[bytes] = []
    window = 32 * 1024  # half the 64 KiB term

    def publish_and_read() -> bool:
        pub.offer(bytes(500))
        _poll_all(tethered, got)
        return bool(goings)

    # the idle subscriber holds the publisher no longer than the window-limit timeout (then lingers)
    wait_until(publish_and_read, timeout=20, what="the untethered subscriber's image going away")
    # it rests (no longer counted), then after the resting timeout rejoins, with the same sub-pos counter, at
    # the consumers' position: more than a window beyond where it stopped, so the publisher got past it
    wait_until(lambda: publish_and_read() and len(comings) == 2, timeout=20, what="the rejoin")
    assert comings[1].join_position > comings[0].join_position + window
    assert comings[1].subscriber_position.counter_id == comings[0].subscriber_position.counter_id
    assert idle.images and idle.images[0].join_position == comings[1].join_position


@pytest.mark.parametrize("endpoint,interface", [("127.0.0.1", "127.0.0.0/8"), ("[::1]", "[::1]"), ("[::1]", "::1/128")])
def test_interface_subnet_and_ipv6_forms_carry_data(client, endpoint: str, interface: str) -> None:  # type: ignore[no-untyped-def]
    channel = f"aeron:udp?endpoint={endpoint}:{free_udp_port()}|term-length=64k|interface={interface}"
    try:
        sub = client.add_subscription(channel, STREAM)
        pub = client.add_publication(channel, STREAM)
    except logbuf.RegistrationError as exc:
        if "::1" in endpoint and exc.code == ErrorCode.GENERIC_ERROR and "socket" in str(exc):
            pytest.skip(f"no IPv6 loopback here: {exc}")
        raise
    wait_until(lambda: pub.is_connected and sub.images, what="connection")
    wait_until(lambda: pub.offer(b"over the interface") > 0, what="offer")
    got: list[bytes] = []
    wait_until(lambda: _poll_all(sub, got) or got, what="message")
    assert got == [b"over the interface"]


def test_socket_buffers_are_set_when_the_channels_socket_is_made(client, driver) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|so-rcvbuf=64k", STREAM)
    client.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|so-sndbuf=64k", STREAM)
    network = driver.conductor.network
    wait_until(lambda: network.receive_endpoints and network.send_endpoints, what="both endpoints")
    receive = next(iter(network.receive_endpoints.values())).transport
    send = next(iter(network.send_endpoints.values())).transport
    # Linux doubles what it is asked for (bookkeeping); the driver's default asks for 2 MiB
    assert receive._recv_socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * 64 * 1024
    assert send._send_socket.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * 64 * 1024
    with pytest.raises(logbuf.RegistrationError, match="so-rcvbuf") as info:
        client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|so-rcvbuf=128k", STREAM + 1)
    assert info.value.code == ErrorCode.INVALID_CHANNEL  # one socket cannot have two sizes


def test_a_closed_publication_stays_until_its_subscriber_read_to_the_end(client) -> None:  # type: ignore[no-untyped-def]
    """As aeronmd: no linger (the channel's 100 ms, the driver's 1 s) cuts off what a subscriber has not read;
    the image goes once it read to the end of stream, then the log is deleted."""
    gone: list[logbuf.Image] = []
    # never polls until the publication is closed; held, since a subscription the application drops is closed
    sub = client.add_subscription("aeron:ipc", STREAM, on_unavailable_image=gone.append)
    pub = client.add_publication("aeron:ipc?linger=100ms", STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connected")
    image = sub.images[0]
    path = Path(pub.log.path)
    sent = [b"unread-%d" % i for i in range(5)]
    for payload in sent:
        assert pub.offer(payload) > 0
    pub.close()
    wait_until(lambda: image.log.end_of_stream_position == image.log.producer_position(),
               what="the end of stream marked")
    # nothing to await but time: 40 drain checks (timer 50 ms), twice the driver's linger, with nothing read
    closed = time.monotonic()
    wait_until(lambda: bool(gone) or time.monotonic() > closed + 2.0, what="two lingers")
    assert not gone and list(sub.images) == [image] and path.exists()
    got: list[bytes] = []
    wait_until(lambda: _poll_all(sub, got) >= 0 and bool(gone), timeout=20,
               what="the subscriber reading to the end, then its image going")
    assert got == sent and gone == [image]
    wait_until(lambda: not path.exists(), what="the log file deleted")


def test_subscribers_that_leave_release_a_closed_publication(driver, client) -> None:  # type: ignore[no-untyped-def]
    """Subscribers that have not read to the end no longer hold a closed publication once they leave: one closes
    its subscription, the other's client closes (the publication then goes, with no deadline to fall back on)."""
    with logbuf.connect(driver.directory) as other:
        first = client.add_subscription("aeron:ipc", STREAM)
        second = other.add_subscription("aeron:ipc", STREAM)
        pub = client.add_publication("aeron:ipc", STREAM)
        wait_until(lambda: pub.is_connected and first.images and second.images, what="both images")
        log = second.images[0].log
        path = Path(pub.log.path)
        for i in range(5):
            assert pub.offer(b"unread-%d" % i) > 0
        pub.close()
        wait_until(lambda: log.end_of_stream_position == log.producer_position(), what="the end of stream marked")
        first.close()
        # (nothing to await: the second still holds it, so it must not have gone on the next few timers)
        time.sleep(0.2)
        assert path.exists()
    wait_until(lambda: not path.exists(), what="the log deleted once the second subscriber's client closed")


def test_a_stalled_untethered_subscriber_does_not_hold_a_closed_publication(client) -> None:  # type: ignore[no-untyped-def]
    """An untethered subscriber that stalls while the publication drains goes through linger to resting and no
    longer counts: the publication goes once the tethered subscriber read to the end (it would otherwise wait
    for the idle one for ever, there being no deadline)."""
    pub = client.add_publication(
        "aeron:ipc?untethered-window-limit-timeout=300ms|untethered-resting-timeout=60s", STREAM)
    tethered_gone: list[logbuf.Image] = []
    tethered = client.add_subscription("aeron:ipc", STREAM, on_unavailable_image=tethered_gone.append)
    idle_gone: list[logbuf.Image] = []
    idle = client.add_subscription("aeron:ipc?tether=false", STREAM, on_unavailable_image=idle_gone.append)
    wait_until(lambda: pub.is_connected and tethered.images and idle.images, what="both images")
    path = Path(pub.log.path)
    window = 32 * 1024  # half the 64 KiB term: the idle subscriber holds the publisher at one window
    got: list[bytes] = []
    while pub.offer(bytes(500)) > 0:
        _poll_all(tethered, got)
    assert pub.position < window + 1024  # (an offer may start just below the limit)
    pub.close()  # the idle subscriber is more than three quarters of a window behind the tethered one
    wait_until(lambda: _poll_all(tethered, got) >= 0 and bool(tethered_gone), timeout=30,
               what="the tethered subscriber reading to the end, then the publication going")
    assert idle_gone == idle_gone[:1] and len(idle_gone) == 1  # told once, when it lingered
    wait_until(lambda: not path.exists(), what="the log file deleted")


def test_an_exclusive_udp_publication_starts_at_the_channels_position(client) -> None:  # type: ignore[no-untyped-def]
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k"
    images: list[logbuf.Image] = []
    sub = client.add_subscription(channel, STREAM, on_available_image=images.append)
    pub = client.add_exclusive_publication(channel + "|init-term-id=-7|term-id=-5|term-offset=4096", STREAM)
    assert pub.position == 2 * 64 * 1024 + 4096
    wait_until(lambda: pub.is_connected and images, what="image")
    assert images[0].join_position == pub.position
    wait_until(lambda: pub.offer(b"over udp") > 0, what="offer")
    got: list[bytes] = []
    wait_until(lambda: _poll_all(sub, got) or got, what="message")
    assert got == [b"over udp"]
