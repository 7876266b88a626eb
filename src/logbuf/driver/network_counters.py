"""``NetworkCounters``: the UDP system counters, kept as plain Python ints and published into cnc.dat.

The sans-IO state machines count with ``counters.name += n`` on one driver-wide :class:`SenderCounters` and
one :class:`ReceiverCounters` (cheap: no shared-memory store per datagram).  :meth:`NetworkCounters.publish`
adds what changed since its last call to the system counters (Aeron's ids) - the driver calls it at least
every millisecond or so, which is as fresh as any reader can use.  It adds (atomically) rather than stores
because native agents add to the same counters from their own threads: the sender agent counts the fields
of :data:`SENDER_AGENT_COUNTERS` itself.
"""

from __future__ import annotations

from typing import Any

from logbuf.cnc.counters import CountersManager, SystemCounter
from logbuf.driver.udp.counters import ReceiverCounters, SenderCounters
from logbuf.native import lib
from logbuf.position import Position

# system counter id -> (sender field, receiver field, extra field): the value is their sum
BYTES_SENT = SystemCounter.BYTES_SENT
BYTES_RECEIVED = SystemCounter.BYTES_RECEIVED
NAKS_SENT = SystemCounter.NAK_MESSAGES_SENT
NAKS_RECEIVED = SystemCounter.NAK_MESSAGES_RECEIVED
STATUS_MESSAGES_SENT = SystemCounter.STATUS_MESSAGES_SENT
STATUS_MESSAGES_RECEIVED = SystemCounter.STATUS_MESSAGES_RECEIVED
HEARTBEATS_SENT = SystemCounter.HEARTBEATS_SENT
HEARTBEATS_RECEIVED = SystemCounter.HEARTBEATS_RECEIVED
RETRANSMITS_SENT = SystemCounter.RETRANSMITS_SENT
FLOW_CONTROL_UNDER_RUNS = SystemCounter.FLOW_CONTROL_UNDER_RUNS
FLOW_CONTROL_OVER_RUNS = SystemCounter.FLOW_CONTROL_OVER_RUNS
INVALID_PACKETS = SystemCounter.INVALID_PACKETS
SHORT_SENDS = SystemCounter.SHORT_SENDS
SENDER_FLOW_CONTROL_LIMITS = SystemCounter.SENDER_FLOW_CONTROL_LIMITS
LOSS_GAP_FILLS = SystemCounter.LOSS_GAP_FILLS
RETRANSMITTED_BYTES = SystemCounter.RETRANSMITTED_BYTES
RETRANSMIT_POOL_OVERFLOW = SystemCounter.RETRANSMIT_OVERFLOW
ERROR_FRAMES_RECEIVED = SystemCounter.ERROR_FRAMES_RECEIVED
ERROR_FRAMES_SENT = SystemCounter.ERROR_FRAMES_SENT

#: SenderCounters field -> system counter id
_SENDER_FIELDS = {
    "bytes_sent": BYTES_SENT,
    "naks_received": NAKS_RECEIVED,
    "status_messages_received": STATUS_MESSAGES_RECEIVED,
    "heartbeats_sent": HEARTBEATS_SENT,
    "retransmits_sent": RETRANSMITS_SENT,
    "invalid_packets": INVALID_PACKETS,
    "short_sends": SHORT_SENDS,
    "flow_control_limits": SENDER_FLOW_CONTROL_LIMITS,
    "retransmitted_bytes": RETRANSMITTED_BYTES,
    "retransmit_pool_overflow": RETRANSMIT_POOL_OVERFLOW,
    "error_frames_received": ERROR_FRAMES_RECEIVED,
}
#: the system counters the native sender agent adds to (``lbd_snd_counters_t`` field -> system counter id): the
#: sender's, and the control bytes it received
SENDER_AGENT_COUNTERS = {**_SENDER_FIELDS, "bytes_received": BYTES_RECEIVED}
_RECEIVER_FIELDS = {
    "bytes_received": BYTES_RECEIVED,
    "naks_sent": NAKS_SENT,
    "status_messages_sent": STATUS_MESSAGES_SENT,
    "heartbeats_received": HEARTBEATS_RECEIVED,
    "flow_control_under_runs": FLOW_CONTROL_UNDER_RUNS,
    "flow_control_over_runs": FLOW_CONTROL_OVER_RUNS,
    "invalid_packets": INVALID_PACKETS,
    "loss_gap_fills": LOSS_GAP_FILLS,
    "error_frames_sent": ERROR_FRAMES_SENT,
}


class NetworkCounters:
    """The sender's and the receiver's counters (shared by every publication / image of the driver), plus
    the bytes that do not pass through them: control frames the receiver sends, those the sender receives."""

    def __init__(self, counters: CountersManager, system: dict[int, int]) -> None:
        self.sender = SenderCounters()
        self.receiver = ReceiverCounters()
        self.control_bytes_sent = 0  # SMs and NAKs (and SETUP requests) the receiver sent
        self.control_bytes_received = 0  # SMs, NAKs, RTTMs the sender received
        self._counters = counters
        self._ids = system
        self._published: dict[int, int] = {}
        self._positions: dict[int, Position] = {}
        self.native_receiver: Any = None  # the receiver agent's lbd_receiver_counters_t (it writes them)

    def totals(self) -> dict[int, int]:
        """Every network system counter's value by system counter id."""
        values: dict[int, int] = {}
        for name, system_id in _SENDER_FIELDS.items():
            values[system_id] = values.get(system_id, 0) + getattr(self.sender, name)
        for name, system_id in _RECEIVER_FIELDS.items():
            values[system_id] = values.get(system_id, 0) + getattr(self.receiver, name)
        values[BYTES_SENT] += self.control_bytes_sent
        values[BYTES_RECEIVED] += self.control_bytes_received
        native = self.native_receiver
        if native is not None:
            for name, system_id in _RECEIVER_FIELDS.items():
                if hasattr(native, name):
                    values[system_id] = values.get(system_id, 0) + getattr(native, name)
            values[BYTES_SENT] += native.control_bytes_sent
        return values

    def publish(self) -> int:
        """Adds to each system counter what its fields counted since the last call; returns how many
        changed."""
        changed = 0
        published = self._published
        for system_id, value in self.totals().items():
            delta = value - published.get(system_id, 0)
            if delta:
                published[system_id] = value
                position = self._positions.get(system_id)
                if position is None:
                    position = self._positions[system_id] = self._counters.position(self._ids[system_id])
                lib.lb_get_and_add_i64(position.pointer, delta)
                changed += 1
        return changed
