"""``DestinationTracker``: where a multi-destination-cast publication's frames go (Aeron's destination tracker),
sans-IO - the specification of the native sender agent's MDC endpoints (``native/drv_sender.c``; a property
test compares them).

- ``control-mode=dynamic``: a status message from a source that is not yet a destination makes it one (the SM's
  receiver id and source port identify it from then on); a destination without a status message for the
  timeout (5 s, Aeron's) is dropped when the next frame goes.
- ``control-mode=manual``: destinations are added and removed by the client (ADD_DESTINATION /
  REMOVE_DESTINATION); a status message only marks its destination active (the first one names its receiver).

Addresses are raw ``sockaddr`` bytes (IPv4 or IPv6).  Removal swaps the last destination into the gap, as the
agent's array does, so the order of :meth:`targets` is the agent's.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

DEFAULT_DESTINATION_TIMEOUT_NS = 5_000_000_000
MAX_DESTINATIONS = 256  # the agent's LBD_SND_MAX_DESTINATIONS

_FAMILY = struct.Struct("=H")


def _family(address: bytes) -> int:
    return int(_FAMILY.unpack_from(address)[0])


def same_port(a: bytes, b: bytes) -> bool:
    return _family(a) == _family(b) and a[2:4] == b[2:4]


def same_host(a: bytes, b: bytes) -> bool:
    if _family(a) != _family(b):
        return False
    return a[8:24] == b[8:24] if _family(a) == socket.AF_INET6 else a[4:8] == b[4:8]


@dataclass(slots=True, eq=False)
class Destination:
    address: bytes
    receiver_id: int | None  # None until an SM from it names its receiver (manual)
    last_activity_ns: int
    registration_id: int = -1  # manual: the ADD_DESTINATION's correlation id


class DestinationTracker:
    def __init__(self, manual: bool, timeout_ns: int = DEFAULT_DESTINATION_TIMEOUT_NS) -> None:
        if timeout_ns <= 0:
            raise ValueError("the destination timeout must be positive")
        self.manual = manual
        self.timeout_ns = timeout_ns
        self.destinations: list[Destination] = []

    def on_status_message(self, receiver_id: int, source: bytes, now_ns: int) -> None:
        """An SM from ``source``: its destination is active (dynamic: a new source becomes one)."""
        if not 8 <= len(source) <= 32:
            return
        for d in self.destinations:
            if d.receiver_id is not None:
                match = d.receiver_id == receiver_id and same_port(d.address, source)
            else:
                match = same_host(d.address, source) and same_port(d.address, source)
            if match:
                if d.receiver_id is None:
                    d.receiver_id = receiver_id
                d.last_activity_ns = now_ns
                return
        if not self.manual and len(self.destinations) < MAX_DESTINATIONS:
            self.destinations.append(Destination(bytes(source), receiver_id, now_ns))

    def add(self, address: bytes, registration_id: int, now_ns: int) -> bool:
        """ADD_DESTINATION (manual only): True when added."""
        if not self.manual or len(self.destinations) >= MAX_DESTINATIONS or not 8 <= len(address) <= 32:
            return False
        self.destinations.append(Destination(bytes(address), None, now_ns, registration_id))
        return True

    def remove(self, address: bytes) -> None:
        """REMOVE_DESTINATION: the last destination added at that host and port goes."""
        for i in range(len(self.destinations) - 1, -1, -1):
            d = self.destinations[i]
            if same_host(d.address, address) and same_port(d.address, address):
                self._remove_at(i)
                return

    def targets(self, now_ns: int) -> list[bytes]:
        """Where a frame sent now goes (dynamic: silent destinations are dropped first)."""
        if not self.manual:
            for i in range(len(self.destinations) - 1, -1, -1):
                if now_ns - self.destinations[i].last_activity_ns > self.timeout_ns:
                    self._remove_at(i)
        return [d.address for d in self.destinations]

    def _remove_at(self, i: int) -> None:
        last = self.destinations.pop()
        if i < len(self.destinations):
            self.destinations[i] = last
