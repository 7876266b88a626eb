"""The life cycles of the driver's publications and images: their states, the events that move them, and the
transition tables that say which event each state allows (h11 style: the table is the specification, and
an event a state does not allow raises :class:`IllegalTransition` naming both).

A publication (IPC or network) is ``ACTIVE`` while publishers are attached; when the last one leaves it is
``DRAINING`` (subscribers and spies read to the end of the stream however long that takes, and a network
publication's receivers are done or its linger timeout passed); it is
``CLOSED`` once drained, or at once when its log file was truncated under the driver.  An image (a remote
publication rebuilt here) is ``ACTIVE`` while subscribers read it, ``REMOVING`` once its stream's last
subscription left and the receiver agent was told to let go, and ``CLOSED`` when the agent has let go (the
stream ended, timed out, its log shrank, or its endpoint closed) or the driver shut down.

Only the objects move themselves: the conductors call the transition methods (``start_draining``,
``close``, ``begin_removing``), never assign a state.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)


class IllegalTransition(RuntimeError):
    """An event the object's current state does not allow: a driver bug (the conductors check the state
    before they act), never something a client or a peer can cause."""

    def __init__(self, what: str, state: enum.Enum, event: enum.Enum) -> None:
        super().__init__(f"{what} in state {state.name} cannot take event {event.name}")
        self.state = state
        self.event = event


class TransitionTable(Generic[S, E]):
    """Every allowed ``(state, event) -> next state``; any other pair is illegal."""

    def __init__(self, what: str, table: Mapping[tuple[S, E], S]) -> None:
        self.what = what
        self.table = dict(table)

    def next_state(self, state: S, event: E) -> S:
        """The state ``event`` leads to from ``state``; :class:`IllegalTransition` when it is not allowed."""
        try:
            return self.table[(state, event)]
        except KeyError:
            raise IllegalTransition(self.what, state, event) from None


class Lifecycle(Generic[S, E]):
    """A state read-only from outside, moved only by the owner's own transition methods through its table."""

    _transitions: TransitionTable[Any, Any]
    _state: S

    @property
    def state(self) -> S:
        return self._state

    def _transition(self, event: E) -> None:
        self._state = self._transitions.next_state(self._state, event)


class PublicationState(enum.Enum):
    ACTIVE = "active"  # publishers attached
    DRAINING = "draining"  # no publisher left: subscribers read to the end of stream (no deadline)
    CLOSED = "closed"  # counters freed and file deleted (or about to be, once the agents let go)


class PublicationEvent(enum.Enum):
    DRAIN = "drain"  # the last publisher left
    CLOSE = "close"  # drained, or its log was truncated


PUBLICATION_TRANSITIONS: TransitionTable[PublicationState, PublicationEvent] = TransitionTable("publication", {
    (PublicationState.ACTIVE, PublicationEvent.DRAIN): PublicationState.DRAINING,
    (PublicationState.ACTIVE, PublicationEvent.CLOSE): PublicationState.CLOSED,  # its log was truncated
    (PublicationState.DRAINING, PublicationEvent.CLOSE): PublicationState.CLOSED,
})


class PublicationImageState(enum.Enum):
    ACTIVE = "active"  # subscribers read it; a new subscription of its stream links to it
    REMOVING = "removing"  # its stream's last subscription left: the receiver agent was told to let go
    CLOSED = "closed"  # the agent let go (or the driver shut down): counters freed, log closed


class PublicationImageEvent(enum.Enum):
    REMOVE = "remove"  # its stream's last subscription left
    CLOSE = "close"  # the receiver agent let go of it, or the driver shuts down


IMAGE_TRANSITIONS: TransitionTable[PublicationImageState, PublicationImageEvent] = TransitionTable("image", {
    (PublicationImageState.ACTIVE, PublicationImageEvent.REMOVE): PublicationImageState.REMOVING,
    (PublicationImageState.ACTIVE, PublicationImageEvent.CLOSE): PublicationImageState.CLOSED,
    (PublicationImageState.REMOVING, PublicationImageEvent.CLOSE): PublicationImageState.CLOSED,
})


class PublicationLifecycle(Lifecycle[PublicationState, PublicationEvent]):
    """The life cycle of a publication (IPC or network), through :data:`PUBLICATION_TRANSITIONS`."""

    _transitions = PUBLICATION_TRANSITIONS
    _state = PublicationState.ACTIVE  # every publication starts active

    def close(self) -> None:
        """Drained, or its log truncated: no publisher joins it and no subscriber links
        to it any more; the conductor then releases its counters and log."""
        self._transition(PublicationEvent.CLOSE)


class ImageLifecycle(Lifecycle[PublicationImageState, PublicationImageEvent]):
    """The life cycle of an image, through :data:`IMAGE_TRANSITIONS` (its owner's ``close`` takes the CLOSE
    event, then releases what it holds)."""

    _transitions = IMAGE_TRANSITIONS
    _state = PublicationImageState.ACTIVE  # every image starts active

    @property
    def removing(self) -> bool:
        """The agent was told to let go (its stream's last subscription left); waiting for its word."""
        return self._state is PublicationImageState.REMOVING

    def begin_removing(self) -> None:
        """Its stream's last subscription left and the receiver agent is told to end it: no new subscription
        links to it while the agent lets go."""
        self._transition(PublicationImageEvent.REMOVE)
