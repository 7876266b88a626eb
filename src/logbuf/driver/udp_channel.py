"""``UdpChannel``: what a UDP channel URI means for sockets, resolved and checked once (Aeron's UdpChannel).

    aeron:udp?endpoint=127.0.0.1:40456                     unicast: the receiver binds the endpoint, the sender
                                                           sends to it from an ephemeral port (or interface=)
    aeron:udp?endpoint=239.1.1.1:40456|interface=10.0.0.7  multicast: data to the group, control (SM, NAK) to
                                                           the group + 1 (Aeron's rule: the data group is odd)

Multi-destination-cast (MDC) publications name no endpoint: ``control=host:port|control-mode=dynamic`` binds the
control address, where receivers' status messages (subscriptions on ``endpoint=<theirs>|control=host:port``)
add them as destinations; ``control-mode=manual`` (``control`` optional) sends to the destinations the client
adds.  ``endpoint=E|control=C`` without a mode is explicit control: the publication binds C and sends to E; a
subscription binds E and sends its status messages and NAKs to C.

``interface`` is the local address to bind (unicast senders, ``host[:port]``) or the interface to send and join
on (multicast).  ``ttl`` sets the multicast TTL.  Two channels that differ only in stream parameters (term
length, MTU, flow control) share one endpoint: :attr:`UdpChannel.key` names the transport.

Addresses travel as raw ``sockaddr`` bytes (:class:`SocketAddress`), so the native shim answers a source
without converting it.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

from logbuf.channel import (
    CONTROL_PARAM,
    INTERFACE_PARAM,
    TTL_PARAM,
    ChannelUri,
    InvalidChannelError,
    parse_endpoint,
)

# sockaddr_in:  family (host order u16) | port (network u16) | address (4) | zero (8)          = 16 bytes
# sockaddr_in6: family (host order u16) | port (network u16) | flowinfo (4) | address (16) | scope id (4) = 28
_FAMILY = struct.Struct("=H")
_PORT = struct.Struct("!H")
SOCKADDR_IN_LENGTH = 16
SOCKADDR_IN6_LENGTH = 28


class UnknownHostError(InvalidChannelError):
    """A channel's host name does not resolve (Aeron's UNKNOWN_HOST)."""


@dataclass(frozen=True)
class SocketAddress:
    """A numeric IPv4/IPv6 address and port; ``sockaddr`` is its raw C form."""

    host: str
    port: int
    family: int = socket.AF_INET

    @property
    def sockaddr(self) -> bytes:
        if self.family == socket.AF_INET:
            return _FAMILY.pack(socket.AF_INET) + _PORT.pack(self.port) + socket.inet_aton(self.host) + bytes(8)
        return (_FAMILY.pack(socket.AF_INET6) + _PORT.pack(self.port) + bytes(4)
                + socket.inet_pton(socket.AF_INET6, self.host) + bytes(4))

    @property
    def python(self) -> tuple[str, int]:
        """The form Python's socket module takes."""
        return (self.host, self.port)

    @property
    def is_multicast(self) -> bool:
        return ipaddress.ip_address(self.host).is_multicast

    @classmethod
    def from_sockaddr(cls, raw: bytes) -> SocketAddress:
        """Decodes a ``sockaddr_in`` / ``sockaddr_in6`` (ValueError for anything else)."""
        if len(raw) < SOCKADDR_IN_LENGTH:
            raise ValueError(f"a sockaddr of {len(raw)} bytes")
        family = _FAMILY.unpack_from(raw)[0]
        port = _PORT.unpack_from(raw, 2)[0]
        if family == socket.AF_INET:
            return cls(socket.inet_ntoa(raw[4:8]), port, socket.AF_INET)
        if family == socket.AF_INET6 and len(raw) >= SOCKADDR_IN6_LENGTH:
            return cls(socket.inet_ntop(socket.AF_INET6, raw[8:24]), port, socket.AF_INET6)
        raise ValueError(f"sockaddr family {family} is neither IPv4 nor IPv6")

    @classmethod
    def resolve(cls, host: str, port: int, what: str = "address") -> SocketAddress:
        """A numeric address for ``host`` (a name resolves to its first IPv4/IPv6 address)."""
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise UnknownHostError(f"{what} {host!r} does not resolve: {exc}") from None
        for family, _, _, _, address in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                return cls(str(address[0]), port, family)
        raise InvalidChannelError(f"{what} {host!r} has no IPv4 or IPv6 address")

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if self.family == socket.AF_INET6 else f"{self.host}:{self.port}"


def describe_sockaddr(raw: bytes) -> str:
    """``host:port`` of a raw sockaddr (a source identity for images); ``?`` when it cannot be decoded."""
    try:
        return str(SocketAddress.from_sockaddr(raw))
    except (ValueError, OSError):
        return "?"


_SIOCGIFADDR = 0x8915
_IF_INET6 = "/proc/net/if_inet6"


def local_addresses() -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses of this host's network interfaces (IPv4 through SIOCGIFADDR, IPv6 from procfs)."""
    import fcntl

    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            found.append(ipaddress.IPv4Address(raw[20:24]))
    try:
        with open(_IF_INET6) as lines:
            for line in lines:
                hex_address = line.split()[0]
                found.append(ipaddress.IPv6Address(bytes.fromhex(hex_address)))
    except (OSError, ValueError, IndexError):
        pass
    return found


def parse_interface(text: str) -> SocketAddress:
    """``interface=``: ``host``, ``host:port``, ``[v6]``, ``[v6]:port``, a bare IPv6 address, or any of these
    with ``/prefix`` (Aeron's form: ``10.0.0.0/24`` picks the local interface address in that subnet)."""
    address_text, slash, prefix = text.partition("/")
    has_port = address_text.startswith("[") or address_text.count(":") == 1
    if has_port and not (address_text.startswith("[") and address_text.endswith("]")):
        host, port = parse_endpoint(address_text)
    else:
        host, port = address_text.strip("[]"), 0
    if not slash:
        return SocketAddress.resolve(host, port, "interface")
    try:
        subnet = ipaddress.ip_network(f"{host}/{prefix}", strict=False)
    except ValueError as exc:
        raise InvalidChannelError(f"interface {text!r} is not address/prefix: {exc}") from None
    for address in local_addresses():
        if address.version == subnet.version and address in subnet:
            family = socket.AF_INET if address.version == 4 else socket.AF_INET6
            return SocketAddress(str(address), port, family)
    raise InvalidChannelError(f"interface {text!r}: no local interface has an address in {subnet}")


def _control_group(group: SocketAddress) -> SocketAddress:
    address = ipaddress.ip_address(group.host)
    if address.version != 4:
        raise InvalidChannelError(f"endpoint {group}: IPv6 multicast is not supported")
    if int(address) & 1 == 0:
        raise InvalidChannelError(
            f"endpoint {group}: a multicast data group must be odd (control frames go to the group + 1)"
        )
    return SocketAddress(str(address + 1), group.port, group.family)


@dataclass(frozen=True)
class UdpChannel:
    uri: ChannelUri
    data: SocketAddress  # where DATA/SETUP go: the endpoint (unicast) or the data group (multicast)
    control: SocketAddress | None  # multicast only: where SM/NAK go (the group + 1)
    interface: SocketAddress | None  # local bind address (port 0: ephemeral) or multicast interface
    ttl: int  # multicast TTL; 0 = the OS default
    explicit_control: SocketAddress | None = None  # control=: what a publication binds / a subscription's SMs go to
    control_mode: str | None = None  # "dynamic" / "manual": a multi-destination-cast publication
    has_endpoint: bool = True  # False: an MDC channel without endpoint= (data then names the bind address)
    instance: int = 0  # MDC without a control port: each publication has its own endpoint (numbered)

    @classmethod
    def from_uri(cls, uri: ChannelUri) -> UdpChannel:
        if not uri.is_udp:
            raise InvalidChannelError(f"channel {uri} is not a UDP channel")
        mode = uri.control_mode()
        explicit_control = None
        control_text = uri.params.get(CONTROL_PARAM)
        if control_text is not None:
            control_host, control_port = parse_endpoint(control_text)
            explicit_control = SocketAddress.resolve(control_host, control_port, "control")
            if explicit_control.is_multicast:
                raise InvalidChannelError(f"channel {uri}: control {explicit_control} must be a unicast address")
        endpoint = uri.endpoint()
        if endpoint is None and mode is None:
            raise InvalidChannelError(f"channel {uri}: a UDP channel needs endpoint=host:port")
        if endpoint is None:
            data = explicit_control if explicit_control is not None else SocketAddress("0.0.0.0", 0)
        else:
            host, port = endpoint
            if port == 0:
                raise InvalidChannelError(f"channel {uri}: the endpoint needs a port")
            data = SocketAddress.resolve(host, port, "endpoint")
        if mode is not None and data.is_multicast:
            raise InvalidChannelError(f"channel {uri}: control-mode={mode} is for unicast destinations")
        if explicit_control is not None and data.is_multicast:
            raise InvalidChannelError(f"channel {uri}: control= is not supported with a multicast endpoint")
        interface = None
        text = uri.params.get(INTERFACE_PARAM)
        if text is not None:
            interface = parse_interface(text)
            if interface.family != data.family:
                raise InvalidChannelError(f"channel {uri}: interface {interface} and endpoint {data} are of "
                                          f"different address families")
        ttl_text = uri.params.get(TTL_PARAM, "0")
        if not ttl_text.isdigit() or not 0 <= int(ttl_text) <= 255:
            raise InvalidChannelError(f"channel {uri}: ttl={ttl_text!r} must be 0..255")
        control = _control_group(data) if data.is_multicast else None
        if interface is not None and interface.is_multicast:
            raise InvalidChannelError(f"channel {uri}: interface {interface} is a multicast address")
        if explicit_control is not None:
            if interface is not None and interface.family != explicit_control.family:
                raise InvalidChannelError(f"channel {uri}: interface {interface} and control {explicit_control} are "
                                          f"of different address families")
            interface = explicit_control  # a publication binds the control address (a subscription binds data)
        return cls(uri, data, control, interface, int(ttl_text), explicit_control, mode, endpoint is not None)

    @property
    def is_multicast(self) -> bool:
        return self.control is not None

    @property
    def is_multi_destination(self) -> bool:
        """A multi-destination-cast publication channel (control-mode=dynamic or manual)."""
        return self.control_mode is not None

    @property
    def key(self) -> str:
        """The send transport this channel needs: publications whose channels have equal keys share one send
        channel endpoint (one socket)."""
        if self.control_mode is not None:
            parts = [f"control-mode={self.control_mode}"]
            if self.explicit_control is not None:
                parts.append(f"control={self.explicit_control}")
            if self.instance:
                parts.append(f"instance={self.instance}")
            return "aeron:udp?" + "|".join(parts)
        parts = [f"endpoint={self.data}"]
        if self.interface is not None:
            parts.append(f"interface={self.interface}")
        if self.ttl:
            parts.append(f"ttl={self.ttl}")
        return "aeron:udp?" + "|".join(parts)

    @property
    def receive_key(self) -> str:
        """The receive transport: what a receiver binds - the endpoint (unicast), or the group joined on an
        interface (multicast).  Subscriptions with equal keys share one receive channel endpoint."""
        if self.is_multicast and self.interface is not None:
            return f"aeron:udp?endpoint={self.data}|interface={self.interface}"
        return f"aeron:udp?endpoint={self.data}"

    def __str__(self) -> str:
        return self.uri.canonical()
