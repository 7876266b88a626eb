"""``FeedHandler``: MoldUDP64 A/B feeds in, arbitrated ITCH messages out into logbuf (``logbuf feed``).

The sans-IO cores (:class:`~logbuf.feed.arbiter.Arbiter`, :class:`~logbuf.feed.recovery.Recovery`) decide;
this module owns the sockets, the clock and the publications::

    feed A ─┐  recvmmsg into one receive ring   ┌──────────────────┐  delivery runs, appended by C ─▶ messages
    feed B ─┼──(arbitration engine in C)───────▶│ Arbiter/Recovery │  gap/session events ──────────▶ events
    answers ┘  (retransmission server, unicast) └──────────────────┘  re-requests ─▶ retransmission server
                                                                       packet/delivery rows ───────▶ capture

One thread, no spinning, Python's cost per round (not per packet): when every socket has been read to the end
it blocks in ``poll(2)`` until a datagram or the arbiter's next deadline (at most ``max_block``), then lets
``batch_wait`` more traffic gather. The arbiter's waits run on kernel arrival stamps; while a socket still
holds datagrams, time only advances to the newest stamp processed. Nothing is skipped silently: messages are
published in sequence order exactly once; a jump is always preceded by a GAP_UNRECOVERABLE record on the events
stream; back-pressure blocks the handler (the subscribers are slower than the feed) rather than dropping. An
unreachable retransmission server is counted and retried with back-off. Counters (kernel drops per feed
socket included) are copied into cnc.dat every 100 ms (``logbuf stat --type feed``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from logbuf.client.client import Client, Counter, connect
from logbuf.client.publication import BACK_PRESSURED, CLOSED, NOT_CONNECTED, Publication
from logbuf.cnc.counters import FEED_HANDLER_COUNTER_TYPE_ID
from logbuf.errors import LogbufError
from logbuf.feed import published as out
from logbuf.feed.arbiter import Arbiter, ArbiterConfig, DeliverRun
from logbuf.feed.events import (
    Deliver,
    DeliverBatch,
    EndOfSession,
    Event,
    Feed,
    FeedMode,
    GapDetected,
    GapReason,
    GapRecovered,
    GapUnrecoverable,
    QueueOverflow,
    RecoveryRequest,
    SessionChanged,
)
from logbuf.feed.feed_native import (
    RecvRing,
    enable_drop_counts,
    enable_kernel_timestamps,
    lib,
    monotonic_ns,
)
from logbuf.feed.moldudp64 import COUNT_OFFSET, HEADER_LENGTH, SEQUENCE_OFFSET
from logbuf.feed.recovery import Recovery, RecoveryConfig
from logbuf.feed.stats import I64_MAX
from logbuf.idle import BackoffIdleStrategy

COUNTER_PUBLISH_INTERVAL_NS = 100_000_000
LATENCY_SAMPLES = 1 << 16
DEFAULT_BATCH_WAIT_S = 0.0003  # a few packets per round at the open's rate; well under the latency budget
DEFAULT_RCVBUF = 32 << 20  # bytes per feed socket: ~1 s of the busiest open (20k packets/s x 1.4 kB)
RETRANSMIT_SLOTS = 8  # receive slots kept for retransmission answers per cycle
UNREACHABLE_BACKOFF_NS = (10_000_000, 1_000_000_000)  # first and longest pause after ECONNREFUSED
NANOS_PER_SECOND = 1_000_000_000
NANOS_PER_MILLI = 1_000_000
NANOS_PER_MICRO = 1_000
INVALID_BATCH = lib.LB_INVALID_BATCH  # lb_offer_batch: a message longer than the publication's maximum
_SEQ = np.dtype(">u8")
_COUNT = np.dtype(">u2")
_LETTERS = np.array([ord("A"), ord("B"), ord("R")], dtype=np.uint8)


class FeedHandlerError(LogbufError):
    """The feed handler cannot run (bad configuration, its publications were closed, ...)."""


def reserved_value(seq: int) -> int:
    """A u64 MoldUDP64 sequence as a frame's int64 reserved value (the same 64 bits; read it back as u64)."""
    return seq - (1 << 64) if seq >= 1 << 63 else seq


@dataclass
class FeedHandlerConfig:
    feed_a: tuple[str, int] | None = ("127.0.0.1", 30001)
    feed_b: tuple[str, int] | None = ("127.0.0.1", 30002)
    interface: str = "0.0.0.0"  # multicast: the interface address to join on
    retransmit: tuple[str, int] | None = None  # recovery server; None = recovery off
    mode: FeedMode = FeedMode.A_AND_B
    driver_directory: str | None = None
    channel: str = "aeron:ipc"
    messages_stream: int = out.MESSAGES_STREAM
    events_stream: int = out.EVENTS_STREAM
    capture_stream: int | None = None  # set to capture packets and deliveries for the recorder
    arbiter: ArbiterConfig = field(default_factory=ArbiterConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    seed: int | None = None  # recovery back-off jitter (None: random)
    rcvbuf: int = DEFAULT_RCVBUF
    ring_slots: int = 64
    max_block_s: float = 0.01  # longest poll(2) sleep (a stop request is noticed within this)
    batch_wait_s: float = DEFAULT_BATCH_WAIT_S  # after a wake-up, let this much traffic gather (0: none)
    kernel_timestamps: bool = True
    stop_at_end_of_session: bool = False
    wait_for_subscriber_s: float = 0.0  # > 0: before reading the feeds, wait this long for a subscriber

    def __post_init__(self) -> None:
        feeds = self.mode.feeds
        if Feed.A in feeds and self.feed_a is None:
            raise ValueError("mode includes feed A but no feed A address was given")
        if Feed.B in feeds and self.feed_b is None:
            raise ValueError("mode includes feed B but no feed B address was given")


def _open_feed_socket(address: tuple[str, int], interface: str, rcvbuf: int) -> socket.socket:
    host, port = address
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:  # past net.core.rmem_max when privileged: bursts at max speed need a deep socket buffer
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), rcvbuf)
    except OSError:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if ipaddress.ip_address(host).is_multicast:
        sock.bind((host, port))  # only this group's datagrams
        membership = socket.inet_aton(host) + socket.inet_aton(interface)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
    else:
        sock.bind((host, port))
    sock.setblocking(False)
    return sock


class FeedHandler:
    """Runs the receive → arbitrate → publish loop; ``run()`` until ``stop()`` (or end of session)."""

    def __init__(self, config: FeedHandlerConfig, client: Client | None = None) -> None:
        self.config = config
        self._own_client = client is None
        self.client = client or connect(config.driver_directory)
        self._stop = threading.Event()
        self.sockets: dict[Feed, socket.socket] = {}
        self.counters: dict[str, Counter] = {}
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        cfg = self.config
        recovery = None
        if cfg.retransmit is not None:
            rng = random.Random(cfg.seed)
            recovery = Recovery(cfg.recovery, rng=rng)
        arbiter_config = cfg.arbiter
        if arbiter_config.mode != cfg.mode:
            arbiter_config = _replace(arbiter_config, mode=cfg.mode)
        self.arbiter = Arbiter(arbiter_config, recovery=recovery)
        self.ring = RecvRing(capacity=cfg.ring_slots)
        for feed, address in ((Feed.A, cfg.feed_a), (Feed.B, cfg.feed_b)):
            if feed in cfg.mode.feeds and address is not None:
                self.sockets[feed] = _open_feed_socket(address, cfg.interface, cfg.rcvbuf)
        if cfg.retransmit is not None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.connect(cfg.retransmit)  # answers come back to this socket, and only from the server
            sock.setblocking(False)
            self.sockets[Feed.RETRANSMIT] = sock
        if cfg.kernel_timestamps:
            for sock in self.sockets.values():
                enable_kernel_timestamps(sock)
        for sock in self.sockets.values():
            with contextlib.suppress(OSError):  # not every kernel reports drops; the counter then stays 0
                enable_drop_counts(sock)
        # slots per socket per receive: A and B share fairly, answers get what is left
        live = [f for f in self.sockets if f != Feed.RETRANSMIT]
        reserved = RETRANSMIT_SLOTS if Feed.RETRANSMIT in self.sockets else 0
        per_live = max(1, (cfg.ring_slots - reserved) // max(1, len(live)))
        self._slots = {f: per_live for f in live}
        if Feed.RETRANSMIT in self.sockets:
            self._slots[Feed.RETRANSMIT] = cfg.ring_slots - per_live * len(live)
        self._poller = select.poll()
        self._fd_feed = {}
        for feed, sock in self.sockets.items():
            self._poller.register(sock.fileno(), select.POLLIN)
            self._fd_feed[sock.fileno()] = feed
        client = self.client
        self.messages = client.add_exclusive_publication(cfg.channel, cfg.messages_stream)
        self.events = client.add_exclusive_publication(cfg.channel, cfg.events_stream)
        self.capture = (
            client.add_exclusive_publication(cfg.channel, cfg.capture_stream) if cfg.capture_stream is not None else None
        )
        self._epoch_offset_ns = time.time_ns() - monotonic_ns()
        self._session = b""
        self.published = 0
        self.unpublished = 0  # no subscriber was connected
        self.back_pressure_waits = 0
        self.end_of_session = False
        self._idle = BackoffIdleStrategy(max_spins=100, max_yields=50, max_park_ns=100_000)
        self._next_counters_ns = 0
        # the retransmission server refused (ECONNREFUSED: nothing listens there): requests pause, then retry
        self.retransmit_unreachable = 0
        self.cpu_ns = 0  # CPU time of the receive/arbitrate/publish loop
        self.rounds = 0  # receive/arbitrate/publish rounds that received something
        self.lost_by_reason = dict.fromkeys(GapReason, 0)  # messages declared unrecoverable, by why
        self.drained = True  # the last round read every feed socket to the end
        self._answers_waiting = False  # poll(2) saw the retransmission socket readable
        self._unreachable_until_ns = 0
        self._unreachable_backoff_ns = UNREACHABLE_BACKOFF_NS[0]
        # wire-to-log latency: packet arrival (kernel stamp) to its messages committed in the log, sampled
        # once per published batch into a ring (the first message of the batch: the longest wait in it)
        self.latency_samples_ns = np.zeros(LATENCY_SAMPLES, dtype=np.int64)
        self.latency_count = 0
        for name in self.counter_values():
            self.counters[name] = client.add_counter(FEED_HANDLER_COUNTER_TYPE_ID, f"feed: {name}", name.encode()[:100])

    # -- the loop --------------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def run(self, duration_s: float | None = None) -> None:
        cfg = self.config
        deadline = None if duration_s is None else time.monotonic() + duration_s
        if cfg.wait_for_subscriber_s > 0:
            until = time.monotonic() + cfg.wait_for_subscriber_s
            while not self.messages.is_connected and time.monotonic() < until and not self._stop.is_set():
                time.sleep(0.005)
        cpu_started = time.process_time_ns()  # the process CPU (rusage) while the loop runs
        try:
            while not self._stop.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                work = self.do_work()
                # the session has ended once the stream reached its end and no hole is being recovered (the
                # give-up timeout bounds that)
                if self.end_of_session and cfg.stop_at_end_of_session and not self.arbiter.recovering:
                    break
                if not work or self.drained:  # every socket read to the end: wait for more
                    self._block()
        finally:
            self.cpu_ns += time.process_time_ns() - cpu_started
        self.publish_counters()

    def do_work(self) -> int:
        """One receive/arbitrate/publish cycle; returns packets received + events handled."""
        n = 0
        drained = True
        for feed, sock in self.sockets.items():
            if feed == Feed.RETRANSMIT and not (self.arbiter.recovering or self._answers_waiting):
                continue  # answers only come while recovering (a late one waits for the next round)
            want = self._slots[feed]
            got = self._receive(sock, feed, n, want)
            if got == want and feed != Feed.RETRANSMIT:
                drained = False  # more may be waiting on this feed
            n += got
        self._answers_waiting = False
        self.drained = drained
        self.rounds += 1 if n else 0
        events: list[Event] = self.arbiter.process(self.ring, 0, n, runs=True) if n else []
        if n and self.capture is not None:
            self._capture_packets(n)
        if events:  # delivery runs live in the engine until its next call: publish them first
            self._handle(events)
        handled = len(events)
        now = monotonic_ns()
        # One clock: the arbiter's waits run on arrival stamps. While a feed socket still holds datagrams, time
        # is only known up to the newest stamp processed — a lagging handler must not declare holes whose other
        # copy is waiting in a socket. Once every feed socket is drained, everything before `now` was seen.
        clock = now if drained or not n else min(now, int(self.ring.arrivals[:n].max()))
        next_deadline = self.arbiter.next_deadline_ns()
        if next_deadline is not None and clock >= next_deadline:
            events = self.arbiter.on_tick(clock)
            handled += len(events)
            if events:
                self._handle(events)
        if now >= self._next_counters_ns:
            self._next_counters_ns = now + COUNTER_PUBLISH_INTERVAL_NS
            self.publish_counters()
        return n + handled

    def _receive(self, sock: socket.socket, feed: Feed, start: int, want: int) -> int:
        try:
            return self.ring.receive(sock, feed, start=start, max_packets=want)
        except ConnectionRefusedError:  # an ICMP port unreachable for a request on the connected socket
            if feed != Feed.RETRANSMIT:
                raise
            self._note_unreachable()
            return 0

    def _note_unreachable(self) -> None:
        self.retransmit_unreachable += 1
        now = monotonic_ns()
        if now >= self._unreachable_until_ns:
            self._unreachable_until_ns = now + self._unreachable_backoff_ns
            self._unreachable_backoff_ns = min(2 * self._unreachable_backoff_ns, UNREACHABLE_BACKOFF_NS[1])

    def _send_request(self, event: RecoveryRequest) -> None:
        sock = self.sockets.get(Feed.RETRANSMIT)
        if sock is None or monotonic_ns() < self._unreachable_until_ns:
            return  # paused after a refusal: recovery asks again at its next retry
        try:
            sock.send(event.encode())
            self._unreachable_backoff_ns = UNREACHABLE_BACKOFF_NS[0]
        except BlockingIOError:
            pass
        except ConnectionRefusedError:
            self._note_unreachable()

    def _block(self) -> None:
        """Sleep in poll(2) until a datagram arrives or the arbiter's next deadline (bounded); then, when data
        came, let ``batch_wait_s`` more arrive, so one receive/arbitrate/publish round serves many packets."""
        timeout_ns = int(self.config.max_block_s * NANOS_PER_SECOND)
        next_deadline = self.arbiter.next_deadline_ns()
        if next_deadline is not None:
            timeout_ns = max(0, min(timeout_ns, next_deadline - monotonic_ns()))
        ready = self._poller.poll(max(0, -(-timeout_ns // NANOS_PER_MILLI)))  # ms, rounded up
        if any(self._fd_feed.get(fd) == Feed.RETRANSMIT for fd, _ in ready):
            self._answers_waiting = True
        if ready and self.config.batch_wait_s > 0:
            time.sleep(self.config.batch_wait_s)

    # -- events ----------------------------------------------------------------------------------------

    def _handle(self, events: list[Event]) -> None:
        delivered: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        slow_seqs: list[int] = []
        slow_feeds: list[int] = []
        slow_arrivals: list[int] = []
        for event in events:
            if isinstance(event, DeliverRun):
                if self.capture is not None:
                    batch = event.batch()
                    delivered.append((batch.seqs, batch.feeds, batch.arrivals_ns))
                self._publish_run(event)
            elif isinstance(event, DeliverBatch):
                self._publish_batch(event)
                if self.capture is not None:
                    delivered.append((event.seqs, event.feeds, event.arrivals_ns))
            elif isinstance(event, Deliver):
                self._offer(self.messages, event.message, reserved_value(event.seq))
                if self.capture is not None:
                    slow_seqs.append(event.seq)
                    slow_feeds.append(int(event.feed))
                    slow_arrivals.append(event.arrival_ns)
            elif isinstance(event, RecoveryRequest):
                self._send_request(event)
            else:
                if self.capture is not None:  # keep capture rows in stream order with the events
                    self._flush_delivered(delivered, slow_seqs, slow_feeds, slow_arrivals)
                self._publish_event(event)
        if self.capture is not None:
            self._flush_delivered(delivered, slow_seqs, slow_feeds, slow_arrivals)

    def _publish_event(self, event: Event) -> None:
        now = time.time_ns()
        if isinstance(event, GapDetected):
            record = out.FeedEvent(out.GAP_DETECTED, int(event.reason), event.first, event.last, now, event.session)
        elif isinstance(event, GapRecovered):
            record = out.FeedEvent(out.GAP_RECOVERED, 0, event.first, event.last, now, event.session)
        elif isinstance(event, GapUnrecoverable):
            record = out.FeedEvent(out.GAP_UNRECOVERABLE, int(event.reason), event.first, event.last, now, event.session)
            self.lost_by_reason[event.reason] = min(I64_MAX, self.lost_by_reason[event.reason] + event.count)
        elif isinstance(event, SessionChanged):
            self._session = event.session
            record = out.FeedEvent(out.SESSION_CHANGED, 0, event.next_sequence, 0, now, event.session)
        elif isinstance(event, EndOfSession):
            self.end_of_session = True
            record = out.FeedEvent(out.END_OF_SESSION, 0, event.next_sequence, 0, now, event.session)
        elif isinstance(event, QueueOverflow):
            record = out.FeedEvent(out.QUEUE_OVERFLOW, 0, event.queued_packets, event.capacity, now, event.session)
        else:  # pragma: no cover - every event type is handled above
            return
        self._offer(self.events, record.encode(), reserved_value(self.arbiter_next_sequence()))

    def arbiter_next_sequence(self) -> int:
        return int(self.arbiter.expected or 0)

    # -- publishing ------------------------------------------------------------------------------------

    def _offer(self, publication: Publication, data: bytes | memoryview, reserved_value: int) -> None:
        while True:
            result = publication.offer(data, reserved_value)
            if result > 0:
                self._idle.reset()
                if publication is self.messages:
                    self.published += 1
                return
            if result == NOT_CONNECTED:
                if publication is self.messages:
                    self.unpublished += 1
                return
            if result == CLOSED:
                raise FeedHandlerError("publication closed (the driver went away?)")
            if result == BACK_PRESSURED:
                self.back_pressure_waits += 1
            self._idle.idle(0)

    def _publish_run(self, run: DeliverRun) -> None:
        """A run of the engine's deliveries, appended by C straight from the receive ring into the log."""
        pub = self.messages
        self._publish(len(run), run.first_arrival_ns(), lambda done: self.arbiter.offer_run(run, done, pub))

    def _publish_batch(self, batch: DeliverBatch) -> None:
        """All of a native batch, in order, with the MoldUDP64 sequence as each frame's reserved value."""
        seqs = batch.seqs.view(np.int64)
        pub = self.messages
        self._publish(
            len(batch), int(batch.ring_arrivals[batch.slots[0]]) if len(batch) else 0,
            lambda done: pub.offer_batch(batch.buffer, batch.lengths[done:], seqs[done:], batch.offsets[done:]),
        )

    def _publish(self, count: int, first_arrival_ns: int, append: Callable[[int], tuple[int, int]]) -> None:
        """Appends ``count`` messages through ``append(done) -> (appended, result)``, one native call per try,
        idling with back-off while the log is back-pressured."""
        done = 0
        while done < count:
            appended, result = append(done)
            if appended:
                if done == 0:
                    slot = self.latency_count % LATENCY_SAMPLES
                    self.latency_samples_ns[slot] = monotonic_ns() - first_arrival_ns
                    self.latency_count += 1
                done += appended
                self.published += appended
                self._idle.reset()
                continue
            if result == NOT_CONNECTED:
                self.unpublished += count - done
                return
            if result == CLOSED:
                raise FeedHandlerError("publication closed (the driver went away?)")
            if result == INVALID_BATCH:
                raise FeedHandlerError("a message is longer than the publication's maximum message length")
            if result == BACK_PRESSURED:
                self.back_pressure_waits += 1
            self._idle.idle(0)

    # -- capture ---------------------------------------------------------------------------------------

    def _capture_packets(self, n: int) -> None:
        ring = self.ring
        slab = ring.slab.reshape(ring.capacity, ring.slot_size)[:n]
        lengths = ring.lengths[:n]
        rows = np.zeros(n, dtype=out.PACKET_ROW)
        rows["feed"] = _LETTERS[ring.feeds[:n]]
        rows["bytes"] = lengths
        rows["arrival_ns"] = ring.arrivals[:n] + self._epoch_offset_ns
        valid = lengths >= HEADER_LENGTH
        seq = np.ascontiguousarray(slab[:, SEQUENCE_OFFSET:COUNT_OFFSET]).view(_SEQ).reshape(n).astype(np.int64)
        count = np.ascontiguousarray(slab[:, COUNT_OFFSET:HEADER_LENGTH]).view(_COUNT).reshape(n).astype(np.int32)
        rows["sequence"] = np.where(valid, seq, -1)
        rows["count"] = np.where(valid, count, -1)
        self._offer_rows(rows, out.CAPTURE_PACKETS)

    def _offer_rows(self, rows: np.ndarray, kind: int) -> None:
        """Capture rows in unfragmented frames (whole rows per frame), so readers never reassemble."""
        assert self.capture is not None
        per_frame = max(1, self.capture.max_payload_length // out.CAPTURE_ROW_LENGTH)
        for start in range(0, len(rows), per_frame):
            self._offer(self.capture, rows[start : start + per_frame].tobytes(), kind)

    def _flush_delivered(self, delivered: list, seqs: list[int], feeds: list[int], arrivals: list[int]) -> None:
        parts = []
        for batch_seqs, batch_feeds, batch_arrivals in delivered:
            parts.append(out.delivered_runs(batch_seqs, batch_feeds, batch_arrivals))
        if seqs:
            parts.append(out.delivered_runs(np.array(seqs, np.uint64), np.array(feeds, np.uint8),
                                            np.array(arrivals, np.int64)))
        delivered.clear()
        seqs.clear()
        feeds.clear()
        arrivals.clear()
        if not parts:
            return
        rows = np.concatenate(parts).astype(out.DELIVERED_ROW)  # concatenate drops the rows' padding
        rows["feed"] = _LETTERS[rows["feed"]]
        rows["arrival_ns"] += self._epoch_offset_ns
        self._offer_rows(rows, out.CAPTURE_DELIVERED)

    # -- counters and lifetime -------------------------------------------------------------------------

    def latency_percentiles_ns(self, percentiles: tuple[float, ...] = (50, 99, 99.9)) -> dict[str, float]:
        """Wire-to-log latency of the sampled batches (the last ``LATENCY_SAMPLES``)."""
        n = min(self.latency_count, LATENCY_SAMPLES)
        if n == 0:
            return {}
        values = np.percentile(self.latency_samples_ns[:n], percentiles)
        return {f"p{p:g}": float(v) for p, v in zip(percentiles, values, strict=True)}

    def counter_values(self) -> dict[str, int]:
        values = dict(self.arbiter.counter_values())
        values["published"] = self.published
        values["unpublished"] = self.unpublished
        values["back_pressure_waits"] = self.back_pressure_waits
        values["retransmit_unreachable"] = self.retransmit_unreachable
        values["cpu_us"] = self.cpu_ns // NANOS_PER_MICRO
        values["rounds"] = self.rounds
        for reason, lost in self.lost_by_reason.items():
            values[f"lost.{reason.name.lower()}"] = lost
        for feed in Feed:  # datagrams the kernel dropped for a full socket buffer (SO_RXQ_OVFL)
            values[f"{feed.name}.kernel_drops"] = int(self.ring.kernel_drops[feed])
        return values

    def publish_counters(self) -> None:
        for name, value in self.counter_values().items():
            counter = self.counters.get(name)
            if counter is not None:
                counter.set(int(value))

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        self.sockets.clear()
        if self._own_client:
            self.client.close()

    def __enter__(self) -> FeedHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _replace(config: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(config, **changes)

