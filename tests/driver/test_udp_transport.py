"""The driver's UDP plumbing on its own: the native data-plane check against ``classify``, batched
send/receive through real loopback sockets, channel resolution, and impairments in the datagram path."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from udp_fuzz_strategies import datagram, wellformed
from udp_rig import free_udp_port

from logbuf.channel import ChannelUri, InvalidChannelError
from logbuf.driver.udp import Impairment
from logbuf.driver.udp_channel import SocketAddress, UdpChannel, describe_sockaddr
from logbuf.driver.udp_transport import (
    DATA,
    HEARTBEAT,
    MALFORMED,
    NOT_DATA,
    PAD,
    TransportOptions,
    TransportRole,
    UdpTransport,
)
from logbuf.native import ffi, lib
from logbuf.protocol import DataPacket, MalformedFrameError, PacketKind, classify, encode_data_frame

NATIVE_KIND = {PacketKind.DATA: DATA, PacketKind.PAD: PAD, PacketKind.HEARTBEAT: HEARTBEAT}


def native_check(raw: bytes) -> tuple[int, int, int]:
    out = ffi.new("int32_t[2]")
    buffer = ffi.from_buffer("uint8_t[]", raw) if raw else ffi.new("uint8_t[1]")
    kind = lib.lbn_classify_data(buffer, len(raw), out, out + 1)
    return kind, out[0], out[1]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(datagram, wellformed()))
def test_native_data_check_agrees_with_classify(raw: bytes) -> None:
    kind, count, span = native_check(raw)
    try:
        packet = classify(raw)
    except MalformedFrameError:
        # a malformed control datagram is Python's to reject (the native check only says "not data")
        assert kind in (MALFORMED, NOT_DATA)
        if kind == NOT_DATA:
            assert len(raw) < 32 or int.from_bytes(raw[6:8], "little") not in (0, 1)
        return
    if isinstance(packet, DataPacket):
        assert (kind, count, span) == (NATIVE_KIND[packet.kind], packet.frame_count, packet.term_span)
    else:
        assert kind == NOT_DATA


def test_native_check_examples() -> None:
    frames = b"".join(encode_data_frame(b"x" * n, term_offset=64 + off, session_id=1, stream_id=2, term_id=3)
                      for n, off in ((10, 0), (40, 64), (3, 160)))
    assert native_check(frames) == (DATA, 3, len(frames))
    assert native_check(frames[:-5])[0] == MALFORMED  # the last frame runs past the datagram
    wrong_offset = bytearray(frames)
    wrong_offset[64 + 8] += 32
    assert native_check(bytes(wrong_offset))[0] == MALFORMED
    assert native_check(b"\x00" * 8)[0] == NOT_DATA


@pytest.fixture
def pair():  # type: ignore[no-untyped-def]
    port = free_udp_port()
    uri = ChannelUri.parse(f"aeron:udp?endpoint=127.0.0.1:{port}")
    channel = UdpChannel.from_uri(uri)
    receiver = UdpTransport(channel, TransportRole.RECEIVE, TransportOptions(receive_batch=8))
    sender = UdpTransport(channel, TransportRole.SEND)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()


def receive_all(transport: UdpTransport, count: int) -> list:
    got: list = []
    for _ in range(1000):
        got += [(bytes(r.datagram), r.source, r.kind, r.frame_count, r.term_span) for r in transport.receive()]
        if len(got) >= count:
            break
    return got


def test_batched_send_and_receive_keep_order_sources_and_kinds(pair) -> None:  # type: ignore[no-untyped-def]
    sender, receiver = pair
    frames = [encode_data_frame(bytes([i]) * (i + 1), term_offset=0, session_id=1, stream_id=2, term_id=3)
              for i in range(20)]
    frames.append(b"junk")
    assert sender.send(frames, sender.channel.data.sockaddr) == len(frames)
    got = receive_all(receiver, len(frames))  # 21 datagrams through batches of 8
    assert [g[0] for g in got] == frames
    assert {describe_sockaddr(g[1]) for g in got} == {str(sender.local_address).replace("0.0.0.0", "127.0.0.1")}
    assert [g[2] for g in got] == [DATA] * 20 + [NOT_DATA]
    assert [g[4] for g in got[:20]] == [len(f) for f in frames[:20]]
    # replies go back to a datagram's source, as the receiver's SMs do
    assert receiver.send([b"reply"], got[0][1]) == 1
    assert receive_all(sender, 1)[0][0] == b"reply"


def test_an_oversized_datagram_is_reported_truncated() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        tx.sendto(b"y" * 100, rx.getsockname())
        slots = ffi.new("uint8_t[]", 64)
        lengths, address_lengths = ffi.new("int32_t[1]"), ffi.new("int32_t[1]")
        addresses = ffi.new("uint8_t[]", lib.LBN_ADDRESS_SLOT)
        n = 0
        for _ in range(1000):
            n = lib.lbn_recv_batch(rx.fileno(), slots, 64, 1, lengths, addresses, address_lengths)
            if n:
                break
        assert n == 1 and lengths[0] == lib.LBN_TRUNCATED
        kinds, counts, spans = ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("int32_t[1]")
        lib.lbn_classify_batch(slots, 64, lengths, 1, kinds, counts, spans)
        assert kinds[0] == MALFORMED


def test_send_impairment_drops_everything_with_drop_1(pair) -> None:  # type: ignore[no-untyped-def]
    sender, receiver = pair
    sender.send_impairment = Impairment(drop=1.0)
    assert sender.send([b"a", b"b"], sender.channel.data.sockaddr) == 2  # the "network" took them
    assert receive_all(receiver, 1) == []


def test_receive_impairment_reorders_and_delays(pair) -> None:  # type: ignore[no-untyped-def]
    sender, receiver = pair
    receiver.receive_impairment = Impairment(delay_ns=1_000, reorder=1.0, reorder_delay_ns=5_000, seed=1)
    sender.send([b"first", b"second"], sender.channel.data.sockaddr)
    got: list[bytes] = []
    for now in range(0, 20_000, 500):
        got += [bytes(r.datagram) for r in receiver.receive(now)]
    assert sorted(got) == [b"first", b"second"] and receiver.receive_impairment.delivered == 2


def test_impairment_spec_parsing() -> None:
    impairment = Impairment.from_spec("drop=0.05,reorder=0.1,duplicate=0.01,delay=50us,jitter=1ms,seed=9")
    assert (impairment.drop, impairment.reorder, impairment.duplicate) == (0.05, 0.1, 0.01)
    assert (impairment.delay_ns, impairment.jitter_ns) == (50_000, 1_000_000)
    for bad in ("drop=2", "delay=5", "bogus=1", "seed=x", "drop"):
        with pytest.raises(ValueError):
            Impairment.from_spec(bad)


def test_udp_channel_resolution() -> None:
    unicast = UdpChannel.from_uri(ChannelUri.parse("aeron:udp?endpoint=localhost:40100|term-length=128k"))
    assert unicast.data == SocketAddress("127.0.0.1", 40100) and not unicast.is_multicast
    assert unicast.key == "aeron:udp?endpoint=127.0.0.1:40100"  # stream parameters do not split endpoints
    multicast = UdpChannel.from_uri(ChannelUri.parse("aeron:udp?endpoint=239.1.2.3:40100|interface=127.0.0.1|ttl=4"))
    assert multicast.is_multicast and multicast.control == SocketAddress("239.1.2.4", 40100)
    assert multicast.interface == SocketAddress("127.0.0.1", 0) and multicast.ttl == 4
    assert SocketAddress.from_sockaddr(multicast.data.sockaddr) == multicast.data
    v6 = SocketAddress("::1", 9, socket.AF_INET6)
    assert SocketAddress.from_sockaddr(v6.sockaddr) == v6 and str(v6) == "[::1]:9"
    for bad in ("aeron:udp?endpoint=239.1.2.2:40100", "aeron:udp?endpoint=127.0.0.1:1|interface=239.1.1.1",
                "aeron:udp?endpoint=127.0.0.1:1|ttl=-1", "aeron:udp?endpoint=127.0.0.1:1|fc=min,x:1"):
        with pytest.raises(InvalidChannelError):
            UdpChannel.from_uri(ChannelUri.parse(bad))
    fc = ChannelUri.parse("aeron:udp?endpoint=127.0.0.1:1|fc=min,t:250ms").flow_control()
    assert fc is not None and (fc.strategy, fc.receiver_timeout_ns) == ("min", 250_000_000)


def test_native_in_order_rebuild_matches_the_term_rebuilder(pair, make_log) -> None:  # type: ignore[no-untyped-def]
    """lbn_rebuild_in_order takes the leading run of in-order datagrams of its image - writing exactly what
    TermRebuilder.insert writes - and stops at the first one that is not (gap, other session, past the limit)."""
    from logbuf.driver.udp import TermRebuilder

    sender, receiver = pair
    term = 64 * 1024
    native_log = make_log("native.logbuffer", term_length=term, session_id=7, stream_id=9, initial_term_id=100)
    python_log = make_log("python.logbuffer", term_length=term, session_id=7, stream_id=9, initial_term_id=100)
    start = term - 256  # the run crosses into the next term

    def frames(position: int, payloads: list[bytes], session: int = 7) -> bytes:
        out = b""
        for payload in payloads:
            offset = (position + len(out)) % term
            out += encode_data_frame(payload, term_offset=offset, session_id=session, stream_id=9,
                                     term_id=100 + (position + len(out)) // term)
        return out

    in_order: list[bytes] = []
    position = start
    for payloads in ([b"a" * 10, b"b" * 40], [b"c" * 20], [b""], [b"d" * 5, b"e" * 200]):  # the 3rd ends term 0
        in_order.append(frames(position, payloads))
        position += (len(in_order[-1]) + 31) & ~31
    end = position
    stoppers = [frames(end + 64, [b"late"]),  # a gap before it
                frames(end, [b"x"], session=8)]  # right place, another session
    datagrams = in_order + stoppers
    assert sender.send(datagrams, sender.channel.data.sockaddr) == len(datagrams)
    n = 0
    for _ in range(1000):
        n = receiver.receive_raw()
        if n:
            break
    assert n == len(datagrams)
    image = ffi.new("lbn_image_t *")
    image.terms = native_log.term_pointer(0)
    image.term_length, image.position_bits, image.initial_term_id = term, 16, 100
    image.session_id, image.stream_id = 7, 9
    image.position, image.limit = start, start + 4096
    slots, slot_length, lengths, kinds, spans = receiver.batch_arrays
    taken = lib.lbn_rebuild_in_order(image, slots, slot_length, lengths, kinds, spans, 0, n)
    assert taken == len(in_order)
    assert image.position == end and image.bytes == sum(map(len, in_order))
    rebuilder = TermRebuilder(python_log)
    position = start
    for raw in in_order:
        rebuilder.insert((position >> 16) % 3, position % term, raw, len(raw))
        position += (len(raw) + 31) & ~31
    assert bytes(native_log.terms.view) == bytes(python_log.terms.view)
    # the limit (last SM position + window) is respected: nothing past it is taken
    image.position, image.limit = start, start + 100
    assert lib.lbn_rebuild_in_order(image, slots, slot_length, lengths, kinds, spans, 0, n) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=120), window=st.integers(0, 40_000),
       batch=st.integers(1, 64))
def test_plan_batch_is_repeated_plan(make_log, sizes: list[int], window: int, batch: int) -> None:  # type: ignore[no-untyped-def]
    """The native batch planner plans exactly what as many plan() calls would, across a term's end (PAD)."""
    from logbuf import ExclusivePublication, Position
    from logbuf.driver.udp import SendPlanner

    log = make_log(term_length=64 * 1024, initial_term_id=3)
    publication = ExclusivePublication(log, Position.standalone(1 << 40))
    start = 64 * 1024 - 4096  # a few frames before the term ends
    for _ in range(start // 1024):
        publication.offer(b"z" * (1024 - 32))
    for size in sizes:
        publication.offer(bytes(size))
    one, many = SendPlanner(log, position=start), SendPlanner(log, position=start)
    limit = start + window
    expected = []
    position = start
    while len(expected) < batch:
        plan = one.plan(limit, position)
        if plan is None:
            break
        expected.append(plan)
        position = plan.next_position
    got = many.plan_batch(limit, batch)
    assert [(p.position, p.term_id, p.term_offset, p.length, p.padding) for p in got] == [
        (p.position, p.term_id, p.term_offset, p.length, p.padding) for p in expected]
    assert all(bytes(a.buffer) == bytes(b.buffer) for a, b in zip(got, expected, strict=True))
