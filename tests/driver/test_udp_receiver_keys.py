"""The receiver's per-subscription settings through an embedded driver on loopback, as aeronmd behaves:
multi-destination subscriptions (``control-mode=manual`` with add/remove destination), ``nak-delay``,
``reliable=false``, ``rejoin=false``, and rejecting an image (REJECT_IMAGE)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from udp_rig import LOSS_GAP_FILLS, NAKS_SENT, Received, free_udp_port, message, publish, system

import logbuf
from logbuf.cnc import counters as c
from logbuf.cnc.messages import ErrorCode
from logbuf.errors import RegistrationError
from logbuf.protocol import Nak, SetupFrame, StatusMessage, classify, encode_data_frame
from logbuf.protocol.error_frame import ErrorFrame
from support import wait_until

pytestmark = pytest.mark.timeout(90)
STREAM = 1001
T = 64 * 1024
MDS = "aeron:udp?control-mode=manual"
ERROR_FRAMES_SENT = c.SystemCounter.ERROR_FRAMES_SENT
ERROR_FRAMES_RECEIVED = c.SystemCounter.ERROR_FRAMES_RECEIVED


def channel(port: int, extra: str = "") -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k{extra}"


@pytest.fixture
def raw() -> Iterator[socket.socket]:
    """A hand-made sender's socket (SETUP, DATA; SMs, NAKs and ERRs come back to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(0.05)
        yield sock


def frames_from(sock: socket.socket, seconds: float) -> list[tuple[object, int]]:
    """Every control frame that reaches ``sock`` within ``seconds``, with the port it came from."""
    out: list[tuple[object, int]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data, source = sock.recvfrom(4096)
        except TimeoutError:
            continue
        out.extend((frame, source[1]) for frame in getattr(classify(data), "frames", ()))
    return out


def data(payload: bytes, offset: int, session: int = 4242, term_id: int = 9) -> bytes:
    return encode_data_frame(payload, term_offset=offset, session_id=session, stream_id=STREAM, term_id=term_id)


def setup(session: int = 4242) -> bytes:
    return SetupFrame(0, session, STREAM, 9, 9, T, 1408, 0).encode()


def test_mds_one_subscription_two_destinations_a_publisher_to_each(tmp_path: Path) -> None:
    """Two destinations of one control-mode=manual subscription, a publisher to each: both streams are
    delivered to the one subscription; once a destination is removed its publisher's image times out while
    the other goes on."""
    a, b = free_udp_port(), free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", image_liveness_timeout_ns=500_000_000) as drv, \
            logbuf.connect(drv.directory) as cl:
        gone: list[logbuf.Image] = []
        sub = cl.add_subscription(MDS, STREAM, on_unavailable_image=gone.append)
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{a}")
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{b}")
        pub_a = cl.add_publication(channel(a), STREAM)
        pub_b = cl.add_publication(channel(b), STREAM)
        wait_until(lambda: pub_a.is_connected and pub_b.is_connected and len(sub.images) == 2, what="both images")
        assert sorted(_receive_sockaddrs(cl)) == sorted(f"127.0.0.1:{p}" for p in (a, b))
        got: dict[int, list[bytes]] = {pub_a.session_id: [], pub_b.session_id: []}

        def poll() -> int:
            return sub.poll(lambda buf, header: got[header.session_id].append(bytes(buf)), 50)

        publish(pub_a, [message(i, 64) for i in range(50)], between=poll)
        publish(pub_b, [message(i, 64) for i in range(50)], between=poll)
        wait_until(lambda: all(len(v) == 50 for v in got.values()), poll=poll, what="both streams delivered")
        assert all(v == [message(i, 64) for i in range(50)] for v in got.values())
        image_a = sub.image_by_session_id(pub_a.session_id)
        sub.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{a}")
        wait_until(lambda: gone == [image_a], timeout=10, what="the removed destination's image to time out")
        publish(pub_b, [message(i, 64) for i in range(50, 60)], between=poll)
        wait_until(lambda: len(got[pub_b.session_id]) == 60, poll=poll, what="the other destination still feeds")
        assert [i.session_id for i in sub.images] == [pub_b.session_id]
        # the removed destination's socket is closed: the port can be bound again
        wait_until(lambda: _bindable(a), what="the removed destination's socket closed")
        assert _receive_sockaddrs(cl) == [f"127.0.0.1:{b}"]


def _receive_sockaddrs(cl: logbuf.Client) -> list[str]:
    """The addresses of the rcv-local-sockaddr counters (one per receive destination)."""
    return [i.label.rsplit(" ", 1)[-1] for i in cl.counters
            if i.type_id == c.LOCAL_SOCKADDR_TYPE_ID and i.label.startswith(c.RECEIVE_LOCAL_SOCKADDR_NAME)]


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_mds_one_image_rebuilt_from_every_destination_and_answers_through_each(tmp_path: Path,
                                                                               raw: socket.socket) -> None:
    """One session sent to both destinations (frames split and duplicated between them): one image, every
    frame once and in order, and its status messages and NAKs go back through each destination it was heard
    on."""
    a, b = free_udp_port(), free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv") as drv, logbuf.connect(drv.directory) as cl:
        sub = cl.add_subscription(MDS, STREAM)
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{a}")
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{b}")
        wait_until(lambda: _sent_setup(raw, a) and sub.images, what="the image")
        frames = [data(bytes([i]) * 20, 64 * i) for i in range(8)]
        for i, frame in enumerate(frames):
            raw.sendto(frame, ("127.0.0.1", a if i % 2 == 0 else b))
            if i % 3 == 0:
                raw.sendto(frame, ("127.0.0.1", b if i % 2 == 0 else a))  # a duplicate through the other one
        got: list[bytes] = []
        wait_until(lambda: len(got) == 8, poll=lambda: sub.poll(lambda buf, h: got.append(bytes(buf)), 20),
                   what="every frame once")
        assert got == [bytes([i]) * 20 for i in range(8)] and len(sub.images) == 1
        raw.sendto(setup(), ("127.0.0.1", b))  # a SETUP through b: answered at once, through both
        ports = {port for frame, port in frames_from(raw, 0.6) if isinstance(frame, StatusMessage)}
        assert ports == {a, b}
        raw.sendto(data(b"after a gap", 64 * 9), ("127.0.0.1", a))  # 64 * 8 never comes: NAKed through both
        naks = [(frame, port) for frame, port in frames_from(raw, 0.6) if isinstance(frame, Nak)]
        assert {port for _, port in naks} == {a, b}
        assert all((n.term_offset, n.length) == (64 * 8, 64) for n, _ in naks)  # type: ignore[attr-defined]


def _sent_setup(raw: socket.socket, port: int) -> bool:
    raw.sendto(setup(), ("127.0.0.1", port))
    return True


def test_mds_commands_are_answered_as_aeronmd(client_driver: logbuf.Client) -> None:
    cl = client_driver
    port = free_udp_port()
    plain = cl.add_subscription(channel(port), STREAM)
    with pytest.raises(RegistrationError, match="channel does not allow manual control") as info:
        plain.add_destination(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}")
    assert info.value.code == ErrorCode.INVALID_CHANNEL
    mds = cl.add_subscription(MDS, STREAM)
    for key in ("mtu=1408", "rcv-wnd=64k", "so-rcvbuf=64k"):
        with pytest.raises(RegistrationError, match=f"must not contain the key: {key.split('=')[0]}") as info:
            mds.add_destination(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|{key}")
        assert info.value.code == ErrorCode.INVALID_CHANNEL
    mds.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}")  # none there: success
    with pytest.raises(RegistrationError, match="control-mode=dynamic") as info:
        cl.add_subscription("aeron:udp?control-mode=dynamic", STREAM)
    assert info.value.code == ErrorCode.INVALID_CHANNEL


@pytest.fixture
def client_driver(tmp_path: Path) -> Iterator[logbuf.Client]:
    with logbuf.MediaDriver.launch(tmp_path / "drv") as drv, logbuf.connect(drv.directory) as cl:
        yield cl


def _gap(raw: socket.socket, port: int) -> None:
    """Frames at 0 and 128 of a hand-made session: [64, 128) is missing."""
    for offset, payload in ((0, b"first"), (128, b"third")):
        raw.sendto(data(payload, offset), ("127.0.0.1", port))


def test_nak_delay_holds_the_first_nak_back(tmp_path: Path, raw: socket.socket) -> None:
    """nak-delay=400ms: a gap's first NAK goes out no sooner than that (the driver's own is 100 us)."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv") as drv, logbuf.connect(drv.directory) as cl:
        sub = cl.add_subscription(channel(port, "|nak-delay=400ms"), STREAM)
        wait_until(lambda: _sent_setup(raw, port) and sub.images, what="the image")
        frames_from(raw, 0.1)
        _gap(raw, port)
        gap_at = time.monotonic()
        naks: list[float] = []
        deadline = gap_at + 10
        while not naks and time.monotonic() < deadline:
            if any(isinstance(f, Nak) for f, _ in frames_from(raw, 0.05)):
                naks.append(time.monotonic())
        assert naks and naks[0] - gap_at >= 0.35


def test_reliable_false_pads_a_gap_and_never_naks(tmp_path: Path, raw: socket.socket) -> None:
    """reliable=false: the missing frame is not NAKed; the gap is filled with padding and the subscriber reads
    on (Loss gap fills 1, NAKs sent 0); the image's log says unreliable."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv") as drv, logbuf.connect(drv.directory) as cl:
        sub = cl.add_subscription(channel(port, "|reliable=false"), STREAM)
        wait_until(lambda: _sent_setup(raw, port) and sub.images, what="the image")
        assert not sub.images[0].log.meta.get_bytes(logbuf.logbuffer.descriptor.LOG_RELIABLE_OFFSET, 1)[0]
        _gap(raw, port)
        got: list[bytes] = []
        wait_until(lambda: len(got) == 2, poll=lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10),
                   what="the subscriber past the padded gap")
        assert got == [b"first", b"third"]
        wait_until(lambda: system(cl, LOSS_GAP_FILLS) == 1, what="one gap fill counted")
        assert not [f for f, _ in frames_from(raw, 0.3) if isinstance(f, Nak)]
        assert system(cl, NAKS_SENT) == 0


def test_reliable_false_over_a_lossy_link_delivers_in_order_with_gaps(tmp_path: Path) -> None:
    """A receive impairment drops datagrams: an unreliable subscription gets what arrived, in order, once,
    reaches the publication's position, and no NAK is ever sent."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", receive_impairment="drop=0.1,seed=7") as drv, \
            logbuf.connect(drv.directory) as cl:
        sub = cl.add_subscription(channel(port, "|reliable=false"), STREAM)
        pub = cl.add_publication(channel(port), STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connection")
        received = Received()
        publish(pub, [message(i, 100) for i in range(400)], between=lambda: received.poll(sub))
        image = sub.images[0]
        wait_until(lambda: image.position == pub.position, poll=lambda: received.poll(sub), timeout=30,
                   what="the subscriber at the publication's position")
        seqs = received.sequences
        assert seqs == sorted(set(seqs)) and received.corrupt == 0 and len(seqs) < 400
        assert system(cl, NAKS_SENT) == 0 and system(cl, LOSS_GAP_FILLS) > 0


@pytest.mark.parametrize("rejoin", [True, False])
def test_rejoin(tmp_path: Path, raw: socket.socket, rejoin: bool) -> None:
    """An image that timed out: with rejoin=true the sender's next SETUPs (after the cool-down) make a new
    image; with rejoin=false they are ignored while the subscription lasts."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", image_liveness_timeout_ns=300_000_000) as drv, \
            logbuf.connect(drv.directory) as cl:
        gone: list[logbuf.Image] = []
        joined: list[logbuf.Image] = []
        sub = cl.add_subscription(channel(port, f"|rejoin={'true' if rejoin else 'false'}"), STREAM,
                                  on_available_image=joined.append, on_unavailable_image=gone.append)
        wait_until(lambda: _sent_setup(raw, port) and joined, what="the image")
        wait_until(lambda: gone, timeout=5, what="the silent image to time out")
        deadline = time.monotonic() + 4  # the cool-down is 1 s
        while time.monotonic() < deadline and len(joined) < 2:
            raw.sendto(setup(), ("127.0.0.1", port))
            sub.poll(lambda b, h: None, 1)
            time.sleep(0.05)
        assert len(joined) == (2 if rejoin else 1)


def test_subscriptions_must_agree_on_reliable_and_rejoin(client_driver: logbuf.Client) -> None:
    port = free_udp_port()
    client_driver.add_subscription(channel(port, "|reliable=false"), STREAM)
    with pytest.raises(RegistrationError, match="option conflicts with existing subscription: reliable=true") as info:
        client_driver.add_subscription(channel(port), STREAM)
    assert info.value.code == ErrorCode.GENERIC_ERROR
    client_driver.add_subscription(channel(port), STREAM + 1)  # another stream: its own images


def test_rejecting_an_image_sends_error_frames_and_the_image_goes(tmp_path: Path, raw: socket.socket) -> None:
    """Image.reject (REJECT_IMAGE): the driver answers with OPERATION_SUCCESS, takes no more data from the
    sender, sends it ERR frames (IMAGE_REJECTED, the reason) instead of SMs, and the image goes when its
    liveness runs out."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", image_liveness_timeout_ns=1_000_000_000) as drv, \
            logbuf.connect(drv.directory) as cl:
        gone: list[logbuf.Image] = []
        sub = cl.add_subscription(channel(port), STREAM, on_unavailable_image=gone.append)
        wait_until(lambda: _sent_setup(raw, port) and sub.images, what="the image")
        image = sub.images[0]
        image.reject("not wanted here")
        errors: list[ErrorFrame] = []
        got: list[bytes] = []
        offset = 0
        deadline = time.monotonic() + 5
        while not gone and time.monotonic() < deadline:
            raw.sendto(data(b"after", offset), ("127.0.0.1", port))  # data keeps coming: not taken
            offset += 64
            errors += [f for f, _ in frames_from(raw, 0.05) if isinstance(f, ErrorFrame)]
            sub.poll(lambda b, h: got.append(bytes(b)), 10)
        assert gone == [image] and not got
        assert errors and all((e.session_id, e.stream_id, e.error_code, e.message) ==
                              (4242, STREAM, ErrorCode.IMAGE_REJECTED, "not wanted here") for e in errors)
        wait_until(lambda: system(cl, ERROR_FRAMES_SENT) >= len(errors), what="error frames counted")
        with pytest.raises(RegistrationError, match="Unable to resolve image"):
            image.reject("again")  # gone: aeronmd's answer for an unknown image


def test_a_publisher_counts_the_error_frames_of_a_rejected_image(tmp_path: Path) -> None:
    """The publication's sender (the same driver) sees the ERR frames (Error Frames received) once its
    subscriber rejected the image, and records the publication error in the error log as aeronmd does."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", image_liveness_timeout_ns=1_000_000_000) as drv, \
            logbuf.connect(drv.directory) as cl:
        sub = cl.add_subscription(channel(port), STREAM)
        pub = cl.add_publication(channel(port), STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connection")
        sub.images[0].reject("stop")
        wait_until(lambda: system(cl, ERROR_FRAMES_RECEIVED) > 0, timeout=10, what="the sender to see ERR frames")
        # the receiver agent publishes its counts on its own cadence: the sender may count them first
        wait_until(lambda: system(cl, ERROR_FRAMES_SENT) > 0, what="the receiver's count of ERR frames sent")
        expected = (f"onPublicationError: registrationId={pub.registration_id}, sessionId={pub.session_id}, "
                    f"streamId={STREAM}, errorCode={int(ErrorCode.IMAGE_REJECTED)}")
        wait_until(lambda: any(expected in o.text for o in drv.cnc.error_log_reader()),
                   what="the publication error in the error log")


@pytest.mark.parametrize(("fc", "gtag"), [("|fc=min,t:60s", ""), ("|fc=tagged,g:5/1,t:60s", "|gtag=5")])
def test_a_publication_whose_only_receiver_rejected_it_is_not_connected(tmp_path: Path, fc: str, gtag: str) -> None:
    """The receiver that rejected the image leaves the sender's flow control at once (its ERR frame), as on
    aeronmd: the publication is no longer connected (offers answer NOT_CONNECTED) long before the receiver
    timeout (60 s here) would drop it, and the image is still there (its liveness has not run out)."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", image_liveness_timeout_ns=60_000_000_000) as drv, \
            logbuf.connect(drv.directory) as cl:
        sub = cl.add_subscription(channel(port, gtag), STREAM)
        pub = cl.add_publication(channel(port, fc), STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connection")
        sub.images[0].reject("stop")
        wait_until(lambda: not pub.is_connected, timeout=20, what="the publication to see it is not connected")
        assert sub.images and pub.offer(b"after") == logbuf.NOT_CONNECTED
