"""``Sender``: the driver's sender agent - every network publication's sender duty, in C (``native/drv_sender.c``).

The agent holds no Python object and takes no GIL: the conductor (this module's caller, the control plane)
talks to it only through two bounded single-producer single-consumer queues - commands in (add / remove a send
endpoint or a publication, drain a publication), events out (removals acknowledged, a publication drained, a
corrupted log).  Its duty, ``lbd_sender_do_work(agent, now_ns)``, polls each endpoint's control socket for SM,
NAK, RTTM and ERR frames, runs flow control, sends SETUP, data, heartbeats and retransmits with ``sendmmsg``,
and writes snd-pos, snd-lmt, snd-bpe, pub-pos, pub-lmt and the sender's system counters into cnc.dat.

A log, a counter or a socket handed to the agent stays alive until the agent acknowledged its removal
(:meth:`Sender.poll_events`), so the duty can run on any thread: today the driver's shared loop calls
:meth:`do_work` (cffi releases the GIL for the call); :meth:`native_duty` hands the function and its state to a
native agent runner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

from logbuf.native import ffi, lib

COMMAND_CAPACITY = 1024
EVENT_CAPACITY = 1024

#: the system counters the agent adds to: lbd_snd_counters_t's fields
COUNTER_FIELDS = (
    "bytes_sent", "bytes_received", "naks_received", "status_messages_received", "heartbeats_sent",
    "retransmits_sent", "invalid_packets", "short_sends", "flow_control_limits", "retransmitted_bytes",
    "retransmit_pool_overflow", "error_frames_received",
)


class SenderEvent(NamedTuple):
    """One record of the agent's events queue (``lbd_snd_event_t``)."""

    type: int  # lib.LBD_SND_*
    endpoint_id: int
    publication_id: int
    value: int


class Sender:
    """The native sender agent and its two queues (see the module docstring)."""

    def __init__(self, counters: Mapping[str, Any] | None = None) -> None:
        """``counters``: ``int64_t *`` into cnc.dat for some of :data:`COUNTER_FIELDS` (the rest are not
        counted); they must stay mapped for the agent's life."""
        fields = ffi.new("lbd_snd_counters_t *")
        for name, pointer in (counters or {}).items():
            if name not in COUNTER_FIELDS:
                raise ValueError(f"the sender agent keeps no counter {name!r}")
            setattr(fields, name, ffi.cast("int64_t *", pointer))
        agent = lib.lbd_sender_new(fields, COMMAND_CAPACITY, EVENT_CAPACITY)
        if agent == ffi.NULL:
            raise MemoryError("cannot create the native sender agent")
        self._agent: Any = agent
        self._state = ffi.cast("void *", agent)
        self._commands = ffi.cast("lb_spsc_t *", lib.lbd_sender_commands(agent))
        self._events = ffi.cast("lb_spsc_t *", lib.lbd_sender_events(agent))
        self._backlog: deque[Any] = deque()  # commands the full queue did not take yet (offered again first)
        self._event = ffi.new("lbd_snd_event_t *")
        self._event_size = ffi.sizeof("lbd_snd_event_t")
        self._command_size = ffi.sizeof("lbd_snd_command_t")
        self._next_endpoint_id = 1

    # -- the duty ----------------------------------------------------------------------------------------

    def do_work(self, now_ns: int) -> int:
        """One duty cycle of the agent on this thread (``now_ns``: CLOCK_MONOTONIC, ``time.monotonic_ns()``)."""
        if self._agent is None:
            return 0
        return int(lib.lbd_sender_do_work(self._state, now_ns))

    def native_duty(self) -> tuple[Any, Any]:
        """``(int32_t (*)(void *, int64_t), void *)``: the duty and its state, for a native agent runner."""
        return ffi.addressof(lib, "lbd_sender_do_work"), self._state

    # -- commands ------------------------------------------------------------------------------------

    def new_command(self, command_type: int) -> Any:
        """A zeroed ``lbd_snd_command_t`` of ``command_type`` to fill and :meth:`offer`."""
        command = ffi.new("lbd_snd_command_t *")
        command.type = command_type
        return command

    def next_endpoint_id(self) -> int:
        endpoint_id = self._next_endpoint_id
        self._next_endpoint_id += 1
        return endpoint_id

    def offer(self, command: Any) -> None:
        """Queues a command; when the queue is full it waits in a backlog, offered again before anything
        newer (the agent drains the queue every duty cycle)."""
        self._flush_backlog()
        if self._backlog or lib.lb_spsc_offer(self._commands, command, self._command_size) != 1:
            self._backlog.append(command)

    def _flush_backlog(self) -> None:
        backlog = self._backlog
        while backlog and lib.lb_spsc_offer(self._commands, backlog[0], self._command_size) == 1:
            backlog.popleft()

    def poll_events(self, limit: int = 256) -> list[SenderEvent]:
        """What the agent reported since the last call (oldest first)."""
        if self._agent is None:
            return []
        self._flush_backlog()
        events: list[SenderEvent] = []
        event = self._event
        for _ in range(limit):
            if lib.lb_spsc_poll(self._events, event, self._event_size) < 0:
                break
            events.append(SenderEvent(event.type, event.endpoint_id, event.publication_id, event.value))
        return events

    @property
    def pending_commands(self) -> int:
        """Commands not yet taken by the agent (queued or in the backlog)."""
        return (0 if self._agent is None else lib.lb_spsc_size(self._commands)) + len(self._backlog)

    @property
    def publication_count(self) -> int:
        return 0 if self._agent is None else int(lib.lbd_sender_publication_count(self._agent))

    @property
    def endpoint_count(self) -> int:
        return 0 if self._agent is None else int(lib.lbd_sender_endpoint_count(self._agent))

    def destination_count(self, endpoint_id: int) -> int:
        """The destinations a multi-destination-cast endpoint sends to now (-1: no such endpoint)."""
        return -1 if self._agent is None else int(lib.lbd_sender_destination_count(self._agent, endpoint_id))

    @property
    def setups_sent(self) -> int:
        return 0 if self._agent is None else int(lib.lbd_sender_setups_sent(self._agent))

    def close(self) -> None:
        """Frees the agent; only once no thread runs its duty (driver shutdown)."""
        if self._agent is not None:
            lib.lbd_sender_free(self._agent)
            self._agent = None
            self._backlog.clear()
