"""The client's API edges: clear errors for bad arguments, context managers, documented options and methods."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import logbuf
from logbuf.client import client_conductor
from logbuf.client.client import Client, connect
from logbuf.client.counter import Counter
from logbuf.client.subscription import Subscription
from logbuf.driver.media_driver import MediaDriver
from logbuf.logbuffer import descriptor as d
from support import wait_until

pytestmark = pytest.mark.timeout(60)
STREAM = 31


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[MediaDriver]:
    driver = logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=64 * 1024)
    try:
        yield driver
    finally:
        driver.close()


@pytest.fixture
def client(driver: MediaDriver) -> Iterator[Client]:
    with logbuf.connect(driver.directory) as c:
        yield c


@pytest.mark.parametrize("method", ["add_publication", "add_exclusive_publication", "add_subscription"])
def test_a_channel_that_is_not_a_string_is_a_type_error(client: Client, method: str) -> None:
    with pytest.raises(TypeError, match="channel must be a str.*got bytes"):
        getattr(client, method)(b"aeron:ipc", STREAM)
    with pytest.raises(ValueError, match="channel must not be empty"):
        getattr(client, method)("", STREAM)


@pytest.mark.parametrize("method", ["add_publication", "add_exclusive_publication", "add_subscription"])
def test_bad_stream_ids_are_named(client: Client, method: str) -> None:
    with pytest.raises(TypeError, match="stream id must be an int, got str"):
        getattr(client, method)("aeron:ipc", "7")
    with pytest.raises(TypeError, match="stream id must be an int, got bool"):
        getattr(client, method)("aeron:ipc", True)
    with pytest.raises(ValueError, match="32-bit signed int.*got 2147483648"):
        getattr(client, method)("aeron:ipc", 2**31)
    with pytest.raises(ValueError, match="got -2147483649"):
        getattr(client, method)("aeron:ipc", -(2**31) - 1)


def test_image_callbacks_must_be_callable(client: Client) -> None:
    with pytest.raises(TypeError, match="on_available_image must be callable"):
        client.add_subscription("aeron:ipc", STREAM, on_available_image=1)  # type: ignore[arg-type]


def test_subscription_is_a_context_manager_that_closes(client: Client) -> None:
    with client.add_subscription("aeron:ipc", STREAM) as sub:
        assert isinstance(sub, Subscription) and not sub.is_closed
    assert sub.is_closed
    assert "closed" in repr(sub)
    with pytest.raises(logbuf.ClosedError, match="subscription .* is closed"):
        sub.wait(0)


def test_connect_lists_its_keyword_options(driver: MediaDriver) -> None:
    parameters = inspect.signature(connect).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    options = {name: p for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(options) == {"connect_timeout", "driver_timeout_ms", "conductor_thread", "error_handler"}
    for name, p in options.items():
        assert p.default is not inspect.Parameter.empty and p.annotation is not inspect.Parameter.empty, name
        assert f"``{name}``" in (connect.__doc__ or ""), name
    with pytest.raises(TypeError, match="unexpected keyword"):
        connect(driver.directory, driver_timeout=5)  # type: ignore[call-arg]


def test_calls_after_the_driver_is_lost_raise_its_error_and_close_raises_closed(client: Client) -> None:
    client._fail(logbuf.DriverTimeout("simulated crash"))
    assert client.is_closed
    with pytest.raises(logbuf.DriverTimeout, match="simulated"):
        client.add_publication("aeron:ipc", STREAM)
    client.close()
    with pytest.raises(logbuf.ClosedError, match="client is closed"):
        client.add_publication("aeron:ipc", STREAM)


def test_a_closed_counter_says_so(client: Client) -> None:
    counter = client.add_counter(1100, "api counter")
    counter.set(5)
    assert counter.get() == 5
    counter.close()
    with pytest.raises(logbuf.ClosedError, match="counter .* is closed"):
        counter.set(6)
    with pytest.raises(TypeError, match="label must be a str"):
        client.add_counter(1100, b"label")  # type: ignore[arg-type]


def test_wait_sleeps_on_the_semaphore_and_an_offer_wakes_it(client: Client) -> None:
    """Under a logbuf driver: the waiter declares itself in the image's log, and the offer wakes it."""
    pub = client.add_publication("aeron:ipc", STREAM)
    sub = client.add_subscription("aeron:ipc", STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connected", poll=lambda: sub.wait(0.01))
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(sub.wait(30)), daemon=True)
    waiter.start()
    meta = pub.log.meta
    def declared() -> bool:  # it is (about to be) asleep
        assert waiter.is_alive(), result
        return meta.get_i32_acquire(d.LOG_WAITING_SUBSCRIBERS_OFFSET) != 0

    wait_until(declared, what="the waiter declared")
    assert pub.offer(b"x") > 0
    waiter.join(30)
    assert result == [True]
    assert meta.get_i32_acquire(d.LOG_WAITING_SUBSCRIBERS_OFFSET) == 0  # the publisher took the count back


PUBLIC_CLASSES = (Client, Subscription, Counter, client_conductor.ClientConductor)


@pytest.mark.parametrize("cls", PUBLIC_CLASSES, ids=lambda cls: cls.__name__)
def test_every_public_method_of_the_client_modules_is_documented(cls: type) -> None:
    assert cls.__doc__, cls.__name__
    missing = [
        name
        for name, member in vars(cls).items()
        if not name.startswith("_")
        and (inspect.isfunction(member) or isinstance(member, property))
        and not (member.__doc__ or "").strip()
    ]
    assert missing == [], f"{cls.__name__}: {missing}"
    assert connect.__doc__


def _mappings(path: str) -> int:
    """How many times this process maps ``path`` (the embedded driver maps it too)."""
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip("\n").endswith(path))


def test_a_log_stays_mapped_while_used_and_goes_with_its_last_user(client: Client) -> None:
    import gc

    pub = client.add_publication("aeron:ipc", STREAM)
    first = client.add_subscription("aeron:ipc", STREAM)
    second = client.add_subscription("aeron:ipc", STREAM)
    # (no closures over the subscriptions here: the test deletes them and counts the mappings left)
    deadline = time.monotonic() + 10
    while not (first.images and second.images):
        assert time.monotonic() < deadline, "no images"
        time.sleep(0.002)
    path = str(pub.log.path)
    drivers = _mappings(path) - 1  # the client maps a log once for its publications and images
    assert drivers >= 1
    first.close()  # the same log, as the publication and the other image: still mapped for them
    assert pub.offer(b"still here") > 0
    got: list[bytes] = []
    deadline = time.monotonic() + 10
    while not got:
        assert time.monotonic() < deadline, "nothing polled"
        second.poll(lambda b, h: got.append(bytes(b)), 10)
    assert got == [b"still here"]
    second.close()
    pub.close()
    assert _mappings(path) == drivers + 1  # `pub` (closed) still holds it
    del pub, first, second
    gc.collect()
    assert _mappings(path) == drivers  # the client kept no reference of its own


def test_the_client_finishes_its_heartbeat_label_as_aeron_clients_do(client: Client) -> None:
    from logbuf.cnc import counters as c

    def labels() -> list[str]:
        return [i.label for i in client.counters if i.type_id == c.CLIENT_HEARTBEAT_TYPE_ID
                and i.registration_id == client.client_id]

    wait_until(lambda: labels() and " name=" in labels()[0], what="the heartbeat label finished")
    assert labels() == [c.client_heartbeat_label(client.client_id) + c.client_heartbeat_label_suffix()]
