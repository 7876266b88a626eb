"""A receiver whose subscription closes says so, as aeronmd's does: its image sends status messages with the
end-of-stream flag for about a second, then goes (its counters freed).  A publisher with ``fc=min`` lets that
receiver go at once (so does ``fc=tagged``), instead of waiting out its receiver timeout, and its limit follows
the receivers left.
Two embedded drivers on loopback: a publishing one (dynamic MDC, two destinations) and a subscribing one (two
endpoints)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from udp_rig import Received, free_udp_port, message

import logbuf
from logbuf.cnc import counters as c
from support import wait_until

pytestmark = pytest.mark.timeout(90)
STREAM = 1005
# a receiver timeout far longer than the waits below: only an EOS status message can let a receiver go in time
CHANNEL = "fc=min,t:60s|term-length=64k"


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[tuple[logbuf.Client, logbuf.Client]]:
    """(a client of the publishing driver, a client of the subscribing driver)."""
    def launch(path: Path) -> logbuf.MediaDriver:
        return logbuf.MediaDriver.launch(path, idle_strategy="backoff:1000000", timer_interval_ns=50_000_000)

    with launch(tmp_path / "pub") as pub_driver, launch(tmp_path / "sub") as sub_driver, \
            logbuf.connect(pub_driver.directory) as pub_client, logbuf.connect(sub_driver.directory) as sub_client:
        yield pub_client, sub_client


def hwm_counters(client: logbuf.Client) -> int:
    return sum(1 for info in client.counters if info.type_id == c.RECEIVER_HWM_TYPE_ID)


@pytest.mark.parametrize(("fc", "tag"), [("fc=min,t:60s", ""), ("fc=tagged,g:7,t:60s", "|gtag=7")])
def test_flow_control_follows_the_receivers_left_when_a_subscription_closes(drivers, fc: str, tag: str) -> None:  # type: ignore[no-untyped-def]
    pub_client, sub_client = drivers
    control = free_udp_port()
    pub = pub_client.add_publication(
        f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic|{fc}|term-length=64k", STREAM)
    subs = [sub_client.add_subscription(
        f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|control=127.0.0.1:{control}{tag}", STREAM)
        for _ in range(2)]
    wait_until(lambda: pub.is_connected and all(s.images for s in subs), timeout=20, what="both images")
    assert hwm_counters(sub_client) == 2
    got = Received()
    subs[1].close()
    closed_at = time.monotonic()
    # far more than a window (the 64k term's half) to the one left: were the closed receiver still counted, the
    # sender would stop a window past where it left until its 60 s timeout
    more = [message(i, 900) for i in range(300)]
    offered = 0

    def through() -> bool:
        nonlocal offered
        got.poll(subs[0])
        while offered < len(more) and pub.offer(more[offered]) > 0:
            offered += 1
        return len(got.sequences) == len(more)

    wait_until(through, timeout=20, what="everything through to the receiver left")
    assert got.sequences == list(range(len(more))) and got.corrupt == 0
    print(f"through {time.monotonic() - closed_at:.2f} s after the close")
    # the closed subscription's image lingered only for its EOS status messages: then its counters went
    wait_until(lambda: hwm_counters(sub_client) == 1, timeout=10, what="the closed image's counters freed")


@pytest.mark.parametrize("other_stream", [False, True])
def test_a_subscription_added_while_the_image_sends_eos_gets_a_new_image(drivers, other_stream: bool) -> None:  # type: ignore[no-untyped-def]
    """The stream subscribed again while its old image still sends EOS SMs: on the same endpoint (another stream
    keeps it open), or on the channel anew (the endpoint was closing: its images end at once so it can go); either
    way the new subscription gets a new image, as on aeronmd, and the messages."""
    pub_client, sub_client = drivers
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|{CHANNEL}"
    pub = pub_client.add_publication(channel, STREAM)
    keeper = sub_client.add_subscription(channel, STREAM + 1) if other_stream else None
    sub = sub_client.add_subscription(channel, STREAM)
    wait_until(lambda: pub.is_connected and sub.images, timeout=20, what="the image")
    old = sub.images[0].correlation_id
    sub.close()
    again = sub_client.add_subscription(channel, STREAM)
    wait_until(lambda: again.images, timeout=20, what="an image for the new subscription")
    assert again.images[0].correlation_id != old
    got = Received()
    sent = [message(i, 900) for i in range(300)]  # more than a window: the sender follows the new image
    offered = 0

    def through() -> bool:
        nonlocal offered
        got.poll(again)
        while offered < len(sent) and pub.offer(sent[offered]) > 0:
            offered += 1
        return len(got.sequences) == len(sent)

    wait_until(through, timeout=30, what="everything through to the new subscription")
    assert got.sequences == list(range(len(sent))) and got.corrupt == 0
    wait_until(lambda: hwm_counters(sub_client) == 1, timeout=10, what="the old image's counters freed")
    if keeper is not None:
        keeper.close()
