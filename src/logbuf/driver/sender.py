"""``Sender``: the driver's sender duty - control frames in, then every network publication's data out.

In shared mode the media driver runs it in the same loop as the conductor and the receiver; the conductor
adds and removes publications and send channel endpoints between cycles.  One ``poll(2)`` over every
endpoint's control socket says which have something to read (SMs arrive a few times per window, so most
cycles read nothing): one system call per cycle instead of one per endpoint.
"""

from __future__ import annotations

import select

from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.send_channel import SendChannelEndpoint


class Sender:
    def __init__(self) -> None:
        self.endpoints: list[SendChannelEndpoint] = []
        self.publications: list[NetworkPublication] = []
        self._poller = select.poll()
        self._by_fd: dict[int, SendChannelEndpoint] = {}
        self._always: list[SendChannelEndpoint] = []  # impaired endpoints: delayed datagrams fall due anyway

    def add_endpoint(self, endpoint: SendChannelEndpoint) -> None:
        self.endpoints.append(endpoint)
        if endpoint.transport.send_impairment is not None or endpoint.transport.receive_impairment is not None:
            self._always.append(endpoint)
        else:
            self._by_fd[endpoint.transport.recv_fd] = endpoint
            self._poller.register(endpoint.transport.recv_fd, select.POLLIN)

    def remove_endpoint(self, endpoint: SendChannelEndpoint) -> None:
        if endpoint in self.endpoints:
            self.endpoints.remove(endpoint)
        if endpoint in self._always:
            self._always.remove(endpoint)
        if self._by_fd.pop(endpoint.transport.recv_fd, None) is not None:
            self._poller.unregister(endpoint.transport.recv_fd)

    def do_work(self, now_ns: int) -> int:
        work = 0
        if self._by_fd:
            by_fd = self._by_fd
            for fd, _ in self._poller.poll(0):  # SMs first: they may open the window this cycle uses
                endpoint = by_fd.get(fd)
                if endpoint is not None:
                    work += endpoint.poll_control(now_ns)
        for endpoint in self._always:
            work += endpoint.poll_control(now_ns)
        for publication in self.publications:
            work += publication.send(now_ns)
        return work
