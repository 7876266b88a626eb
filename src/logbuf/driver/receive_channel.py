"""``ReceiveChannelEndpoint``: the conductor's record of one UDP receive channel (Aeron's
ReceiveChannelEndpoint): its transport (the socket Python created and configured), the streams subscribed on
it and the images rebuilt from it.

The data plane of the endpoint - receiving, dispatching by session and stream, rebuilding images, NAKs and
status messages - runs in the native receiver agent (:class:`~logbuf.driver.receiver.Receiver`), which knows
the endpoint by ``endpoint_id`` and holds its socket's fd until it reports the endpoint removed.

An MDS endpoint (``aeron:udp?control-mode=manual``, Aeron's multi-destination subscription) has no socket of
its own: its client adds and removes receive destinations, each a socket of its own (:class:`ReceiveDestination`)
that feeds the same images; each image answers the sender through every destination it hears it on.
"""

from __future__ import annotations

from dataclasses import dataclass

from logbuf.channel import ChannelUri
from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.udp_channel import UdpChannel
from logbuf.driver.udp_transport import UdpTransport

MDS_KEY = "aeron:udp?control-mode=manual"


@dataclass
class ReceiveDestination:
    """One receive destination of an MDS endpoint: its channel and socket, known to the agent by ``id``."""

    id: int
    channel: UdpChannel
    transport: UdpTransport
    local_sockaddr_counter_id: int = -1  # its rcv-local-sockaddr counter
    removing: bool = False


class ReceiveChannelEndpoint:
    def __init__(self, channel: UdpChannel | None, transport: UdpTransport | None, endpoint_id: int,
                 receiver_id: int, *, status_counter_id: int = -1, uri: ChannelUri | None = None) -> None:
        """``channel`` and ``transport`` None: an MDS endpoint of ``uri`` (control-mode=manual)."""
        self.channel = channel
        self.uri = uri if uri is not None else channel.uri if channel is not None else ChannelUri.parse(MDS_KEY)
        self.key = channel.receive_key if channel is not None else MDS_KEY
        self.transport = transport
        self.destinations: dict[int, ReceiveDestination] = {}  # MDS: by destination id
        self.nak_delay_ns: int | None = None  # nak-delay of the channel that opened it (None: the driver's)
        self.socket_sndbuf: int | None = None  # MDS: its destinations' socket buffers (the subscription's)
        self.socket_rcvbuf: int | None = None
        self.endpoint_id = endpoint_id
        self.receiver_id = receiver_id
        self.status_counter_id = status_counter_id
        self.local_sockaddr_counter_id = -1  # rcv-local-sockaddr, when the conductor allocated one
        self.stream_refs: dict[int, int] = {}  # stream id -> subscriptions on it
        self.images: dict[int, PublicationImage] = {}  # correlation id -> image
        self.closing = False  # removal asked of the agent, not yet acknowledged
        self.group_tag: int | None = None  # gtag= of its subscriptions: carried by its status messages

    def add_subscription(self, stream_id: int) -> bool:
        """One subscription of ``stream_id`` more; True when it is the stream's first."""
        refs = self.stream_refs.get(stream_id, 0)
        self.stream_refs[stream_id] = refs + 1
        return refs == 0

    def remove_subscription(self, stream_id: int) -> bool:
        """One subscription of ``stream_id`` fewer; True when it was the last (the stream's images end)."""
        refs = self.stream_refs.get(stream_id, 0) - 1
        if refs > 0:
            self.stream_refs[stream_id] = refs
            return False
        self.stream_refs.pop(stream_id, None)
        return True

    @property
    def is_manual(self) -> bool:
        """An MDS endpoint: its sockets are its destinations."""
        return self.channel is None

    @property
    def is_multicast(self) -> bool:
        return self.channel is not None and self.channel.is_multicast

    @property
    def is_unused(self) -> bool:
        return not self.stream_refs

    def images_of(self, stream_id: int) -> list[PublicationImage]:
        return [image for image in self.images.values() if image.stream_id == stream_id and not image.removing]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        for destination in self.destinations.values():
            destination.transport.close()
        self.destinations.clear()

    def __repr__(self) -> str:
        return f"ReceiveChannelEndpoint({self.key}, streams {sorted(self.stream_refs)}, {len(self.images)} images)"
