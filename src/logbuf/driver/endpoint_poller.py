"""``EndpointPoller``: which of the driver's UDP endpoints have datagrams to read, in one ``poll(2)``.

The sender (control sockets) and the receiver (data sockets) both keep a set of endpoints and ask, once per
duty cycle, which are readable: one system call per cycle instead of one per endpoint.  Endpoints with an
impairment layer are always visited, since their delayed datagrams fall due without the socket waking.
"""

from __future__ import annotations

import select
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


# Read-only members (properties), so an endpoint whose attributes have narrower types still matches.
class _Transport(Protocol):
    @property
    def recv_fd(self) -> int: ...
    @property
    def send_impairment(self) -> object: ...
    @property
    def receive_impairment(self) -> object: ...


class _Endpoint(Protocol):
    @property
    def transport(self) -> _Transport: ...


E = TypeVar("E", bound=_Endpoint)


class EndpointPoller(Generic[E]):
    def __init__(self) -> None:
        self.endpoints: list[E] = []
        self._poller = select.poll()
        self._by_fd: dict[int, E] = {}
        self._always: list[E] = []  # impaired endpoints: delayed datagrams fall due anyway

    def add(self, endpoint: E) -> None:
        self.endpoints.append(endpoint)
        transport = endpoint.transport
        if transport.send_impairment is not None or transport.receive_impairment is not None:
            self._always.append(endpoint)
        else:
            self._by_fd[transport.recv_fd] = endpoint
            self._poller.register(transport.recv_fd, select.POLLIN)

    def remove(self, endpoint: E) -> None:
        if endpoint in self.endpoints:
            self.endpoints.remove(endpoint)
        if endpoint in self._always:
            self._always.remove(endpoint)
        if self._by_fd.pop(endpoint.transport.recv_fd, None) is not None:
            self._poller.unregister(endpoint.transport.recv_fd)

    def ready(self) -> Iterator[E]:
        """The endpoints to read this cycle (readable sockets, then every impaired endpoint)."""
        if self._by_fd:
            by_fd = self._by_fd
            for fd, _ in self._poller.poll(0):
                endpoint = by_fd.get(fd)
                if endpoint is not None:
                    yield endpoint
        yield from self._always
