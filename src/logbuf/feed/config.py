"""Every setting of the feed handler with its default and its help text: the one place they are written.

The arbitration engine's settings (:class:`ArbiterConfig`), the re-request pacing's (:class:`RecoveryConfig`)
and the handler's own (addresses, sockets, joining, the checkpoint) are all defaulted from the constants
below; ``logbuf feed``'s options and their ``--help`` are generated from :data:`FEED_OPTIONS`
(:func:`add_feed_options`). The feed mode is stored once, in :class:`ArbiterConfig`.
"""

from __future__ import annotations

import argparse
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass

from logbuf.feed import published as out
from logbuf.feed.events import FeedMode
from logbuf.marketdata import moldudp64
from logbuf.marketdata.moldudp64 import MAX_MESSAGE_COUNT, MAX_SEQUENCE
from logbuf.units import NANOS_PER_MILLI, NANOS_PER_SECOND

# A packet more than this many messages past everything known needs a confirmation before it counts (the other
# feed's copy, or the next packet of the same feed continuing after it): ~100 packets of ~40 messages, so an
# ordinary loss is never held back and a jump costs one packet's wait.
DEFAULT_MAX_JUMP = 4_096
# The out-of-order queue's bound in datagram bytes: over 5 s of the busiest documented open (20k packets/s of
# ~1.4 kB), so a blackout of both feeds or a late start queues everything live while recovery fetches the past.
DEFAULT_MAX_QUEUE_BYTES = 256 << 20
DEFAULT_MAX_QUEUE_PACKETS = 1 << 20
# Requested ranges remembered for accepting answers (the oldest are forgotten past this).
MAX_REQUESTED_RANGES = 4096
# Gap detection (common published defaults: 3 packets, 100 ms).
DEFAULT_OUT_OF_ORDER_MAX_INTERVAL = 3
DEFAULT_LOST_PACKET_WAIT_MS = 100
# Re-request pacing: under the 1,000 requests/s per client a retransmission server typically allows, with room
# for a burst; several answer-sized requests in flight; back-off, retry and give-up as in a common NAK scheme.
DEFAULT_REQUEST_RATE = 800.0
DEFAULT_REQUEST_BURST = 64
DEFAULT_MAX_OUTSTANDING = 64
DEFAULT_INITIAL_BACKOFF_MS = 50
DEFAULT_RETRY_INTERVAL_MS = 200
DEFAULT_GIVE_UP_S = 10
# Bounds the engine's integer token bucket stays exact within (native/feed.h LBF_MAX_*).
MAX_REQUEST_RATE = 1_000_000.0
MAX_REQUEST_BURST = 1_000_000
# The handler.
DEFAULT_RCVBUF = 32 << 20  # bytes per socket: ~1 s of the busiest open (20k packets/s x 1.4 kB)
DEFAULT_UDP_GRO = True  # the kernel may hand over a coalesced run of datagrams as one (split again in C)
DEFAULT_BATCH_WAIT_US = 1000  # rounds of ~50 packets at the open's rate: each sleep costs ~20 us of CPU on a VM
DEFAULT_WAIT_FOR_SUBSCRIBER_S = 60.0
DEFAULT_RING_SLOTS = 256  # receive slots per round (A and B share fairly): a catch-up burst in few rounds
DEFAULT_MAX_BLOCK_S = 0.01  # longest ppoll(2) sleep when idle (a stop request is noticed within this)
JOIN_CHOICES = ("from-start", "live")
DEFAULT_JOIN = "from-start"


@dataclass(frozen=True)
class ArbiterConfig:
    """Arbitration and gap-detection settings (common published defaults: 3 packets, 100 ms)."""

    mode: FeedMode = FeedMode.A_AND_B
    out_of_order_max_interval: int = DEFAULT_OUT_OF_ORDER_MAX_INTERVAL  # packets per live feed past the hole
    lost_packet_wait_time_ns: int = DEFAULT_LOST_PACKET_WAIT_MS * NANOS_PER_MILLI
    start_sequence: int | None = 1  # None: join wherever the first packet is
    session: str | bytes | None = None  # pin the session; None: join the first seen
    max_queue_packets: int = DEFAULT_MAX_QUEUE_PACKETS
    max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES  # datagram bytes queued at most
    session_change_idle_ns: int = 3 * NANOS_PER_SECOND
    # an END_OF_SESSION acts after this long without traffic past it on either feed (copies and repeats confirm
    # nothing: a forger sends both); with both feeds arbitrated, a feed's own next datagram confirms a session
    # only once the other feed has been silent this long (a heartbeat interval)
    end_of_session_quiet_ns: int = NANOS_PER_SECOND
    # a session (first or switch) and the --join live start point act only when a second datagram confirms them,
    # an END_OF_SESSION only after the quiet period; False trusts one datagram (a feed nobody can inject into, and
    # tests of other rules)
    confirm: bool = True
    delay_window_bits: int = 16
    max_jump: int | None = DEFAULT_MAX_JUMP  # messages past everything known that need a confirmation
    resume: tuple[str | bytes, int] | None = None  # (session, next sequence): join that session there

    def __post_init__(self) -> None:
        FeedMode(self.mode)
        if self.out_of_order_max_interval < 1:
            raise ValueError("out_of_order_max_interval must be >= 1 packet")
        if self.lost_packet_wait_time_ns <= 0:
            raise ValueError("lost_packet_wait_time_ns must be > 0")
        if self.start_sequence is not None and not 1 <= self.start_sequence <= MAX_SEQUENCE:
            raise ValueError("start_sequence must be a MoldUDP64 sequence (>= 1) or None")
        if self.max_queue_packets < 2:
            raise ValueError("max_queue_packets must be >= 2")
        if self.max_queue_bytes < 2 * 1500:
            raise ValueError("max_queue_bytes must be >= 3000 (two datagrams)")
        if self.session_change_idle_ns <= 0:
            raise ValueError("session_change_idle_ns must be > 0")
        if self.end_of_session_quiet_ns <= 0:
            raise ValueError("end_of_session_quiet_ns must be > 0")
        if not 4 <= self.delay_window_bits <= 24:
            raise ValueError("delay_window_bits must be within 4..24")
        if self.session is not None:
            moldudp64.encode_session(self.session)
        if self.resume is not None:
            self.resume_session_field()
            if not 1 <= self.resume[1] <= MAX_SEQUENCE:
                raise ValueError("resume's next sequence must be a MoldUDP64 sequence (>= 1)")
        if self.max_jump is not None and self.max_jump < 1:
            raise ValueError("max_jump must be >= 1 message (or None: no confirmation)")

    def resume_session_field(self) -> bytes:
        """The 10-byte session field ``resume`` names: 10 bytes are taken as they are (a session read from the
        wire, any bytes, as a checkpoint stores it), anything shorter as a session name (ASCII, padded)."""
        assert self.resume is not None
        session = self.resume[0]
        if isinstance(session, bytes) and len(session) == moldudp64.SESSION_LENGTH:
            return session
        return moldudp64.encode_session(session)


@dataclass(frozen=True)
class RecoveryConfig:
    """Re-request pacing; defaults as in a common NAK scheme (initial back-off 50 ms × 0.5–1.5, retry 200 ms, give up 10 s)."""

    initial_backoff_ns: int = DEFAULT_INITIAL_BACKOFF_MS * NANOS_PER_MILLI
    backoff_jitter: tuple[float, float] = (0.5, 1.5)
    retry_interval_ns: int = DEFAULT_RETRY_INTERVAL_MS * NANOS_PER_MILLI
    give_up_ns: int = DEFAULT_GIVE_UP_S * NANOS_PER_SECOND
    max_request_count: int = MAX_MESSAGE_COUNT
    max_outstanding: int = DEFAULT_MAX_OUTSTANDING
    request_rate: float = DEFAULT_REQUEST_RATE  # requests per second (kept under the server's per-client limit)
    request_burst: int = DEFAULT_REQUEST_BURST  # requests that may go out at once after a quiet period

    def __post_init__(self) -> None:
        low, high = self.backoff_jitter
        if not 0.0 <= low <= high:
            raise ValueError(f"backoff_jitter {self.backoff_jitter} must satisfy 0 <= low <= high")
        if self.initial_backoff_ns < 0:
            raise ValueError("initial_backoff_ns must be >= 0")
        if self.retry_interval_ns <= 0 or self.give_up_ns <= 0:
            raise ValueError("retry_interval_ns and give_up_ns must be > 0")
        if not 1 <= self.max_request_count <= MAX_MESSAGE_COUNT:
            raise ValueError(f"max_request_count must be within 1..{MAX_MESSAGE_COUNT} (MoldUDP64 request count)")
        if self.max_outstanding < 1:
            raise ValueError("max_outstanding must be >= 1")
        if not 0 < self.request_rate <= MAX_REQUEST_RATE or not 1 <= self.request_burst <= MAX_REQUEST_BURST:
            raise ValueError(f"request_rate must be within (0, {MAX_REQUEST_RATE:g}] and request_burst within "
                             f"1..{MAX_REQUEST_BURST}")

    @property
    def rate_units(self) -> int:
        """``request_rate`` in thousandths of a request per second (the token bucket's exact integer unit)."""
        return max(1, round(self.request_rate * 1_000))


# -- the command line ------------------------------------------------------------------------------------------

# Where the handler listens and publishes by default (the library's FeedHandlerConfig and the CLI share them).
DEFAULT_FEED_A = ("127.0.0.1", 30001)
DEFAULT_FEED_B = ("127.0.0.1", 30002)
DEFAULT_INTERFACE = "0.0.0.0"
DEFAULT_CHANNEL = "aeron:ipc"
MODE_CHOICES = {"ab": FeedMode.A_AND_B, "a": FeedMode.A_ONLY, "b": FeedMode.B_ONLY}
DEFAULT_MODE = "ab"
# Upper bounds of the command line's numbers: each fits the engine's integer fields (ns in int64, counts in
# int32/int64) with room to spare, so a value past them is a typo, refused by name instead of overflowing.
MAX_WAIT_MS = 3_600_000.0  # an hour
MAX_GIVE_UP_S = 86_400.0  # a day
MAX_BATCH_WAIT_US = 100_000.0
MAX_OUT_OF_ORDER_MAX_INTERVAL = 1_000_000
MAX_QUEUE_BYTES = 1 << 40
MAX_QUEUE_PACKETS = 1 << 32
MAX_OUTSTANDING = 1 << 20
MAX_RCVBUF = (1 << 31) - 1  # setsockopt's int
# The options that only the re-request pacing reads: refused by name while recovery is off.
RECOVERY_ONLY = ("request_rate", "max_outstanding", "initial_backoff_ms", "retry_interval_ms", "give_up", "seed")
# Set on the parsed namespace: the dests given on the command line (not left at their defaults).
EXPLICIT = "feed_explicit"


@dataclass(frozen=True)
class Option:
    """One ``logbuf feed`` option: its flag, type, default and help (the default is shown by --help); ``flag``
    options take no value (on when given)."""

    flag: str
    type: Callable[[str], object] | None
    default: object
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _count(low: int = 1, high: int | None = None) -> Callable[[str], int]:
    """A whole number (``5000``, ``50k``, ``2M``) within ``low..high``."""

    def parse(text: str) -> int:
        from logbuf.cli_args import count

        value = count(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r} must be within {low:,}..{high:,}" if high is not None
                                             else f"{text!r} must be >= {low:,}")
        return value

    return parse


def _number(low: float, high: float, unit: str, *, low_open: bool = True) -> Callable[[str], float]:
    """A finite number within ``(low, high]`` (``[low, high]`` when not ``low_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and (value > low if low_open else value >= low) and value <= high):
            raise argparse.ArgumentTypeError(
                f"{text!r} must be within {'(' if low_open else '['}{low:g}, {high:g}] {unit}".rstrip())
        return value

    return parse


def _ipv4_endpoint(text: str, *, literal: bool = False, server: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` for the handler's sockets, which are IPv4 (an IPv6 address is refused by name, not left
    to fail at bind time). ``literal``: the host must be an address written a.b.c.d (a feed's socket binds it,
    or joins it as a multicast group, so a host name means nothing there). ``server``: port 0 is refused (a
    request sent there reaches no server; a feed may bind port 0 for an ephemeral port)."""
    from logbuf.channel import parse_endpoint

    host, port = parse_endpoint(text)
    if ":" in host:
        raise ValueError(f"{text}: the feed handler speaks IPv4 only")
    if server and port == 0:
        raise ValueError(f"endpoint {text!r}: port 0 reaches no server")
    if literal:
        try:
            socket.inet_aton(host)
        except OSError:
            raise ValueError(f"endpoint {text!r}: {host!r} is not an IPv4 address (a.b.c.d)") from None
        if host.count(".") != 3:
            raise ValueError(f"endpoint {text!r}: {host!r} is not an IPv4 address (a.b.c.d)")
    return host, port


def _endpoint_or_off(text: str) -> tuple[str, int] | None:
    if text.lower() == "off":
        return None
    try:
        return _ipv4_endpoint(text, literal=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _endpoint(text: str) -> tuple[str, int]:
    try:
        return _ipv4_endpoint(text, server=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _interface(text: str) -> str:
    try:
        socket.inet_aton(text)
    except OSError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IPv4 address") from None
    if text.count(".") != 3:  # inet_aton also takes '10.1' and '10': an address is written in full
        raise argparse.ArgumentTypeError(f"{text!r} is not an IPv4 address (a.b.c.d)")
    return text


def _stream_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a stream id") from None
    if not -(1 << 31) <= value < 1 << 31:
        raise argparse.ArgumentTypeError(f"{text!r} must be a 32-bit signed int")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value < 1 << 64:
        raise argparse.ArgumentTypeError(f"{text!r} must be within 0..2**64-1")
    return value


def _checkpoint(text: str) -> str | None:
    return None if text.lower() == "off" else text


def _show(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


FEED_OPTIONS: tuple[Option, ...] = (
    # -- where: feeds, server, publications
    Option("--feed-a", _endpoint_or_off, DEFAULT_FEED_A, "feed A address to bind (a multicast group joins it on "
           f"--interface; off: none) (default: {_show(DEFAULT_FEED_A)})", metavar="HOST:PORT|off"),
    Option("--feed-b", _endpoint_or_off, DEFAULT_FEED_B,
           f"feed B address to bind (off: none) (default: {_show(DEFAULT_FEED_B)})", metavar="HOST:PORT|off"),
    Option("--interface", _interface, DEFAULT_INTERFACE, "interface address for multicast joins"),
    Option("--mode", None, DEFAULT_MODE, "arbitrate A+B, A only or B only (the other feed must then be off or "
           "left at its default)", choices=tuple(MODE_CHOICES)),
    Option("--retransmit", _endpoint, None, "retransmission server (recovery is off without one)",
           metavar="HOST:PORT"),
    Option("--no-recovery", None, False, "declare gaps lost at once (no --retransmit then)", switch=True),
    Option("--channel", None, DEFAULT_CHANNEL, "channel of the publications"),
    Option("--stream", _stream_id, out.MESSAGES_STREAM, "messages stream id"),
    Option("--events-stream", _stream_id, out.EVENTS_STREAM, "gap/session events stream id"),
    Option("--capture", None, False, "publish packet/delivery capture rows for the recorder", switch=True),
    Option("--capture-stream", _stream_id, out.CAPTURE_STREAM, "capture stream id (with --capture)"),
    # -- joining and restarts
    Option("--join", None, DEFAULT_JOIN, "from-start: recover the session from sequence 1 (everything "
           "missed before the first packet is re-requested); live: start at the first packet seen that a second "
           "datagram confirms (the past is skipped: one SESSION_CHANGED names where the stream starts). A restart resumes from the checkpoint "
           "instead", choices=JOIN_CHOICES),
    Option("--checkpoint", _checkpoint, None, "file holding the session and next sequence published and the "
           "append in flight (stored around every append, cleared once the session was published to its end); a "
           "restarted handler resumes the same session right after the last sequence published, reading an "
           "interrupted append back from the previous run's log, so subscribers see no duplicate (default: "
           "feed-STREAM.checkpoint in the driver directory; off: none)",
           metavar="PATH|off"),
    # -- gap detection, the queue, trust
    Option("--out-of-order-max-interval", _count(1, MAX_OUT_OF_ORDER_MAX_INTERVAL),
           DEFAULT_OUT_OF_ORDER_MAX_INTERVAL, "packets per feed past a hole that declare it a gap"),
    Option("--lost-packet-wait-ms", _number(0, MAX_WAIT_MS, "ms"), float(DEFAULT_LOST_PACKET_WAIT_MS),
           "arrival time past a hole that declares it a gap"),
    Option("--queue-bytes", _count(3000, MAX_QUEUE_BYTES), DEFAULT_MAX_QUEUE_BYTES,
           "out-of-order queue bound (datagram bytes; > 5 s of the busiest open); past it packets are shed and "
           "re-requested (--no-recovery: the oldest holes are given up)"),
    Option("--queue-packets", _count(2, MAX_QUEUE_PACKETS), DEFAULT_MAX_QUEUE_PACKETS,
           "out-of-order queue bound (datagrams)"),
    Option("--max-jump", _count(1, MAX_SEQUENCE), DEFAULT_MAX_JUMP,
           "every packet that skips ahead on its feed waits for a confirmation (the same feed continuing after "
           "it, or the other feed reaching it); one more than this many messages past everything known is also "
           "confirmed by the other feed within this distance, and stays provisional until the stream reaches it"),
    # -- sockets and rounds
    Option("--rcvbuf", _count(1, MAX_RCVBUF), DEFAULT_RCVBUF,
           "receive buffer of each socket, the answers' included (bytes)"),
    Option("--udp-gro", None, "on" if DEFAULT_UDP_GRO else "off",
           "on: the kernel may hand over a run of datagrams it coalesced (a sender's segmented send, a NIC's "
           "receive offload) as one, split again by the handler: far less kernel work per packet; the run's "
           "datagrams share one arrival stamp and a dropped run counts once in kernel_drops (Linux >= 5.0)",
           choices=("on", "off")),
    Option("--batch-wait-us", _number(0, MAX_BATCH_WAIT_US, "us", low_open=False), float(DEFAULT_BATCH_WAIT_US),
           "while traffic flows, one sleep this long per round (fewer, larger rounds: less CPU, more latency)"),
    # -- recovery (refused while recovery is off)
    Option("--request-rate", _number(0, MAX_REQUEST_RATE, "requests/s"), DEFAULT_REQUEST_RATE,
           "re-requests per second at most (stay under the server's per-client limit)"),
    Option("--max-outstanding", _count(1, MAX_OUTSTANDING), DEFAULT_MAX_OUTSTANDING,
           "answer-sized re-requests in flight at most"),
    Option("--initial-backoff-ms", _number(0, MAX_WAIT_MS, "ms"), float(DEFAULT_INITIAL_BACKOFF_MS),
           "first re-request after a gap (x 0.5..1.5, randomised)"),
    Option("--retry-interval-ms", _number(0, MAX_WAIT_MS, "ms"), float(DEFAULT_RETRY_INTERVAL_MS),
           "re-request again after no answer"),
    Option("--give-up", _number(0, MAX_GIVE_UP_S, "s"), float(DEFAULT_GIVE_UP_S),
           "seconds a requested message may stay unanswered (or the server silent) before its gap is lost"),
    Option("--seed", _seed, None, "seed of the re-request back-off jitter (default: random)"),
    # -- the run
    Option("--wait-for-subscriber", _number(0, MAX_GIVE_UP_S, "s", low_open=False), DEFAULT_WAIT_FOR_SUBSCRIBER_S,
           "before reading the feeds, wait up to this many seconds for a subscriber of the messages stream and "
           "exit with an error if none came; 0: publish regardless (a warning and exit status 1 if any message "
           "was not published)", metavar="SECONDS"),
    Option("--until-end-of-session", None, False,
           "exit after the session's end, once every hole of it is recovered or given up", switch=True),
    Option("--duration", _number(0, float(1 << 40), "s"), None, "stop after this many seconds"),
    Option("--summary-json", None, None, "write the final counters as JSON", metavar="PATH"),
)


class _Store(argparse.Action):
    """Stores the value and notes the option as given (:data:`EXPLICIT`), so a setting that the rest of the
    command line makes meaningless is refused by name instead of ignored."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True if self.nargs == 0 else values)
        setattr(namespace, EXPLICIT, frozenset(getattr(namespace, EXPLICIT, frozenset())) | {self.dest})


def add_feed_options(parser: argparse.ArgumentParser) -> None:
    """Add :data:`FEED_OPTIONS` to ``parser`` (each noted in the namespace's :data:`EXPLICIT` when given)."""
    parser.set_defaults(**{EXPLICIT: frozenset()})
    for option in FEED_OPTIONS:
        kwargs: dict[str, object] = {"default": option.default, "help": option.help, "action": _Store}
        if option.switch:
            kwargs["nargs"] = 0
        if option.type is not None:
            kwargs["type"] = option.type
        if option.metavar is not None:
            kwargs["metavar"] = option.metavar
        if option.choices is not None:
            kwargs["choices"] = option.choices
        parser.add_argument(option.flag, **kwargs)  # type: ignore[arg-type]
