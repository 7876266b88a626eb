"""A subscription refused for want of counters (STORAGE_SPACE) leaves nothing behind in the driver: a link it
made before the refusal, which nobody would ever read, would hold its publisher (IPC) or image (UDP) for good."""

from __future__ import annotations

from pathlib import Path

import pytest
from udp_rig import free_udp_port

import logbuf
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
        with CncFile.open(Path(drv.directory) / "cnc.dat") as cnc:
            used = sum(1 for _ in cnc.counters_reader())
        fillers = [client.add_counter(1001, "filler") for _ in range(COUNTERS - used - 1)]  # room for one
        with pytest.raises(logbuf.RegistrationError) as refused:
            client.add_subscription("aeron:ipc", STREAM)  # needs two sub-pos counters
        assert refused.value.code == ErrorCode.STORAGE_SPACE
        accepted = 0

        def publish() -> bool:
            nonlocal accepted
            accepted += first.offer(bytes(992)) > 0
            reader.poll(lambda buffer, header: None, 100)
            return accepted >= 48  # three windows: only the reader holds it

        wait_until(publish, timeout=30, what="the first publication going past its window")
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
        with CncFile.open(Path(drv.directory) / "cnc.dat") as cnc:
            used = sum(1 for _ in cnc.counters_reader())
        fillers = [client.add_counter(1001, "filler") for _ in range(COUNTERS - used - 1)]  # room for one
        with pytest.raises(logbuf.RegistrationError) as refused:
            client.add_subscription(channel, STREAM)  # needs a sub-pos counter on each image
        assert refused.value.code == ErrorCode.STORAGE_SPACE
        accepted = 0

        def publish() -> bool:
            nonlocal accepted
            accepted += first.offer(bytes(992)) > 0
            reader.poll(lambda buffer, header: None, 100)
            return accepted >= 3 * 64  # three terms: only the reader's position holds the image

        wait_until(publish, timeout=30, what="the first publication going three terms on")
        assert fillers and second.is_connected
