"""What docs/client.md says about polling a subscription: ``batch_poll`` on the subscription, a handler's
exception consuming its fragment, and which positions still read once the client is closed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import logbuf
from logbuf.client.client import Client
from logbuf.client.image import Image
from logbuf.driver.media_driver import MediaDriver
from logbuf.errors import ClosedError
from support import wait_until

pytestmark = pytest.mark.timeout(60)
STREAM = 41


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    driver = MediaDriver.launch(tmp_path / "drv", ipc_term_length=64 * 1024)
    try:
        with logbuf.connect(driver.directory) as c:
            yield c
    finally:
        driver.close()


def offer(publication: logbuf.Publication, payload: bytes) -> None:
    wait_until(lambda: publication.offer(payload) > 0, 10, what=f"offer of {payload!r}")


def test_batch_poll_on_a_subscription_takes_each_image_in_turn(client: Client) -> None:
    sub = client.add_subscription("aeron:ipc", STREAM)
    with sub.batch_poll() as nothing:  # no image yet: an empty batch, nothing to commit
        assert len(nothing) == 0
    a = client.add_exclusive_publication("aeron:ipc", STREAM)
    b = client.add_exclusive_publication("aeron:ipc", STREAM)
    wait_until(lambda: len(sub.images) == 2, 10, what="both images")
    for i in range(3):
        offer(a, b"a%d" % i)
        offer(b, b"b%d" % i)
    batches = []
    for _ in range(3):
        with sub.batch_poll() as batch:
            batches.append(sorted(bytes(batch.payload(i)) for i in range(len(batch))))
    assert sorted(batches[:2]) == [[b"a0", b"a1", b"a2"], [b"b0", b"b1", b"b2"]]  # one image per batch
    assert batches[2] == []  # committed: nothing is delivered twice


def test_a_handlers_exception_consumes_its_fragment(client: Client) -> None:
    sub = client.add_subscription("aeron:ipc", STREAM)
    pub = client.add_publication("aeron:ipc", STREAM)
    wait_until(lambda: sub.images, 10, what="the image")
    for payload in (b"first", b"second"):
        offer(pub, payload)
    seen: list[bytes] = []

    def fail_on_first(buffer: memoryview, header: object) -> None:
        seen.append(bytes(buffer))
        if bytes(buffer) == b"first":
            raise ValueError("the handler failed")

    with pytest.raises(ValueError, match="the handler failed"):
        sub.poll(fail_on_first, 10)
    wait_until(lambda: sub.poll(fail_on_first, 10) > 0, 10, what="the next fragment")
    assert seen == [b"first", b"second"]  # "first" was not delivered again


def test_after_close_the_own_cursor_reads_and_shared_positions_raise(client: Client) -> None:
    sub = client.add_subscription("aeron:ipc", STREAM)
    pub = client.add_publication("aeron:ipc", STREAM)
    wait_until(lambda: sub.images, 10, what="the image")
    image: Image = sub.images[0]
    offer(pub, b"x" * 10)
    wait_until(lambda: sub.poll(lambda buffer, header: None, 10) > 0, 10, what="the fragment")
    position = image.position
    client.close()
    assert image.position == position and "closed" in repr(pub)
    assert pub.offer(b"y") == logbuf.PublicationResult.CLOSED
    assert sub.poll(lambda buffer, header: None, 10) == 0 and sub.images == ()
    for read in (lambda: pub.position, lambda: pub.position_limit_value, lambda: pub.available_window(),
                 lambda: image.released_position):
        with pytest.raises(ClosedError):
            read()
