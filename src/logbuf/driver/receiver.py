"""``Receiver``: the driver's receiver duty - datagrams into images, then every image's loss, liveness and
status messages.

In shared mode the media driver runs it in the same loop as the conductor and the sender; the conductor
adds and removes receive channel endpoints between cycles.  One ``poll(2)`` over every endpoint's socket
says which have datagrams waiting: one system call per cycle instead of one per endpoint.  Every endpoint's
images are polled each cycle (cheap when nothing is due).
"""

from __future__ import annotations

from logbuf.driver.endpoint_poller import EndpointPoller
from logbuf.driver.receive_channel import ReceiveChannelEndpoint


class Receiver:
    def __init__(self) -> None:
        self._endpoints: EndpointPoller[ReceiveChannelEndpoint] = EndpointPoller()

    @property
    def endpoints(self) -> list[ReceiveChannelEndpoint]:
        return self._endpoints.endpoints

    def add_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
        self._endpoints.add(endpoint)

    def remove_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
        self._endpoints.remove(endpoint)

    def do_work(self, now_ns: int) -> int:
        work = 0
        for endpoint in self._endpoints.ready():
            work += endpoint.receive(now_ns)
        for endpoint in self.endpoints:
            work += endpoint.poll(now_ns)
        return work
