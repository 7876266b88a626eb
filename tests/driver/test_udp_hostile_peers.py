"""The native receiver against what a peer may send: an aborted claim's unaligned PAD, overlapping DATA frames
of a forged session, and a flood of SETUPs asking for many images with huge terms."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pytest
from udp_rig import STATUS_MESSAGES_SENT, Received, free_udp_port, message, publish, system

import logbuf
from logbuf.directory import cnc_path
from logbuf.protocol import SetupFrame, encode_data_frame
from logbuf.tools.error_stat import read_errors
from support import running_driver, wait_until

STREAM = 1001
T = 64 * 1024


def channel(port: int) -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"


@pytest.fixture
def driver(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield from running_driver(tmp_path / "drv", idle_strategy="backoff:1000000",
                              max_images_per_source=8, max_image_term_length=1024 * 1024)



def errors(driver: logbuf.MediaDriver) -> list:
    return read_errors(cnc_path(driver.directory)).entries


def test_an_aborted_claims_unaligned_pad_crosses_the_network(client) -> None:  # type: ignore[no-untyped-def]
    """A claim of 100 bytes aborted becomes a PAD of length 132 on the wire; the receiver takes it and the
    stream goes on (no NAK loop, nothing lost)."""
    port = free_udp_port()
    sub = client.add_subscription(channel(port), STREAM)
    pub = client.add_publication(channel(port), STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connection")
    received = Received()
    publish(pub, [message(i, 64) for i in range(5)])
    claim = pub.try_claim(100)
    assert claim, claim.result
    claim.abort()
    publish(pub, [message(i, 64) for i in range(5, 10)])
    wait_until(lambda: len(received.sequences) == 10, poll=lambda: received.poll(sub), what="messages after the PAD")
    assert received.sequences == list(range(10)) and received.corrupt == 0


def _setup(session_id: int, term_length: int = T, stream_id: int = STREAM) -> bytes:
    return SetupFrame(0, session_id, stream_id, 7, 7, term_length, 1408, 0).encode()


def test_a_setup_flood_is_bounded_and_a_valid_stream_is_untouched(client, driver) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    sub = client.add_subscription(channel(port), STREAM)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.bind(("127.0.0.1", 0))
        for session in range(100, 160):  # 60 sessions from one source, over its limit of 8
            raw.sendto(_setup(session), ("127.0.0.1", port))
        for session in range(200, 210):  # terms over the 1 MiB a remote SETUP may ask for
            raw.sendto(_setup(session, 1 << 30), ("127.0.0.1", port))
        wait_until(lambda: len(sub.images) >= 8 and len(errors(driver)) >= 2, what="the flood handled")
    pub = client.add_publication(channel(port), STREAM)
    wait_until(lambda: pub.is_connected and any(i.session_id == pub.session_id for i in sub.images),
               what="the valid stream's image")
    received = Received()
    image = next(i for i in sub.images if i.session_id == pub.session_id)
    publish(pub, [message(i, 200) for i in range(200)], between=lambda: received.poll(image))
    wait_until(lambda: len(received.sequences) == 200, poll=lambda: received.poll(image), what="delivery")
    assert received.sequences == list(range(200)) and received.corrupt == 0
    forged = [i for i in sub.images if i.session_id != pub.session_id]
    assert len(forged) == 8  # the limit per source (address and port: the valid stream has its own)
    texts = [e.text for e in errors(driver)]
    assert any("term length 1073741824 is over the limit" in t for t in texts), texts
    assert any("limit of 8 images" in t for t in texts), texts
    # refusals are counted as observations of one entry per source and reason, not one entry each
    assert len(texts) <= 3, texts
    assert driver.is_running


def test_overlapping_data_frames_close_the_image_once(client, driver) -> None:  # type: ignore[no-untyped-def]
    """Ahead of the rebuild position (the frame at 0 still missing): frame A (40 bytes at offset 64), then frame B
    at offset 96 - inside A's aligned space - whose payload puts an impossible frame length where A says the
    next frame begins; once the frame at 0 arrives the term is broken: the image is closed with one error-log
    entry, not polled in a loop."""
    port = free_udp_port()
    sub = client.add_subscription(channel(port), STREAM)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.bind(("127.0.0.1", 0))
        raw.sendto(_setup(4242), ("127.0.0.1", port))
        wait_until(lambda: sub.images, what="the forged session's image")
        first = encode_data_frame(bytes(32), term_offset=0, session_id=4242, stream_id=STREAM, term_id=7)
        a = encode_data_frame(bytes(8), term_offset=64, session_id=4242, stream_id=STREAM, term_id=7)
        payload = bytearray(168)
        struct.pack_into("<i", payload, 0, 0x7FFFFFF0)  # lands at term offset 128: A's next frame
        b = encode_data_frame(bytes(payload), term_offset=96, session_id=4242, stream_id=STREAM, term_id=7)
        for datagram in (a, b, first):
            raw.sendto(datagram, ("127.0.0.1", port))
        wait_until(lambda: not sub.images, what="the corrupt image closed")
    corrupt = [e for e in errors(driver) if "impossible frame" in e.text]
    assert len(corrupt) == 1 and corrupt[0].count == 1, [(e.count, e.text) for e in errors(driver)]
    assert driver.is_running


def test_a_frame_overlapping_what_the_stream_already_has_is_dropped(client, driver) -> None:  # type: ignore[no-untyped-def]
    """Below the rebuild position the term is complete: a forged frame inside a delivered frame's space (where
    its payload bytes are zero) is not written; the image stays and the stream goes on intact."""
    port = free_udp_port()
    sub = client.add_subscription(channel(port), STREAM)
    slow = client.add_subscription(channel(port), STREAM)  # reads only at the end, after the forged frame
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.bind(("127.0.0.1", 0))
        raw.sendto(_setup(4343), ("127.0.0.1", port))
        wait_until(lambda: sub.images and slow.images, what="the session's image")
        a = encode_data_frame(bytes(200), term_offset=0, session_id=4343, stream_id=STREAM, term_id=7)
        forged = encode_data_frame(b"\xee" * 64, term_offset=64, session_id=4343, stream_id=STREAM, term_id=7)
        after = encode_data_frame(b"next", term_offset=256, session_id=4343, stream_id=STREAM, term_id=7)
        got: list[bytes] = []
        raw.sendto(a, ("127.0.0.1", port))
        wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) or got, what="the first frame")
        raw.sendto(forged, ("127.0.0.1", port))
        raw.sendto(after, ("127.0.0.1", port))
        wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) or len(got) >= 2, what="the next frame")
    assert got == [bytes(200), b"next"]
    late: list[bytes] = []
    wait_until(lambda: slow.poll(lambda b, h: late.append(bytes(b)), 10) or len(late) >= 2, what="the slow reader")
    assert late == [bytes(200), b"next"]  # the delivered frame's bytes are as they were sent
    assert sub.images and not [e for e in errors(driver) if "impossible frame" in e.text]


def test_the_send_impairment_reaches_the_receivers_status_messages(tmp_path: Path) -> None:
    """``send_impairment`` impairs every datagram the driver sends: the receiver agent's SMs too (drop=1: the
    SM is counted, and nothing arrives)."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", idle_strategy="backoff:1000000",
                                   send_impairment="drop=1.0") as drv, logbuf.connect(drv.directory) as cl, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        sub = cl.add_subscription(channel(port), STREAM)
        raw.bind(("127.0.0.1", 0))
        raw.sendto(_setup(99), ("127.0.0.1", port))
        wait_until(lambda: sub.images and system(cl, STATUS_MESSAGES_SENT) > 0, what="an image and its first SM")
        raw.setblocking(False)
        with pytest.raises(BlockingIOError):
            raw.recv(2048)


@pytest.mark.parametrize(("option", "value", "match"), [
    ("max_images", 0, "max_images must be >= 1"),
    ("max_images_per_channel", -1, "max_images_per_channel must be >= 1"),
    ("max_images_per_source", 0, "max_images_per_source must be >= 1"),
    ("max_image_term_length", 100_000, "max_image_term_length: term length 100000 must be a power of two"),
])
def test_image_limits_are_validated(option: str, value: int, match: str) -> None:
    from logbuf.driver.context import DriverContext

    with pytest.raises(ValueError, match=match):
        DriverContext.build(**{option: value})
