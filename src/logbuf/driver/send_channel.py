"""``SendChannelEndpoint``: one UDP send channel (its sockets) shared by the network publications on it.

Publications on the same transport (same endpoint and interface, any stream or session) share the sockets.
The conductor creates the sockets (:class:`UdpTransport`) and hands the native sender agent their file
descriptors (:meth:`add_command`); the agent reads the control frames receivers send back (SM, NAK, RTTM, ERR)
and routes each to the publication of its ``(session id, stream id)``.  Frames for sessions it does not have
are ignored; a datagram that is malformed or not all control frames is counted as an invalid packet and
dropped.  The sockets are closed only after the agent acknowledged the endpoint's removal.

A multi-destination-cast endpoint (``control-mode=dynamic|manual``) sends every frame of its publications to
each of its destinations: dynamic ones are the sources of receivers' status messages (dropped after
:data:`~logbuf.driver.udp.destination_tracker.DEFAULT_DESTINATION_TIMEOUT_NS` without one, Aeron's destination timeout), manual ones those the clients added
(:attr:`SendChannelEndpoint.destinations`, mirrored in the agent).
"""

from __future__ import annotations

from typing import Any, Protocol

from logbuf.driver.network_counters import NetworkCounters
from logbuf.driver.udp.destination_tracker import DEFAULT_DESTINATION_TIMEOUT_NS
from logbuf.driver.udp.impairment import Impairment
from logbuf.driver.udp_channel import UdpChannel
from logbuf.driver.udp_transport import MAX_BATCH, UdpTransport
from logbuf.native import lib


class SessionHolder(Protocol):
    """What sends on an endpoint: a network publication of one session and stream."""

    session_id: int
    stream_id: int


class SendChannelEndpoint:
    def __init__(self, channel: UdpChannel, transport: UdpTransport, counters: NetworkCounters | None = None,
                 status_counter_id: int = -1, endpoint_id: int = 0) -> None:
        self.channel = channel
        self.key = channel.key
        self.transport = transport
        self.counters = counters
        self.status_counter_id = status_counter_id
        self.endpoint_id = endpoint_id  # the native sender agent's name for it
        self.local_sockaddr_counter_id = -1  # snd-local-sockaddr, when the conductor allocated one
        self.publications: dict[tuple[int, int], SessionHolder] = {}
        # manual MDC: (sockaddr, the ADD_DESTINATION's correlation id) as the agent's table holds them - a
        # destination added twice is there twice
        self.destinations: list[tuple[bytes, int]] = []

    def add(self, publication: SessionHolder) -> None:
        key = (publication.session_id, publication.stream_id)
        if key in self.publications:
            raise ValueError(f"session {key[0]} stream {key[1]} already sends on {self.key}")
        self.publications[key] = publication

    def remove(self, publication: SessionHolder) -> None:
        key = (publication.session_id, publication.stream_id)
        if self.publications.get(key) is publication:
            del self.publications[key]

    @property
    def is_unused(self) -> bool:
        return not self.publications

    def fill_add_command(self, command: Any) -> None:
        """Fills an ``LBD_SND_ADD_ENDPOINT`` command: the fds, the receive batch and the impairments (applied
        in C, with the impairment's parameters and seed, to everything the endpoint sends and to the control
        datagrams it receives)."""
        transport = self.transport
        command.type = lib.LBD_SND_ADD_ENDPOINT
        command.endpoint_id = self.endpoint_id
        command.send_fd = transport.send_fd
        command.control_fd = transport.recv_fd
        command.receive_batch = max(1, min(transport.options.receive_batch, MAX_BATCH))
        mode = self.channel.control_mode
        command.control_mode = (lib.LBD_MDC_DYNAMIC if mode == "dynamic" else
                                lib.LBD_MDC_MANUAL if mode == "manual" else lib.LBD_MDC_NONE)
        command.destination_timeout_ns = DEFAULT_DESTINATION_TIMEOUT_NS
        _fill_impairment(command.send_impairment, transport.send_impairment)
        _fill_impairment(command.receive_impairment, transport.receive_impairment)

    @property
    def is_manual(self) -> bool:
        return self.channel.control_mode == "manual"

    def close(self) -> None:
        self.transport.close()

    def __repr__(self) -> str:
        return f"SendChannelEndpoint({self.key}, {len(self.publications)} publications)"


def _fill_impairment(spec: Any, impairment: Impairment | None) -> None:
    if impairment is None:
        return
    spec.enabled = 1
    spec.drop = impairment.drop
    spec.duplicate = impairment.duplicate
    spec.reorder = impairment.reorder
    spec.delay_ns = impairment.delay_ns
    spec.jitter_ns = impairment.jitter_ns
    spec.reorder_delay_ns = impairment.reorder_delay_ns
    spec.seed = impairment.seed & 0xFFFFFFFFFFFFFFFF
