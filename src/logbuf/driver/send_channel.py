"""``SendChannelEndpoint``: one UDP send channel (its sockets) shared by the network publications on it.

Publications on the same transport (same endpoint and interface, any stream or session) share the sockets.
The endpoint reads the control frames receivers send back (SM, NAK, RTTM, ERR) and routes each to the
publication of its ``(session id, stream id)``; frames for sessions it does not have are ignored, anything
malformed or not a control frame is counted as an invalid packet and dropped.
"""

from __future__ import annotations

from typing import Protocol

from logbuf.driver.network_counters import NetworkCounters
from logbuf.driver.udp_channel import UdpChannel
from logbuf.driver.udp_transport import NOT_DATA, UdpTransport
from logbuf.protocol.datagram import ControlFrame, ControlPacket, classify
from logbuf.protocol.header import MalformedFrameError


class ControlFrameHandler(Protocol):
    """What the endpoint hands a control frame to: a network publication of one session and stream."""

    session_id: int
    stream_id: int

    def on_control(self, frame: ControlFrame, source: bytes, now_ns: int) -> int: ...

MAX_BATCHES_PER_CYCLE = 4


class SendChannelEndpoint:
    def __init__(self, channel: UdpChannel, transport: UdpTransport, counters: NetworkCounters,
                 status_counter_id: int = -1) -> None:
        self.channel = channel
        self.key = channel.key
        self.transport = transport
        self.counters = counters
        self.status_counter_id = status_counter_id
        self.local_sockaddr_counter_id = -1  # snd-local-sockaddr, when the conductor allocated one
        self.publications: dict[tuple[int, int], ControlFrameHandler] = {}

    def add(self, publication: ControlFrameHandler) -> None:
        key = (publication.session_id, publication.stream_id)
        if key in self.publications:
            raise ValueError(f"session {key[0]} stream {key[1]} already sends on {self.key}")
        self.publications[key] = publication

    def remove(self, publication: ControlFrameHandler) -> None:
        key = (publication.session_id, publication.stream_id)
        if self.publications.get(key) is publication:
            del self.publications[key]

    @property
    def is_unused(self) -> bool:
        return not self.publications

    def poll_control(self, now_ns: int) -> int:
        """Reads control frames (a few batches at most) and hands them to their publications."""
        work = 0
        transport = self.transport
        for _ in range(MAX_BATCHES_PER_CYCLE):
            batch = transport.receive(now_ns)
            for received in batch:
                work += self._on_datagram(received.datagram, received.kind, received.source, now_ns)
            if len(batch) < transport.options.receive_batch:
                break
        if transport.send_impairment is not None:
            transport.service(now_ns)
        return work

    def _on_datagram(self, datagram: memoryview | bytes, kind: int, source: bytes, now_ns: int) -> int:
        counters = self.counters
        counters.control_bytes_received += len(datagram)
        if kind != NOT_DATA:  # data (or malformed data) has no business on a sender's control socket
            counters.sender.invalid_packets += 1
            return 1
        try:
            packet = classify(datagram)
        except MalformedFrameError:
            counters.sender.invalid_packets += 1
            return 1
        if not isinstance(packet, ControlPacket):
            counters.sender.invalid_packets += 1
            return 1
        work = 1
        publications = self.publications
        for frame in packet.frames:
            publication = publications.get((frame.session_id, frame.stream_id))
            if publication is not None:
                work += publication.on_control(frame, source, now_ns)
        return work

    def close(self) -> None:
        self.transport.close()

    def __repr__(self) -> str:
        return f"SendChannelEndpoint({self.key}, {len(self.publications)} publications)"
