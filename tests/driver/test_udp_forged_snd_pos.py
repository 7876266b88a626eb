"""A client that writes a forged snd-pos into cnc.dat (every counter value there is client-writable) must not
steer the driver: the unblocker pads only where the sender agent really waits, and a spy joins at the agent's
own snd-pos.  A forged position inside a committed message's zero payload is the worst case: an unblocker that
trusted it would write a PAD header into data already sent (what retransmits and spies read)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from udp_rig import free_udp_port

import logbuf
from logbuf.cnc import counters as c
from logbuf.cnc.cnc_file import CncFile
from support import WaitTimeout, wait_until

pytestmark = pytest.mark.timeout(90)
STREAM = 47
T = 64 * 1024
PAYLOAD = 512  # zero bytes: a forged position inside it finds an all-zero span, as an abandoned claim does
FORGED = 64  # a frame boundary inside the first message's payload


@pytest.fixture
def driver(tmp_path: Path):  # type: ignore[no-untyped-def]
    drv = logbuf.MediaDriver.launch(tmp_path / "drv", network_term_length=T, timer_interval_ns=20_000_000,
                                    unblock_timeout_ns=300_000_000, idle_strategy="backoff:1000000")
    try:
        yield drv
    finally:
        drv.close()


@contextmanager
def _forging(directory: str, value: int) -> Iterator[CncFile]:
    """Keeps writing ``value`` into the publication's snd-pos counter (the agent rewrites it only on a move)."""
    cnc = CncFile.open(Path(directory) / "cnc.dat")
    reader = cnc.counters_reader()
    snd_pos = reader.position(reader.find(c.SENDER_POSITION_TYPE_ID))
    stop = threading.Event()

    def forge() -> None:
        while not stop.is_set():
            snd_pos.set(value)
            stop.wait(0.002)

    thread = threading.Thread(target=forge, daemon=True)
    thread.start()
    try:
        yield cnc
    finally:
        stop.set()
        thread.join(timeout=10)
        cnc.close()


def _setup(client: logbuf.Client, port: int) -> tuple[logbuf.Publication, logbuf.Subscription, list[bytes]]:
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length={T}"
    sub = client.add_subscription(channel, STREAM)
    pub = client.add_publication(channel, STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="the publication connected")
    got: list[bytes] = []
    for _ in range(3):
        wait_until(lambda: pub.offer(bytes(PAYLOAD)) > 0, what="an offer")
    wait_until(lambda: sub.poll(lambda buffer, header: got.append(bytes(buffer)), 10) >= 0 and len(got) == 3,
               what="three messages received")
    return pub, sub, got


def _log_bytes(directory: str, pub: logbuf.Publication) -> bytes:
    path = Path(directory) / "publications" / f"{pub.registration_id}.logbuffer"
    with open(path, "rb") as log:
        return log.read(T)


def test_a_forged_snd_pos_never_makes_the_unblocker_pad_committed_data(driver) -> None:  # type: ignore[no-untyped-def]
    with logbuf.connect(driver.directory) as client:
        pub, sub, got = _setup(client, free_udp_port())
        before = _log_bytes(driver.directory, pub)
        with _forging(driver.directory, FORGED) as cnc:
            # a real dead claim behind a committed message: the unblocker's one rightful job here
            claim = pub.try_claim(100)
            assert claim
            wait_until(lambda: pub.offer(b"after the dead claim") > 0, what="an offer past the claim")
            wait_until(lambda: sub.poll(lambda buffer, header: got.append(bytes(buffer)), 10) >= 0 and len(got) == 4,
                       timeout=30, what="the message past the dead claim (its claim padded)")
            unblocked = cnc.counters_reader().counter_value(c.SystemCounter.UNBLOCKED_PUBLICATIONS)
        after = _log_bytes(driver.directory, pub)
        assert after[: 3 * (32 + PAYLOAD)] == before[: 3 * (32 + PAYLOAD)], "committed messages were overwritten"
        assert got[3] == b"after the dead claim" and unblocked == 1
        del claim


def test_a_spy_joins_at_the_agents_snd_pos_not_a_forged_one(driver) -> None:  # type: ignore[no-untyped-def]
    with logbuf.connect(driver.directory) as client:
        port = free_udp_port()
        pub, _sub, _got = _setup(client, port)
        end = pub.position
        with _forging(driver.directory, FORGED):
            spy = client.add_subscription(f"aeron-spy:aeron:udp?endpoint=127.0.0.1:{port}|term-length={T}", STREAM)
            wait_until(lambda: spy.images, what="the spy's image")
            assert spy.images[0].position == end


def test_a_forged_spy_position_never_moves_the_sender_off_a_frame_boundary(driver) -> None:  # type: ignore[no-untyped-def]
    """With ssc and no receiver snd-pos follows the fastest spy, whose sub-pos any client can write: it moves
    only over whole committed frames (else the sender would send from mid-frame and the unblocker pad there)."""
    with logbuf.connect(driver.directory) as client:
        channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length={T}"
        spy = client.add_subscription("aeron-spy:" + channel, STREAM)
        pub = client.add_publication(channel + "|ssc=true", STREAM)
        wait_until(lambda: pub.is_connected and spy.images, what="connected by the spy")
        for _ in range(3):
            wait_until(lambda: pub.offer(bytes(PAYLOAD)) > 0, what="an offer")
        frame = 32 + PAYLOAD
        sub_pos = spy.images[0].subscriber_position
        with CncFile.open(Path(driver.directory) / "cnc.dat") as cnc:
            reader = cnc.counters_reader()
            snd_pos = reader.position(reader.find(c.SENDER_POSITION_TYPE_ID))
            assert snd_pos.get() == 0
            sub_pos.set(FORGED)  # inside the first frame
            with pytest.raises(WaitTimeout):  # nothing to await but time: the agent runs every millisecond
                wait_until(lambda: snd_pos.get() != 0, timeout=1.0, what="snd-pos moving")
            sub_pos.set(frame + FORGED)  # inside the second: as far as the first frame's end
            wait_until(lambda: snd_pos.get() == frame, what="snd-pos at the first frame's end")
            sub_pos.set(3 * frame)
            wait_until(lambda: snd_pos.get() == 3 * frame, what="snd-pos at the spy")
