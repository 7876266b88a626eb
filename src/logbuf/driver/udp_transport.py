"""``UdpTransport``: the sockets of one channel endpoint, non-blocking, moved in batches by the native shim.

Which sockets (Aeron's layout, so Aeron peers and tools see the same traffic)::

                     send channel (publications)                receive channel (subscriptions)
    unicast          one socket, bound to interface or any:0;   one socket bound to the endpoint; SM/NAK go
                     DATA/SETUP to the endpoint, SM/NAK back    back to each datagram's source from it
                     to it
    multicast        send socket bound to interface:0 (DATA to   receive socket bound to group:port (joined);
                     group:port); control socket bound to        send socket bound to interface:0, SM/NAK to
                     (group+1):port, joined, for SM/NAK          (group+1):port

Receiving: one ``recvmmsg`` fills up to ``receive_batch`` fixed slots; the native data-plane check classifies
each datagram in the same pass (:data:`LBN_DATA` ...), so Python reads only first headers.  Sending: one
``sendmmsg`` of views straight into a publication's terms (no copy).

An optional :class:`~logbuf.driver.udp.Impairment` on either path (a driver option, for tests) drops,
duplicates, reorders and delays datagrams; while one is set, :meth:`UdpTransport.service` must be called every
duty cycle to let delayed datagrams go.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from logbuf.driver.udp.impairment import Impairment
from logbuf.driver.udp_channel import SocketAddress, UdpChannel
from logbuf.native import ffi, lib

MAX_DATAGRAM_LENGTH = 65536  # receive slot: any UDP datagram fits (a bigger one is flagged truncated)
ADDRESS_SLOT = lib.LBN_ADDRESS_SLOT
MAX_BATCH = lib.LBN_MAX_BATCH
IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)  # Linux: only groups this socket joined

# datagram kinds from the native check
DATA = lib.LBN_DATA
PAD = lib.LBN_PAD
HEARTBEAT = lib.LBN_HEARTBEAT
NOT_DATA = lib.LBN_NOT_DATA
MALFORMED = lib.LBN_MALFORMED


class TransportRole(enum.Enum):
    SEND = "send"  # a publication's channel: data out, control in
    RECEIVE = "receive"  # a subscription's channel: data in, control out


class Received(NamedTuple):
    """One received datagram: ``datagram`` is valid until the next :meth:`UdpTransport.receive`."""

    datagram: Any  # memoryview into a receive slot (or bytes, through an impairment)
    source: bytes  # raw sockaddr of the sender
    kind: int  # DATA, PAD, HEARTBEAT, NOT_DATA (control: decode in Python) or MALFORMED
    frame_count: int
    term_span: int


@dataclass
class TransportOptions:
    socket_rcvbuf: int = 0  # bytes asked for (the kernel caps it at net.core.rmem_max); 0 = OS default
    socket_sndbuf: int = 0
    receive_batch: int = 32  # datagrams per recvmmsg
    send_impairment: Impairment | None = None
    receive_impairment: Impairment | None = None


def _wildcard(family: int) -> str:
    return "::" if family == socket.AF_INET6 else "0.0.0.0"


class UdpTransport:
    def __init__(self, channel: UdpChannel, role: TransportRole, options: TransportOptions | None = None) -> None:
        self.channel = channel
        self.role = role
        self.options = options = options or TransportOptions()
        self.send_impairment = options.send_impairment
        self.receive_impairment = options.receive_impairment
        self._sockets: list[socket.socket] = []
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        self.recv_fd = self._recv_socket.fileno()
        self.send_fd = self._send_socket.fileno()
        local_host, local_port = self._send_socket.getsockname()[:2]
        self.local_address = SocketAddress(local_host, local_port, family=channel.data.family)
        self.send_errors = 0  # sends refused for a reason other than a full socket buffer
        self.receive_errors = 0
        self.last_error: str | None = None
        batch = max(1, min(options.receive_batch, MAX_BATCH))
        self._batch = batch
        self._slots = bytearray(batch * MAX_DATAGRAM_LENGTH)
        self._slots_ptr = ffi.from_buffer("uint8_t[]", self._slots)
        view = memoryview(self._slots)
        self._slot_views = [view[i * MAX_DATAGRAM_LENGTH : (i + 1) * MAX_DATAGRAM_LENGTH] for i in range(batch)]
        self._addresses = bytearray(batch * ADDRESS_SLOT)
        self._addresses_ptr = ffi.from_buffer("uint8_t[]", self._addresses)
        self._lengths = ffi.new("int32_t[]", batch)
        self._address_lengths = ffi.new("int32_t[]", batch)
        self._kinds = ffi.new("int32_t[]", batch)
        self._frame_counts = ffi.new("int32_t[]", batch)
        self._term_spans = ffi.new("int32_t[]", batch)
        self._one = ffi.new("int32_t[3]")
        self._send_ptrs = ffi.new("const uint8_t *[]", MAX_BATCH)
        self._send_lengths = ffi.new("int32_t[]", MAX_BATCH)
        self._destinations: dict[bytes, Any] = {}

    # -- sockets ---------------------------------------------------------------------------------------

    def _socket(self, family: int) -> socket.socket:
        s = socket.socket(family, socket.SOCK_DGRAM)
        self._sockets.append(s)
        s.setblocking(False)
        if self.options.socket_rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.options.socket_rcvbuf)
        if self.options.socket_sndbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.options.socket_sndbuf)
        return s

    def _multicast_sender(self, family: int) -> socket.socket:
        c = self.channel
        s = self._socket(family)
        interface = c.interface.host if c.interface is not None else "0.0.0.0"
        s.bind((interface, 0))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)  # receivers on this host hear it too
        if c.ttl:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, c.ttl)
        return s

    def _multicast_receiver(self, group: SocketAddress) -> socket.socket:
        c = self.channel
        s = self._socket(group.family)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # every driver on the host may join
        with contextlib.suppress(OSError):
            s.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
        s.bind(group.python)  # bound to the group: only its datagrams arrive here
        interface = c.interface.host if c.interface is not None else "0.0.0.0"
        membership = struct.pack("4s4s", socket.inet_aton(group.host), socket.inet_aton(interface))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        return s

    def _open(self) -> None:
        c = self.channel
        family = c.data.family
        if c.control is not None:  # multicast
            sender = self._multicast_sender(family)
            receiver = self._multicast_receiver(c.control if self.role is TransportRole.SEND else c.data)
            self._send_socket, self._recv_socket = sender, receiver
            return
        s = self._socket(family)
        if self.role is TransportRole.RECEIVE:
            s.bind(c.data.python)
        else:
            local = c.interface.python if c.interface is not None else (_wildcard(family), 0)
            s.bind(local)
        self._send_socket = self._recv_socket = s

    @property
    def socket_rcvbuf(self) -> int:
        """What the kernel granted for the receive socket (it doubles requests and caps them)."""
        return self._recv_socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    @property
    def socket_sndbuf(self) -> int:
        return self._send_socket.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)

    @property
    def receive_address(self) -> SocketAddress:
        host, port = self._recv_socket.getsockname()[:2]
        return SocketAddress(host, port, self.channel.data.family)

    def close(self) -> None:
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
        self._sockets.clear()

    # -- sending ---------------------------------------------------------------------------------------

    def destination(self, sockaddr: bytes) -> Any:
        """A native handle for a destination address (cached: data and control addresses repeat)."""
        handle = self._destinations.get(sockaddr)
        if handle is None:
            if len(self._destinations) > 1024:
                self._destinations.clear()
            handle = self._destinations[sockaddr] = ffi.from_buffer("uint8_t[]", sockaddr)
        return handle

    def send(self, buffers: Sequence[Any], sockaddr: bytes, now_ns: int = 0) -> int:
        """Sends ``buffers`` in order, each as one datagram, to ``sockaddr``.  Returns how many went whole (the
        rest did not go: the socket buffer is full, or an error was recorded)."""
        if not buffers:
            return 0
        if self.send_impairment is not None:
            for buffer in buffers:
                self.send_impairment.submit(buffer, now_ns, sockaddr)
            self._release_impaired(now_ns)
            return len(buffers)
        return self._send_now(buffers, sockaddr)

    def _send_now(self, buffers: Sequence[Any], sockaddr: bytes) -> int:
        destination = self.destination(sockaddr)
        ptrs, lengths = self._send_ptrs, self._send_lengths
        sent = 0
        total = len(buffers)
        while sent < total:
            count = min(total - sent, MAX_BATCH)
            keep = []  # the cdata views must outlive the call
            for i in range(count):
                view = ffi.from_buffer("uint8_t[]", buffers[sent + i])
                keep.append(view)
                ptrs[i] = view
                lengths[i] = len(view)
            n = lib.lbn_send_batch(self.send_fd, ptrs, lengths, count, destination, len(sockaddr))
            if n < 0:
                if -n not in (errno.EAGAIN, errno.ENOBUFS):
                    self.send_errors += 1
                    self.last_error = f"send to {sockaddr.hex()}: {os.strerror(-n)}"
                return sent
            sent += n
            if n < count:
                return sent
        return sent

    def _release_impaired(self, now_ns: int) -> None:
        impairment = self.send_impairment
        assert impairment is not None
        for data, sockaddr in impairment.poll_tagged(now_ns):
            self._send_now((data,), sockaddr)  # a full buffer drops it: the network lost it

    # -- receiving -------------------------------------------------------------------------------------

    def receive(self, now_ns: int = 0) -> list[Received]:
        """What arrived (up to one batch), each datagram checked by the native data-plane rules."""
        if self.receive_impairment is not None:
            return self._impaired(self._recv(), now_ns)
        n = self.receive_raw()
        return [self.received(i) for i in range(n)]

    def _recv(self) -> int:
        n = lib.lbn_recv_batch(self.recv_fd, self._slots_ptr, MAX_DATAGRAM_LENGTH, self._batch, self._lengths,
                               self._addresses_ptr, self._address_lengths)
        if n < 0:
            self.receive_errors += 1
            self.last_error = f"receive: {os.strerror(-n)}"
            return 0
        return n

    def receive_raw(self) -> int:
        """One batch into the slots, classified natively, without building anything per datagram: the
        caller reads :attr:`kinds` / :attr:`term_spans` and :meth:`received` what it must handle itself.
        (Not with a receive impairment: use :meth:`receive`.)"""
        n = self._recv()
        if n:
            lib.lbn_classify_batch(self._slots_ptr, MAX_DATAGRAM_LENGTH, self._lengths, n, self._kinds,
                                   self._frame_counts, self._term_spans)
        return n

    def received(self, i: int) -> Received:
        """Datagram ``i`` of the last :meth:`receive_raw` batch."""
        length = self._lengths[i]
        at = i * ADDRESS_SLOT
        source = bytes(self._addresses[at : at + self._address_lengths[i]])
        view = self._slot_views[i]
        datagram = view[:length] if length >= 0 else view[:0]
        return Received(datagram, source, self._kinds[i], self._frame_counts[i], self._term_spans[i])

    def slot(self, i: int) -> memoryview:
        """The whole receive slot of datagram ``i`` (its first bytes are the datagram's)."""
        return self._slot_views[i]

    @property
    def batch_arrays(self) -> tuple[Any, int, Any, Any, Any]:
        """``(slots, slot length, lengths, kinds, term spans)`` of the receive batch, for a native consumer."""
        return self._slots_ptr, MAX_DATAGRAM_LENGTH, self._lengths, self._kinds, self._term_spans

    @property
    def kinds(self) -> Any:
        return self._kinds

    def _impaired(self, n: int, now_ns: int) -> list[Received]:
        impairment = self.receive_impairment
        assert impairment is not None
        for i in range(n):
            length = self._lengths[i]
            at = i * ADDRESS_SLOT
            source = bytes(self._addresses[at : at + self._address_lengths[i]])
            data = bytes(self._slot_views[i][:length]) if length >= 0 else b""
            impairment.submit(data, now_ns, source)
        return [self.classify(data, source) for data, source in impairment.poll_tagged(now_ns)]

    def classify(self, datagram: Any, source: bytes) -> Received:
        """One datagram through the native data-plane check (outside a receive batch)."""
        out = self._one
        if len(datagram) == 0:
            return Received(datagram, source, MALFORMED, 0, 0)
        kind = lib.lbn_classify_data(ffi.from_buffer("uint8_t[]", datagram), len(datagram), out, out + 1)
        return Received(datagram, source, kind, out[0] if kind > 0 else 0, out[1] if kind > 0 else 0)

    def service(self, now_ns: int) -> int:
        """Lets delayed datagrams of a send impairment go; returns how many are still held back."""
        if self.send_impairment is None:
            return 0
        self._release_impaired(now_ns)
        return self.send_impairment.pending

    @property
    def has_pending(self) -> bool:
        """Datagrams held back by an impairment (the duty cycle must come back for them)."""
        return bool((self.send_impairment is not None and self.send_impairment.pending)
                    or (self.receive_impairment is not None and self.receive_impairment.pending))

    def __repr__(self) -> str:
        return f"UdpTransport({self.role.value} {self.channel.key}, local {self.local_address})"
