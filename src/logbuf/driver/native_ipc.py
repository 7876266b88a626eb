"""``NativeIpcDuty``: the control plane's handle on the native IPC conductor duty (``native/drv_ipc.c``).

The duty moves pub-pos, pub-lmt, cleaning, isConnected and the unblocking of stalled claims for every IPC
publication handed to it, on a native agent thread, exactly as :class:`IpcPublicationDuty` specifies them.
This object only queues commands (add/remove a publication or a subscriber link, draining, whether a link
counts toward pub-lmt) and reads the events that acknowledge removals: until a removal is acknowledged the log
stays mapped and the counters stay allocated.  Commands the queue cannot take now wait here, in order, and go
at the next :meth:`poll_events` - the control plane never blocks on the agent.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from logbuf.driver.agents import NativeDuty
from logbuf.driver.ipc_publication import IpcPublication, SubscriberLink
from logbuf.native import ffi, lib
from logbuf.position import Position

PUBLICATION_REMOVED = lib.LBD_IPC_PUBLICATION_REMOVED
SUBSCRIBER_REMOVED = lib.LBD_IPC_SUBSCRIBER_REMOVED
COMMAND_REFUSED = lib.LBD_IPC_COMMAND_REFUSED


class NativeIpcDuty:
    """Commands in, events out, for one ``lbd_ipc`` duty state (see the module docstring)."""

    def __init__(self, timer_interval_ns: int, unblocked_publications: Position | None = None,
                 capacity: int = 1024) -> None:
        if timer_interval_ns <= 0:
            raise ValueError("timer_interval_ns must be positive")
        if capacity < 2 or capacity > 65536 or capacity & (capacity - 1):
            raise ValueError("capacity must be a power of two in 2..65536")
        counter = ffi.NULL if unblocked_publications is None else ffi.cast("int64_t *", unblocked_publications.pointer)
        state = lib.lbd_ipc_new(capacity, timer_interval_ns, counter)
        if state == ffi.NULL:
            raise MemoryError("lbd_ipc_new failed")
        self._state: Any = state
        self._counter = unblocked_publications
        self._backlog: deque[Any] = deque()
        self._event = ffi.new("lbd_ipc_event_t *")
        # per publication: the [clean position, consumer position] the duty publishes, and what the commands
        # point into (the log, its counters), kept until the removal is acknowledged
        self._published: dict[int, Any] = {}
        self._keep: dict[int, tuple[Any, ...]] = {}

    @property
    def duty(self) -> NativeDuty:
        """``(lbd_ipc_do_work, state)`` for a :class:`NativeAgent`."""
        return ffi.addressof(lib, "lbd_ipc_do_work"), ffi.cast("void *", self._live())

    def _live(self) -> Any:
        if self._state is None:
            raise RuntimeError("the native IPC duty is closed")
        return self._state

    def _send(self, **fields: Any) -> None:
        command = ffi.new("lbd_ipc_command_t *")
        for name, value in fields.items():
            setattr(command, name, value)
        if self._backlog or not lib.lbd_ipc_command(self._live(), command):
            self._backlog.append(command)

    def _flush(self) -> None:
        while self._backlog and lib.lbd_ipc_command(self._live(), self._backlog[0]):
            self._backlog.popleft()

    # -- commands --------------------------------------------------------------------------------------

    def add_publication(self, publication: IpcPublication) -> None:
        """Hands the publication's duty over (its state so far: consumer, clean position, trip limit)."""
        duty = publication.duty
        log = duty.log
        published = ffi.new("int64_t[2]", [duty.cleaner.clean_position, duty.consumer_position])
        self._published[publication.registration_id] = published
        self._keep[publication.registration_id] = (log, duty.publisher_position, duty.publisher_limit)
        self._send(
            type=lib.LBD_IPC_ADD_PUBLICATION,
            flag=1 if publication.is_exclusive else 0,
            registration_id=publication.registration_id,
            terms=log.term_pointer(0),
            meta=log.meta.pointer(0),
            pub_pos=ffi.cast("int64_t *", duty.publisher_position.pointer),
            pub_lmt=ffi.cast("int64_t *", duty.publisher_limit.pointer),
            published=published,
            unblock_timeout_ns=duty.unblock_timeout_ns,
            consumer_position=duty.consumer_position,
            clean_position=duty.cleaner.clean_position,
            trip_limit=duty.trip_limit,
            term_length=log.term_length,
            initial_term_id=log.initial_term_id,
            window_length=duty.window_length,
            trip_gain=duty.trip_gain,
        )

    def remove_publication(self, registration_id: int) -> None:
        """Acknowledged by a PUBLICATION_REMOVED event: only then may the log be unmapped."""
        self._send(type=lib.LBD_IPC_REMOVE_PUBLICATION, registration_id=registration_id)

    def draining(self, registration_id: int) -> None:
        self._send(type=lib.LBD_IPC_DRAINING, registration_id=registration_id)

    def add_subscriber(self, registration_id: int, link: SubscriberLink) -> None:
        self._send(type=lib.LBD_IPC_ADD_SUBSCRIBER, registration_id=registration_id,
                   subscription_id=link.subscription_id, sub_pos=ffi.cast("int64_t *", link.position.pointer),
                   flag=1 if link.included else 0)

    def remove_subscriber(self, registration_id: int, subscription_id: int) -> None:
        """Acknowledged by a SUBSCRIBER_REMOVED event: only then may its sub-pos counter be freed."""
        self._send(type=lib.LBD_IPC_REMOVE_SUBSCRIBER, registration_id=registration_id,
                   subscription_id=subscription_id)

    def set_included(self, registration_id: int, subscription_id: int, included: bool) -> None:
        """Whether the link's position counts toward the publication's pub-lmt."""
        self._send(type=lib.LBD_IPC_SET_INCLUDED, registration_id=registration_id,
                   subscription_id=subscription_id, flag=1 if included else 0)

    # -- events ----------------------------------------------------------------------------------------

    def poll_events(self, limit: int = 64) -> list[tuple[int, int, int, int]]:
        """Sends what waited, then up to ``limit`` events ``(type, registration id, subscription id,
        value)``; a PUBLICATION_REMOVED releases what this object kept for the publication."""
        self._flush()
        events: list[tuple[int, int, int, int]] = []
        event = self._event
        while len(events) < limit and lib.lbd_ipc_poll_event(self._live(), event):
            events.append((event.type, event.registration_id, event.subscription_id, event.value))
            if event.type == PUBLICATION_REMOVED:
                self._published.pop(event.registration_id, None)
                self._keep.pop(event.registration_id, None)
        return events

    @property
    def pending_commands(self) -> int:
        """Commands waiting here for room in the queue."""
        return len(self._backlog)

    def clean_position(self, registration_id: int) -> int | None:
        """Where the duty has cleaned the publication's log up to (None: not handed over)."""
        published = self._published.get(registration_id)
        return None if published is None else int(lib.lb_get_i64_acquire(published))

    def consumer_position(self, registration_id: int) -> int | None:
        published = self._published.get(registration_id)
        return None if published is None else int(lib.lb_get_i64_acquire(published + 1))

    def publication_count(self) -> int:
        """Publications the duty holds (only while its agent is stopped or between its cycles in tests)."""
        return int(lib.lbd_ipc_publication_count(self._live()))

    def close(self) -> None:
        """Frees the duty state: only once no agent runs it any more."""
        if self._state is not None:
            lib.lbd_ipc_free(self._state)
            self._state = None
            self._published.clear()
            self._keep.clear()
