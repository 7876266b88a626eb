"""UDP publications and subscriptions through one embedded driver (loopback 127.0.0.1): data, counters,
flow control, pub-lmt and cleaning, loss recovery, end of stream, image liveness, channel errors."""

from __future__ import annotations

import errno
import os
import random
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from udp_rig import (
    BYTES_RECEIVED,
    BYTES_SENT,
    LOSS_GAP_FILLS,
    NAKS_RECEIVED,
    NAKS_SENT,
    RETRANSMITS_SENT,
    RETRANSMITTED_BYTES,
    SENDER_FLOW_CONTROL_LIMITS,
    STATUS_MESSAGES_RECEIVED,
    STATUS_MESSAGES_SENT,
    Received,
    counter,
    free_udp_port,
    message,
    publish,
    system,
)

import logbuf
from logbuf.cnc import counters as c
from logbuf.cnc.loss_report import LossReportFile
from logbuf.cnc.messages import ErrorCode
from logbuf.directory import IMAGES_DIR, LOSS_REPORT_FILE
from logbuf.driver.agents import THREADING_MODES
from logbuf.logbuffer import descriptor as d
from logbuf.protocol import DataHeader, Nak, SetupFrame, StatusMessage, classify, encode_data_frame
from support import running_driver, wait_until

pytestmark = pytest.mark.timeout(60)
STREAM = 1001
T = 64 * 1024


@pytest.fixture
def driver(tmp_path: Path, threading_mode: str | None):  # type: ignore[no-untyped-def]
    # threading_mode: when a test parametrises it, the driver runs its agents in that mode
    yield from running_driver(tmp_path / "drv", idle_strategy="backoff:1000000", timer_interval_ns=50_000_000,
                              publication_linger_timeout_ns=2_000_000_000)



def channel(port: int, extra: str = "") -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k{extra}"


def sequenced(count: int, seed: int, sizes: tuple[int, ...]) -> list[bytes]:
    rng = random.Random(seed)
    return [message(i, rng.choice(sizes)) for i in range(count)]


@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)
def test_loopback_delivers_every_message_in_order_with_counters(client, driver, threading_mode) -> None:  # type: ignore[no-untyped-def]
    assert driver.ctx.threading_mode == threading_mode
    port = free_udp_port()
    images: list[logbuf.Image] = []
    sub = client.add_subscription(channel(port), STREAM, on_available_image=images.append)
    pub = client.add_publication(channel(port), STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connection")
    sent = sequenced(3000, seed=1, sizes=(8, 100, 1000, 3000))  # 3000 B: fragmented over datagrams
    received = Received()
    publish(pub, sent, between=lambda: received.poll(sub))
    wait_until(lambda: len(received.sequences) == len(sent), poll=lambda: received.poll(sub), what="all messages")
    assert received.sequences == list(range(len(sent))) and received.corrupt == 0

    # the image is an ordinary image to the client: its log under images/, a sub-pos counter, a source
    image = sub.images[0]
    assert images == [image] and image.session_id == pub.session_id
    assert Path(image.log.path).parent == Path(driver.directory) / IMAGES_DIR
    assert Path(image.log.path).name == f"{image.correlation_id}.logbuffer"
    host, _, src_port = image.source_identity.rpartition(":")
    assert host == "127.0.0.1" and src_port.isdigit() and int(src_port) != port

    end = pub.position
    snd_pos = counter(client, c.SENDER_POSITION_TYPE_ID, pub.registration_id)
    wait_until(lambda: client.counters.counter_value(snd_pos.counter_id) == end, what="snd-pos at the end")
    for type_id in (c.PUBLISHER_POSITION_TYPE_ID, c.SENDER_POSITION_TYPE_ID):
        info = counter(client, type_id, pub.registration_id)
        assert info.label.endswith(f"{pub.registration_id} {pub.session_id} {STREAM} {channel(port)} ")
    snd_lmt = client.counters.counter_value(counter(client, c.SENDER_LIMIT_TYPE_ID, pub.registration_id).counter_id)
    assert end < snd_lmt <= end + T // 2  # the receiver's window (min(128k, T/2)) from its last SM
    for type_id, registration_id in ((c.RECEIVER_HWM_TYPE_ID, image.correlation_id),
                                     (c.RECEIVER_POSITION_TYPE_ID, image.correlation_id),
                                     (c.SUBSCRIBER_POSITION_TYPE_ID, sub.registration_id)):
        info = counter(client, type_id, registration_id)
        wait_until(lambda i=info: client.counters.counter_value(i.counter_id) == end, what=f"{info.label} at end")
    # Aeron's sub-pos: keyed and labelled by the subscription, owned by its client, referring to the image
    sub_pos = counter(client, c.SUBSCRIBER_POSITION_TYPE_ID, sub.registration_id)
    assert sub_pos.label.endswith(" @0") and sub_pos.registration_id == sub.registration_id
    assert (sub_pos.owner_id, sub_pos.reference_id) == (client.client_id, image.correlation_id)
    payload = sum(len(m) for m in sent)
    # one driver at both ends of a loss-free loopback: every byte it sent, it received
    wait_until(lambda: system(client, BYTES_RECEIVED) == system(client, BYTES_SENT) > payload, what="bytes counted")
    assert system(client, STATUS_MESSAGES_SENT) > 0 and system(client, STATUS_MESSAGES_RECEIVED) > 0
    assert system(client, NAKS_SENT) == 0  # loopback lost nothing


def test_network_publication_pub_lmt_follows_snd_pos_and_cleaning_keeps_one_term(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    pub = client.add_publication(channel(port), STREAM)
    pub_lmt = counter(client, c.PUBLISHER_LIMIT_TYPE_ID, pub.registration_id).counter_id
    snd_pos = counter(client, c.SENDER_POSITION_TYPE_ID, pub.registration_id).counter_id
    value = client.counters.counter_value
    # no receiver: nothing may be appended past what was sent
    assert pub.offer(b"x" * 100) == logbuf.NOT_CONNECTED and not pub.is_connected
    assert value(pub_lmt) == value(snd_pos) == 0
    sub = client.add_subscription(channel(port), STREAM)
    wait_until(lambda: pub.is_connected, what="connection")
    wait_until(lambda: value(pub_lmt) == value(snd_pos) + T // 2, what="pub-lmt = snd-pos + window")
    received = Received()
    sent = [message(i, 200) for i in range(2500)]  # ~8 terms of 64 KiB
    publish(pub, sent, between=lambda: received.poll(sub))
    wait_until(lambda: len(received.sequences) == len(sent), poll=lambda: received.poll(sub), what="delivery")
    end = pub.position
    wait_until(lambda: value(snd_pos) == end, what="snd-pos")
    assert end - T // 2 <= value(pub_lmt) - T // 2 <= end  # snd-pos + window, within the trip gain
    assert value(pub_lmt) >= end + T // 2 - T // 16

    # the term behind snd-pos is intact (retransmits read it); older space is cleaned
    words = pub.log.terms.view.cast("i")
    bits = d.position_bits_to_shift(T)

    def frame_word(position: int) -> int:
        index = d.index_by_position(position, bits)
        return words[(index * T + (position & (T - 1))) >> 2]

    frame = 256  # each message is one 256-byte frame, at positions that are multiples of 256
    for position in range(end - T, end, frame):
        assert frame_word(position) == 232, f"frame at {position} (snd-pos {end}) was cleaned"
    cleaned = [frame_word(p) for p in range(end - 2 * T, end - T - T // 2, frame)]
    assert cleaned and all(word == 0 for word in cleaned)


@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)
def test_slow_subscriber_throttles_the_sender_and_nothing_is_lost(client, driver, threading_mode) -> None:  # type: ignore[no-untyped-def]
    assert driver.ctx.threading_mode == threading_mode
    port = free_udp_port()
    sub = client.add_subscription(channel(port), STREAM)
    pub = client.add_publication(channel(port), STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connection")
    received = Received()
    sent = [message(i, 500) for i in range(800)]  # ~6 receiver windows of 32 KiB
    ticks = [0]

    def slow() -> bool:
        ticks[0] += 1
        if ticks[0] % 8 == 0:
            received.poll(sub, 2)  # two fragments now and then: far slower than the sender
        return False

    publish(pub, sent, between=slow)
    wait_until(lambda: len(received.sequences) == len(sent), poll=lambda: received.poll(sub, 4), what="delivery")
    assert received.sequences == list(range(len(sent))) and received.corrupt == 0
    bpe = counter(client, c.SENDER_BPE_TYPE_ID, pub.registration_id)
    assert client.counters.counter_value(bpe.counter_id) > 0
    wait_until(lambda: system(client, SENDER_FLOW_CONTROL_LIMITS) > 0, what="flow control limits counted")
    assert system(client, NAKS_SENT) == 0  # held back by the window, never overrun


def _stream_once_in_order(cl: logbuf.Client, port: int, count: int, seed: int, what: str) -> logbuf.Publication:
    """``count`` sequenced messages of mixed sizes (some fragmented) over ``port``: each arrives once, in order,
    intact; returns the publication."""
    sub = cl.add_subscription(channel(port), STREAM)
    pub = cl.add_publication(channel(port), STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connection")
    received = Received()
    sent = sequenced(count, seed=seed, sizes=(40, 300, 1500, 2500))
    publish(pub, sent, between=lambda: received.poll(sub), timeout=40)
    wait_until(lambda: len(received.sequences) == len(sent), timeout=30, poll=lambda: received.poll(sub), what=what)
    assert received.sequences == list(range(len(sent))) and received.corrupt == 0
    return pub


@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)
def test_send_impairment_in_the_native_sender_every_message_once_and_in_order(tmp_path: Path,
                                                                             threading_mode: str) -> None:
    """``--impair-send``: the sender agent drops, reorders, duplicates and delays what it sends (SETUP, data,
    heartbeats, retransmits) with its own seeded dice; the receiver NAKs the holes and gets everything once."""
    spec = "drop=0.05,reorder=0.05,duplicate=0.02,delay=20us,reorder-delay=300us,seed=5"
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "lossy", send_impairment=spec, idle_strategy="backoff:200000") as drv, \
            logbuf.connect(drv.directory) as cl:
        assert drv.ctx.threading_mode == threading_mode
        _stream_once_in_order(cl, port, 1500, seed=4, what="all messages through the impaired sender")
        wait_until(lambda: system(cl, RETRANSMITS_SENT) > 0, what="retransmits counted")
        assert system(cl, NAKS_SENT) > 0 and system(cl, NAKS_RECEIVED) > 0


@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)
def test_lossy_network_every_message_once_and_in_order(tmp_path: Path, threading_mode: str) -> None:
    spec = "drop=0.05,reorder=0.05,duplicate=0.02,delay=20us,reorder-delay=300us,seed=11"
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "lossy", receive_impairment=spec, idle_strategy="backoff:200000") as drv, \
            logbuf.connect(drv.directory) as cl:
        assert drv.ctx.threading_mode == threading_mode
        pub = _stream_once_in_order(cl, port, 2000, seed=3, what="all messages through the lossy network")
        wait_until(lambda: system(cl, RETRANSMITTED_BYTES) > 0, what="retransmits counted")
        assert system(cl, NAKS_SENT) > 0 and system(cl, NAKS_RECEIVED) > 0 and system(cl, RETRANSMITS_SENT) > 0
        # every NAK is a loss observation of the image's entry in loss-report.dat
        with LossReportFile.open(Path(drv.directory) / LOSS_REPORT_FILE) as report:
            wait_until(lambda: [e.observation_count for e in report.entries()] == [system(cl, NAKS_SENT)],
                     what="one loss report entry counting every NAK")
            (entry,) = report.entries()
        assert (entry.session_id, entry.stream_id) == (pub.session_id, STREAM)
        assert f"127.0.0.1:{port}" in entry.channel and entry.source.startswith("127.0.0.1:")
        assert entry.total_bytes_lost >= 32 * entry.observation_count
        assert entry.first_observation_ms <= entry.last_observation_ms


def test_closed_publication_ends_the_stream_and_the_image_goes(client, driver) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    gone: list[logbuf.Image] = []
    sub = client.add_subscription(channel(port), STREAM, on_unavailable_image=gone.append)
    pub = client.add_publication(channel(port), STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connection")
    image = sub.images[0]
    path = Path(image.log.path)
    received = Received()
    publish(pub, [message(i, 64) for i in range(100)])
    pub.close()
    wait_until(lambda: bool(gone), poll=lambda: received.poll(sub), what="the image to go at end of stream")
    assert gone == [image] and received.sequences == list(range(100))
    assert image.log.end_of_stream_position == 100 * 96
    wait_until(lambda: not path.exists(), what="the image file deleted")
    # the publication drained (its receiver acknowledged the end): counters freed, socket closed
    wait_until(lambda: not [i for i in client.counters if i.type_id == c.SENDER_POSITION_TYPE_ID], what="drained")


def test_a_silent_sender_s_image_times_out(tmp_path: Path) -> None:
    """A hand-made sender on a plain socket: SETUP, data, then silence; the image goes after the liveness
    timeout and subscribers are told.  Its SMs come back to the socket."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", image_liveness_timeout_ns=300_000_000) as drv, \
            logbuf.connect(drv.directory) as cl, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.bind(("127.0.0.1", 0))
        raw.settimeout(5)
        gone: list[logbuf.Image] = []
        sub = cl.add_subscription(channel(port), STREAM, on_unavailable_image=gone.append)
        setup = SetupFrame(0, 4242, STREAM, 9, 9, T, 1408, 0)
        raw.sendto(setup.encode(), ("127.0.0.1", port))
        wait_until(lambda: sub.images, what="the image")
        sm = classify(raw.recv(2048)).frames[0]  # type: ignore[union-attr]
        assert isinstance(sm, StatusMessage) and (sm.session_id, sm.stream_id) == (4242, STREAM)
        assert sm.receiver_window == T // 2 and sm.position(16, 9) == 0
        raw.sendto(encode_data_frame(b"hello", term_offset=0, session_id=4242, stream_id=STREAM, term_id=9),
                   ("127.0.0.1", port))
        got: list[bytes] = []
        wait_until(lambda: got, poll=lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10), what="the data")
        assert got == [b"hello"]
        silent_since = time.monotonic()
        wait_until(lambda: gone, timeout=5, what="the image to time out")
        assert 0.25 < time.monotonic() - silent_since < 3
        assert not sub.images


def test_heartbeats_keep_an_idle_image_alive(tmp_path: Path) -> None:
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", image_liveness_timeout_ns=400_000_000) as drv, \
            logbuf.connect(drv.directory) as cl:
        sub = cl.add_subscription(channel(port), STREAM)
        pub = cl.add_publication(channel(port), STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connection")
        assert pub.offer(b"x" * 10) > 0
        time.sleep(1.2)  # let time pass: three liveness timeouts with nothing but heartbeats
        assert len(sub.images) == 1 and pub.is_connected
        assert system(cl, 9) >= 5 and system(cl, 10) >= 5  # Heartbeats sent / received


def test_subscriber_waiting_on_a_network_image_is_woken(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    sub = client.add_subscription(channel(port), STREAM)
    pub = client.add_publication(channel(port), STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connection")
    woke: list[float] = []

    def waiter() -> None:
        start = time.monotonic()
        if sub.wait(5.0):
            woke.append(time.monotonic() - start)

    thread = threading.Thread(target=waiter)
    thread.start()
    meta = sub.images[0].log.meta  # the waiter declares itself in the image's log before it sleeps
    wait_until(lambda: meta.get_i32_acquire(d.LOG_WAITING_SUBSCRIBERS_OFFSET) == 1, what="the waiter asleep")
    assert pub.offer(b"wake up") > 0
    thread.join(6)
    assert woke and woke[0] < 1.0


def test_late_subscription_joins_a_live_image(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    first = client.add_subscription(channel(port), STREAM)
    pub = client.add_publication(channel(port), STREAM)
    wait_until(lambda: pub.is_connected and first.images, what="connection")
    early = Received()
    publish(pub, [message(i, 100) for i in range(50)], between=lambda: early.poll(first))
    wait_until(lambda: len(early.sequences) == 50, poll=lambda: early.poll(first), what="first 50")
    second = client.add_subscription(channel(port), STREAM)
    wait_until(lambda: second.images, what="the second subscription's image")
    assert second.images[0].correlation_id == first.images[0].correlation_id  # one image, two sub-pos
    late = Received()
    publish(pub, [message(50 + i, 100) for i in range(50)], between=lambda: early.poll(first))
    wait_until(lambda: len(late.sequences) == 50 and len(early.sequences) == 100,
             poll=lambda: late.poll(second) + early.poll(first), what="both subscriptions")
    assert late.sequences == list(range(50, 100)) and early.sequences == list(range(100))


@pytest.mark.parametrize("bad", [
    "aeron:udp?endpoint=127.0.0.1:0",  # no port
    "aeron:udp?endpoint=no.such.host.invalid:40000",
    "aeron:udp?endpoint=239.1.1.2:40000",  # a multicast data group must be odd
    "aeron:udp?endpoint=127.0.0.1:40000|fc=fastest",
    "aeron:udp?endpoint=127.0.0.1:40000|ttl=300",
    "aeron:udp?endpoint=127.0.0.1:40000|term-length=3k",
])
def test_bad_udp_channels_are_refused(client, bad: str) -> None:  # type: ignore[no-untyped-def]
    for add in (client.add_publication, client.add_subscription):
        with pytest.raises(logbuf.RegistrationError) as info:
            add(bad, STREAM)
        # a host that does not resolve is Aeron's UNKNOWN_HOST; every other bad channel INVALID_CHANNEL
        expected = ErrorCode.UNKNOWN_HOST if ".invalid:" in bad else ErrorCode.INVALID_CHANNEL
        assert info.value.code == expected


def test_an_endpoint_someone_else_bound_is_refused_with_the_os_error_as_aeronmd_does(client) -> None:  # type: ignore[no-untyped-def]
    """GENERIC_ERROR with "(98) Address already in use" first, for a subscription and for a publication's
    control address (Aeron's clients take CHANNEL_ENDPOINT_ERROR for a later failure, not an answer)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        for add in (lambda: client.add_subscription(channel(port), STREAM),
                    lambda: client.add_publication(f"aeron:udp?control=127.0.0.1:{port}|control-mode=dynamic", STREAM)):
            with pytest.raises(logbuf.RegistrationError) as info:
                add()
            assert info.value.code == ErrorCode.GENERIC_ERROR
            assert f"GENERIC_ERROR: ({errno.EADDRINUSE}) {os.strerror(errno.EADDRINUSE)}\n" in str(info.value)
    sub = client.add_subscription(channel(port), STREAM)  # free again: fine now
    sub.close()


def test_publications_share_a_session_per_stream_and_exclusive_ones_do_not(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    a = client.add_publication(channel(port), STREAM)
    b = client.add_publication(channel(port), STREAM)
    x = client.add_exclusive_publication(channel(port), STREAM)
    other = client.add_publication(channel(port), STREAM + 1)
    assert a.session_id == b.session_id and a.log.path == b.log.path
    assert len({a.session_id, x.session_id}) == 2 and other.stream_id == STREAM + 1
    with pytest.raises(logbuf.RegistrationError, match="existing publication has different 'mtu'"):
        client.add_publication(channel(port, "|mtu=4096"), STREAM)
    sends = [i for i in client.counters if i.type_id == c.SEND_CHANNEL_STATUS_TYPE_ID]
    assert len(sends) == 1 and sends[0].value == 1  # one socket for all of them, ACTIVE


def test_multiple_streams_on_one_channel_are_separated(client) -> None:  # type: ignore[no-untyped-def]
    port = free_udp_port()
    subs = {s: client.add_subscription(channel(port), s) for s in (1, 2)}
    pubs = {s: client.add_publication(channel(port), s) for s in (1, 2)}
    wait_until(lambda: all(p.is_connected for p in pubs.values()) and all(s.images for s in subs.values()),
             what="both streams")
    got: dict[int, list[bytes]] = {1: [], 2: []}
    for s in (1, 2):
        publish(pubs[s], [f"{s}-{i}".encode() for i in range(20)])
    wait_until(lambda: len(got[1]) == 20 and len(got[2]) == 20,
             poll=lambda: sum(sub.poll(lambda b, h, s=s: got[s].append(bytes(b)), 10) for s, sub in subs.items()),
             what="both streams' messages")
    for s in (1, 2):
        assert got[s] == [f"{s}-{i}".encode() for i in range(20)]


def test_udp_counters_have_their_types_and_stat_shows_them(client, driver) -> None:  # type: ignore[no-untyped-def]
    from logbuf.directory import cnc_path
    from logbuf.tools import read_stat

    port = free_udp_port()
    sub = client.add_subscription(channel(port), STREAM)
    pub = client.add_publication(channel(port), STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connection")
    types = {info.type_id for info in client.counters}
    assert {1, 2, 3, 4, 5, 6, 7, 9, 12, 13} <= types
    stat = read_stat(cnc_path(driver.directory)).to_dict()
    text = str(stat)
    for name in ("snd-pos", "snd-lmt", "snd-bpe", "rcv-hwm", "rcv-pos", "sub-pos", "snd-channel", "rcv-channel"):
        assert name in text


def test_data_for_an_unknown_session_asks_for_a_setup(client) -> None:  # type: ignore[no-untyped-def]
    """A receiver that joins mid-stream (no SETUP seen) asks the sender for one with an SM flag 0x80."""
    port = free_udp_port()
    client.add_subscription(channel(port), STREAM)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.bind(("127.0.0.1", 0))
        raw.settimeout(5)
        raw.sendto(DataHeader.heartbeat(77, STREAM, 3, 4096).encode(), ("127.0.0.1", port))
        sm = classify(raw.recv(2048)).frames[0]  # type: ignore[union-attr]
    assert isinstance(sm, StatusMessage) and sm.is_setup_requested and sm.session_id == 77


def test_a_hand_made_receiver_connects_a_publication(client) -> None:  # type: ignore[no-untyped-def]
    """A hand-made receiver: the driver's sender SETUPs it, and its SM opens the sender's window."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.bind(("127.0.0.1", 0))
        raw.settimeout(5)
        port = raw.getsockname()[1]
        pub = client.add_publication(channel(port), STREAM)
        datagram, sender = raw.recvfrom(2048)
        setup = classify(datagram).frames[0]  # type: ignore[union-attr]
        assert isinstance(setup, SetupFrame) and setup.session_id == pub.session_id and setup.term_length == T
        sm = StatusMessage.at_position(setup.session_id, STREAM, 0, 16, setup.initial_term_id, 4096, 5)
        raw.sendto(sm.encode(), sender)
        wait_until(lambda: pub.is_connected, what="connected by our SM")
        assert pub.offer(b"q" * 100) > 0
        while True:  # SETUPs may still be in flight; the data follows
            packet = classify(raw.recv(2048))
            if not hasattr(packet, "frames"):
                break
        header = packet.header  # type: ignore[union-attr]
        assert header.session_id == pub.session_id and header.frame_length == 132 and packet.length == 160


def test_driver_directory_is_cleaned_of_images_on_close(tmp_path: Path) -> None:
    port = free_udp_port()
    drv = logbuf.MediaDriver.launch(tmp_path / "drv")
    with logbuf.connect(drv.directory) as cl:
        sub = cl.add_subscription(channel(port), STREAM)
        pub = cl.add_publication(channel(port), STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connection")
        images_dir = Path(drv.directory) / IMAGES_DIR
        assert os.listdir(images_dir)
    drv.close()
    assert not images_dir.exists()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", port))  # the receive socket was closed


def test_ipv6_loopback_and_subscriptions_sharing_one_receive_socket(client) -> None:  # type: ignore[no-untyped-def]
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("::1", 0))
        except OSError as exc:
            pytest.skip(f"no IPv6 loopback: {exc}")
        port = probe.getsockname()[1]
    ch = f"aeron:udp?endpoint=[::1]:{port}|term-length=64k"
    sub = client.add_subscription(ch, STREAM)
    # a unicast receiver binds the endpoint; an interface parameter does not make it another socket
    also = client.add_subscription(f"aeron:udp?endpoint=[::1]:{port}|interface=::1", STREAM)
    pub = client.add_publication(ch, STREAM)
    wait_until(lambda: pub.is_connected and sub.images and also.images, what="IPv6 connection")
    assert sub.images[0].source_identity.startswith("[::1]:")
    assert len([i for i in client.counters if i.type_id == c.RECEIVE_CHANNEL_STATUS_TYPE_ID]) == 1
    received = Received()
    publish(pub, [message(i, 64) for i in range(100)], between=lambda: received.poll(sub) + also.poll(
        lambda b, h: None, 100))
    wait_until(lambda: len(received.sequences) == 100, poll=lambda: received.poll(sub) + also.poll(
        lambda b, h: None, 100), what="delivery over IPv6")
    assert received.sequences == list(range(100))


def test_a_gap_nobody_repairs_is_nakked_then_filled_and_subscribers_move_on(tmp_path: Path) -> None:
    """A hand-made sender skips one frame and never answers NAKs: the driver NAKs the exact range, gives up
    after its loss give-up time, fills the gap with padding (Loss gap fills) and the subscriber reads on."""
    port = free_udp_port()
    with logbuf.MediaDriver.launch(tmp_path / "drv", loss_give_up_ns=300_000_000) as drv, \
            logbuf.connect(drv.directory) as cl, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.bind(("127.0.0.1", 0))
        raw.settimeout(5)
        sub = cl.add_subscription(channel(port), STREAM)
        raw.sendto(SetupFrame(0, 4242, STREAM, 9, 9, T, 1408, 0).encode(), ("127.0.0.1", port))
        wait_until(lambda: sub.images, what="the image")
        for offset, payload in ((0, b"first"), (128, b"third")):  # each a 64-byte frame: [64, 128) never comes
            raw.sendto(encode_data_frame(payload, term_offset=offset, session_id=4242, stream_id=STREAM,
                                         term_id=9), ("127.0.0.1", port))
        naks = []
        deadline = time.monotonic() + 2
        while not naks and time.monotonic() < deadline:
            frames = getattr(classify(raw.recv(2048)), "frames", ())
            naks = [f for f in frames if isinstance(f, Nak)]
        assert naks and (naks[0].term_id, naks[0].term_offset, naks[0].length) == (9, 64, 64)
        got: list[bytes] = []
        wait_until(lambda: len(got) == 2, poll=lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10),
                 what="the subscriber past the filled gap")
        assert got == [b"first", b"third"]
        wait_until(lambda: system(cl, LOSS_GAP_FILLS) == 1, what="one gap fill counted")
        assert system(cl, NAKS_SENT) >= 1


def test_setup_repeats_every_100_ms_until_a_status_message(client) -> None:  # type: ignore[no-untyped-def]
    """SETUPs keep coming while no status message answers, never closer than the 100 ms SETUP timeout apart.
    The kernel stamps each arrival (SO_TIMESTAMPNS), so a test thread that was starved on a busy machine and
    reads two queued SETUPs at once does not see them as close; a starved driver only sends them later."""
    so_timestampns = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux value; the socket module may lack it
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.bind(("127.0.0.1", 0))
        raw.setsockopt(socket.SOL_SOCKET, so_timestampns, 1)
        raw.settimeout(5)
        client.add_publication(channel(raw.getsockname()[1]), STREAM)
        arrivals: list[float] = []
        while len(arrivals) < 4:
            datagram, ancillary, _, _ = raw.recvmsg(2048, socket.CMSG_SPACE(16))
            if isinstance(getattr(classify(datagram), "frames", (None,))[0], SetupFrame):
                stamps = [struct.unpack("qq", data[:16]) for level, kind, data in ancillary
                          if level == socket.SOL_SOCKET and kind == so_timestampns]
                assert stamps, "the kernel did not stamp the datagram"
                arrivals.append(stamps[0][0] + stamps[0][1] / 1e9)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert all(gap > 0.08 for gap in gaps), gaps
