"""``ReceiveChannelEndpoint``: the conductor's record of one UDP receive channel (Aeron's
ReceiveChannelEndpoint): its transport (the socket Python created and configured), the streams subscribed on
it and the images rebuilt from it.

The data plane of the endpoint - receiving, dispatching by session and stream, rebuilding images, NAKs and
status messages - runs in the native receiver agent (:class:`~logbuf.driver.receiver.Receiver`), which knows
the endpoint by ``endpoint_id`` and holds its socket's fd until it reports the endpoint removed.
"""

from __future__ import annotations

from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.udp_channel import UdpChannel
from logbuf.driver.udp_transport import UdpTransport


class ReceiveChannelEndpoint:
    def __init__(self, channel: UdpChannel, transport: UdpTransport, endpoint_id: int, receiver_id: int,
                 *, status_counter_id: int = -1) -> None:
        self.channel = channel
        self.key = channel.receive_key
        self.transport = transport
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
    def is_unused(self) -> bool:
        return not self.stream_refs

    def images_of(self, stream_id: int) -> list[PublicationImage]:
        return [image for image in self.images.values() if image.stream_id == stream_id and not image.removing]

    def close(self) -> None:
        self.transport.close()

    def __repr__(self) -> str:
        return f"ReceiveChannelEndpoint({self.key}, streams {sorted(self.stream_refs)}, {len(self.images)} images)"
