"""Helpers of the UDP driver tests: free ports, sequenced messages, counters, a receiving subscriber (waiting:
``support.wait_until``)."""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Callable, Iterator

import logbuf
from logbuf.cnc import counters as c
from logbuf.cnc.counters import CounterInfo
from logbuf.driver.agents import AERON_THREADING_MODE
from logbuf.samples.ports import free_udp_ports

SEQ = struct.Struct("<Q")

# system counter ids (Aeron's), by the names the tests use
S = c.SystemCounter
BYTES_SENT = S.BYTES_SENT
BYTES_RECEIVED = S.BYTES_RECEIVED
NAKS_SENT = S.NAK_MESSAGES_SENT
NAKS_RECEIVED = S.NAK_MESSAGES_RECEIVED
STATUS_MESSAGES_SENT = S.STATUS_MESSAGES_SENT
STATUS_MESSAGES_RECEIVED = S.STATUS_MESSAGES_RECEIVED
HEARTBEATS_SENT = S.HEARTBEATS_SENT
HEARTBEATS_RECEIVED = S.HEARTBEATS_RECEIVED
RETRANSMITS_SENT = S.RETRANSMITS_SENT
INVALID_PACKETS = S.INVALID_PACKETS
ERRORS = S.ERRORS
SHORT_SENDS = S.SHORT_SENDS
SENDER_FLOW_CONTROL_LIMITS = S.SENDER_FLOW_CONTROL_LIMITS
LOSS_GAP_FILLS = S.LOSS_GAP_FILLS
RETRANSMITTED_BYTES = S.RETRANSMITTED_BYTES

def free_udp_port() -> int:
    """A port nothing on 127.0.0.1 is bound to right now (the kernel's choice)."""
    return free_udp_ports(1)[0]


def message(seq: int, size: int) -> bytes:
    """``size`` bytes (>= 8): the sequence number, then bytes derived from it (a mixed-up byte is caught)."""
    return SEQ.pack(seq) + bytes((seq * 31 + i) & 0xFF for i in range(size - SEQ.size))


class Received:
    """A fragment handler (through a FragmentAssembler) recording sequence numbers and corrupt messages."""

    def __init__(self) -> None:
        self.sequences: list[int] = []
        self.corrupt = 0
        self.assembler = logbuf.FragmentAssembler(self._on_message)

    def _on_message(self, buffer: memoryview, header: object) -> None:
        data = bytes(buffer)
        seq = SEQ.unpack_from(data)[0]
        if data != message(seq, len(data)):
            self.corrupt += 1
        self.sequences.append(seq)

    def poll(self, subscription: logbuf.Subscription, limit: int = 256) -> int:
        return subscription.poll(self.assembler, limit)


def publish(pub: logbuf.Publication, messages: list[bytes], *, timeout: float = 20.0,
            between: Callable[[], object] | None = None) -> None:
    """Offers every message in order, retrying while back-pressured (running ``between`` meanwhile)."""
    deadline = time.monotonic() + timeout
    for data in messages:
        while pub.offer(data) < 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"publishing stuck at position {pub.position}")
            if between is None or not between():
                time.sleep(0.0002)
        if between is not None:
            between()


def stream_counters(client: logbuf.Client, type_id: int) -> list[CounterInfo]:
    return [info for info in client.counters if info.type_id == type_id]


def counter(client: logbuf.Client, type_id: int, registration_id: int | None = None) -> CounterInfo:
    found = [i for i in stream_counters(client, type_id) if registration_id is None or
             c.decode_stream_position_key(i.key)[0] == registration_id]
    assert len(found) == 1, f"expected one counter of type {type_id}, found {found}"
    return found[0]


def system(client: logbuf.Client, system_id: int) -> int:
    return client.counters.counter_value(system_id)


def threading_mode_of(client: logbuf.Client) -> str:
    """The threading mode of ``client``'s driver, as its sender cycle-time counter's label names it (Aeron's
    label: ``...: SHARED``)."""
    label = client.counters.counter_label(S.SENDER_MAX_CYCLE_TIME)
    named = label.rpartition(": ")[2].strip()
    return {aeron: mode for mode, aeron in AERON_THREADING_MODE.items()}[named]


@contextlib.contextmanager
def subscription(client: logbuf.Client, channel: str, stream_id: int, **kwargs: object) -> Iterator[
        logbuf.Subscription]:
    sub = client.add_subscription(channel, stream_id, **kwargs)  # type: ignore[arg-type]
    try:
        yield sub
    finally:
        sub.close()
