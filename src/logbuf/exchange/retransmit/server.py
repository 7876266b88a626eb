"""The retransmission server's socket loop: each cycle drains the socket (up to a bound, 64 datagrams per
recvmmsg), then answers round-robin, up to 64 answers built and sent by one C call (``rtx_answer_batch``: the
extents, the headers and one sendmmsg). Clients are known by their raw sockaddr bytes, as the kernel gives them
and takes them back.

A client that exceeds its rate gets a socket of its own, connected to it on the same port: the kernel then queues
that client's datagrams apart (a flood overflows its own queue, not everybody's), and the loop reads a bounded
number of them per cycle."""

from __future__ import annotations

import errno
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
from logbuf.exchange.retransmit.fair import DEFAULT_QUEUE, FairService
from logbuf.exchange.retransmit.rate import DEFAULT_BURST, DEFAULT_RATE, RateLimiter
from logbuf.exchange.retransmit.ring import MessageRing
from logbuf.marketdata.moldudp64 import DEFAULT_PAYLOAD_BUDGET, REQUEST_LENGTH
from logbuf.native import ffi, lib
from logbuf.units import NANOS_PER_SECOND

log = logging.getLogger(__name__)

_RECV_SIZE = REQUEST_LENGTH + 1  # anything longer than a request reads as REQUEST_LENGTH + 1: wrong size
DEFAULT_RCVBUF = 4 << 20  # the shared socket's receive buffer: ~5,000 queued requests (a 768-byte skb each)
_DRAIN_LIMIT = 4_096  # datagrams read from the shared socket per cycle (a flood cannot stall the answers)
_ANSWERS_PER_CYCLE = 512  # answers per cycle before the sockets are read again
_ISOLATE_MAX = 64  # clients with a connected socket of their own
_ISOLATE_IDLE_NS = 5 * NANOS_PER_SECOND  # a quiet isolated client goes back to the shared socket
_POLL_MS = 100  # how often an idle loop looks at its stop condition

_ADDRESS_SLOT = 32  # bytes per address in a batch: a sockaddr_in (16) or a sockaddr_in6 (28)
_TOO_LONG = bytes(_RECV_SIZE)  # what a datagram cut at its slot reads as: not a request (bad_size)

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

    def __init__(self, service: FairService[ClientKey], sock: socket.socket | None = None, host: str = "127.0.0.1",
                 port: int = 0, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.service = service
        self.stats = service.stats
        self.clock = clock
        self.sock = sock if sock is not None else bind_server_socket(host, port)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]
        self._isolated: dict[ClientKey, tuple[socket.socket, list[int]]] = {}  # client -> (socket, [last seen])
        self._by_fd: dict[int, socket.socket] = {self.sock.fileno(): self.sock}
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        # one batch of answers for rtx_answer_batch
        batch = lib.RTX_MAX_BATCH
        self._firsts = ffi.new("int64_t[]", batch)
        self._counts = ffi.new("int64_t[]", batch)
        self._addresses = ffi.new("uint8_t[]", batch * _ADDRESS_SLOT)
        self._address_lengths = ffi.new("int32_t[]", batch)
        self._results = ffi.new("int32_t[]", batch)
        self._went = ffi.new("uint8_t[]", batch)
        # one recvmmsg's worth of requests: datagram i in slot i, its source's sockaddr in address slot i
        rx = lib.LBN_MAX_BATCH
        self._rx_slots = ffi.new("uint8_t[]", rx * _RECV_SIZE)
        self._rx_view = ffi.buffer(self._rx_slots)
        self._rx_lengths = ffi.new("int32_t[]", rx)
        self._rx_addresses = ffi.new("uint8_t[]", rx * lib.LBN_ADDRESS_SLOT)
        self._rx_address_view = ffi.buffer(self._rx_addresses)
        self._rx_address_lengths = ffi.new("int32_t[]", rx)

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
        service = self.service
        shared = sock is self.sock
        limit = _DRAIN_LIMIT if shared else service.queue  # an isolated flooder is read at its queue's pace
        fd = sock.fileno()
        slots, lengths, addresses, address_lengths = (self._rx_slots, self._rx_lengths, self._rx_addresses,
                                                      self._rx_address_lengths)
        view, address_view = self._rx_view, self._rx_address_view
        batch = lib.LBN_MAX_BATCH
        slot = lib.LBN_ADDRESS_SLOT
        read = 0
        while read < limit:
            n = lib.lbn_recv_batch(fd, slots, _RECV_SIZE, min(batch, limit - read), lengths, addresses,
                                   address_lengths)
            if n == 0:
                return
            if n < 0:  # ECONNREFUSED etc. from an earlier answer to a vanished client: not a request
                if n in (-errno.EAGAIN, -errno.EINTR):
                    return
                read += 1
                continue
            read += n
            for i in range(n):
                length = lengths[i]
                # a datagram longer than a request was cut (LBN_TRUNCATED): any wrong size reads as bad_size
                request = view[i * _RECV_SIZE : i * _RECV_SIZE + length] if length >= 0 else _TOO_LONG
                client = address_view[i * slot : i * slot + address_lengths[i]]
                service.receive(request, client, now_ns)
                if not shared:
                    entry = self._isolated.get(client)
                    if entry is not None:
                        entry[1][0] = now_ns
                elif service.over_rate and client not in self._isolated:
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
        self._isolated[client] = (sock, [now_ns])
        self._by_fd[sock.fileno()] = sock
        self._poll.register(sock, select.POLLIN)
        self.stats.isolated_clients += 1

    def _expire(self, now_ns: int) -> None:
        for client, (sock, seen) in list(self._isolated.items()):
            if now_ns - seen[0] > _ISOLATE_IDLE_NS:
                self._release(client, sock)

    def _release(self, client: ClientKey, sock: socket.socket) -> None:
        self.stats.kernel_dropped += _kernel_drops(sock)
        self._poll.unregister(sock)
        self._by_fd.pop(sock.fileno(), None)
        self._isolated.pop(client, None)
        # datagrams still queued on it are lost with it; they are counted as kernel drops of a closed socket
        sock.close()

    def _answer(self) -> None:
        """Up to ``_ANSWERS_PER_CYCLE`` answers, in the fair service's order, in batches of RTX_MAX_BATCH."""
        service = self.service
        firsts, counts, addresses, lengths = self._firsts, self._counts, self._addresses, self._address_lengths
        batch = lib.RTX_MAX_BATCH
        n = 0
        for _ in range(_ANSWERS_PER_CYCLE):
            turn = service.next_request()
            if turn is None:
                break
            client, firsts[n], counts[n] = turn
            ffi.memmove(addresses + n * _ADDRESS_SLOT, client, len(client))
            lengths[n] = len(client)
            n += 1
            if n == batch:
                self._send_batch(n)
                n = 0
        if n:
            self._send_batch(n)

    def _send_batch(self, n: int) -> None:
        # answers that cannot go (buffer full, the client went away) are counted: UDP has no one to tell
        self.service.core.answer_batch(self.sock.fileno(), self._firsts, self._counts, self._addresses,
                                       _ADDRESS_SLOT, self._address_lengths, n, self._results, self._went)

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
        self.stats.kernel_dropped += _kernel_drops(self.sock)
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
    if sock is None:
        sock = bind_server_socket(host, port, rcvbuf)
    return RetransmitServer(FairService(core, limiter, queue), sock, host, port)
