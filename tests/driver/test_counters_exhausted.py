"""A subscription refused for want of counters (STORAGE_SPACE) leaves nothing behind in the driver: a link it
made before the refusal, which nobody would ever read, would hold its publisher (IPC) or image (UDP) for good."""

from __future__ import annotations

from pathlib import Path

import pytest
from udp_rig import free_udp_port

import logbuf
from logbuf.client.counter import Counter
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.messages import ErrorCode
from support import wait_until

pytestmark = pytest.mark.timeout(60)
STREAM = 77
COUNTERS = 64


def test_an_ipc_subscription_refused_for_want_of_counters_holds_no_publisher(tmp_path: Path) -> None:
    with logbuf.MediaDriver.launch(tmp_path / "d", ipc_term_length=64 * 1024, counters_values_length=COUNTERS * 128,
                                   idle_strategy="backoff:1000000") as drv, logbuf.connect(drv.directory) as client:
        reader = client.add_subscription("aeron:ipc", STREAM)
        first = client.add_exclusive_publication("aeron:ipc?pub-wnd=16k", STREAM)
        second = client.add_exclusive_publication("aeron:ipc", STREAM)  # kept: a collected one would close
        wait_until(lambda: len(reader.images) == 2, what="both images")
        fillers = _refuse_a_subscription_for_want_of_counters(drv, client, "aeron:ipc")  # it needs two
        _publish_past(first, reader, 48, what="the first publication past its window (only the reader holds it)")
        assert fillers and second.is_connected


def test_a_udp_subscription_refused_for_want_of_counters_holds_no_image(tmp_path: Path) -> None:
    with logbuf.MediaDriver.launch(tmp_path / "d", network_term_length=64 * 1024,
                                   counters_values_length=COUNTERS * 128, idle_strategy="backoff:1000000") as drv, \
            logbuf.connect(drv.directory) as client:
        channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k"
        reader = client.add_subscription(channel, STREAM)
        first = client.add_exclusive_publication(channel, STREAM)
        second = client.add_exclusive_publication(channel, STREAM)  # kept: a collected one would close
        wait_until(lambda: len(reader.images) == 2 and first.is_connected and second.is_connected,
                   what="both images")
        fillers = _refuse_a_subscription_for_want_of_counters(drv, client, channel)  # one per image
        _publish_past(first, reader, 3 * 64, what="the first publication going three terms on (only the reader's "
                                                  "position holds the image)")
        assert fillers and second.is_connected


def _refuse_a_subscription_for_want_of_counters(drv: logbuf.MediaDriver, client: logbuf.Client,
                                                channel: str) -> list[Counter]:
    """Fills the counters but one, then asks for a subscription that needs two: STORAGE_SPACE.  The fillers
    are returned (kept alive by the caller)."""
    with CncFile.open(Path(drv.directory) / "cnc.dat") as cnc:
        used = sum(1 for _ in cnc.counters_reader())
    fillers = [client.add_counter(1001, "filler") for _ in range(COUNTERS - used - 1)]  # room for one
    with pytest.raises(logbuf.RegistrationError) as refused:
        client.add_subscription(channel, STREAM)
    assert refused.value.code == ErrorCode.STORAGE_SPACE
    return fillers


def _publish_past(publication: logbuf.Publication, reader: logbuf.Subscription, messages: int,
                  what: str) -> None:
    """Offers 1 KiB messages, the reader polling, until ``messages`` were accepted (a leftover link would stop
    it at a window)."""
    accepted = 0

    def publish() -> bool:
        nonlocal accepted
        accepted += publication.offer(bytes(992)) > 0
        reader.poll(lambda buffer, header: None, 100)
        return accepted >= messages

    wait_until(publish, timeout=30, what=what)
