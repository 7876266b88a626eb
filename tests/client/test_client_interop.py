"""The client on a driver without wake-up semaphores (as Aeron's aeronmd), and failures after the driver said yes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import posix_ipc
import pytest

import logbuf
from logbuf.client import client_conductor
from logbuf.cnc import counters as c
from logbuf.directory import wake_semaphore_name
from logbuf.driver.media_driver import MediaDriver
from logbuf.errors import InvalidLogBufferError
from support import wait_until

pytestmark = pytest.mark.timeout(60)
STREAM = 21
WAIT_BOUND_S = 10.0  # generous: a loaded 2-core machine


def semaphore_exists(directory: Path, stream_id: int) -> bool:
    try:
        posix_ipc.Semaphore(wake_semaphore_name(directory, stream_id)).close()
    except posix_ipc.ExistentialError:
        return False
    return True


@pytest.fixture
def aeron_like_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MediaDriver]:
    """An embedded driver that makes no wake-up semaphores, as Aeron's drivers do not."""
    monkeypatch.setattr(MediaDriver, "_ensure_wake_semaphore", lambda self, stream_id: None)
    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=64 * 1024)
    try:
        yield driver
    finally:
        driver.close()


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[MediaDriver]:
    driver = logbuf.MediaDriver.launch(
        tmp_path / "drv", ipc_term_length=64 * 1024, timer_interval_ns=50_000_000,
        publication_linger_timeout_ns=100_000_000,
    )
    try:
        yield driver
    finally:
        driver.close()


def _offer_later(pub: logbuf.Publication, ready: Callable[[], bool]) -> threading.Thread:
    def run() -> None:
        wait_until(ready, what="the waiter")
        wait_until(lambda: pub.offer(b"wake up") > 0, what="the offer taken")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_without_semaphores_publications_publish_and_wait_idles_until_data(aeron_like_driver: MediaDriver) -> None:
    with logbuf.connect(aeron_like_driver.directory) as client:
        sub = client.add_subscription("aeron:ipc", STREAM)
        pub = client.add_publication("aeron:ipc", STREAM)  # no FileNotFoundError
        assert not semaphore_exists(aeron_like_driver.directory, STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connected")
        start = time.monotonic()
        assert sub.wait(0.05) is False  # no ExistentialError: a timeout, after about that long
        assert 0.05 <= time.monotonic() - start < WAIT_BOUND_S
        entered = threading.Event()
        offerer = _offer_later(pub, entered.is_set)
        entered.set()
        assert sub.wait(WAIT_BOUND_S) is True
        offerer.join(WAIT_BOUND_S)
        got: list[bytes] = []
        assert sub.poll(lambda b, h: got.append(bytes(b)), 10) == 1
        assert got == [b"wake up"]
        # wait_async as well
        offerer = _offer_later(pub, lambda: True)
        assert asyncio.run(sub.wait_async(WAIT_BOUND_S)) is True
        offerer.join(WAIT_BOUND_S)


def test_without_semaphores_close_wakes_a_waiter_with_no_timeout(aeron_like_driver: MediaDriver) -> None:
    with logbuf.connect(aeron_like_driver.directory) as client:
        sub = client.add_subscription("aeron:ipc", STREAM)
        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(sub.wait(None)), daemon=True)
        waiter.start()
        time.sleep(0.02)  # let it get into its back-off (any moment is a valid one to close)
        sub.close()
        waiter.join(WAIT_BOUND_S)
        assert not waiter.is_alive() and result == [False]
        with pytest.raises(logbuf.ClosedError):
            sub.wait(0.01)


def test_a_semaphore_gone_before_add_publication_is_no_error(driver: MediaDriver) -> None:
    with logbuf.connect(driver.directory) as client:
        sub = client.add_subscription("aeron:ipc", STREAM)  # the driver makes the stream's semaphore
        assert semaphore_exists(driver.directory, STREAM)
        posix_ipc.unlink_semaphore(wake_semaphore_name(driver.directory, STREAM))  # ours: this test's driver
        pub = client.add_publication("aeron:ipc", STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connected")
        offerer = _offer_later(pub, lambda: True)
        assert sub.wait(WAIT_BOUND_S) is True  # back-off, since the semaphore is gone
        offerer.join(WAIT_BOUND_S)
        assert sub.poll(lambda b, h: None, 10) == 1


def _publication_limits(client: logbuf.Client, stream_id: int) -> list[int]:
    return [
        info.registration_id
        for info in client.counters
        if info.type_id == c.PUBLISHER_LIMIT_TYPE_ID and f" {stream_id} " in info.label
    ]


def test_a_log_that_cannot_be_mapped_releases_the_publication_the_driver_made(
    driver: MediaDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Unmappable(client_conductor.LogBuffers):
        @classmethod
        def open(cls, path: object) -> client_conductor.LogBuffers:
            raise InvalidLogBufferError(f"{path}: simulated failure")

    with logbuf.connect(driver.directory) as client, logbuf.connect(driver.directory) as observer:
        monkeypatch.setattr(client_conductor, "LogBuffers", Unmappable)
        with pytest.raises(InvalidLogBufferError, match="simulated"):
            client.add_exclusive_publication("aeron:ipc", STREAM)
        # the client is still open, yet the driver let the publication go (its pub-lmt counter is freed)
        wait_until(lambda: not _publication_limits(observer, STREAM), what="the publication released")
        assert not client.is_closed
        monkeypatch.undo()
        pub = client.add_exclusive_publication("aeron:ipc", STREAM)
        assert _publication_limits(observer, STREAM) == [pub.registration_id]


def test_a_publication_that_cannot_be_built_is_released_too(
    driver: MediaDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("simulated failure")

    with logbuf.connect(driver.directory) as client, logbuf.connect(driver.directory) as observer:
        monkeypatch.setattr(client_conductor, "ConcurrentPublication", broken)
        with pytest.raises(OSError, match="simulated"):
            client.add_publication("aeron:ipc", STREAM)
        wait_until(lambda: not _publication_limits(observer, STREAM), what="the publication released")
