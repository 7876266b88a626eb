"""The native receiver agent on a thread of its own, as an agent runner drives it: the conductor's side (this
test's thread) only offers commands and polls events while the duty runs elsewhere without the GIL."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from udp_rig import free_udp_port, stream_counters

import logbuf
from logbuf import LogBuffers
from logbuf.cnc import counters as c
from logbuf.driver.receiver import Receiver
from logbuf.native import ffi, lib
from logbuf.protocol import SetupFrame, StatusMessage, classify, encode_data_frame
from support import wait_until

T = 64 * 1024
SESSION, STREAM, INITIAL = 31, 1001, 9


class Agent:
    """The duty on a thread, through the function pointer and state an agent runner gets."""

    def __init__(self, receiver: Receiver) -> None:
        self.duty, self.state = receiver.native_duty()
        self.stop = threading.Event()
        self.cycles = 0
        self.thread = threading.Thread(target=self._run, name="receiver-agent", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.duty(self.state, time.monotonic_ns()) == 0:
                time.sleep(0.0002)
            self.cycles += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


@pytest.fixture
def sockets() -> Iterator[tuple[socket.socket, socket.socket]]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    tx.settimeout(5)
    try:
        yield rx, tx
    finally:
        rx.close()
        tx.close()


def test_the_agent_rebuilds_a_stream_on_its_own_thread(make_log: Callable[..., LogBuffers],
                                                        sockets: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = sockets
    receiver = Receiver()
    agent = Agent(receiver)
    events: list = []
    try:
        receiver.offer(receiver.command(lib.LBD_CMD_ADD_ENDPOINT, endpoint_id=1, fd=rx.fileno(), send_fd=rx.fileno(),
                                        receiver_id=12))
        receiver.offer(receiver.command(lib.LBD_CMD_ADD_SUBSCRIPTION, endpoint_id=1, stream_id=STREAM))
        target = rx.getsockname()
        tx.sendto(SetupFrame(0, SESSION, STREAM, INITIAL, INITIAL, T, 1408, 0).encode(), target)
        wait_until(lambda: events.extend(receiver.poll_events()) or events, what="a CREATE_IMAGE event")
        create = events[0]
        assert (create.type, create.session_id, create.stream_id, create.term_length) == (
            lib.LBD_EVENT_CREATE_IMAGE, SESSION, STREAM, T)
        log = make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM)
        positions = ffi.new("int64_t[3]")  # rcv-hwm, rcv-pos, one subscriber's sub-pos
        receiver.offer(receiver.command(
            lib.LBD_CMD_ADD_IMAGE, endpoint_id=1, image_id=100, session_id=SESSION, stream_id=STREAM, term_length=T,
            initial_term_id=INITIAL, window_length=T // 2, join_position=0,
            terms=ffi.cast("uint8_t *", log.term_pointer(0)), meta=ffi.cast("uint8_t *", log.meta.pointer(0)),
            rcv_hwm=positions, rcv_pos=positions + 1, liveness_timeout_ns=10**10, sm_timeout_ns=200_000_000,
            nak_delay_ns=100_000, nak_retry_ns=10_000_000, give_up_ns=-1, address=create.address))
        receiver.offer(receiver.command(lib.LBD_CMD_ADD_SUBSCRIBER, image_id=100, position=positions + 2))
        sm = classify(tx.recv(2048)).frames[0]  # type: ignore[union-attr]
        assert isinstance(sm, StatusMessage) and sm.session_id == SESSION and sm.receiver_id == 12
        frames = 0
        offset = 0
        while offset + 128 <= T // 4:  # within the first window
            tx.sendto(encode_data_frame(bytes([frames % 256]) * 96, term_offset=offset, session_id=SESSION,
                                        stream_id=STREAM, term_id=INITIAL), target)
            frames += 1
            offset += 128
        wait_until(lambda: positions[1] == offset, what="rcv-pos at the end of what was sent")
        assert positions[0] == offset
        term = log.terms.view
        assert all(term[i * 128 + 32] == i % 256 for i in range(frames))
        # the subscriber consumed: an SM follows its sub-pos
        positions[2] = offset
        while True:
            sm = classify(tx.recv(2048)).frames[0]  # type: ignore[union-attr]
            if isinstance(sm, StatusMessage) and sm.consumption_term_offset == offset:
                break
        receiver.offer(receiver.command(lib.LBD_CMD_REMOVE_ENDPOINT, endpoint_id=1))
        removed: list = []
        wait_until(lambda: removed.extend(receiver.poll_events()) or
                   any(e.type == lib.LBD_EVENT_ENDPOINT_REMOVED for e in removed), what="the endpoint let go")
        kinds = [(e.type, e.image_id, e.reason) for e in removed]
        assert kinds == [(lib.LBD_EVENT_IMAGE_REMOVED, 100, lib.LBD_REASON_REMOVED),
                         (lib.LBD_EVENT_ENDPOINT_REMOVED, 0, 0)]
    finally:
        agent.close()
        receiver.close()
    assert agent.cycles > 0


def test_events_the_full_queue_cannot_take_wait_in_order_and_none_is_lost(
        make_log: Callable[..., LogBuffers]) -> None:
    """While the conductor does not drain the event queue, the agent keeps what does not fit (removals of
    unknown endpoints, images it refuses, subscriber acknowledgements) and hands it over in order once the queue
    has room: every event that changes what the conductor holds arrives, none is counted as dropped."""
    capacity = 4
    native = lib.lbd_receiver_new(capacity, 1, 10**8, 10**9, 10**9, 16)
    assert native != ffi.NULL
    log = make_log(term_length=T, initial_term_id=INITIAL, session_id=SESSION, stream_id=STREAM)
    counters = ffi.new("int64_t[3]")
    expected: list[tuple[int, int, int, int]] = []
    try:
        for round_ in range(3):  # each round: more events than the queue holds
            for i in range(capacity):
                command = Receiver.command(lib.LBD_CMD_REMOVE_ENDPOINT, endpoint_id=100 + 10 * round_ + i)
                if i == 1:  # an image for an endpoint that does not exist: refused, reported removed
                    command = Receiver.command(
                        lib.LBD_CMD_ADD_IMAGE, endpoint_id=99, image_id=500 + round_, session_id=SESSION,
                        stream_id=STREAM, term_length=T, initial_term_id=INITIAL, window_length=T // 2,
                        terms=ffi.cast("uint8_t *", log.term_pointer(0)),
                        meta=ffi.cast("uint8_t *", log.meta.pointer(0)), rcv_hwm=counters, rcv_pos=counters + 1)
                    expected.append((lib.LBD_EVENT_IMAGE_REMOVED, 99, 500 + round_, 0))
                elif i == 2:  # a subscriber of an image already gone: still acknowledged
                    command = Receiver.command(lib.LBD_CMD_REMOVE_SUBSCRIBER, image_id=600 + round_,
                                               position=counters + 2, subscriber_id=700 + round_)
                    expected.append((lib.LBD_EVENT_SUBSCRIBER_REMOVED, 0, 600 + round_, 700 + round_))
                else:
                    expected.append((lib.LBD_EVENT_ENDPOINT_REMOVED, command.endpoint_id, 0, 0))
                assert lib.lbd_receiver_offer(native, command) == 1
            lib.lbd_receiver_do_work(native, round_ + 1)
        got: list[tuple[int, int, int, int]] = []
        event = ffi.new("lbd_event_t *")
        for cycle in range(100):
            while lib.lbd_receiver_poll_event(native, event):
                got.append((event.type, event.endpoint_id, event.image_id, event.subscriber_id))
            if len(got) >= len(expected):
                break
            lib.lbd_receiver_do_work(native, 10 + cycle)
        assert got == expected
        assert lib.lbd_receiver_counters(native).events_dropped == 0
    finally:
        lib.lbd_receiver_free(native)


def test_a_network_subscribers_counter_is_freed_only_once_the_agent_let_go(tmp_path: Path) -> None:
    """Unlinking a subscription from a network image: the agent reads that sub-pos counter until it handles
    REMOVE_SUBSCRIBER, so the conductor frees it (where a new counter could take its place) only on the agent's
    SUBSCRIBER_REMOVED - here the command is held back from the agent for a while to show it."""
    with logbuf.MediaDriver.launch(tmp_path / "drv", idle_strategy="backoff:1000000",
                                   timer_interval_ns=50_000_000) as driver, logbuf.connect(driver.directory) as client:
        assert driver.conductor is not None
        receiver = driver.conductor.network.receiver
        held: list[Any] = []
        polls = [0]  # the conductor's cycles (it polls the agent's events in each)
        holding = threading.Event()
        holding.set()
        offer, poll_events = receiver.offer, receiver.poll_events

        def holding_offer(command: Any) -> None:  # runs on the conductor's thread, as the real one
            if holding.is_set() and command.type == lib.LBD_CMD_REMOVE_SUBSCRIBER:
                held.append(command)
            else:
                offer(command)

        def releasing_poll(limit: int = 256) -> list:
            polls[0] += 1
            while held and not holding.is_set():
                offer(held.pop(0))
            return poll_events(limit)

        receiver.offer, receiver.poll_events = holding_offer, releasing_poll  # type: ignore[method-assign]
        channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k"
        first = client.add_subscription(channel, STREAM)
        second = client.add_subscription(channel, STREAM)  # keeps the image (and the agent's reads) going
        pub = client.add_publication(channel, STREAM)
        wait_until(lambda: pub.is_connected and first.images and second.images, what="an image for both")

        def sub_pos_of(registration_id: int) -> list:
            return [i for i in stream_counters(client, c.SUBSCRIBER_POSITION_TYPE_ID)
                    if c.decode_stream_position_key(i.key)[0] == registration_id]

        assert len(sub_pos_of(first.registration_id)) == 1
        first.close()
        wait_until(lambda: held, what="the conductor unlinking the subscription")
        cycles = polls[0]
        wait_until(lambda: polls[0] >= cycles + 2, what="the conductor done with the removal")
        assert first.registration_id not in driver.conductor.network.subscriptions
        assert len(sub_pos_of(first.registration_id)) == 1  # not acknowledged: still allocated
        holding.clear()
        wait_until(lambda: not sub_pos_of(first.registration_id), what="the counter freed on the acknowledgement")
        assert len(sub_pos_of(second.registration_id)) == 1
