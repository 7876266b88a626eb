"""The replay's settings, checked when built: the whole replay (:class:`ReplayConfig`), each feed
(:class:`FeedConfig`) and the faults injected on it (:class:`FaultConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from logbuf.errors import LogbufError
from logbuf.exchange.synth import CLOSE_NS, OPEN_NS
from logbuf.marketdata import moldudp64
from logbuf.marketdata.moldudp64 import DEFAULT_PAYLOAD_BUDGET, HEADER_LENGTH

START_PHASES: dict[str, int] = {"pre-open": 0, "open": OPEN_NS, "close": CLOSE_NS}
NANOS_PER_SECOND = 1_000_000_000
NANOS_PER_MILLI = 1_000_000
DEFAULT_FLUSH_GAP_NS = 50_000
DEFAULT_CATCH_UP_BUDGET = 2_800  # ~70 messages of ~36 framed bytes per catch-up packet


class ReplayError(LogbufError, ValueError):
    """A replay setting is out of range (speed, budget, fault probabilities, destinations, ...)."""


@dataclass(frozen=True)
class FaultConfig:
    """The faults injected on one feed (probabilities per packet, freezes, drop ranges)."""

    loss: float = 0.0  # probability a packet is lost
    duplicate: float = 0.0  # probability a packet is sent twice
    reorder: float = 0.0  # probability a packet is swapped with the next one
    freeze: float = 0.0  # probability, per packet, that a head-end freeze starts
    freeze_ms: tuple[float, float] = (100.0, 200.0)
    freeze_max_packets: int = 64  # at most this many packets held by one freeze (bounds it at max speed)
    catch_up_budget: int = DEFAULT_CATCH_UP_BUDGET
    drop_ranges: tuple[tuple[int, int], ...] = ()  # inclusive message sequence ranges
    freeze_every_ms: float = 0.0  # a scheduled freeze every this many ms of the feed's time (0: none)

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder", "freeze"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ReplayError(f"fault probability {name} must be within [0, 1]")
        if not self.freeze_every_ms >= 0:
            raise ReplayError("freeze_every_ms must be >= 0 (0: no scheduled freezes)")
        low, high = self.freeze_ms
        if not 0 <= low <= high:
            raise ReplayError("freeze_ms must be (low, high) with 0 <= low <= high")
        if self.freeze_max_packets < 1 or self.catch_up_budget < HEADER_LENGTH + 2:
            raise ReplayError("freeze_max_packets must be >= 1 and catch_up_budget must fit a message")
        for first, last in self.drop_ranges:
            if not 1 <= first <= last:
                raise ReplayError(f"drop range {first}-{last} must satisfy 1 <= first <= last")


@dataclass(frozen=True)
class FeedConfig:
    """One feed: its name, its delay behind the exchange's clock and jitter, and its faults."""

    name: str
    delay_ns: int = 0
    jitter_ns: int = 0
    faults: FaultConfig = field(default_factory=FaultConfig)


@dataclass(frozen=True)
class ReplayConfig:
    """The whole replay: session, pace (``speed`` or ``packet_rate``), start phase, packet budget and flush gap,
    heartbeats, end of session, the fault seed and the feeds."""

    session: str | bytes = "SYNTH0001"
    speed: float | None = 1.0  # None = as fast as possible
    packet_rate: float | None = None  # packets per second per feed, full packets; overrides speed
    start: str = "pre-open"
    budget: int = DEFAULT_PAYLOAD_BUDGET
    flush_gap_ns: int = DEFAULT_FLUSH_GAP_NS
    heartbeat_ns: int = NANOS_PER_SECOND
    end_of_session_count: int = 3
    end_of_session_interval_ns: int = NANOS_PER_SECOND
    seed: int = 1
    feeds: tuple[FeedConfig, ...] = (FeedConfig("A"),)
    block_messages: int = 65_536

    def __post_init__(self) -> None:
        if self.speed is not None and self.speed <= 0:
            raise ReplayError("speed must be positive (or None for max)")
        if self.packet_rate is not None and not self.packet_rate > 0:
            raise ReplayError("packet rate must be positive (or None to follow the timestamps)")
        if self.start not in START_PHASES:
            raise ReplayError(f"start must be one of {', '.join(START_PHASES)}")
        if self.budget < HEADER_LENGTH + 2:
            raise ReplayError(f"payload budget {self.budget} leaves no room for a message")
        if self.heartbeat_ns <= 0 or self.end_of_session_count < 0 or self.end_of_session_interval_ns < 0:
            raise ReplayError("heartbeat interval must be positive; end-of-session count/interval >= 0")
        moldudp64.encode_session(self.session)
