"""``Receiver``: the driver's receiver duty, a native agent (``native/drv_receiver.c``).

Datagrams into images, loss detection and NAKs, status messages, RTT, liveness and end of stream all run in
C, holding no GIL, on whichever thread calls the duty (:meth:`native_duty` hands it to an agent runner; in
shared mode the media driver's loop calls :meth:`do_work`).  The conductor talks to the agent only through
two bounded queues: it :meth:`offer` s commands (endpoints, subscriptions, images and their subscribers) and
drains :meth:`poll_events` (images to create, images, endpoints and subscriber counters the agent let go of,
losses, corrupt images).  The state machines of :mod:`logbuf.driver.udp` are the agent's specification.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from logbuf.driver.udp.receiver_dispatcher import (  # the sans-IO dispatcher's rules, which the agent runs
    DEFAULT_COOL_DOWN_NS,
    DEFAULT_ELICIT_INTERVAL_NS,
    DEFAULT_PENDING_TIMEOUT_NS,
)
from logbuf.native import ffi, lib

QUEUE_CAPACITY = 4096
DEFAULT_MAX_PENDING = 1024  # sessions remembered per endpoint (pending SETUPs, elicits, cool-downs)
_EVENT_FIELDS = ("type", "endpoint_id", "image_id", "reason", "session_id", "stream_id", "term_offset",
                 "initial_term_id", "active_term_id", "term_length", "mtu", "ttl", "term_id", "length", "flags",
                 "destination_id", "subscriber_id")


class ReceiverEvent:
    """One record from the agent's event queue (the fields of ``lbd_event_t``), copied out."""

    __slots__ = (*_EVENT_FIELDS, "address")

    def __init__(self, event: Any) -> None:
        self.type: int = event.type
        self.endpoint_id: int = event.endpoint_id
        self.image_id: int = event.image_id
        self.reason: int = event.reason
        self.session_id: int = event.session_id
        self.stream_id: int = event.stream_id
        self.term_offset: int = event.term_offset
        self.initial_term_id: int = event.initial_term_id
        self.active_term_id: int = event.active_term_id
        self.term_length: int = event.term_length
        self.mtu: int = event.mtu
        self.ttl: int = event.ttl
        self.term_id: int = event.term_id
        self.length: int = event.length
        self.flags: int = event.flags
        self.destination_id: int = event.destination_id
        self.subscriber_id: int = event.subscriber_id
        self.address: bytes = bytes(ffi.buffer(event.address, max(0, min(event.address_length, 32))))

    def __repr__(self) -> str:
        return "ReceiverEvent(" + ", ".join(f"{n}={getattr(self, n)}" for n in _EVENT_FIELDS) + ")"


class Receiver:
    """The native receiver agent and the conductor's side of its queues."""

    def __init__(self, *, receive_batch: int = 32, elicit_interval_ns: int = DEFAULT_ELICIT_INTERVAL_NS,
                 pending_timeout_ns: int = DEFAULT_PENDING_TIMEOUT_NS, cool_down_ns: int = DEFAULT_COOL_DOWN_NS,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        native = lib.lbd_receiver_new(QUEUE_CAPACITY, receive_batch, elicit_interval_ns, pending_timeout_ns,
                                      cool_down_ns, max_pending)
        if native == ffi.NULL:
            raise MemoryError("cannot allocate the receiver agent")
        self._native = native
        self._event = ffi.new("lbd_event_t *")
        self.counters = lib.lbd_receiver_counters(native)
        self.runs_inline = True  # False once an agent runner owns the duty (see native_duty)
        self._backlog: deque[Any] = deque()  # commands the full queue did not take yet

    def native_duty(self) -> tuple[Any, Any]:
        """``(lbd_receiver_do_work, state)`` for an agent runner; from then on only the runner calls it."""
        self.runs_inline = False
        return ffi.addressof(lib, "lbd_receiver_do_work"), ffi.cast("void *", self._native)

    def do_work(self, now_ns: int) -> int:
        """One duty cycle (cffi releases the GIL during the call); 0 once closed."""
        native = self._native
        return 0 if native is None else lib.lbd_receiver_do_work(native, now_ns)

    @staticmethod
    def command(kind: int, **fields: Any) -> Any:
        """A zeroed ``lbd_command_t`` of ``kind`` with ``fields`` set (``address``: sockaddr bytes); images are
        reliable and rejoin unless told otherwise."""
        command = ffi.new("lbd_command_t *")
        command.type = kind
        command.drop = -1.0
        command.send_drop = -1.0
        command.reliable = 1
        command.rejoin = 1
        address = fields.pop("address", None)
        if address:
            command.address_length = len(address)
            ffi.memmove(command.address, address, len(address))
        for name, value in fields.items():
            setattr(command, name, value)
        return command

    def offer(self, command: Any) -> None:
        """Queues a command; when the queue is full it waits in a backlog, offered again before anything newer
        (flushed by :meth:`poll_events`, which the conductor calls every cycle): the control plane never
        blocks on the agent."""
        self._flush_backlog()
        if self._backlog or lib.lbd_receiver_offer(self._native, command) != 1:
            self._backlog.append(command)

    def _flush_backlog(self) -> None:
        backlog = self._backlog
        while backlog and lib.lbd_receiver_offer(self._native, backlog[0]) == 1:
            backlog.popleft()

    def poll_events(self, limit: int = 256) -> list[ReceiverEvent]:
        """What the agent reported since the last call (oldest first); first offers the backlog again."""
        if self._native is None:
            return []
        self._flush_backlog()
        events: list[ReceiverEvent] = []
        event = self._event
        while len(events) < limit and lib.lbd_receiver_poll_event(self._native, event):
            events.append(ReceiverEvent(event))
        return events

    def close(self) -> None:
        """Frees the agent; its runner must have stopped."""
        self._backlog.clear()
        if self._native is not None:
            native, self._native = self._native, None
            lib.lbd_receiver_free(native)
