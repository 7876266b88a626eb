"""Aeron's sender -> our receiver: the datagrams aeronmd sent (captured on loopback) rebuild the exact image.

The captures hold 2000 messages of 100 bytes on 64 KiB terms: every term ends with DATA frames and a PAD header
in one datagram, heartbeats run while idle and end-of-stream heartbeats after the close.  In the lossy capture
Aeron's loss generator dropped datagrams inside the receiving driver, after the capture point: the first copy
of every datagram that was retransmitted is the one that was lost, so the replay drops it too, and our
receiver must NAK exactly the ranges Aeron's receiver NAKed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from aeron_vectors import UdpPacket, udp_packets

from logbuf import LogBuffers
from logbuf.driver.agents import THREADING_MODES
from logbuf.driver.udp import CreateImage, ImageReceiver, ImageState, ReceiverDispatcher, Reply
from logbuf.driver.udp_transport import DATA, HEARTBEAT, PAD
from logbuf.logbuffer import descriptor as d
from logbuf.native import ffi, lib
from logbuf.protocol import (
    DataHeader,
    DataPacket,
    FrameType,
    Nak,
    PacketKind,
    SetupFrame,
    StatusMessage,
    classify,
)

MESSAGES = 2000
MESSAGE_LENGTH = 100  # streaming_publisher -L 100: the index as 8 bytes little-endian, then zeros
FRAME_LENGTH = 32 + MESSAGE_LENGTH
ALIGNED_FRAME = 160
HEADER = struct.Struct("<iBBHiiiiq")
NATIVE_KIND = {PacketKind.DATA: DATA, PacketKind.PAD: PAD, PacketKind.HEARTBEAT: HEARTBEAT}


def expected_term(term_length: int, term_count: int, session_id: int, stream_id: int, initial_term_id: int,
                  first_message: int, end_offset: int) -> bytes:
    """What the sample's messages make of term ``term_count``: frames back to back from ``first_message``,
    then a PAD to the term end when the next frame does not fit; zeros from ``end_offset`` on."""
    term = bytearray(term_length)
    term_id = initial_term_id + term_count
    offset, message = 0, first_message
    while message < MESSAGES and offset < end_offset:
        if offset + ALIGNED_FRAME > term_length:
            HEADER.pack_into(term, offset, term_length - offset, 0, 0xC0, FrameType.PAD, offset, session_id,
                             stream_id, term_id, 0)
            break
        HEADER.pack_into(term, offset, FRAME_LENGTH, 0, 0xC0, FrameType.DATA, offset, session_id, stream_id,
                         term_id, 0)
        term[offset + 32 : offset + 40] = message.to_bytes(8, "little")
        offset += ALIGNED_FRAME
        message += 1
    return bytes(term)


def messages_in(term: bytes) -> list[int]:
    """The message indexes of the DATA frames of a term, in order (stops at the first empty slot)."""
    out = []
    offset = 0
    while offset < len(term):
        length, _, _, frame_type = HEADER.unpack_from(term, offset)[:4]
        if length <= 0:
            break
        if frame_type == FrameType.DATA:
            out.append(int.from_bytes(term[offset + 32 : offset + 40], "little"))
        offset += (length + 31) & -32
    return out


class Replay:
    """Feeds captured datagrams to a ReceiverDispatcher as the driver's receiver would, with a subscriber that
    keeps up (consumption = rebuild position); keeps each term as it completes, before cleaning reuses it."""

    def __init__(self, stream_id: int, make_log: Callable[..., LogBuffers]) -> None:
        self.dispatcher = ReceiverDispatcher(receiver_id=4242)
        self.dispatcher.add_subscription(stream_id)
        self.make_log = make_log
        self.image: ImageReceiver | None = None
        self.setup: SetupFrame | None = None
        self.terms: dict[int, bytes] = {}  # term count -> its bytes when the rebuild position left it
        self.naks: list[Nak] = []
        self.removed: list[ImageState] = []

    def feed(self, packet: UdpPacket) -> None:
        for _ in range(8):  # the receiver's timers (NAK delay, SM) fire between datagrams, as in the driver
            deadline = self.image.next_deadline_ns() if self.image is not None else packet.time_ns
            if deadline >= packet.time_ns:
                break
            self.poll(deadline)
        before = self.image.rebuild_position if self.image is not None else 0
        events = self.dispatcher.on_datagram(packet.payload, packet.time_ns, packet.source)
        self._handle(events, packet.time_ns)
        if self.image is not None:
            self._keep_completed_terms(before)
        self.poll(packet.time_ns)

    def poll(self, now_ns: int) -> None:
        image = self.image
        before = image.rebuild_position if image is not None else 0
        events = self.dispatcher.poll(now_ns, lambda img: img.rebuild_position)
        if image is not None:
            self._keep_completed_terms(before)  # before the next datagram: cleaning may reuse the term then
        self._handle(events, now_ns)

    def _keep_completed_terms(self, before: int) -> None:
        image = self.image
        assert image is not None
        bits = image.position_bits
        for term_count in range(before >> bits, image.rebuild_position >> bits):
            if term_count not in self.terms:
                self.terms[term_count] = self.term(term_count)

    def term(self, term_count: int) -> bytes:
        image = self.image
        assert image is not None
        index = term_count % 3
        return bytes(image.log.terms.view[index * image.term_length : (index + 1) * image.term_length])

    def _handle(self, events: list, now_ns: int) -> None:
        for event in events:
            if isinstance(event, CreateImage):
                setup = event.setup
                log = self.make_log(term_length=setup.term_length, initial_term_id=setup.initial_term_id,
                                    session_id=setup.session_id, stream_id=setup.stream_id)
                self.image = ImageReceiver(log, setup.join_position(), now_ns,
                                           receiver_id=self.dispatcher.receiver_id,
                                           counters=self.dispatcher.counters)
                self.dispatcher.add_image(self.image, event.source)
                self.setup = setup
            elif isinstance(event, Reply) and isinstance(event.frame, Nak):
                self.naks.append(event.frame)
            elif not isinstance(event, Reply):
                self.removed.append(event.reason)


def sender_datagrams(name: str) -> tuple[int, list[UdpPacket], list[UdpPacket]]:
    """(endpoint port, datagrams to the endpoint, datagrams from it) of a unicast capture."""
    packets = list(udp_packets(f"pcap/{name}"))
    port = packets[0].destination[1]  # the capture starts with the sender's first SETUP
    return port, [p for p in packets if p.destination[1] == port], [p for p in packets if p.source[1] == port]


def lost_datagrams(to_receiver: list[UdpPacket]) -> set[int]:
    """Indexes of data datagrams sent again later (retransmitted byte for byte: the first copy was lost)."""
    first: dict[bytes, int] = {}
    lost = set()
    for i, packet in enumerate(to_receiver):
        payload = packet.payload
        if len(payload) < 32 or int.from_bytes(payload[6:8], "little") != FrameType.DATA:
            continue
        if int.from_bytes(payload[0:4], "little", signed=True) == 0:
            continue  # idle heartbeats repeat unchanged: not retransmits
        if payload in first:
            lost.add(first[payload])
        else:
            first[payload] = i
    return lost


def replay(name: str, make_log: Callable[..., LogBuffers]) -> tuple[Replay, list[UdpPacket], set[int]]:
    _, to_receiver, from_receiver = sender_datagrams(name)
    setup = next(classify(p.payload).frames[0] for p in to_receiver  # type: ignore[union-attr]
                 if int.from_bytes(p.payload[6:8], "little") == FrameType.SETUP)
    lost = lost_datagrams(to_receiver)
    rig = Replay(setup.stream_id, make_log)
    for i, packet in enumerate(to_receiver):
        if i not in lost:
            rig.feed(packet)
    rig.poll(to_receiver[-1].time_ns + 1)
    return rig, from_receiver, lost


def check_image(rig: Replay) -> None:
    image, setup = rig.image, rig.setup
    assert image is not None and setup is not None
    T = setup.term_length
    final = MESSAGES * ALIGNED_FRAME + (MESSAGES * ALIGNED_FRAME // (T - T % ALIGNED_FRAME)) * (T % ALIGNED_FRAME)
    assert image.rebuild_position == image.hwm_position == final == image.end_of_stream_position
    last_term = final >> image.position_bits
    rig.terms[last_term] = rig.term(last_term)
    per_term = T // ALIGNED_FRAME
    seen: list[int] = []
    for term_count, term in sorted(rig.terms.items()):
        end = T if term_count < last_term else final & (T - 1)
        expected = expected_term(T, term_count, setup.session_id, setup.stream_id, setup.initial_term_id,
                                 term_count * per_term, end)
        assert term == expected, f"term {term_count} differs from what the sender wrote"
        seen += messages_in(term)
    assert seen == list(range(MESSAGES))
    assert sorted(rig.terms) == list(range(last_term + 1))
    assert image.counters.invalid_packets == 0
    assert image.counters.flow_control_over_runs == 0
    assert rig.removed == [ImageState.END_OF_STREAM]


def test_clean_capture_rebuilds_every_term_exactly(make_log: Callable[..., LogBuffers]) -> None:
    rig, from_receiver, lost = replay("unicast-clean.pcap", make_log)
    assert lost == set()
    check_image(rig)
    assert rig.naks == []


def test_lossy_capture_naks_what_aeron_naked_and_rebuilds_exactly(make_log: Callable[..., LogBuffers]) -> None:
    rig, from_receiver, lost = replay("unicast-loss.pcap", make_log)
    assert len(lost) == 11  # as the capture's notes say: 11 data datagrams dropped, each retransmitted once
    check_image(rig)
    aeron_naks = [frame for p in from_receiver
                  if int.from_bytes(p.payload[6:8], "little") == FrameType.NAK
                  for frame in classify(p.payload).frames]  # type: ignore[union-attr]
    assert len(aeron_naks) == 11
    ours = [(n.term_id, n.term_offset, n.length) for n in rig.naks]
    assert ours == [(n.term_id, n.term_offset, n.length) for n in aeron_naks]


@pytest.mark.parametrize("name", ["unicast-clean.pcap", "unicast-loss.pcap", "unicast-rttm-trimmed.pcap",
                                  "multicast-netns.pcap"])
def test_every_captured_datagram_passes_the_native_check_as_classify_says(name: str) -> None:
    """The driver's native data-plane check (its hot path) agrees with ``classify`` on every datagram Aeron
    sent, and none is malformed - DATA then PAD header at every term end included."""
    shapes = set()
    out = ffi.new("int32_t[2]")
    for packet in udp_packets(f"pcap/{name}"):
        raw = packet.payload
        parsed = classify(raw)
        kind = lib.lbn_classify_data(ffi.from_buffer("uint8_t[]", raw), len(raw), out, out + 1)
        if isinstance(parsed, DataPacket):
            assert (kind, out[0], out[1]) == (NATIVE_KIND[parsed.kind], parsed.frame_count, parsed.term_span)
            last_type = int.from_bytes(raw[len(raw) - 32 + 6 : len(raw) - 32 + 8], "little")
            shapes.add((parsed.kind, parsed.frame_count > 1 and last_type == FrameType.PAD))
            end = parsed.term_offset + parsed.term_span
            assert end <= 65536
        else:
            assert kind == lib.LBN_NOT_DATA
    assert (PacketKind.HEARTBEAT, False) in shapes
    if name.startswith("unicast-clean") or name.startswith("unicast-loss"):
        assert (PacketKind.DATA, True) in shapes  # DATA frames then a PAD header, at every term end


def test_position_of_the_last_message_matches_the_capture_notes() -> None:
    """The captures' notes: message i at i*160 plus 96 bytes skipped per term end; final position 320,384."""
    T = 65536
    assert d.compute_position(3, 0, 16, 0) == 3 * T
    final = MESSAGES * ALIGNED_FRAME + (MESSAGES * ALIGNED_FRAME // (T - T % ALIGNED_FRAME)) * (T % ALIGNED_FRAME)
    assert final == 320_384


@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)
def test_a_driver_rebuilds_aeron_s_datagrams_sent_to_it_on_loopback(tmp_path: Path, threading_mode: str) -> None:
    """The driver's own receive path (native check, native in-order rebuild), in each threading mode: the clean
    capture's datagrams, sent from a plain socket that honours the driver's status messages as Aeron's sender
    did, reach a subscriber as the 2000 messages in order, and none is counted invalid."""
    import socket
    import time

    import logbuf
    from logbuf.cnc.counters import SystemCounter
    from logbuf.samples.ports import free_udp_ports

    _, to_receiver, _ = sender_datagrams("unicast-clean.pcap")
    setup = next(classify(p.payload).frames[0] for p in to_receiver  # type: ignore[union-attr]
                 if int.from_bytes(p.payload[6:8], "little") == FrameType.SETUP)
    data_plane = [p.payload for p in to_receiver
                  if int.from_bytes(p.payload[6:8], "little") in (FrameType.DATA, FrameType.PAD)]
    bits = setup.term_length.bit_length() - 1
    port = free_udp_ports(1)[0]
    received: list[int] = []

    def on_fragment(buffer: memoryview, header: object) -> None:
        received.append(int.from_bytes(bytes(buffer[:8]), "little"))

    with logbuf.MediaDriver.launch(tmp_path / "drv", idle_strategy="backoff:200000") as driver, \
            logbuf.connect(driver.directory) as client, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        assert driver.ctx.threading_mode == threading_mode
        subscription = client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", setup.stream_id)
        sender.bind(("127.0.0.1", 0))
        sender.settimeout(0.001)
        limit = -1  # what the receiver's last SM lets the sender send up to

        def serve(deadline: float) -> None:
            nonlocal limit
            assert time.monotonic() < deadline, f"stalled after {len(received)} messages"
            subscription.poll(on_fragment, 256)
            try:
                raw = sender.recv(2048)
            except (TimeoutError, BlockingIOError):
                return
            for frame in classify(raw).frames:  # type: ignore[union-attr]
                if isinstance(frame, StatusMessage):
                    position = d.compute_position(frame.consumption_term_id, frame.consumption_term_offset, bits,
                                                  setup.initial_term_id)
                    limit = max(limit, position + frame.receiver_window)

        deadline = time.monotonic() + 20
        while limit < 0:  # SETUP until the receiver answers, as Aeron's sender does
            sender.sendto(setup.encode(), ("127.0.0.1", port))
            serve(deadline)
        for datagram in data_plane:
            header = DataHeader.decode(datagram, 0, len(datagram))
            end = d.compute_position(header.term_id, header.term_offset, bits, setup.initial_term_id) + len(datagram)
            while end > limit:
                serve(deadline)
            sender.sendto(datagram, ("127.0.0.1", port))
            serve(deadline)
        while len(received) < MESSAGES:
            serve(deadline)
        assert received == list(range(MESSAGES))
        assert client.counters.counter_value(SystemCounter.INVALID_PACKETS) == 0
