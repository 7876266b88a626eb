"""The native sender agent on its own - no conductor, no driver loop: commands in, a receiver's socket on the
other side.  It sends SETUP until the first status message, then moves snd-lmt, pub-lmt and the log's
isConnected flag itself (a starved conductor cannot hold a publisher back), sends committed frames and answers
RTT requests; hostile datagrams are counted and dropped; removals are acknowledged on its events queue."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from logbuf.channel import ChannelUri
from logbuf.driver.network_publication import NetworkPublication, NetworkPublicationPositions
from logbuf.driver.send_channel import SendChannelEndpoint
from logbuf.driver.sender import Sender
from logbuf.driver.udp.flow_control import UnicastFlowControl
from logbuf.driver.udp.retransmit import RetransmitHandler
from logbuf.driver.udp_channel import UdpChannel
from logbuf.driver.udp_transport import TransportRole, UdpTransport
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import lib
from logbuf.position import Position
from logbuf.protocol import RttMeasurement, StatusMessage, classify, encode_data_frame
from logbuf.protocol.datagram import ControlPacket, DataPacket
from logbuf.protocol.setup import SetupFrame
from support import wait_until

T = 64 * 1024
SESSION, STREAM, INITIAL_TERM_ID = 7, 9, 100


def test_the_sender_agent_alone_connects_moves_pub_lmt_sends_and_acknowledges_removals(tmp_path: Path) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    channel = UdpChannel.from_uri(ChannelUri.parse(f"aeron:udp?endpoint=127.0.0.1:{receiver.getsockname()[1]}"))
    transport = UdpTransport(channel, TransportRole.SEND)
    log = LogBuffers.create(tmp_path / "pub.logbuffer", term_length=T, session_id=SESSION, stream_id=STREAM,
                            initial_term_id=INITIAL_TERM_ID)
    invalid = Position.standalone()
    sender = Sender({"invalid_packets": invalid.pointer})
    try:
        endpoint = SendChannelEndpoint(channel, transport, endpoint_id=sender.next_endpoint_id())
        positions = NetworkPublicationPositions(*(Position.standalone() for _ in range(5)))
        publication = NetworkPublication(
            registration_id=42, channel=str(channel.uri), is_exclusive=True, log=log, sender=sender,
            endpoint_key=endpoint.key, endpoint_id=endpoint.endpoint_id, destination=channel.data.sockaddr,
            channel_status_id=-1, positions=positions, window_length=T // 2, max_datagrams=8,
            flow_control=UnicastFlowControl(), retransmit=RetransmitHandler(T, INITIAL_TERM_ID),
            now_ns=time.monotonic_ns(),
        )
        for command, fill in ((lib.LBD_SND_ADD_ENDPOINT, endpoint.fill_add_command),
                              (lib.LBD_SND_ADD_PUBLICATION, publication.fill_add_command)):
            c = sender.new_command(command)
            fill(c)
            sender.offer(c)
        duty, state = sender.native_duty()  # what a native agent runner calls: the same duty, through C
        assert duty(state, time.monotonic_ns()) > 0
        assert (sender.endpoint_count, sender.publication_count) == (1, 1) and sender.poll_events() == []

        def receive() -> tuple[object, tuple[str, int]]:
            data, source = receiver.recvfrom(65536)
            return classify(data), source

        # nothing connected: a SETUP goes, pub-lmt stays at snd-pos
        packet, source = receive()
        assert isinstance(packet, ControlPacket) and isinstance(packet.frames[0], SetupFrame)
        assert (packet.frames[0].session_id, packet.frames[0].term_length) == (SESSION, T)
        assert positions.pub_lmt.get() == 0 and not log.is_connected

        # a status message: the agent alone moves snd-lmt and pub-lmt and raises isConnected
        receiver.sendto(StatusMessage(SESSION, STREAM, INITIAL_TERM_ID, 0, T // 4, 1).encode(), source)
        wait_until(lambda: sender.do_work(time.monotonic_ns()) >= 0 and positions.pub_lmt.get() == T // 2,
                   what="pub-lmt = snd-pos + window")
        assert log.is_connected and positions.snd_lmt.get() == T // 4

        # a committed frame goes out whole; snd-pos and pub-pos follow
        frame = encode_data_frame(b"hello sender agent", term_offset=0, session_id=SESSION, stream_id=STREAM,
                                  term_id=INITIAL_TERM_ID)
        log.terms.view[: len(frame)] = frame
        log.meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET, d.pack_tail(INITIAL_TERM_ID, len(frame)))
        wait_until(lambda: sender.do_work(time.monotonic_ns()) >= 0 and positions.snd_pos.get() == len(frame),
                   what="snd-pos past the frame")
        assert positions.pub_pos.get() == len(frame)
        while True:  # heartbeats may come first
            packet, _ = receive()
            if isinstance(packet, DataPacket) and not packet.header.is_heartbeat:
                break
        assert packet.session_id == SESSION and packet.length == len(frame)

        # an RTT request is echoed; hostile bytes are counted and dropped
        receiver.sendto(RttMeasurement(SESSION, STREAM, 123456, 0, 1, 0x80).encode(), source)
        receiver.sendto(b"\x05\x00\x00\x00garbage", source)

        def rtt_reply() -> RttMeasurement | None:
            sender.do_work(time.monotonic_ns())
            packet, _ = receive()
            frame = packet.frames[0] if isinstance(packet, ControlPacket) else None
            return frame if isinstance(frame, RttMeasurement) else None

        reply = wait_until(rtt_reply, what="the RTT reply")
        assert reply.echo_timestamp_ns == 123456 and not reply.is_reply
        wait_until(lambda: sender.do_work(time.monotonic_ns()) >= 0 and invalid.get() == 1,
                   what="the garbage counted")

        # removals are acknowledged (only then may the log, counters and sockets go)
        for command, field, value in ((lib.LBD_SND_REMOVE_PUBLICATION, "publication_id", 42),
                                      (lib.LBD_SND_REMOVE_ENDPOINT, "endpoint_id", endpoint.endpoint_id)):
            c = sender.new_command(command)
            setattr(c, field, value)
            sender.offer(c)
        sender.do_work(time.monotonic_ns())
        events = [(e.type, e.publication_id, e.endpoint_id) for e in sender.poll_events()]
        assert events == [(lib.LBD_SND_PUBLICATION_REMOVED, 42, 0),
                          (lib.LBD_SND_ENDPOINT_REMOVED, 0, endpoint.endpoint_id)]
        assert (sender.endpoint_count, sender.publication_count) == (0, 0)
    finally:
        sender.close()
        transport.close()
        receiver.close()
        log.close()


def test_the_agent_on_its_own_thread_while_the_control_plane_adds_and_removes(tmp_path: Path) -> None:
    """The duty on another thread (as a native runner will run it; cffi releases the GIL) while this thread
    adds and removes endpoints and publications and a receiver sends status messages: every removal is
    acknowledged, and a log is closed only after its acknowledgement."""
    import threading

    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.setblocking(False)
    channel = UdpChannel.from_uri(ChannelUri.parse(f"aeron:udp?endpoint=127.0.0.1:{receiver.getsockname()[1]}"))
    sender = Sender()
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            if not sender.do_work(time.monotonic_ns()):
                time.sleep(0.0001)

    duty = threading.Thread(target=run, daemon=True)
    duty.start()
    acknowledged: set[int] = set()
    try:
        for round_ in range(20):
            transport = UdpTransport(channel, TransportRole.SEND)
            endpoint = SendChannelEndpoint(channel, transport, endpoint_id=sender.next_endpoint_id())
            c = sender.new_command(lib.LBD_SND_ADD_ENDPOINT)
            endpoint.fill_add_command(c)
            sender.offer(c)
            logs = []
            for i in range(3):
                registration_id = round_ * 10 + i
                log = LogBuffers.create(tmp_path / f"{registration_id}.logbuffer", term_length=T,
                                        session_id=SESSION + i, stream_id=STREAM, initial_term_id=INITIAL_TERM_ID)
                publication = NetworkPublication(
                    registration_id=registration_id, channel=str(channel.uri), is_exclusive=True, log=log,
                    sender=sender, endpoint_key=endpoint.key, endpoint_id=endpoint.endpoint_id,
                    destination=channel.data.sockaddr, channel_status_id=-1,
                    positions=NetworkPublicationPositions(*(Position.standalone() for _ in range(5))),
                    window_length=T // 2, max_datagrams=8, flow_control=UnicastFlowControl(),
                    retransmit=RetransmitHandler(T, INITIAL_TERM_ID), now_ns=time.monotonic_ns())
                c = sender.new_command(lib.LBD_SND_ADD_PUBLICATION)
                publication.fill_add_command(c)
                sender.offer(c)
                logs.append((registration_id, publication))  # its log and counters live until acknowledged
            sm = StatusMessage(SESSION, STREAM, INITIAL_TERM_ID, 0, T // 4, 1).encode()
            receiver.sendto(sm, transport.local_address.python)
            for registration_id, _ in logs:  # noqa: B007
                c = sender.new_command(lib.LBD_SND_REMOVE_PUBLICATION)
                c.publication_id = registration_id
                sender.offer(c)
            c = sender.new_command(lib.LBD_SND_REMOVE_ENDPOINT)
            c.endpoint_id = endpoint.endpoint_id
            sender.offer(c)

            def removed(logs: list[tuple[int, NetworkPublication]] = logs, endpoint_id: int = endpoint.endpoint_id
                        ) -> bool:
                for event in sender.poll_events():
                    assert event.type != lib.LBD_SND_COMMAND_REFUSED, event
                    if event.type == lib.LBD_SND_PUBLICATION_REMOVED:
                        acknowledged.add(event.publication_id)
                    elif event.type == lib.LBD_SND_ENDPOINT_REMOVED:
                        acknowledged.add(-event.endpoint_id)
                return all(r in acknowledged for r, _ in logs) and -endpoint_id in acknowledged

            wait_until(removed, what=f"round {round_}'s removals acknowledged")
            for _, publication in logs:
                publication.log.close()  # only now: the agent let go of it (and of its counters)
            transport.close()
    finally:
        stop.set()
        duty.join(10)
        sender.close()
        receiver.close()
    assert not duty.is_alive()


def _mdc_agent(tmp_path: Path, mode: str) -> tuple[Sender, SendChannelEndpoint, NetworkPublication, LogBuffers,
                                                  Position]:
    channel = UdpChannel.from_uri(ChannelUri.parse(f"aeron:udp?control=127.0.0.1:0|control-mode={mode}"))
    transport = UdpTransport(channel, TransportRole.SEND)
    log = LogBuffers.create(tmp_path / f"{mode}.logbuffer", term_length=T, session_id=SESSION, stream_id=STREAM,
                            initial_term_id=INITIAL_TERM_ID)
    sender = Sender()
    endpoint = SendChannelEndpoint(channel, transport, endpoint_id=sender.next_endpoint_id())
    positions = NetworkPublicationPositions(*(Position.standalone() for _ in range(5)))
    publication = NetworkPublication(
        registration_id=43, channel=str(channel.uri), is_exclusive=True, log=log, sender=sender,
        endpoint_key=endpoint.key, endpoint_id=endpoint.endpoint_id, destination=b"", channel_status_id=-1,
        positions=positions, window_length=T // 2, max_datagrams=8, flow_control=UnicastFlowControl(),
        retransmit=RetransmitHandler(T, INITIAL_TERM_ID, group_semantics=True), now_ns=0)
    for command, fill in ((lib.LBD_SND_ADD_ENDPOINT, endpoint.fill_add_command),
                          (lib.LBD_SND_ADD_PUBLICATION, publication.fill_add_command)):
        c = sender.new_command(command)
        fill(c)
        sender.offer(c)
    return sender, endpoint, publication, log, positions.snd_pos


def _receivers(count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        sockets.append(s)
    return sockets


def _drain(s: socket.socket) -> list[object]:
    packets = []
    while True:
        try:
            packets.append(classify(s.recv(65536)))
        except BlockingIOError:
            return packets


def _commit_frame(log: LogBuffers) -> int:
    frame = encode_data_frame(b"to every destination", term_offset=0, session_id=SESSION, stream_id=STREAM,
                              term_id=INITIAL_TERM_ID)
    log.terms.view[: len(frame)] = frame
    log.meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET, d.pack_tail(INITIAL_TERM_ID, len(frame)))
    return len(frame)


def _data_frames(packets: list[object]) -> int:
    return sum(1 for p in packets if isinstance(p, DataPacket) and not p.header.is_heartbeat)


def test_dynamic_mdc_destinations_are_the_sources_of_status_messages_and_time_out(tmp_path: Path) -> None:
    """Each receiver's SM (any session: a SETUP request for session 0 too) adds its source; every frame goes
    to each destination; one silent for 5 s is dropped, and comes back with its next SM."""
    sender, endpoint, _, log, snd_pos = _mdc_agent(tmp_path, "dynamic")
    receivers = _receivers(2)
    try:
        control = endpoint.transport.local_address.python
        sender.do_work(1)
        assert sender.destination_count(endpoint.endpoint_id) == 0
        receivers[0].sendto(StatusMessage(SESSION, STREAM, INITIAL_TERM_ID, 0, T // 4, 11).encode(), control)
        receivers[1].sendto(StatusMessage(0, STREAM, 0, 0, 0, 12, 0x80).encode(), control)  # a SETUP request
        now = 1_000_000
        wait_until(lambda: sender.do_work(now) >= 0 and sender.destination_count(endpoint.endpoint_id) == 2,
                   what="both receivers as destinations")
        end = _commit_frame(log)
        wait_until(lambda: sender.do_work(now) >= 0 and snd_pos.get() == end, what="the frame sent")
        got = [[], []]  # type: list[list[object]]
        wait_until(lambda: all(_data_frames(g.__iadd__(_drain(r)) or g) for g, r in zip(got, receivers, strict=True)),
                   what="the frame at both destinations")
        # 5 s without an SM from either: dropped (at the next send, a heartbeat here)
        later = now + 5_000_000_001 + 200_000_000
        sender.do_work(later)
        assert sender.destination_count(endpoint.endpoint_id) == 0
        receivers[0].sendto(StatusMessage(SESSION, STREAM, INITIAL_TERM_ID, 0, T // 4, 11).encode(), control)
        wait_until(lambda: sender.do_work(later) >= 0 and sender.destination_count(endpoint.endpoint_id) == 1,
                   what="the receiver back")
    finally:
        sender.close()
        endpoint.close()
        for r in receivers:
            r.close()
        log.close()


def test_manual_mdc_destinations_come_and_go_by_command_only(tmp_path: Path) -> None:
    sender, endpoint, _, log, snd_pos = _mdc_agent(tmp_path, "manual")
    receivers = _receivers(2)
    try:
        control = endpoint.transport.local_address.python

        def destination(command_type: int, r: socket.socket, correlation_id: int) -> None:
            c = sender.new_command(command_type)
            c.endpoint_id = endpoint.endpoint_id
            c.publication_id = correlation_id
            address = UdpChannel.from_uri(ChannelUri.parse(
                f"aeron:udp?endpoint=127.0.0.1:{r.getsockname()[1]}")).data.sockaddr
            c.destination_length = len(address)
            c.destination[0: len(address)] = address
            sender.offer(c)

        stranger = _receivers(1)[0]
        stranger.sendto(StatusMessage(SESSION, STREAM, INITIAL_TERM_ID, 0, T // 4, 99).encode(), control)
        for i, r in enumerate(receivers):
            destination(lib.LBD_SND_ADD_DESTINATION, r, 100 + i)
        wait_until(lambda: sender.do_work(time.monotonic_ns()) >= 0
                   and sender.destination_count(endpoint.endpoint_id) == 2, what="two destinations")
        for r in receivers:  # SETUPs or heartbeats go to each destination (none to the stranger: its SM added
            # nothing, though it counts for the publication, as on aeronmd)
            wait_until(lambda r=r: sender.do_work(time.monotonic_ns()) >= 0 and _drain(r),
                       what="a frame at the destination")
        assert _drain(stranger) == []
        destination(lib.LBD_SND_REMOVE_DESTINATION, receivers[1], 0)
        wait_until(lambda: sender.do_work(time.monotonic_ns()) >= 0
                   and sender.destination_count(endpoint.endpoint_id) == 1, what="one removed")
        receivers[0].sendto(StatusMessage(SESSION, STREAM, INITIAL_TERM_ID, 0, T // 4, 11).encode(), control)
        end = _commit_frame(log)
        wait_until(lambda: sender.do_work(time.monotonic_ns()) >= 0 and snd_pos.get() == end, what="the frame sent")
        _drain(receivers[1])
        wait_until(lambda: _data_frames(_drain(receivers[0])), what="the frame at the kept destination")
        assert _data_frames(_drain(receivers[1])) == 0
        stranger.close()
    finally:
        sender.close()
        endpoint.close()
        for r in receivers:
            r.close()
        log.close()
