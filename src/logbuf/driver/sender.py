"""``Sender``: the driver's sender duty - control frames in, then every network publication's data out.

In shared mode the media driver runs it in the same loop as the conductor and the receiver; the conductor
adds and removes publications and send channel endpoints between cycles.  One ``poll(2)`` over every
endpoint's control socket says which have something to read (SMs arrive a few times per window, so most
cycles read nothing): one system call per cycle instead of one per endpoint.
"""

from __future__ import annotations

from logbuf.driver.endpoint_poller import EndpointPoller
from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.send_channel import SendChannelEndpoint


class Sender:
    def __init__(self) -> None:
        self._endpoints: EndpointPoller[SendChannelEndpoint] = EndpointPoller()
        self.publications: list[NetworkPublication] = []

    @property
    def endpoints(self) -> list[SendChannelEndpoint]:
        return self._endpoints.endpoints

    def add_endpoint(self, endpoint: SendChannelEndpoint) -> None:
        self._endpoints.add(endpoint)

    def remove_endpoint(self, endpoint: SendChannelEndpoint) -> None:
        self._endpoints.remove(endpoint)

    def do_work(self, now_ns: int) -> int:
        work = 0
        for endpoint in self._endpoints.ready():  # SMs first: they may open the window this cycle uses
            work += endpoint.poll_control(now_ns)
        for publication in self.publications:
            work += publication.send(now_ns)
        return work
