"""The native receiver agent on a thread of its own, as an agent runner drives it: the conductor's side (this
test's thread) only offers commands and polls events while the duty runs elsewhere without the GIL."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from logbuf import LogBuffers
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
