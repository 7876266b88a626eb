"""Channel URIs, Aeron's syntax: ``aeron:ipc``, ``aeron:udp?endpoint=host:port|term-length=64k|mtu=8k``.

``logbuf:`` is accepted as an alias of ``aeron:`` (``logbuf:ipc``).  Parameters are ``key=value`` pairs
separated by ``|``; sizes accept ``k``/``m``/``g`` suffixes (binary, as Aeron does).  Unknown parameters are
kept here (tools show them); the driver refuses every key it does not honour (:data:`AERON_URI_KEYS` says
which) and resolves the rest against its own settings.  Values are checked here as far as they stand alone.

UDP parameters: ``endpoint`` (required unless ``control`` or ``control-mode=manual`` is given; a multicast group
for multicast), ``interface`` (local address to bind or to send and join on, ``host[:port]``), ``ttl``
(multicast), ``control`` and ``control-mode`` (multi-destination-cast publications: ``dynamic`` or ``manual``),
``fc`` (flow control: ``min``, ``max``, ``tagged`` or ``unicast``, optionally ``,t:<receiver timeout>`` such as
``fc=min,t:2s``, and for ``tagged`` ``,g:<group tag>[/<min group size>]``).  Addresses are resolved by the
driver (:mod:`logbuf.driver.udp_channel`).

A subscription channel ``aeron-spy:aeron:udp?endpoint=...`` is a spy: it reads the driver's own network
publications of that channel and stream from their logs (:attr:`ChannelUri.spy`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from logbuf.errors import LogbufError
from logbuf.logbuffer import descriptor as d
from logbuf.units import NANOS_PER_UNIT

SCHEMES = ("aeron", "logbuf")
MEDIA = ("ipc", "udp")

TERM_LENGTH_PARAM = "term-length"
MTU_PARAM = "mtu"
ENDPOINT_PARAM = "endpoint"
INTERFACE_PARAM = "interface"
CONTROL_PARAM = "control"
CONTROL_MODE_PARAM = "control-mode"
CONTROL_MODES = ("dynamic", "manual")  # multi-destination-cast; Aeron's "response" is refused by name
FLOW_CONTROL_PARAM = "fc"
TTL_PARAM = "ttl"
SESSION_ID_PARAM = "session-id"
CONTROL_MODE_PARAM = "control-mode"
# a subscription channel behind this prefix spies on the driver's own network publications of that channel
SPY_PREFIX = "aeron-spy:"

# Every key of an Aeron 1.48 channel URI, with what this driver does with it.  ``implemented``: honoured as
# aeronmd honours it; ``partial``: some values honoured, the others refused by name; ``refused``: any use is
# refused with INVALID_CHANNEL (the behaviour lives where this driver does not have it).  Keys of neither
# list are refused as unknown.  docs/interop.md shows this table.
AERON_URI_KEYS: dict[str, tuple[str, str]] = {
    "endpoint": ("implemented", "UDP: the unicast address or multicast group"),
    "interface": ("implemented", "UDP: local address, host[:port], a CIDR subnet (10.0.0.0/24) or IPv6"),
    "ttl": ("implemented", "UDP multicast TTL"),
    "term-length": ("implemented", "publication term length (defaults: the driver's IPC / network one)"),
    "mtu": ("implemented", "publication MTU, checked against the resolved term length"),
    "session-id": ("implemented", "publications take it; subscriptions see only that session"),
    "init-term-id": ("implemented", "with term-id and term-offset: where a new publication starts"),
    "term-id": ("implemented", "see init-term-id"),
    "term-offset": ("implemented", "see init-term-id"),
    "linger": ("implemented", "how long a closed publication lingers for its subscribers"),
    "sparse": ("implemented", "sparse=false allocates (pre-touches) the log's pages"),
    "pub-wnd": ("implemented", "publication window (pub-lmt ahead of the slowest consumer)"),
    "tether": ("partial", "IPC and aeron-spy: subscriptions: true and false; other UDP subscriptions: true only"),
    "untethered-window-limit-timeout": ("implemented", "IPC and UDP publications: untethered subscribers and spies"),
    "untethered-resting-timeout": ("implemented", "IPC and UDP publications: untethered subscribers and spies"),
    "eos": ("partial", "true everywhere; false on IPC only (the flag is in the log metadata)"),
    "so-sndbuf": ("implemented", "UDP: SO_SNDBUF of the channel's socket"),
    "so-rcvbuf": ("implemented", "UDP: SO_RCVBUF of the channel's socket"),
    "rcv-wnd": ("implemented", "UDP subscriptions: the receiver window its images offer"),
    "fc": ("implemented", "UDP publications: min, max, tagged (g:<tag>[/<min group size>]) and logbuf's unicast; "
                          ",t:<timeout>"),
    "cc": ("partial", "static only (the default); cubic refused"),
    "reliable": ("implemented", "UDP subscriptions: false pads a gap where its NAK would go (no NAK)"),
    "rejoin": ("implemented", "UDP subscriptions: false leaves a session whose image ended unjoined while "
                              "subscribed"),
    "alias": ("implemented", "a label: kept in the channel string, no other effect (as Aeron)"),
    "nak-delay": ("implemented", "UDP subscriptions: the unicast NAK delay (retries at 100x); none with group "
                                 "semantics"),
    "max-resend": ("implemented", "UDP publications: retransmits in flight (1..256, default 16; multicast and "
                                  "MDC; unicast has one, as Aeron)"),
    "group": ("implemented", "UDP subscriptions: true, false or infer (the default: multicast, or the sender's "
                             "group flag) - randomised multicast NAK delays"),
    "control": ("implemented", "UDP publications: the address an MDC publication binds for status messages"),
    "control-mode": ("partial", "UDP publications: dynamic and manual (multi-destination-cast); UDP "
                                "subscriptions: manual (multi-destination subscriptions); response refused"),
    "tags": ("refused", "channel and publication tags"),
    "gtag": ("implemented", "UDP subscriptions: the group tag their status messages carry (fc=tagged)"),
    "ssc": ("implemented", "UDP publications: spies simulate a connection (default: the driver's setting)"),
    "ats": ("refused", "Aeron transport security"),
    "media-rcv-ts-offset": ("refused", "receive timestamps"),
    "channel-rcv-ts-offset": ("refused", "receive timestamps"),
    "channel-snd-ts-offset": ("refused", "send timestamps"),
    "response-correlation-id": ("refused", "response channels"),
    "stream-id": ("refused", "response channels"),
}
# logbuf's own keys (not Aeron's): resume-position= on IPC subscriptions
LOGBUF_URI_KEYS: dict[str, tuple[str, str]] = {
    "resume-position": ("implemented", "subscriptions: sessionId:position[,...] joins an IPC image where it read "
                                       "before while that is in the log (else its oldest); a UDP image starts "
                                       "where it joins"),
}

_SIZE = re.compile(r"^(\d+)([kKmMgG]?)$")
_SCALE = {"": 1, "k": 1024, "m": 1024 * 1024, "g": 1024 * 1024 * 1024}
_DURATION = re.compile(r"^(\d+)(ns|us|ms|s)$")
# fc=<strategy>[,t:<receiver timeout>][,g:<tag>[/<min group size>]]: min = the slowest receiver sets the limit
# (receivers tracked by id), max = the fastest one does (Aeron's multicast and MDC default), tagged = the slowest
# of the receivers whose SMs carry the group tag, unicast = the one receiver
FLOW_CONTROL_STRATEGIES = ("min", "max", "tagged", "unicast")
DEFAULT_GROUP_TAG = -1  # Aeron's default flow-control group tag
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
    return int(match.group(1)) * NANOS_PER_UNIT[match.group(2)]


@dataclass(frozen=True)
class FlowControlSpec:
    strategy: str  # one of FLOW_CONTROL_STRATEGIES
    receiver_timeout_ns: int | None = None  # None: the driver's default
    group_tag: int | None = None  # tagged: g:<tag> (None: Aeron's default, -1)
    group_min_size: int | None = None  # tagged: g:<tag>/<min group size> (None: 0)


@dataclass(frozen=True)
class ChannelUri:
    media: str  # "ipc" or "udp"
    params: dict[str, str] = field(default_factory=dict)
    spy: bool = False  # aeron-spy:aeron:udp?...: a subscription reading this driver's network publications

    @classmethod
    def parse(cls, channel: str) -> ChannelUri:
        if not isinstance(channel, str) or not channel:
            raise InvalidChannelError("channel must be a non-empty string such as 'aeron:ipc'")
        if not channel.isascii() or any(c.isspace() for c in channel):
            raise InvalidChannelError(f"channel {channel!r} must be ASCII without spaces")
        spy = channel.startswith(SPY_PREFIX)
        if spy:
            channel = channel[len(SPY_PREFIX):]
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
        if spy and media != "udp":
            raise InvalidChannelError(f"channel {SPY_PREFIX}{channel!r}: a spy reads a UDP publication "
                                      f"({SPY_PREFIX}aeron:udp?endpoint=host:port)")
        uri = cls(media, params, spy)
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
        group_tag = group_min_size = None
        for option in options:
            key, sep, value = option.partition(":")
            if key == "t" and sep:
                timeout = parse_duration_ns(value, "fc receiver timeout")
                if timeout <= 0:
                    raise InvalidChannelError(f"fc={text!r}: the receiver timeout must be positive")
            elif key == "g" and sep:
                if strategy != "tagged":
                    raise InvalidChannelError(f"fc={text!r}: g: is supported with fc=tagged only")
                group_tag, group_min_size = _parse_group(text, value)
            else:
                raise InvalidChannelError(f"fc={text!r}: unknown option {option!r} (t:<receiver timeout>, "
                                          f"g:<group tag>[/<min group size>])")
        return FlowControlSpec(strategy, timeout, group_tag, group_min_size)

    def control_mode(self) -> str | None:
        """``control-mode=dynamic|manual`` (multi-destination-cast), or None when the channel does not say."""
        mode = self.params.get(CONTROL_MODE_PARAM)
        if mode is not None and mode not in CONTROL_MODES:
            raise InvalidChannelError(f"channel {self}: parameter 'control-mode' = {mode} is not supported by this "
                                      f"driver (supported: {', '.join(CONTROL_MODES)})")
        return mode

    def validate(self) -> None:
        """Syntax and ranges a value has on its own; what depends on the driver (a term length's default, the
        MTU against it, which keys are honoured) is checked when the driver resolves the channel."""
        try:
            if TERM_LENGTH_PARAM in self.params:
                d.check_term_length(self.term_length(0))
            if MTU_PARAM in self.params:
                d.check_mtu(self.mtu(0), d.TERM_MAX_LENGTH)
        except InvalidChannelError:
            raise
        except ValueError as exc:
            raise InvalidChannelError(f"channel {self}: {exc}") from None
        if self.is_udp:
            mode = self.control_mode()
            if ENDPOINT_PARAM not in self.params and CONTROL_PARAM not in self.params and mode != "manual":
                raise InvalidChannelError(f"channel {self}: a UDP channel needs endpoint=host:port")
            if mode == "dynamic" and CONTROL_PARAM not in self.params:
                raise InvalidChannelError(f"channel {self}: control-mode=dynamic needs control=host:port")
            if ENDPOINT_PARAM in self.params:
                parse_endpoint(self.params[ENDPOINT_PARAM])
            if CONTROL_PARAM in self.params:
                parse_endpoint(self.params[CONTROL_PARAM])
            self.flow_control()
        elif ENDPOINT_PARAM in self.params:
            raise InvalidChannelError(f"channel {self}: an IPC channel has no endpoint")

    def canonical(self) -> str:
        """``aeron:<media>`` plus parameters in a stable order (the form the driver shows and keys on), behind
        ``aeron-spy:`` for a spy."""
        prefix = SPY_PREFIX if self.spy else ""
        if not self.params:
            return f"{prefix}aeron:{self.media}"
        return f"{prefix}aeron:{self.media}?" + "|".join(f"{k}={v}" for k, v in sorted(self.params.items()))

    def __str__(self) -> str:
        return self.canonical()


def _parse_group(text: str, value: str) -> tuple[int | None, int | None]:
    """``g:<tag>``, ``g:<tag>/<min group size>`` or ``g:/<min group size>`` (Aeron's forms)."""
    tag_text, slash, size_text = value.partition("/")
    tag = size = None
    try:
        if tag_text:
            tag = int(tag_text, 10)
            if not -(2**63) <= tag < 2**63:
                raise ValueError
        if slash:
            size = int(size_text, 10)
            if not 0 <= size <= 2**31 - 1:
                raise ValueError
    except ValueError:
        raise InvalidChannelError(f"fc={text!r}: g:{value} must be <group tag>[/<min group size>]") from None
    if tag is None and size is None:
        raise InvalidChannelError(f"fc={text!r}: g: needs a group tag or /<min group size>")
    return tag, size


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); an IPv6 address only in brackets (``::1:80`` is ambiguous)."""
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
        if ":" in host:
            sep = ""
    if not sep or not host or "[" in host or "]" in host or not (port_text.isascii() and port_text.isdigit()):
        raise InvalidChannelError(f"endpoint {text!r} must be host:port")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise InvalidChannelError(f"endpoint {text!r}: port out of range")
    return host, port
