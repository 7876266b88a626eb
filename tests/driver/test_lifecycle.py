"""The life cycles of publications and images (:mod:`logbuf.driver.lifecycle`): every (state, event) pair of
each transition table - an allowed one leads to the expected state, any other raises IllegalTransition naming
both - and the objects moving themselves through them (a state is never assigned from outside)."""

from __future__ import annotations

import enum
import itertools
import os
import tempfile
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from logbuf import LogBuffers, Position
from logbuf.driver.ipc_publication import IpcPublication
from logbuf.driver.lifecycle import (
    IMAGE_TRANSITIONS,
    PUBLICATION_TRANSITIONS,
    IllegalTransition,
    PublicationEvent,
    PublicationImageEvent,
    PublicationImageState,
    PublicationState,
    TransitionTable,
)
from logbuf.driver.network_publication import NetworkPublication, NetworkPublicationPositions
from logbuf.driver.publication_image import ImageWaker, PublicationImage
from logbuf.driver.udp import RetransmitHandler, UnicastFlowControl
from logbuf.native import lib

TERM = 64 * 1024
SECOND = 1_000_000_000

# the specification, written out here rather than read from the module: what each allowed event leads to
PUBLICATION_EXPECTED = {
    (PublicationState.ACTIVE, PublicationEvent.DRAIN): PublicationState.DRAINING,
    (PublicationState.ACTIVE, PublicationEvent.CLOSE): PublicationState.CLOSED,
    (PublicationState.DRAINING, PublicationEvent.CLOSE): PublicationState.CLOSED,
}
IMAGE_EXPECTED = {
    (PublicationImageState.ACTIVE, PublicationImageEvent.REMOVE): PublicationImageState.REMOVING,
    (PublicationImageState.ACTIVE, PublicationImageEvent.CLOSE): PublicationImageState.CLOSED,
    (PublicationImageState.REMOVING, PublicationImageEvent.CLOSE): PublicationImageState.CLOSED,
}


TABLES: list[tuple[TransitionTable[Any, Any], dict[tuple[Any, Any], Any], type[enum.Enum], type[enum.Enum]]] = [
    (PUBLICATION_TRANSITIONS, PUBLICATION_EXPECTED, PublicationState, PublicationEvent),
    (IMAGE_TRANSITIONS, IMAGE_EXPECTED, PublicationImageState, PublicationImageEvent),
]


@pytest.mark.parametrize(("table", "expected", "state", "event"), [
    pytest.param(table, expected, state, event, id=f"{table.what}-{state.name}-{event.name}")
    for table, expected, states, events in TABLES for state, event in itertools.product(states, events)
])
def test_every_state_and_event(table: TransitionTable[Any, Any], expected: dict[tuple[Any, Any], Any],
                               state: enum.Enum, event: enum.Enum) -> None:
    """An allowed event leads to its next state; any other is refused, naming the object, state and event."""
    next_state = expected.get((state, event))
    if next_state is not None:
        assert table.next_state(state, event) is next_state
    else:
        with pytest.raises(IllegalTransition, match=f"^{table.what} in state {state.name} cannot take event "
                                                    f"{event.name}$") as refused:
            table.next_state(state, event)
        assert (refused.value.state, refused.value.event) == (state, event)


def test_closed_is_final() -> None:
    """Nothing leaves CLOSED: a closed publication or image can never be drained, removed or closed again."""
    for publication_event in PublicationEvent:
        with pytest.raises(IllegalTransition):
            PUBLICATION_TRANSITIONS.next_state(PublicationState.CLOSED, publication_event)
    for image_event in PublicationImageEvent:
        with pytest.raises(IllegalTransition):
            IMAGE_TRANSITIONS.next_state(PublicationImageState.CLOSED, image_event)


# -- the objects ----------------------------------------------------------------------------------------


@pytest.fixture
def directory() -> Iterator[str]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="logbuf-lifecycle-", dir=base) as path:
        yield path


def _log(directory: str, name: str) -> LogBuffers:
    return LogBuffers.create(os.path.join(directory, name), term_length=TERM, session_id=7, stream_id=9,
                             initial_term_id=11)


def _ipc_publication(directory: str) -> IpcPublication:
    return IpcPublication(registration_id=1, channel="aeron:ipc", is_exclusive=False, log=_log(directory, "ipc"),
                          publisher_position=Position.standalone(), publisher_limit=Position.standalone(),
                          pub_pos_counter_id=0, pub_lmt_counter_id=1, window_length=TERM // 2,
                          unblock_timeout_ns=SECOND, on_unblocked=lambda: None)


def test_ipc_publication_drains_then_closes(directory: str) -> None:
    publication = _ipc_publication(directory)
    told: list[int] = []
    publication.on_draining = lambda p: told.append(p.registration_id)
    assert publication.state is PublicationState.ACTIVE
    publication.start_draining(now_ns=100, linger_ns=5 * SECOND)
    assert publication.state is PublicationState.DRAINING
    assert told == [1] and publication.drain_deadline_ns == 100 + 5 * SECOND
    assert publication.log.end_of_stream_position == publication.log.producer_position()
    assert publication.on_timer(200) is False and publication.is_drained(200)  # no subscriber: nothing blocks
    with pytest.raises(IllegalTransition, match="DRAINING cannot take event DRAIN"):
        publication.start_draining(now_ns=300, linger_ns=SECOND)
    assert told == [1] and publication.drain_deadline_ns == 100 + 5 * SECOND  # the refused drain changed nothing
    publication.close()
    assert publication.state is PublicationState.CLOSED
    with pytest.raises(IllegalTransition, match="CLOSED cannot take event CLOSE"):
        publication.close()
    with pytest.raises(IllegalTransition, match="CLOSED cannot take event DRAIN"):
        publication.start_draining(now_ns=400, linger_ns=SECOND)
    publication.log.close()


def test_ipc_publication_closes_while_active(directory: str) -> None:
    """A publication whose log was truncated closes with its publishers still attached."""
    publication = _ipc_publication(directory)
    publication.close()
    assert publication.state is PublicationState.CLOSED
    publication.log.close()


def test_a_state_is_not_assigned_from_outside(directory: str) -> None:
    publication = _ipc_publication(directory)
    with pytest.raises(AttributeError):
        publication.state = PublicationState.CLOSED  # type: ignore[misc]
    assert publication.state is PublicationState.ACTIVE
    publication.log.close()


class FakeSender:
    """The sender agent's command queue, as a network publication uses it: records what it was offered."""

    def __init__(self) -> None:
        self.offered: list[Any] = []

    def new_command(self, command_type: int) -> Any:
        return SimpleNamespace(type=command_type)

    def offer(self, command: Any) -> None:
        self.offered.append(command)


def test_network_publication_drains_once(directory: str) -> None:
    log = _log(directory, "udp")
    sender = FakeSender()
    publication = NetworkPublication(
        registration_id=5, channel="aeron:udp?endpoint=127.0.0.1:40123", is_exclusive=False, log=log,
        sender=sender,  # type: ignore[arg-type]
        endpoint_key="k", endpoint_id=1, destination=b"\x02\x00" + bytes(14), channel_status_id=0,
        positions=NetworkPublicationPositions(*(Position.standalone() for _ in range(5))),
        window_length=TERM // 2, max_datagrams=16, flow_control=UnicastFlowControl(SECOND),
        retransmit=RetransmitHandler(TERM, log.initial_term_id), now_ns=0)
    assert publication.state is PublicationState.ACTIVE
    publication.start_draining(now_ns=10, linger_ns=SECOND)
    assert publication.state is PublicationState.DRAINING
    assert [c.type for c in sender.offered] == [lib.LBD_SND_DRAIN_PUBLICATION]
    with pytest.raises(IllegalTransition):
        publication.start_draining(now_ns=20, linger_ns=SECOND)
    assert len(sender.offered) == 1  # the agent is not told twice
    publication.close()
    assert publication.state is PublicationState.CLOSED
    log.close()


def _image(directory: str) -> PublicationImage:
    log = _log(directory, "image")
    return PublicationImage(correlation_id=3, channel="aeron:udp?endpoint=127.0.0.1:40124", log=log, session_id=7,
                            stream_id=9, join_position=0, source=b"", source_identity="127.0.0.1:1",
                            rcv_hwm=Position.standalone(), rcv_pos=Position.standalone(),
                            waker=ImageWaker(log, None))


def test_image_removing_then_closed(directory: str) -> None:
    image = _image(directory)
    assert image.state is PublicationImageState.ACTIVE and not image.removing
    image.begin_removing()
    assert image.state is PublicationImageState.REMOVING and image.removing
    with pytest.raises(IllegalTransition, match="REMOVING cannot take event REMOVE"):
        image.begin_removing()
    image.close()
    assert image.state is PublicationImageState.CLOSED and image.log.is_closed
    with pytest.raises(IllegalTransition, match="CLOSED cannot take event CLOSE"):
        image.close()


def test_image_closes_while_active(directory: str) -> None:
    """An image that ended, timed out or shrank is let go of without being asked to go first; nobody marks it
    removing from outside."""
    image = _image(directory)
    with pytest.raises(AttributeError):
        image.removing = True  # type: ignore[misc]
    assert image.state is PublicationImageState.ACTIVE
    image.close()
    assert image.state is PublicationImageState.CLOSED and image.log.is_closed
    with pytest.raises(IllegalTransition, match="CLOSED cannot take event REMOVE"):
        image.begin_removing()
