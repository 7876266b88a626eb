"""Resolving a channel once: a :class:`ChannelUri` plus the driver's context become the validated parameters
of a publication (:class:`PublicationParams`) or a subscription (:class:`SubscriptionParams`).

Everything that creates a log, a window, a socket or a subscriber link takes its values from here; nothing
re-derives them from the URI.  Every key is checked against :data:`logbuf.channel.AERON_URI_KEYS`: a key the
driver does not honour (an Aeron key whose behaviour it lacks, a value of a partly honoured key, an unknown or
misspelt key) is refused with :class:`InvalidChannelError` naming it, never silently ignored.  Keys that Aeron
reads only on the other side (``term-length`` on a subscription, ``tether`` on a publication) are accepted
and have no effect there, as on aeronmd, so one channel string serves both ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from logbuf.channel import (
    AERON_URI_KEYS,
    LOGBUF_URI_KEYS,
    ChannelUri,
    FlowControlSpec,
    InvalidChannelError,
    parse_size,
)
from logbuf.driver.context import DriverContext
from logbuf.driver.log_metadata import (  # Aeron's defaults for the untethered subscriber timeouts
    DEFAULT_UNTETHERED_RESTING_TIMEOUT_NS,
    DEFAULT_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS,
)
from logbuf.driver.udp.retransmit import MAX_RESEND_LIMIT
from logbuf.driver.windows import publication_window
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.frame import FRAME_ALIGNMENT
from logbuf.units import NANOS_PER_UNIT

# keys that only mean something on one medium (refused on the other: they would be ignored there)
UDP_ONLY_KEYS = frozenset({"interface", "ttl", "so-sndbuf", "so-rcvbuf", "rcv-wnd", "fc", "cc", "reliable",
                           "rejoin", "ssc", "control", "control-mode", "max-resend", "gtag", "nak-delay", "group"})
# group=: Aeron's inferable boolean (infer: multicast channel, or a SETUP with the sender's group flag)
GROUP_VALUES = ("true", "false", "infer")
# keys a receive destination of an MDS subscription may not carry (they belong to the subscription's channel)
INVALID_DESTINATION_KEYS = ("mtu", "rcv-wnd", "so-rcvbuf", "so-sndbuf", "response-correlation-id")

# partly honoured keys: the values honoured on each medium
_HONOURED_VALUES: dict[str, dict[str, frozenset[str]]] = {
    # (a spy is tethered or not as an IPC subscriber is; an untethered UDP image is not implemented)
    "tether": {"ipc": frozenset({"true", "false"}), "spy": frozenset({"true", "false"}),
               "udp": frozenset({"true"})},
    "eos": {"ipc": frozenset({"true", "false"}), "udp": frozenset({"true"})},
    "cc": {"udp": frozenset({"static"})},
}

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_DURATION = re.compile(r"^(\d+)(ns|us|ms|s)?$")


def check_keys(uri: ChannelUri) -> None:
    """Refuses (InvalidChannelError naming the key) every key of ``uri`` this driver does not honour."""
    for key, value in uri.params.items():
        known = AERON_URI_KEYS.get(key) or LOGBUF_URI_KEYS.get(key)
        if known is None:
            raise InvalidChannelError(f"channel {uri}: unknown channel parameter {key!r}")
        status, note = known
        if status == "refused":
            raise InvalidChannelError(
                f"channel {uri}: parameter {key!r} is not supported by this driver ({note})")
        if uri.is_ipc and key in UDP_ONLY_KEYS:
            raise InvalidChannelError(f"channel {uri}: parameter {key!r} has no meaning on aeron:ipc")
        honoured = _HONOURED_VALUES.get(key, {}).get("spy" if uri.spy else uri.media)
        if honoured is not None and value not in honoured:
            raise InvalidChannelError(
                f"channel {uri}: {key}={value} is not supported by this driver on aeron:{uri.media} "
                f"(supported: {', '.join(sorted(honoured))})")


def parse_bool(uri: ChannelUri, key: str, default: bool) -> bool:
    """``true`` / ``false`` (Aeron's only spellings)."""
    text = uri.params.get(key)
    if text is None:
        return default
    if text not in ("true", "false"):
        raise InvalidChannelError(f"channel {uri}: {key}={text!r} must be true or false")
    return text == "true"


def parse_int32(uri: ChannelUri, key: str) -> int | None:
    text = uri.params.get(key)
    if text is None:
        return None
    try:
        value = int(text, 10)
    except ValueError:
        raise InvalidChannelError(f"channel {uri}: {key}={text!r} is not an integer") from None
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise InvalidChannelError(f"channel {uri}: {key}={text} is out of the int32 range")
    return value


def parse_timeout_ns(uri: ChannelUri, key: str, default: int) -> int:
    """A duration as Aeron writes one: digits (nanoseconds) with an optional ns, us, ms or s suffix."""
    text = uri.params.get(key)
    if text is None:
        return default
    match = _DURATION.match(text)
    if not match:
        raise InvalidChannelError(f"channel {uri}: {key}={text!r} is not a duration (digits, then ns, us, ms or s)")
    return int(match.group(1)) * NANOS_PER_UNIT[match.group(2) or "ns"]


def _size(uri: ChannelUri, key: str) -> int | None:
    text = uri.params.get(key)
    return None if text is None else parse_size(text, key)


@dataclass(frozen=True)
class InitialPosition:
    """``init-term-id``, ``term-id``, ``term-offset``: where a new publication's log starts."""

    initial_term_id: int
    term_id: int
    term_offset: int

    def position(self, term_length: int) -> int:
        return ((self.term_id - self.initial_term_id) & 0xFFFFFFFF) * term_length + self.term_offset


@dataclass(frozen=True)
class PublicationParams:
    """A publication's settings, resolved from its channel and the driver's context."""

    term_length: int
    mtu: int
    window_length: int
    linger_timeout_ns: int
    sparse: bool
    signal_eos: bool
    session_id: int | None
    initial_position: InitialPosition | None
    untethered_window_limit_timeout_ns: int
    untethered_resting_timeout_ns: int
    socket_sndbuf: int | None
    socket_rcvbuf: int | None
    flow_control: FlowControlSpec | None
    spies_simulate_connection: bool = False  # UDP: the publication is connected while only spies read it
    max_resend: int | None = None  # UDP: retransmits in flight (None: the driver's, 16)
    term_length_given: bool = False  # the channel named it (a shared publication must then match it)
    mtu_given: bool = False


@dataclass(frozen=True)
class SubscriptionParams:
    """A subscription's settings, resolved from its channel and the driver's context."""

    session_id: int | None
    tether: bool
    receiver_window: int | None  # UDP: rcv-wnd, None = the driver's
    socket_sndbuf: int | None
    socket_rcvbuf: int | None
    sparse: bool = True  # UDP: the images' logs
    resume_positions: dict[int, int] = field(default_factory=dict)
    group_tag: int | None = None  # UDP: gtag=, carried by the endpoint's status messages (fc=tagged)
    reliable: bool = True  # UDP: reliable=false pads gaps instead of NAKing them
    rejoin: bool = True  # UDP: rejoin=false leaves an ended session unjoined while subscribed
    group: str = "infer"  # UDP: one of GROUP_VALUES
    nak_delay_ns: int | None = None  # UDP: nak-delay, None = the driver's
    manual: bool = False  # UDP: control-mode=manual (MDS)

    def matches(self, session_id: int) -> bool:
        """Whether an image of ``session_id`` is for this subscription."""
        return self.session_id is None or self.session_id == session_id


def _socket_buffers(uri: ChannelUri) -> tuple[int | None, int | None]:
    sndbuf = _size(uri, "so-sndbuf")
    rcvbuf = _size(uri, "so-rcvbuf")
    for key, value in (("so-sndbuf", sndbuf), ("so-rcvbuf", rcvbuf)):
        if value is not None and not 0 < value <= _INT32_MAX:
            raise InvalidChannelError(f"channel {uri}: {key}={value} must be positive")
    return sndbuf, rcvbuf


def resolve_publication(uri: ChannelUri, ctx: DriverContext) -> PublicationParams:
    """The publication parameters of ``uri`` on a driver with ``ctx`` (InvalidChannelError when not valid)."""
    check_keys(uri)
    term_length = _size(uri, "term-length")
    term_length_given = term_length is not None
    if term_length is None:
        term_length = ctx.ipc_term_length if uri.is_ipc else ctx.network_term_length
    mtu = _size(uri, "mtu")
    mtu_given = mtu is not None
    if mtu is None:
        mtu = ctx.mtu
    try:
        d.check_term_length(term_length)
        d.check_mtu(mtu, term_length)
    except ValueError as exc:
        raise InvalidChannelError(f"channel {uri}: {exc} (term length {term_length})") from None
    window = _size(uri, "pub-wnd")
    if window is not None:
        if not mtu <= window <= term_length // 2:
            raise InvalidChannelError(
                f"channel {uri}: pub-wnd={window} must be at least the mtu ({mtu}) and at most half the term "
                f"length ({term_length // 2})")
    elif uri.is_ipc:
        window = publication_window(term_length, ctx.ipc_publication_window)
    else:
        window = publication_window(term_length, ctx.network_publication_window, network=True)
    _receiver_values(uri)
    linger = parse_timeout_ns(uri, "linger", ctx.publication_linger_timeout_ns)
    session_id = parse_int32(uri, "session-id")
    initial_position = _initial_position(uri, term_length)
    sndbuf, rcvbuf = _socket_buffers(uri)
    if sndbuf is not None and sndbuf < mtu:
        raise InvalidChannelError(f"channel {uri}: so-sndbuf={sndbuf} is less than the mtu ({mtu})")
    return PublicationParams(
        term_length=term_length,
        mtu=mtu,
        window_length=window,
        linger_timeout_ns=linger,
        sparse=parse_bool(uri, "sparse", not ctx.pre_touch),
        signal_eos=parse_bool(uri, "eos", True),
        session_id=session_id,
        initial_position=initial_position,
        untethered_window_limit_timeout_ns=parse_timeout_ns(
            uri, "untethered-window-limit-timeout", DEFAULT_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS),
        untethered_resting_timeout_ns=parse_timeout_ns(
            uri, "untethered-resting-timeout", DEFAULT_UNTETHERED_RESTING_TIMEOUT_NS),
        socket_sndbuf=sndbuf,
        socket_rcvbuf=rcvbuf,
        flow_control=uri.flow_control() if uri.is_udp else None,
        spies_simulate_connection=parse_bool(uri, "ssc", ctx.spies_simulate_connection),
        max_resend=_max_resend(uri),
        term_length_given=term_length_given,
        mtu_given=mtu_given,
    )


def _max_resend(uri: ChannelUri) -> int | None:
    """``max-resend``: 1..256 retransmits in flight (a size, as Aeron parses it)."""
    value = _size(uri, "max-resend")
    if value is not None and not 1 <= value <= MAX_RESEND_LIMIT:
        raise InvalidChannelError(f"channel {uri}: max-resend={value} must be > 0 and <= {MAX_RESEND_LIMIT}")
    return value


def _initial_position(uri: ChannelUri, term_length: int) -> InitialPosition | None:
    keys = ("init-term-id", "term-id", "term-offset")
    given = [k for k in keys if k in uri.params]
    if not given:
        return None
    if len(given) < len(keys):
        raise InvalidChannelError(f"channel {uri}: init-term-id, term-id and term-offset must be used as a "
                                  f"complete set")
    initial_term_id = parse_int32(uri, "init-term-id")
    term_id = parse_int32(uri, "term-id")
    term_offset = parse_int32(uri, "term-offset")
    assert initial_term_id is not None and term_id is not None and term_offset is not None
    if ((term_id - initial_term_id + 2**31) & 0xFFFFFFFF) - 2**31 < 0:
        raise InvalidChannelError(f"channel {uri}: term-id={term_id} is before init-term-id={initial_term_id}")
    if not 0 <= term_offset <= term_length:
        raise InvalidChannelError(f"channel {uri}: term-offset={term_offset} must be in [0, term-length "
                                  f"{term_length}]")
    if term_offset % FRAME_ALIGNMENT:
        raise InvalidChannelError(f"channel {uri}: term-offset={term_offset} must be a multiple of "
                                  f"{FRAME_ALIGNMENT}")
    return InitialPosition(initial_term_id, term_id, term_offset)


def resolve_subscription(uri: ChannelUri, ctx: DriverContext) -> SubscriptionParams:
    """The subscription parameters of ``uri`` on a driver with ``ctx`` (InvalidChannelError when not valid)."""
    check_keys(uri)
    window = _size(uri, "rcv-wnd")
    if window is not None and not 0 < window <= _INT32_MAX:
        raise InvalidChannelError(f"channel {uri}: rcv-wnd={window} must be positive")
    sndbuf, rcvbuf = _socket_buffers(uri)
    group = _receiver_values(uri)
    control_mode = uri.params.get("control-mode")
    if control_mode is not None and control_mode != "manual":
        raise InvalidChannelError(f"channel {uri}: control-mode={control_mode} is not supported on subscriptions by "
                                  f"this driver (supported: manual)")
    if control_mode == "manual" and "endpoint" in uri.params:
        raise InvalidChannelError(f"channel {uri}: control-mode=manual takes its endpoints from add_destination, "
                                  f"not endpoint=")
    nak_delay = uri.params.get("nak-delay")
    group_tag = None
    if "gtag" in uri.params:
        try:
            group_tag = int(uri.params["gtag"], 10)
        except ValueError:
            group_tag = None
        if group_tag is None or not -(2**63) <= group_tag < 2**63:
            raise InvalidChannelError(f"channel {uri}: gtag={uri.params['gtag']!r} is not an int64")
    return SubscriptionParams(
        session_id=parse_int32(uri, "session-id"),
        tether=parse_bool(uri, "tether", True),
        receiver_window=window,
        socket_sndbuf=sndbuf,
        socket_rcvbuf=rcvbuf,
        sparse=parse_bool(uri, "sparse", not ctx.pre_touch),
        resume_positions=parse_resume_positions(uri),
        group_tag=group_tag,
        reliable=parse_bool(uri, "reliable", True),
        rejoin=parse_bool(uri, "rejoin", True),
        group=group,
        nak_delay_ns=None if nak_delay is None else parse_timeout_ns(uri, "nak-delay", 0),
        manual=control_mode == "manual",
    )


def _receiver_values(uri: ChannelUri) -> str:
    """The receiver keys' values checked on either side (a publication ignores them, as aeronmd, but a bad
    value is refused there too); returns ``group``."""
    group = uri.params.get("group", "infer")
    if group not in GROUP_VALUES:
        raise InvalidChannelError(f"channel {uri}: group={group!r} must be one of {', '.join(GROUP_VALUES)}")
    parse_timeout_ns(uri, "nak-delay", 0)
    parse_bool(uri, "reliable", True)
    parse_bool(uri, "rejoin", True)
    return group


def check_destination(uri: ChannelUri) -> None:
    """A receive destination of an MDS subscription: a UDP channel with an endpoint, none of the keys that
    belong to the subscription (INVALID_CHANNEL naming the key, as aeronmd)."""
    for key in INVALID_DESTINATION_KEYS:
        if key in uri.params:
            raise InvalidChannelError(f"destinations must not contain the key: {key} channel={uri}")
    check_keys(uri)
    if not uri.is_udp or "endpoint" not in uri.params or "control-mode" in uri.params:
        raise InvalidChannelError(f"channel {uri}: a receive destination is aeron:udp?endpoint=host:port")


def confirm_match(params: PublicationParams, term_length: int, mtu: int, session_id: int, where: str) -> str | None:
    """Why a shared publication (``term_length``, ``mtu``, ``session_id``) cannot take a publisher asking for
    ``params`` - what aeronmd says, with the first setting that differs - or None when it can."""
    for name, given, asked, existing in (("mtu", params.mtu_given, params.mtu, mtu),
                                         ("term-length", params.term_length_given, params.term_length, term_length),
                                         ("session-id", params.session_id is not None, params.session_id, session_id)):
        if given and asked != existing:
            return f"existing publication has different '{name}': existing={existing} requested={asked} {where}"
    return None


def parse_resume_positions(uri: ChannelUri) -> dict[int, int]:
    """logbuf's ``resume-position=<sessionId>:<position>[,...]``: join those sessions where the subscriber
    read up to before (a restarted durable consumer) instead of their live end."""
    text = uri.params.get("resume-position")
    if text is None:
        return {}
    resume: dict[int, int] = {}
    for item in text.split(","):
        session, sep, position = item.partition(":")
        try:
            session_id, pos = int(session), int(position)
        except ValueError:
            raise InvalidChannelError(
                f"channel {uri}: resume-position={text!r}: expected sessionId:position[,...]") from None
        if not sep or pos < 0 or pos % FRAME_ALIGNMENT:
            raise InvalidChannelError(f"channel {uri}: resume-position: bad position in {item!r}")
        resume[session_id] = pos
    return resume
