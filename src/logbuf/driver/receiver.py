"""``Receiver``: the driver's receiver duty - datagrams into images, then every image's loss, liveness and
status messages.

In shared mode the media driver runs it in the same loop as the conductor and the sender; the conductor
adds and removes receive channel endpoints between cycles.  One ``poll(2)`` over every endpoint's socket
says which have datagrams waiting: one system call per cycle instead of one per endpoint.  Every endpoint's
images are polled each cycle (cheap when nothing is due).
"""

from __future__ import annotations

import select

from logbuf.driver.receive_channel import ReceiveChannelEndpoint


class Receiver:
    def __init__(self) -> None:
        self.endpoints: list[ReceiveChannelEndpoint] = []
        self._poller = select.poll()
        self._by_fd: dict[int, ReceiveChannelEndpoint] = {}
        self._always: list[ReceiveChannelEndpoint] = []  # impaired endpoints: delayed datagrams fall due anyway

    def add_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
        self.endpoints.append(endpoint)
        if endpoint.transport.send_impairment is not None or endpoint.transport.receive_impairment is not None:
            self._always.append(endpoint)
        else:
            self._by_fd[endpoint.transport.recv_fd] = endpoint
            self._poller.register(endpoint.transport.recv_fd, select.POLLIN)

    def remove_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
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
            for fd, _ in self._poller.poll(0):
                endpoint = by_fd.get(fd)
                if endpoint is not None:
                    work += endpoint.receive(now_ns)
        for endpoint in self._always:
            work += endpoint.receive(now_ns)
        for endpoint in self.endpoints:
            work += endpoint.poll(now_ns)
        return work
