"""End to end in virtual time: publication log -> sender -> lossy network -> receiver -> image -> subscriber.

Everything is the real code (log buffers, ExclusivePublication, the C scanner and reader, Image) except the
sockets, which an Impairment replaces; seeds make every run the same.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from udp_loopback import Config, Loopback, message

from logbuf import LogBuffers
from logbuf.driver.udp import ImageRemoved, ImageState, MinMulticastFlowControl
from logbuf.protocol import DataPacket, PacketKind, classify

T = 64 * 1024
MS = 1_000_000


def messages(count: int, seed: int, sizes: tuple[int, ...] = (8, 40, 100, 300, 1000, 1500, 3000)) -> list[bytes]:
    rng = random.Random(seed)
    return [message(i, rng.choice(sizes)) for i in range(count)]


def test_lossy_network_delivers_every_message_once_and_in_order(make_log: Callable[..., LogBuffers]) -> None:
    loop = Loopback(make_log, Config(drop=0.05, duplicate=0.05, reorder=0.05, jitter_ns=20_000, seed=11))
    sent = messages(3000, seed=5)  # sizes up to 3000 bytes: fragmented messages cross datagrams too
    loop.publish(sent)
    loop.drain(len(sent))
    assert loop.received.sequences == list(range(len(sent)))
    assert loop.received.corrupt == 0
    # the network really was bad, and loss recovery did the work
    assert loop.forward.dropped > 50 and loop.forward.duplicated > 50 and loop.forward.reordered > 50
    assert loop.backward.dropped > 0
    rc, sc = loop.dispatcher.counters, loop.sender.counters
    assert rc.naks_sent > 50 and sc.naks_received > 0 and sc.retransmits_sent > 0 and sc.retransmitted_bytes > 0
    assert rc.loss_gap_fills == 0 and rc.invalid_packets == 0
    assert loop.sender.snd_pos > 10 * T  # many term rotations on both logs


def test_slow_consumer_throttles_the_sender_and_nothing_is_lost(make_log: Callable[..., LogBuffers]) -> None:
    loop = Loopback(make_log, Config(fragments_per_poll=2, seed=3))
    sent = messages(1500, seed=6, sizes=(100, 300, 1000))
    loop.publish(sent, poll_every=4)
    loop.drain(len(sent), poll_every=4)
    assert loop.received.sequences == list(range(len(sent)))
    assert loop.sender.snd_bpe > 0 and loop.sender.counters.flow_control_limits == loop.sender.snd_bpe
    assert loop.dispatcher.counters.flow_control_over_runs == 0  # the sender kept inside the window


def test_fast_consumer_is_not_flow_control_limited_by_much(make_log: Callable[..., LogBuffers]) -> None:
    """The contrast to the slow consumer: the same traffic drained at full speed hits the window far less."""
    sent = messages(600, seed=6, sizes=(100, 300, 1000))
    slow = Loopback(make_log, Config(fragments_per_poll=2, seed=3), name="slow-")
    slow.publish(sent, poll_every=4)
    slow.drain(len(sent), poll_every=4)
    fast = Loopback(make_log, Config(seed=3), name="fast-")
    fast.publish(sent)
    fast.drain(len(sent))
    assert fast.received.sequences == slow.received.sequences == list(range(len(sent)))
    assert fast.sender.snd_bpe * 2 < slow.sender.snd_bpe


def test_a_gap_nobody_can_repair_is_filled_and_subscribers_move_on(make_log: Callable[..., LogBuffers]) -> None:
    positions: list[int] = []

    def black_hole(raw: bytes) -> bool:
        """Every datagram (first send or retransmit) covering message 200's frame disappears."""
        if len(positions) <= 200:
            return False
        packet = classify(raw)
        if not isinstance(packet, DataPacket) or packet.kind is not PacketKind.DATA:
            return False
        start = (packet.term_id - 5) * T + packet.term_offset
        return start <= positions[200] < start + packet.term_span

    loop = Loopback(make_log, Config(give_up_ns=20 * MS, seed=2, drop_forward=black_hole))
    sent = messages(400, seed=8, sizes=(100,))
    for data in sent:
        positions.append(loop.publication.position)
        loop.publish([data])
    loop.run_until(lambda: 399 in loop.received.sequences, max_steps=50_000)
    got = loop.received.sequences
    assert 200 not in got and 399 in got
    assert got == sorted(set(got))  # in order, no duplicates
    assert len(got) > len(sent) - 30  # only the messages of the lost datagrams are gone
    counters = loop.dispatcher.counters
    assert counters.loss_gap_fills >= 1 and counters.naks_sent > 1


def test_a_restarted_receiver_rejoins_mid_stream(make_log: Callable[..., LogBuffers]) -> None:
    loop = Loopback(make_log, Config(drop=0.02, seed=4))
    first = messages(800, seed=1, sizes=(50, 200, 700))
    loop.publish(first)
    loop.drain(len(first))
    assert loop.received.sequences == list(range(800))
    loop.start_receiver()  # a new receiver process: no image, knows nothing
    more = [message(800 + i, 120) for i in range(800)]
    loop.publish(more, max_steps=100_000)
    loop.run_until(lambda: 1599 in loop.received.sequences[800:])
    rejoined = loop.received.sequences[800:]
    assert rejoined == list(range(rejoined[0], 1600))  # contiguous from where it joined, in order
    # it joins where the sender is: at most one receiver window (32 KiB = 204 frames of 160 bytes) on
    assert rejoined[0] <= 800 + 32768 // 160
    assert loop.sender.counters.setups_sent >= 2  # its data-triggered SETUP request was answered


def test_min_multicast_flow_control_end_to_end(make_log: Callable[..., LogBuffers]) -> None:
    loop = Loopback(make_log, Config(drop=0.02, seed=9, flow_control=MinMulticastFlowControl))
    sent = messages(500, seed=2, sizes=(64, 640))
    loop.publish(sent)
    loop.drain(len(sent))
    assert loop.received.sequences == list(range(500))
    assert loop.sender.flow_control.receiver_count == 1


def test_end_of_stream_reaches_the_receiver_and_ends_the_image(make_log: Callable[..., LogBuffers]) -> None:
    loop = Loopback(make_log, Config(drop=0.05, seed=12))
    sent = messages(300, seed=3, sizes=(100, 900))
    loop.publish(sent)
    loop.drain(len(sent))
    end = loop.publication.position
    loop.sender.end_of_stream_position = end  # the publication closed: its last heartbeats carry EOS
    image = loop.image
    assert image is not None
    loop.run_until(lambda: bool(loop.removed), max_steps=100_000)
    assert loop.removed == [ImageRemoved(77, 1001, ImageState.END_OF_STREAM)]
    assert image.end_of_stream_position == end and image.log.end_of_stream_position == end
    assert loop.received.sequences == list(range(len(sent)))
    for _ in range(10):  # the image's last SM (EOS flag) is on its way back
        loop.step()
    receiver = loop.sender.flow_control.receiver  # type: ignore[attr-defined]
    assert receiver is not None and receiver.end_of_stream  # the receiver said it is done


def test_a_silent_sender_s_image_times_out(make_log: Callable[..., LogBuffers]) -> None:
    loop = Loopback(make_log, Config(seed=13))
    sent = messages(50, seed=4, sizes=(100,))
    loop.publish(sent)
    loop.drain(len(sent))
    loop.sender_alive = False  # the sender process died: no more data, heartbeats or SETUPs
    silent_since = loop.now
    loop.config.step_ns = 10 * MS
    loop.run_until(lambda: bool(loop.removed), max_steps=2_000)
    assert loop.removed == [ImageRemoved(77, 1001, ImageState.TIMED_OUT)]
    assert 10_000 * MS < loop.now - silent_since <= 10_000 * MS + 2 * loop.config.step_ns
