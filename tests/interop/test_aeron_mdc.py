"""Multi-destination-cast and tagged flow control between logbuf's driver and Aeron's aeronmd, both ways: a
dynamic MDC publication with ``fc=tagged,g:7/2`` on one driver, subscriptions with ``control=`` and ``gtag=7``
on the other.  The receivers' SETUP-eliciting and tagged status messages must make the other driver's sender
add them as destinations and count them in the group (not connected with one of two; every message to both
once connected); a manual MDC publication of one driver reaches the other's subscriptions it adds.  Skipped,
with the reason, where Aeron's binaries are absent (see ``aeron_driver``)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from aeron_driver import require_aeron_bin, running

import logbuf
from support import wait_until

pytestmark = pytest.mark.timeout(120)
STREAM = 77


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _receive_all(subs: list[logbuf.Subscription], pub: logbuf.Publication, count: int) -> list[list[bytes]]:
    sent = [b"message %d" % i for i in range(count)]
    got: list[list[bytes]] = [[] for _ in subs]

    def poll() -> int:
        return sum(sub.poll(lambda buffer, header, into=into: into.append(bytes(buffer)), 100)
                   for sub, into in zip(subs, got, strict=True))

    for message in sent:
        wait_until(lambda message=message: pub.offer(message) > 0, poll=poll, what="offer")
    wait_until(lambda: all(len(into) >= count for into in got), poll=poll, timeout=20, what="every message")
    assert got == [sent] * len(subs)
    return got


@pytest.mark.parametrize("publisher", ["logbuf", "aeronmd"])
def test_dynamic_mdc_with_tagged_flow_control_across_drivers(tmp_path: Path, publisher: str) -> None:
    require_aeron_bin()
    subscriber = "aeronmd" if publisher == "logbuf" else "logbuf"
    control = f"127.0.0.1:{free_udp_port()}"
    with running(publisher, tmp_path / publisher) as pub_dir, running(subscriber, tmp_path / subscriber) as sub_dir, \
            logbuf.connect(pub_dir) as pub_client, logbuf.connect(sub_dir) as sub_client:
        pub = pub_client.add_publication(
            f"aeron:udp?control={control}|control-mode=dynamic|fc=tagged,g:7/2|term-length=64k", STREAM)

        def subscribe(tag: str) -> logbuf.Subscription:
            return sub_client.add_subscription(
                f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|control={control}{tag}", STREAM)

        first, untagged = subscribe("|gtag=7"), subscribe("")
        wait_until(lambda: first.images and untagged.images, timeout=20, what="images of the first two")
        time.sleep(0.5)  # status messages of both reached the sender
        assert not pub.is_connected  # one tagged receiver of the two the group needs
        second = subscribe("|gtag=7")
        wait_until(lambda: pub.is_connected and second.images, timeout=20, what="the group complete")
        _receive_all([first, second], pub, 200)


@pytest.mark.parametrize("publisher", ["logbuf", "aeronmd"])
def test_manual_mdc_across_drivers(tmp_path: Path, publisher: str) -> None:
    require_aeron_bin()
    subscriber = "aeronmd" if publisher == "logbuf" else "logbuf"
    with running(publisher, tmp_path / publisher) as pub_dir, running(subscriber, tmp_path / subscriber) as sub_dir, \
            logbuf.connect(pub_dir) as pub_client, logbuf.connect(sub_dir) as sub_client:
        destinations = [f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}" for _ in range(2)]
        subs = [sub_client.add_subscription(destination, STREAM) for destination in destinations]
        pub = pub_client.add_publication("aeron:udp?control-mode=manual|fc=min|term-length=64k", STREAM)
        for destination in destinations:
            pub.add_destination(destination)
        wait_until(lambda: pub.is_connected and all(sub.images for sub in subs), timeout=20, what="both images")
        _receive_all(subs, pub, 200)


def test_min_flow_control_lets_go_of_an_aeronmd_receiver_that_left(tmp_path: Path) -> None:
    """Two aeronmd subscriptions of a dynamic MDC publication of logbuf's with ``fc=min``: when one closes,
    aeronmd's receiver says so with end-of-stream SMs and the publication stops waiting for it at once, as
    aeronmd's own sender does - not after the receiver timeout (60 s here) - so the other reader goes on."""
    require_aeron_bin()
    control = f"127.0.0.1:{free_udp_port()}"
    with running("logbuf", tmp_path / "logbuf") as pub_dir, running("aeronmd", tmp_path / "aeronmd") as sub_dir, \
            logbuf.connect(pub_dir) as pub_client, logbuf.connect(sub_dir) as sub_client:
        pub = pub_client.add_publication(
            f"aeron:udp?control={control}|control-mode=dynamic|fc=min,t:60s|term-length=64k", STREAM)
        stays, leaves = (sub_client.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|control={control}", STREAM) for _ in range(2))
        wait_until(lambda: pub.is_connected and stays.images and leaves.images, timeout=20, what="both images")
        _receive_all([stays, leaves], pub, 50)
        leaves.close()
        start = pub.position

        def publish() -> int:
            while pub.offer(b"x" * 1000) > 0:
                pass
            return stays.poll(lambda buffer, header: None, 100)

        # more than the window (a term here) beyond where the leaver stopped: nothing holds the sender back
        wait_until(lambda: pub.position - start > 2 * 64 * 1024, poll=publish, timeout=20,
                   what="the publication to move on without the receiver that left")


@pytest.mark.parametrize("subscriber", ["logbuf", "aeronmd"])
@pytest.mark.parametrize("publisher", ["logbuf", "aeronmd"])
def test_min_flow_control_lets_go_of_a_receiver_whose_subscription_closed(tmp_path: Path, publisher: str,
                                                                          subscriber: str) -> None:
    """A receiver whose subscription closes sends end-of-stream status messages (aeronmd's and ours alike), and a
    sender with ``fc=min`` (ours and aeronmd's alike) lets it go at once: with a 60 s receiver timeout, more than a
    window still reaches the receiver left within seconds."""
    require_aeron_bin()
    control = f"127.0.0.1:{free_udp_port()}"
    with running(publisher, tmp_path / "pub") as pub_dir, running(subscriber, tmp_path / "sub") as sub_dir, \
            logbuf.connect(pub_dir) as pub_client, logbuf.connect(sub_dir) as sub_client:
        pub = pub_client.add_publication(
            f"aeron:udp?control={control}|control-mode=dynamic|fc=min,t:60s|term-length=64k", STREAM)
        subs = [sub_client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|control={control}",
                                            STREAM) for _ in range(2)]
        wait_until(lambda: pub.is_connected and all(sub.images for sub in subs), timeout=20, what="both images")
        subs[1].close()
        sent = [bytes([i % 251]) * 900 for i in range(300)]  # far more than the window (half the 64k term)
        got: list[bytes] = []

        def poll() -> int:
            return subs[0].poll(lambda buffer, header: got.append(bytes(buffer)), 100)

        for message in sent:
            wait_until(lambda message=message: pub.offer(message) > 0, poll=poll, timeout=20,
                       what="offer past the closed receiver's window")
        wait_until(lambda: len(got) >= len(sent), poll=poll, timeout=20, what="every message")
        assert got == sent
