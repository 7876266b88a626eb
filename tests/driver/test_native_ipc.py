"""The native IPC duty (``drv_ipc.c``) against its specification, :class:`IpcPublicationDuty`: the same
publisher traffic and subscriber positions on two identical logs give the same pub-pos, pub-lmt,
isConnected, cleaning (byte for byte) and unblocking."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logbuf import ConcurrentPublication, LogBuffers, Position
from logbuf.driver.ipc_publication import IpcPublicationDuty, SubscriberLink
from logbuf.driver.native_ipc import PUBLICATION_REMOVED, SUBSCRIBER_REMOVED, NativeIpcDuty
from logbuf.native import ffi, lib
from logbuf.units import NANOS_PER_SECOND as SECOND

TERM = 64 * 1024


class Side:
    """One log with its publication, pub-pos/pub-lmt and subscriber positions."""

    def __init__(self, directory: str, name: str, window: int) -> None:
        self.log = LogBuffers.create(os.path.join(directory, name), term_length=TERM, session_id=7, stream_id=9,
                                     initial_term_id=11)
        self.pub_pos, self.pub_lmt = Position.standalone(), Position.standalone()
        self.publication = ConcurrentPublication(self.log, self.pub_lmt)
        self.duty = IpcPublicationDuty(self.log, self.pub_pos, self.pub_lmt, self.positions, window_length=window,
                                       unblock_timeout_ns=2 * SECOND)
        self.links: dict[int, SubscriberLink] = {}

    def positions(self) -> tuple[Position, ...]:
        return tuple(link.position for link in self.links.values() if link.included)


@pytest.fixture
def directory() -> Iterator[str]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="logbuf-native-ipc-", dir=base) as path:
        yield path


class FakePublication:
    """The fields NativeIpcDuty.add_publication reads from an IpcPublication."""

    def __init__(self, registration_id: int, duty: IpcPublicationDuty, exclusive: bool = False) -> None:
        self.registration_id = registration_id
        self.duty = duty
        self.is_exclusive = exclusive


def _state(side: Side) -> tuple[int, int, bool]:
    return side.pub_pos.get(), side.pub_lmt.get(), side.log.is_connected


def _terms(log: LogBuffers) -> bytes:
    return bytes(log.terms.view[: 3 * TERM])


operation = st.one_of(
    st.tuples(st.just("offer"), st.integers(1, 40), st.sampled_from([0, 20, 100, 500, 1400, 3000])),
    st.tuples(st.just("add"), st.integers(0, 4), st.booleans()),
    st.tuples(st.just("remove"), st.integers(0, 4), st.booleans()),
    st.tuples(st.just("move"), st.integers(0, 4), st.floats(0, 1)),
    st.tuples(st.just("consume"), st.floats(0, 1)),
    st.tuples(st.just("include"), st.integers(0, 4), st.booleans()),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(operation, min_size=1, max_size=80),
       window=st.sampled_from([TERM // 2, TERM // 4, 4096, TERM]))
def test_native_duty_matches_the_python_duty(directory: str, ops: list[tuple], window: int) -> None:
    py, c = Side(directory, "py.logbuffer", window), Side(directory, "c.logbuffer", window)
    native = NativeIpcDuty(timer_interval_ns=SECOND)
    state = native.duty[1]
    try:
        native.add_publication(FakePublication(1, c.duty))  # type: ignore[arg-type]
        now = SECOND
        for op in [("add", 0, True), *ops]:
            if op[0] == "offer":
                _, count, size = op
                for _ in range(count):
                    a, b = py.publication.offer(b"m" * size), c.publication.offer(b"m" * size)
                    assert a == b
            elif op[0] == "add":
                _, sub, included = op
                if sub in py.links:
                    continue
                join = py.log.producer_position()
                for side in (py, c):
                    side.links[sub] = SubscriberLink(sub, 0, -1, Position.standalone(join), join, included)
                native.add_subscriber(1, c.links[sub])
            elif op[0] == "remove":
                sub = op[1]
                if sub not in py.links:
                    continue
                del py.links[sub], c.links[sub]
                native.remove_subscriber(1, sub)
            elif op[0] == "move":
                _, sub, fraction = op
                if sub not in py.links:
                    continue
                current, producer = py.links[sub].position.get(), py.log.producer_position()
                target = current + int((producer - current) * fraction) // 32 * 32
                py.links[sub].position.set(target)
                c.links[sub].position.set(target)
            elif op[0] == "consume":  # every subscriber reads part of what is there
                for sub, link in py.links.items():
                    current, producer = link.position.get(), py.log.producer_position()
                    target = current + int((producer - current) * op[1]) // 32 * 32
                    link.position.set(target)
                    c.links[sub].position.set(target)
            elif op[0] == "include":
                _, sub, included = op
                if sub not in py.links:
                    continue
                py.links[sub].included = c.links[sub].included = included
                native.set_included(1, sub, included)
            now += 1_000
            py_work = py.duty.update()
            native.poll_events()  # sends anything still queued here (nothing, with a queue this deep)
            c_work = lib.lbd_ipc_do_work(state, now)
            assert _state(py) == _state(c), op
            assert native.clean_position(1) == py.duty.cleaner.clean_position
            assert native.consumer_position(1) == py.duty.consumer_position
            assert (py_work > 0) <= (c_work > 0)  # the native duty also counts the commands it took
        assert _terms(py.log) == _terms(c.log)
        native.remove_publication(1)
        lib.lbd_ipc_do_work(state, now)
        kinds = [event[0] for event in native.poll_events()]
        assert kinds.count(PUBLICATION_REMOVED) == 1 and set(kinds) <= {PUBLICATION_REMOVED, SUBSCRIBER_REMOVED}
        assert native.publication_count() == 0
    finally:
        native.close()
        for side in (py, c):
            side.log.close()
            os.unlink(side.log.path)


def test_native_duty_unblocks_a_stalled_claim_after_the_timeout(directory: str) -> None:
    side = Side(directory, "stuck.logbuffer", TERM // 2)
    unblocked = Position.standalone()
    native = NativeIpcDuty(timer_interval_ns=SECOND, unblocked_publications=unblocked)
    state = native.duty[1]
    try:
        native.add_publication(FakePublication(1, side.duty))  # type: ignore[arg-type]
        side.links[1] = SubscriberLink(1, 0, -1, Position.standalone(0), 0)
        native.add_subscriber(1, side.links[1])
        lib.lbd_ipc_do_work(state, 0)
        side.publication.offer(b"before")
        stuck = side.publication.try_claim(200)  # never committed
        assert stuck is not None
        side.publication.offer(b"after")
        side.links[1].position.set(64)  # the subscriber read "before" and waits at the claim
        now = 0
        for now in range(0, 5 * SECOND, SECOND // 2):
            lib.lbd_ipc_do_work(state, now)
            if unblocked.get():
                break
        assert unblocked.get() == 1
        assert now > 2 * SECOND  # not before the unblock timeout
        header = ffi.cast("int32_t *", side.log.term_pointer(0) + 64)
        frame_length, frame_type = header[0], ffi.cast("uint16_t *", header)[3]
        assert (frame_length, frame_type) == (232, 0)  # the claim became a committed PAD of its length
    finally:
        native.close()
        side.log.close()


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_draining_publication_pads_a_dead_claim_at_once(directory: str, exclusive: bool) -> None:
    """No publisher is left (as aeronmd): a claim that blocks the subscriber can only be a dead publisher's, so
    the next timer pads it, long before the unblock timeout, exclusive or not; the Python specification
    (``unblock_draining``) pads the same bytes."""
    native_side, spec_side = (Side(directory, f"draining-{i}.logbuffer", TERM // 2) for i in range(2))
    unblocked = Position.standalone()
    native = NativeIpcDuty(timer_interval_ns=SECOND, unblocked_publications=unblocked)
    try:
        native.add_publication(FakePublication(1, native_side.duty, exclusive))  # type: ignore[arg-type]
        for side in (native_side, spec_side):
            side.links[1] = SubscriberLink(1, 0, -1, Position.standalone(0), 0)
        native.add_subscriber(1, native_side.links[1])
        lib.lbd_ipc_do_work(native.duty[1], 0)  # pub-lmt set; the timer's first cycle only starts it
        spec_side.duty.update()
        for side in (native_side, spec_side):
            assert side.publication.try_claim(200) is not None  # never committed: its writer died
            assert side.publication.offer(b"after") > 0
        native.draining(1)
        lib.lbd_ipc_do_work(native.duty[1], SECOND // 2)
        assert unblocked.get() == 0  # not before the timer
        lib.lbd_ipc_do_work(native.duty[1], SECOND)  # the next timer, half the unblock timeout (2 s) on
        assert unblocked.get() == 1
        spec_side.duty.update()
        assert spec_side.duty.unblock_draining() is True
        assert _terms(native_side.log) == _terms(spec_side.log)
        header = ffi.cast("int32_t *", native_side.log.term_pointer(0))
        assert (header[0], ffi.cast("uint16_t *", header)[3]) == (232, 0)  # a committed PAD of the claim's length
        for now in range(2 * SECOND, 6 * SECOND, SECOND // 2):  # nothing else blocks: no more unblocking
            lib.lbd_ipc_do_work(native.duty[1], now)
        assert unblocked.get() == 1 and spec_side.duty.unblock_draining() is False
    finally:
        native.close()
        native_side.log.close()
        spec_side.log.close()


def test_an_active_exclusive_publication_is_never_unblocked(directory: str) -> None:
    side = Side(directory, "exclusive.logbuffer", TERM // 2)
    unblocked = Position.standalone()
    native = NativeIpcDuty(timer_interval_ns=SECOND, unblocked_publications=unblocked)
    try:
        native.add_publication(FakePublication(1, side.duty, exclusive=True))  # type: ignore[arg-type]
        side.links[1] = SubscriberLink(1, 0, -1, Position.standalone(0), 0)
        native.add_subscriber(1, side.links[1])
        side.publication.try_claim(200)
        side.publication.offer(b"after")
        for now in range(0, 6 * SECOND, SECOND // 2):
            lib.lbd_ipc_do_work(native.duty[1], now)
        assert unblocked.get() == 0
    finally:
        native.close()
        side.log.close()


def test_commands_that_do_not_fit_the_queue_wait_and_go_in_order(directory: str) -> None:
    side = Side(directory, "backlog.logbuffer", TERM // 2)
    native = NativeIpcDuty(timer_interval_ns=SECOND, capacity=2)
    try:
        native.add_publication(FakePublication(1, side.duty))  # type: ignore[arg-type]
        for sub in range(5):
            side.links[sub] = SubscriberLink(sub, 0, -1, Position.standalone(0), 0)
            native.add_subscriber(1, side.links[sub])
        assert native.pending_commands == 4
        for _ in range(10):
            lib.lbd_ipc_do_work(native.duty[1], 0)
            native.poll_events()
        assert native.pending_commands == 0
        for sub in range(5):
            native.remove_subscriber(1, sub)
        removed = []
        for _ in range(10):
            lib.lbd_ipc_do_work(native.duty[1], 0)
            removed += [event[2] for event in native.poll_events() if event[0] == SUBSCRIBER_REMOVED]
        assert removed == list(range(5))
    finally:
        native.close()
        side.log.close()


def test_a_refused_command_is_reported(directory: str) -> None:
    native = NativeIpcDuty(timer_interval_ns=SECOND)
    try:
        native.set_included(99, 1, True)  # no such publication
        lib.lbd_ipc_do_work(native.duty[1], 0)
        assert native.poll_events() == [(lib.LBD_IPC_COMMAND_REFUSED, 99, 1, lib.LBD_IPC_SET_INCLUDED)]
    finally:
        native.close()


def test_a_trip_gain_outside_the_window_is_refused(directory: str) -> None:
    # the gain comes from the conductor (logbuf.driver.windows.trip_gain): the duty checks it, never trusts it
    side = Side(directory, "gain.logbuffer", TERM // 2)
    native = NativeIpcDuty(timer_interval_ns=SECOND)
    try:
        for gain in (-1, side.duty.window_length + 1):
            side.duty.trip_gain = gain
            native.add_publication(FakePublication(1, side.duty))  # type: ignore[arg-type]
            lib.lbd_ipc_do_work(native.duty[1], 0)
            assert native.poll_events() == [(lib.LBD_IPC_COMMAND_REFUSED, 1, 0, lib.LBD_IPC_ADD_PUBLICATION)]
    finally:
        native.close()
        side.log.close()
