"""Channel URIs, Aeron's syntax: ``aeron:ipc``, ``aeron:udp?endpoint=host:port|term-length=64k|mtu=8k``.

``logbuf:`` is accepted as an alias of ``aeron:`` (``logbuf:ipc``).  Parameters are ``key=value`` pairs
separated by ``|``; sizes accept ``k``/``m``/``g`` suffixes (binary, as Aeron does).  Unknown parameters are
kept (tools show them) but every parameter logbuf acts on is validated here, so a bad channel is refused
with a message that says what is wrong before anything is created.

UDP parameters: ``endpoint`` (required; a multicast group for multicast), ``interface`` (local address to bind
or to send and join on, ``host[:port]``), ``ttl`` (multicast), ``fc`` (flow control: ``min``, ``max`` or
``unicast``, optionally ``,t:<receiver timeout>`` such as ``fc=min,t:2s``).  Addresses are resolved by the
driver (:mod:`logbuf.driver.udp_channel`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from logbuf.errors import LogbufError
from logbuf.logbuffer import descriptor as d

SCHEMES = ("aeron", "logbuf")
MEDIA = ("ipc", "udp")

TERM_LENGTH_PARAM = "term-length"
MTU_PARAM = "mtu"
ENDPOINT_PARAM = "endpoint"
INTERFACE_PARAM = "interface"
CONTROL_PARAM = "control"
FLOW_CONTROL_PARAM = "fc"
TTL_PARAM = "ttl"
SESSION_ID_PARAM = "session-id"

_SIZE = re.compile(r"^(\d+)([kKmMgG]?)$")
_SCALE = {"": 1, "k": 1024, "m": 1024 * 1024, "g": 1024 * 1024 * 1024}
_DURATION = re.compile(r"^(\d+)(ns|us|ms|s)$")
_DURATION_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
# fc=<strategy>[,t:<receiver timeout>]: min = the slowest receiver sets the limit (receivers tracked by id),
# max = the fastest one does (Aeron's multicast default), unicast = the one receiver
FLOW_CONTROL_STRATEGIES = ("min", "max", "unicast")
# UDP payload limit for one datagram carrying whole frames (IPv4: 65535 - 20 IP - 8 UDP), frame-aligned
MAX_UDP_PAYLOAD_LENGTH = 65504


class InvalidChannelError(LogbufError, ValueError):
    """The channel string cannot be used (Aeron's INVALID_CHANNEL)."""


def parse_size(text: str, what: str) -> int:
    match = _SIZE.match(text.strip())
    if not match:
        raise InvalidChannelError(f"{what}={text!r} is not a size (digits with an optional k, m or g suffix)")
    return int(match.group(1)) * _SCALE[match.group(2).lower()]


def parse_duration_ns(text: str, what: str) -> int:
    """``250us``, ``10ms``, ``5s`` (Aeron's duration suffixes) -> nanoseconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise InvalidChannelError(f"{what}={text!r} is not a duration (digits with ns, us, ms or s)")
    return int(match.group(1)) * _DURATION_NS[match.group(2)]


@dataclass(frozen=True)
class FlowControlSpec:
    strategy: str  # one of FLOW_CONTROL_STRATEGIES
    receiver_timeout_ns: int | None = None  # None: the driver's default


@dataclass(frozen=True)
class ChannelUri:
    media: str  # "ipc" or "udp"
    params: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, channel: str) -> ChannelUri:
        if not isinstance(channel, str) or not channel:
            raise InvalidChannelError("channel must be a non-empty string such as 'aeron:ipc'")
        if not channel.isascii() or any(c.isspace() for c in channel):
            raise InvalidChannelError(f"channel {channel!r} must be ASCII without spaces")
        scheme, sep, rest = channel.partition(":")
        if not sep or scheme not in SCHEMES:
            raise InvalidChannelError(f"channel {channel!r} must start with 'aeron:' (or 'logbuf:')")
        media, _, query = rest.partition("?")
        if media not in MEDIA:
            raise InvalidChannelError(f"channel {channel!r}: media must be one of {', '.join(MEDIA)}, not {media!r}")
        params: dict[str, str] = {}
        if query:
            for item in query.split("|"):
                key, eq, value = item.partition("=")
                if not eq or not key or not value:
                    raise InvalidChannelError(f"channel {channel!r}: parameter {item!r} is not key=value")
                if key in params:
                    raise InvalidChannelError(f"channel {channel!r}: parameter {key!r} given twice")
                params[key] = value
        uri = cls(media, params)
        uri.validate()
        return uri

    # -- typed parameters ----------------------------------------------------------------------------

    @property
    def is_ipc(self) -> bool:
        return self.media == "ipc"

    @property
    def is_udp(self) -> bool:
        return self.media == "udp"

    def term_length(self, default: int) -> int:
        text = self.params.get(TERM_LENGTH_PARAM)
        return default if text is None else parse_size(text, TERM_LENGTH_PARAM)

    def mtu(self, default: int) -> int:
        text = self.params.get(MTU_PARAM)
        return default if text is None else parse_size(text, MTU_PARAM)

    def endpoint(self) -> tuple[str, int] | None:
        text = self.params.get(ENDPOINT_PARAM)
        return None if text is None else parse_endpoint(text)

    def flow_control(self) -> FlowControlSpec | None:
        """``fc=min``, ``fc=max,t:2s``, ... or None when the channel does not say."""
        text = self.params.get(FLOW_CONTROL_PARAM)
        if text is None:
            return None
        strategy, *options = text.split(",")
        if strategy not in FLOW_CONTROL_STRATEGIES:
            raise InvalidChannelError(
                f"fc={text!r}: flow control must be one of {', '.join(FLOW_CONTROL_STRATEGIES)}"
            )
        timeout = None
        for option in options:
            key, sep, value = option.partition(":")
            if key != "t" or not sep:
                raise InvalidChannelError(f"fc={text!r}: unknown option {option!r} (t:<receiver timeout>)")
            timeout = parse_duration_ns(value, "fc receiver timeout")
            if timeout <= 0:
                raise InvalidChannelError(f"fc={text!r}: the receiver timeout must be positive")
        return FlowControlSpec(strategy, timeout)

    def validate(self) -> None:
        term_length = self.term_length(d.DEFAULT_IPC_TERM_LENGTH)
        try:
            d.check_term_length(term_length)
            mtu = self.mtu(d.DEFAULT_MTU)
            d.check_mtu(mtu, term_length)
        except InvalidChannelError:
            raise
        except ValueError as exc:
            raise InvalidChannelError(f"channel {self}: {exc}") from None
        if self.is_udp:
            if mtu > MAX_UDP_PAYLOAD_LENGTH:
                raise InvalidChannelError(f"channel {self}: mtu {mtu} exceeds a UDP datagram ({MAX_UDP_PAYLOAD_LENGTH})")
            if ENDPOINT_PARAM not in self.params and CONTROL_PARAM not in self.params:
                raise InvalidChannelError(f"channel {self}: a UDP channel needs endpoint=host:port")
            if ENDPOINT_PARAM in self.params:
                parse_endpoint(self.params[ENDPOINT_PARAM])
            self.flow_control()
        elif ENDPOINT_PARAM in self.params:
            raise InvalidChannelError(f"channel {self}: an IPC channel has no endpoint")

    def canonical(self) -> str:
        """``aeron:<media>`` plus parameters in a stable order (the form the driver shows and keys on)."""
        if not self.params:
            return f"aeron:{self.media}"
        return f"aeron:{self.media}?" + "|".join(f"{k}={v}" for k, v in sorted(self.params.items()))

    def __str__(self) -> str:
        return self.canonical()


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port)."""
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise InvalidChannelError(f"endpoint {text!r} must be host:port")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise InvalidChannelError(f"endpoint {text!r}: port out of range")
    return host, port
