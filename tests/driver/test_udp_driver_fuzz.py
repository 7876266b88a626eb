"""Hypothesis: fuzzed datagrams into a live driver's receive socket (with a live image) and into its sender's
control socket - nothing crashes, every malformed datagram is counted as invalid, and real traffic still
flows afterwards."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from udp_fuzz_strategies import INITIAL, SESSION, STREAM, T, datagram
from udp_rig import (
    BYTES_RECEIVED,
    INVALID_PACKETS,
    Received,
    free_udp_port,
    message,
    publish,
    system,
)

import logbuf
from logbuf.directory import cnc_path
from logbuf.protocol import DataPacket, MalformedFrameError, SetupFrame, classify
from logbuf.tools.error_stat import read_errors
from support import wait_until

pytestmark = pytest.mark.timeout(120)


class Target:
    """A driver with (1) a subscription whose endpoint already holds an image for the fuzz session (made by
    a hand-made sender's SETUP) and (2) a publication whose send socket we found by receiving its SETUP."""

    def __init__(self, directory: Path) -> None:
        self.driver = logbuf.MediaDriver.launch(directory, idle_strategy="backoff:200000")
        self.client = logbuf.connect(self.driver.directory)
        self.raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.raw.bind(("127.0.0.1", 0))
        self.raw.settimeout(5)
        self.receive_port = free_udp_port()
        self.subscription = self.client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{self.receive_port}",
                                                         STREAM)
        self.raw.sendto(SetupFrame(0, SESSION, STREAM, INITIAL, INITIAL, T, 1408).encode(),
                        ("127.0.0.1", self.receive_port))
        wait_until(lambda: self.subscription.images, what="the fuzz session's image")
        # a publication towards our raw socket: its first SETUP tells us where its control socket is
        self.publication = self.client.add_publication(
            f"aeron:udp?endpoint=127.0.0.1:{self.raw.getsockname()[1]}|term-length=64k", STREAM + 1
        )
        while True:
            data, source = self.raw.recvfrom(65536)
            frames = getattr(classify(data), "frames", ())
            if frames and isinstance(frames[0], SetupFrame):
                self.control_address = source
                break

    def close(self) -> None:
        self.raw.close()
        self.client.close()
        self.driver.close()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    t = Target(tmp_path_factory.mktemp("fuzz") / "drv")
    try:
        yield t
    finally:
        t.close()


def settled(read: Callable[[], int], quiet_s: float = 0.02, timeout_s: float = 10.0) -> int:
    """A counter's value once it has stopped moving for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = read()
        if again == value:
            return value
        value = again
    raise AssertionError(f"counter still moving after {timeout_s} s")


def malformed(raw: bytes) -> bool:
    try:
        classify(raw)
    except MalformedFrameError:
        return True
    return False


def is_data(raw: bytes) -> bool:
    try:
        return isinstance(classify(raw), DataPacket)
    except MalformedFrameError:
        return False


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(receiver_batch=st.lists(datagram, max_size=20), sender_batch=st.lists(datagram, max_size=10))
def test_fuzzed_datagrams_are_counted_and_dropped(target: Target, receiver_batch: list[bytes],
                                                  sender_batch: list[bytes]) -> None:
    client = target.client
    # the previous example's datagrams may still be being classified (a receive batch is counted in bytes
    # first, then datagram by datagram): start from a settled count
    invalid_before = settled(lambda: system(client, INVALID_PACKETS))
    received_before = system(client, BYTES_RECEIVED)
    for raw in receiver_batch:
        target.raw.sendto(raw, ("127.0.0.1", target.receive_port))
    for raw in sender_batch:
        target.raw.sendto(raw, target.control_address)
    total = sum(map(len, receiver_batch + sender_batch))
    wait_until(lambda: system(client, BYTES_RECEIVED) - received_before >= total, what="the driver to read them")
    # the receiver counts what classify rejects, plus well-formed data that does not fit its image's term;
    # the sender's control socket counts what classify rejects and any data-plane datagram
    low = sum(map(malformed, receiver_batch)) + sum(malformed(r) or is_data(r) for r in sender_batch)
    high = low + sum(map(is_data, receiver_batch))
    wait_until(lambda: system(client, INVALID_PACKETS) - invalid_before >= low, what="invalid packets counted")
    assert low <= system(client, INVALID_PACKETS) - invalid_before <= high
    assert target.driver.is_running


def test_the_driver_still_carries_real_traffic_after_the_fuzzing(target: Target) -> None:
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    sub = target.client.add_subscription(channel, 7)
    pub = target.client.add_publication(channel, 7)
    wait_until(lambda: pub.is_connected and sub.images, what="connection")
    received = Received()
    publish(pub, [message(i, 200) for i in range(300)], between=lambda: received.poll(sub))
    wait_until(lambda: len(received.sequences) == 300, poll=lambda: received.poll(sub), what="delivery")
    assert received.sequences == list(range(300)) and received.corrupt == 0
    assert target.driver.is_running
    # what the driver logged: SETUPs it refused, nothing else (no exception escaped a duty)
    errors = read_errors(cnc_path(target.driver.directory)).entries
    assert all(e.text.startswith("SETUP from") for e in errors), [e.text for e in errors]
