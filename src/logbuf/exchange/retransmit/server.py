"""The retransmission server's socket loop: each cycle drains the readable sockets (one C call each reads up
to a bound, 64 datagrams per recvmmsg, and checks, rate-limits and queues them), then answers round-robin (one C
call builds and sends up to 512 answers, 64 per sendmmsg): :class:`~.service.NativeFairService`, no Python per
request. Clients are known by their raw sockaddr bytes, as the kernel gives them and takes them back.

A client that exceeds its rate gets a socket of its own, connected to it on the same port: the kernel then queues
that client's datagrams apart (a flood overflows its own queue, not everybody's), and the loop reads a bounded
number of them per cycle."""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

import numpy as np

from logbuf.errors import bind_error
from logbuf.exchange.retransmit.core import RetransmitCore, RetransmitStats
from logbuf.exchange.retransmit.fair import DEFAULT_QUEUE
from logbuf.exchange.retransmit.rate import DEFAULT_BURST, DEFAULT_RATE, RateLimiter
from logbuf.exchange.retransmit.ring import MessageRing
from logbuf.exchange.retransmit.service import NativeFairService
from logbuf.marketdata.moldudp64 import DEFAULT_PAYLOAD_BUDGET
from logbuf.units import NANOS_PER_SECOND

log = logging.getLogger(__name__)

DEFAULT_RCVBUF = 4 << 20  # the shared socket's receive buffer: ~5,000 queued requests (a 768-byte skb each)
_DRAIN_LIMIT = 4_096  # datagrams read from the shared socket per cycle (a flood cannot stall the answers)
_ANSWERS_PER_CYCLE = 512  # answers per cycle before the sockets are read again
_ISOLATE_MAX = 64  # clients with a connected socket of their own
_ISOLATE_IDLE_NS = 5 * NANOS_PER_SECOND  # a quiet isolated client goes back to the shared socket
_POLL_MS = 100  # how often an idle loop looks at its stop condition

#: a UDP peer as ``recvfrom`` gives it: (host, port) for IPv4, (host, port, flowinfo, scope_id) for IPv6
SocketAddress = tuple[str, int] | tuple[str, int, int, int]
#: a client as the server keys it: the raw sockaddr_in / sockaddr_in6 bytes recvmmsg gave
ClientKey = bytes


def sockaddr_address(raw: bytes) -> SocketAddress:
    """Raw sockaddr_in / sockaddr_in6 bytes as ``recvfrom`` would give them (to connect a socket to)."""
    family = struct.unpack_from("=H", raw)[0]
    if family == socket.AF_INET and len(raw) >= 8:
        return socket.inet_ntoa(raw[4:8]), struct.unpack_from(">H", raw, 2)[0]
    if family == socket.AF_INET6 and len(raw) >= 28:
        port, flowinfo = struct.unpack_from(">HI", raw, 2)
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port, flowinfo, struct.unpack_from("=I", raw, 24)[0]
    raise ValueError(f"not an IPv4 or IPv6 socket address (family {family})")


def sockaddr_bytes(client: SocketAddress) -> bytes:
    """``client`` as the kernel's sockaddr_in / sockaddr_in6 (what sendmmsg is given)."""
    if len(client) == 2:
        host, port = client[0], client[1]
        return struct.pack("=H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(host) + bytes(8)
    host, port, flowinfo, scope_id = client  # the IPv6 form
    return (struct.pack("=H", socket.AF_INET6) + struct.pack(">HI", port, flowinfo)
            + socket.inet_pton(socket.AF_INET6, host.split("%", 1)[0]) + struct.pack("=I", scope_id))


def _kernel_drops(sock: socket.socket) -> int:
    """Datagrams the kernel dropped on ``sock`` (``drops`` of /proc/net/udp{,6}); 0 when unknown."""
    try:
        inode = str(os.fstat(sock.fileno()).st_ino)
    except OSError:
        return 0
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    columns = line.split()
                    if len(columns) >= 13 and columns[9] == inode:
                        return int(columns[-1])
        except (OSError, ValueError):
            continue
    return 0


def bind_server_socket(host: str, port: int, rcvbuf: int = DEFAULT_RCVBUF) -> socket.socket:
    """A non-blocking UDP socket on (host, port) with SO_REUSEPORT (isolated clients share the port) and a
    receive buffer of ``rcvbuf`` bytes (past net.core.rmem_max where the process may: CAP_NET_ADMIN)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:  # past net.core.rmem_max when allowed (CAP_NET_ADMIN), else as much as it grants
            sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", socket.SO_RCVBUF), rcvbuf)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise bind_error(exc, (host, port)) from exc
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class RetransmitServer:
    """One socket loop answering re-requests fairly; ``run`` in the calling thread or ``start`` a thread."""

    def __init__(self, service: NativeFairService, sock: socket.socket | None = None, host: str = "127.0.0.1",
                 port: int = 0, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.service = service
        self._socket_stats = RetransmitStats()  # kernel drops and isolations: the loop's own counters
        self.clock = clock
        self.sock = sock if sock is not None else bind_server_socket(host, port)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]
        self._isolated: dict[ClientKey, tuple[socket.socket, list[int]]] = {}  # client -> (socket, [last seen])
        self._isolated_seen: dict[int, list[int]] = {}  # an isolated socket's fd -> its client's [last seen]
        self._by_fd: dict[int, socket.socket] = {self.sock.fileno(): self.sock}
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def stats(self) -> RetransmitStats:
        """What the server did so far: the service's outcome counters and the loop's own (a snapshot)."""
        stats = self.service.stats
        stats.add(self._socket_stats)
        return stats

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool] | None = None, wake_fd: int | None = None) -> RetransmitStats:
        """Serve until ``should_stop()`` (or :meth:`stop`), or until ``wake_fd`` is readable (end of file)."""
        if wake_fd is not None:
            self._poll.register(wake_fd, select.POLLIN)
        service = self.service
        clock = self.clock
        try:
            while not self._stop.is_set() and (should_stop is None or not should_stop()):
                busy = service.pending > 0
                ready = self._poll.poll(0 if busy else _POLL_MS)
                for fd, _ in ready:
                    if fd == wake_fd:
                        return self.stats
                    sock = self._by_fd.get(fd)
                    if sock is not None:
                        self._drain(sock, clock())
                self._answer()
                if self._isolated:
                    self._expire(clock())
        finally:
            if wake_fd is not None:
                self._poll.unregister(wake_fd)
        return self.stats

    def _drain(self, sock: socket.socket, now_ns: int) -> None:
        shared = sock is self.sock
        limit = _DRAIN_LIMIT if shared else self.service.queue  # an isolated flooder is read at its queue's pace
        read, over = self.service.drain(sock.fileno(), limit, now_ns)  # one C call: no Python per request
        if not shared:  # a connected socket: every datagram on it came from its one client
            seen = self._isolated_seen.get(sock.fileno())
            if seen is not None and read:
                seen[0] = now_ns
        else:
            for client in over:
                if client not in self._isolated:
                    self._isolate(client, now_ns)

    def _isolate(self, client: ClientKey, now_ns: int) -> None:
        """Give a client that asks faster than it may a socket connected to it: its flood queues apart."""
        if len(self._isolated) >= _ISOLATE_MAX:
            return
        try:
            sock = socket.socket(self.sock.family, socket.SOCK_DGRAM)
        except OSError:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(self.sock.getsockname())
            sock.connect(sockaddr_address(client))
            sock.setblocking(False)
        except (OSError, ValueError) as exc:
            log.debug("cannot isolate %s: %s", client.hex(), exc)
            sock.close()
            return
        seen = [now_ns]
        self._isolated[client] = (sock, seen)
        self._isolated_seen[sock.fileno()] = seen
        self._by_fd[sock.fileno()] = sock
        self._poll.register(sock, select.POLLIN)
        self._socket_stats.isolated_clients += 1

    def _expire(self, now_ns: int) -> None:
        for client, (sock, seen) in list(self._isolated.items()):
            if now_ns - seen[0] > _ISOLATE_IDLE_NS:
                self._release(client, sock)

    def _release(self, client: ClientKey, sock: socket.socket) -> None:
        self._socket_stats.kernel_dropped += _kernel_drops(sock)
        self._poll.unregister(sock)
        self._by_fd.pop(sock.fileno(), None)
        self._isolated_seen.pop(sock.fileno(), None)
        self._isolated.pop(client, None)
        # datagrams still queued on it are lost with it; they are counted as kernel drops of a closed socket
        sock.close()

    def _answer(self) -> None:
        """Up to ``_ANSWERS_PER_CYCLE`` answers in the fair service's order, built and sent in C (answers that
        cannot go -- buffer full, the client went away -- are counted: UDP has no one to tell)."""
        self.service.answer(self.sock.fileno(), _ANSWERS_PER_CYCLE)

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> RetransmitServer:
        """Serve in a thread of this process (for tests and tools; a replay uses :class:`RetransmitProcess`)."""
        self._thread = threading.Thread(target=self.run, name="retransmit", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client, (sock, _) in list(self._isolated.items()):
            self._release(client, sock)
        self._socket_stats.kernel_dropped += _kernel_drops(self.sock)
        self.sock.close()

    def __enter__(self) -> RetransmitServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_server(session: str | bytes, ring: MessageRing, buffer: bytes | memoryview | np.ndarray, *,
                budget: int = DEFAULT_PAYLOAD_BUDGET, rate: float = DEFAULT_RATE, burst: float = DEFAULT_BURST,
                queue: int = DEFAULT_QUEUE, sock: socket.socket | None = None, host: str = "127.0.0.1",
                port: int = 0, rcvbuf: int = DEFAULT_RCVBUF) -> RetransmitServer:
    """A server answering from ``ring`` / ``buffer`` with a per-client rate and a fair queue (a socket bound
    here gets ``rcvbuf`` bytes of receive buffer)."""
    limiter = RateLimiter(rate, burst)
    core = RetransmitCore(session, ring, buffer, budget)
    service = NativeFairService(core, limiter, queue)
    if sock is None:
        sock = bind_server_socket(host, port, rcvbuf)
    return RetransmitServer(service, sock, host, port)
