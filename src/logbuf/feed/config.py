"""Every setting of the feed handler with its default and its help text: the one place they are written.

The arbitration engine's settings (:class:`ArbiterConfig`), the re-request pacing's (:class:`RecoveryConfig`)
and the handler's own (addresses, sockets, joining, the checkpoint) are all defaulted from the constants
below; ``logbuf feed``'s options and their ``--help`` are generated from :data:`FEED_OPTIONS`
(:func:`add_feed_options`). The feed mode is stored once, in :class:`ArbiterConfig`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

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
        if not 4 <= self.delay_window_bits <= 24:
            raise ValueError("delay_window_bits must be within 4..24")
        if self.session is not None:
            moldudp64.encode_session(self.session)
        if self.resume is not None:
            moldudp64.encode_session(self.resume[0])
            if not 1 <= self.resume[1] <= MAX_SEQUENCE:
                raise ValueError("resume's next sequence must be a MoldUDP64 sequence (>= 1)")
        if self.max_jump is not None and self.max_jump < 1:
            raise ValueError("max_jump must be >= 1 message (or None: no confirmation)")


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


@dataclass(frozen=True)
class Option:
    """One ``logbuf feed`` option: its flag, type, default and help (the default is shown by --help)."""

    flag: str
    type: Callable[[str], object] | None
    default: object
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


def _count(text: str) -> int:
    from logbuf.cli_args import count

    return count(text)


def _checkpoint(text: str) -> str | None:
    return None if text.lower() == "off" else text


FEED_OPTIONS: tuple[Option, ...] = (
    Option("--join", None, DEFAULT_JOIN, "from-start: recover the session from sequence 1 (everything "
           "missed before the first packet is re-requested); live: start at the first packet seen (the past is "
           "skipped: one SESSION_CHANGED names where the stream starts). A restart resumes from the checkpoint "
           "instead", choices=JOIN_CHOICES),
    Option("--checkpoint", _checkpoint, None, "file holding the session and next sequence published (updated "
           "after every append, cleared once the session was published to its end); a restarted handler resumes "
           "the same session right after it, so subscribers see no duplicate (default: feed-STREAM.checkpoint in "
           "the driver directory; off: none)",
           metavar="PATH|off"),
    Option("--out-of-order-max-interval", _count, DEFAULT_OUT_OF_ORDER_MAX_INTERVAL,
           "packets per feed past a hole that declare it a gap"),
    Option("--lost-packet-wait-ms", float, float(DEFAULT_LOST_PACKET_WAIT_MS),
           "arrival time past a hole that declares it a gap"),
    Option("--queue-bytes", _count, DEFAULT_MAX_QUEUE_BYTES,
           "out-of-order queue bound (datagram bytes; > 5 s of the busiest open); past it packets are shed and "
           "re-requested (--no-recovery: the oldest holes are given up)"),
    Option("--queue-packets", _count, DEFAULT_MAX_QUEUE_PACKETS, "out-of-order queue bound (datagrams)"),
    Option("--max-jump", _count, DEFAULT_MAX_JUMP,
           "a packet this many messages past everything known waits for a confirmation: the other feed's copy "
           "or the same feed continuing after it"),
    Option("--rcvbuf", _count, DEFAULT_RCVBUF, "receive buffer of each socket, the answers' included (bytes)"),
    Option("--udp-gro", None, "on" if DEFAULT_UDP_GRO else "off",
           "on: the kernel may hand over a run of datagrams it coalesced (a sender's segmented send, a NIC's "
           "receive offload) as one, split again by the handler: far less kernel work per packet; the run's "
           "datagrams share one arrival stamp and a dropped run counts once in kernel_drops (Linux >= 5.0)",
           choices=("on", "off")),
    Option("--batch-wait-us", float, float(DEFAULT_BATCH_WAIT_US),
           "while traffic flows, one sleep this long per round (fewer, larger rounds: less CPU, more latency)"),
    Option("--request-rate", float, DEFAULT_REQUEST_RATE,
           "re-requests per second at most (stay under the server's per-client limit)"),
    Option("--max-outstanding", _count, DEFAULT_MAX_OUTSTANDING,
           "answer-sized re-requests in flight at most"),
    Option("--initial-backoff-ms", float, float(DEFAULT_INITIAL_BACKOFF_MS), "first re-request after a gap "
           "(x 0.5..1.5, randomised)"),
    Option("--retry-interval-ms", float, float(DEFAULT_RETRY_INTERVAL_MS), "re-request again after no answer"),
    Option("--give-up", float, float(DEFAULT_GIVE_UP_S),
           "seconds a requested message may stay unanswered (or the server silent) before its gap is lost"),
    Option("--wait-for-subscriber", float, DEFAULT_WAIT_FOR_SUBSCRIBER_S,
           "before reading the feeds, wait up to this many seconds for a subscriber of the messages stream and "
           "exit with an error if none came; 0: publish regardless (a warning and exit status 1 if any message "
           "was not published)", metavar="SECONDS"),
)


def add_feed_options(parser: argparse.ArgumentParser) -> None:
    """Add :data:`FEED_OPTIONS` to ``parser``."""
    for option in FEED_OPTIONS:
        kwargs: dict[str, object] = {"default": option.default, "help": option.help}
        if option.type is not None:
            kwargs["type"] = option.type
        if option.metavar is not None:
            kwargs["metavar"] = option.metavar
        if option.choices is not None:
            kwargs["choices"] = option.choices
        parser.add_argument(option.flag, **kwargs)  # type: ignore[arg-type]
