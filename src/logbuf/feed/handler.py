"""``FeedHandler``: MoldUDP64 A/B feeds in, arbitrated ITCH messages out into logbuf (``logbuf feed``).

The sans-IO core (:class:`~logbuf.feed.arbiter.Arbiter`: the C engine with its re-request pacing) decides;
this module owns the sockets, the clock and the publications. A whole round runs in C (``lbf_round``,
:class:`~logbuf.feed.feed_native.NativeRound`), and rounds follow each other in C (``lbf_round_run``) until one
needs Python or ``max_block`` passed. With ``udp_gro`` a run of datagrams the kernel coalesced arrives in one
receive slot and is split again there::

    feed A ─┐  recvmmsg into one receive ring   ┌────────────────────┐  delivery runs appended ──▶ messages
    feed B ─┼──────────────────────────────────▶│ arbitration engine │  packet/delivery rows ────▶ capture
    answers ┘  (retransmission server, unicast) └────────────────────┘  re-requests (sendmmsg) ──▶ server
                     Python, only when the round asks: gap/session records ─▶ events (with the requests
                     among them); back-pressure (idle, then resume); a refusal (back-off); counters every 100 ms

One thread, no spinning, Python's cost per round (not per packet), and only off the happy path. While traffic
flows a round sleeps ``batch_wait`` once and then takes everything waiting; when a round found nothing it
blocks in ``ppoll(2)`` until a datagram or the engine's next deadline (at most ``max_block``). The engine's
waits run on kernel arrival stamps; while a socket still holds datagrams, time only advances to the newest
stamp processed. Nothing is skipped silently: messages are published in sequence order exactly once; a jump is
always preceded by a GAP_UNRECOVERABLE record on the events stream; back-pressure blocks the handler (the
subscribers are slower than the feed) rather than dropping. An unreachable retransmission server is counted
and retried with back-off. Counters (kernel drops per feed socket included) are copied into cnc.dat every
100 ms (``logbuf stat --type feed``).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import mmap
import os
import random
import resource
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from logbuf.client.client import Client, Counter, connect
from logbuf.client.publication import BACK_PRESSURED, CLOSED, NOT_CONNECTED, Publication
from logbuf.cnc.counters import (
    FEED_HANDLER_COUNTER_TYPE_ID,
    SUBSCRIBER_POSITION_TYPE_ID,
    decode_stream_position_key,
)
from logbuf.errors import LogbufError, bind_error
from logbuf.feed import checkpoint
from logbuf.feed import published as out
from logbuf.feed.arbiter import Arbiter
from logbuf.feed.config import (
    DEFAULT_BATCH_WAIT_US,
    DEFAULT_CHANNEL,
    DEFAULT_FEED_A,
    DEFAULT_FEED_B,
    DEFAULT_INTERFACE,
    DEFAULT_JOIN,
    DEFAULT_MAX_BLOCK_S,
    DEFAULT_RCVBUF,
    DEFAULT_RING_SLOTS,
    DEFAULT_UDP_GRO,
    JOIN_CHOICES,
    ArbiterConfig,
    RecoveryConfig,
)
from logbuf.feed.events import (
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
    ROUND_BACK_PRESSURED,
    ROUND_COUNTERS,
    ROUND_DONE,
    ROUND_EVENTS,
    ROUND_KIND_MASK,
    ROUND_REFUSED,
    NativeRound,
    RecvRing,
    enable_drop_counts,
    enable_gro,
    enable_kernel_timestamps,
    lib,
    monotonic_ns,
    socket_drops,
)
from logbuf.feed.stats import I64_MAX
from logbuf.idle import BackoffIdleStrategy
from logbuf.units import NANOS_PER_MICRO, NANOS_PER_SECOND

COUNTER_PUBLISH_INTERVAL_NS = 100_000_000
LATENCY_SAMPLES = 1 << 16
DEFAULT_BATCH_WAIT_S = DEFAULT_BATCH_WAIT_US / 1e6
RETRANSMIT_SLOTS = 8  # receive slots kept for retransmission answers per cycle
UNREACHABLE_BACKOFF_NS = (10_000_000, 1_000_000_000)  # first and longest pause after ECONNREFUSED
INVALID_BATCH = lib.LB_INVALID_BATCH  # lb_offer_batch: a message longer than the publication's maximum


def read_checkpoint(path: str) -> tuple[bytes, int] | None:
    """The (session, next sequence) a run started now would resume at, from the checkpoint at ``path`` and, for
    an append the previous run had in flight, its log (None: nothing to resume)."""
    resume = checkpoint.resume_point(checkpoint.load(path))
    return None if resume is None else (resume.session, resume.next_sequence)


class FeedHandlerError(LogbufError):
    """The feed handler cannot run (bad configuration, its publications were closed, ...)."""


def reserved_value(seq: int) -> int:
    """A u64 MoldUDP64 sequence as a frame's int64 reserved value (the same 64 bits; read it back as u64)."""
    return seq - (1 << 64) if seq >= 1 << 63 else seq


@dataclass
class FeedHandlerConfig:
    feed_a: tuple[str, int] | None = DEFAULT_FEED_A
    feed_b: tuple[str, int] | None = DEFAULT_FEED_B
    interface: str = DEFAULT_INTERFACE  # multicast: the interface address to join on
    retransmit: tuple[str, int] | None = None  # recovery server; None = recovery off
    driver_directory: str | None = None
    channel: str = DEFAULT_CHANNEL
    messages_stream: int = out.MESSAGES_STREAM
    events_stream: int = out.EVENTS_STREAM
    capture_stream: int | None = None  # set to capture packets and deliveries for the recorder
    arbiter: ArbiterConfig = field(default_factory=ArbiterConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    seed: int | None = None  # recovery back-off jitter (None: random)
    rcvbuf: int = DEFAULT_RCVBUF
    ring_slots: int = DEFAULT_RING_SLOTS  # receive slots per round (A and B share fairly)
    max_block_s: float = DEFAULT_MAX_BLOCK_S  # longest ppoll(2) sleep when idle
    batch_wait_s: float = DEFAULT_BATCH_WAIT_S  # while traffic flows, one sleep this long per round (0: none)
    kernel_timestamps: bool = True
    # UDP_GRO on every socket: a run of datagrams the kernel coalesced (a segmented send, a NIC's receive
    # offload) is received as one and split again in C: far fewer receive calls' worth of kernel work
    udp_gro: bool = DEFAULT_UDP_GRO
    stop_at_end_of_session: bool = False
    wait_for_subscriber_s: float = 0.0  # > 0: before reading the feeds, wait this long for a subscriber (or fail)
    join: str = DEFAULT_JOIN  # "from-start": recover the session from sequence 1; "live": from the first packet
    # around every append the handler stores what it appends here; a restart resumes after what went in
    checkpoint: str | None = None

    @property
    def mode(self) -> FeedMode:
        """The feeds arbitrated (stored once, in the arbiter's settings)."""
        return self.arbiter.mode

    def __post_init__(self) -> None:
        feeds = self.mode.feeds
        if Feed.A in feeds and self.feed_a is None:
            raise ValueError("mode includes feed A but no feed A address was given")
        if Feed.B in feeds and self.feed_b is None:
            raise ValueError("mode includes feed B but no feed B address was given")
        if self.join not in JOIN_CHOICES:
            raise ValueError(f"join must be one of {', '.join(JOIN_CHOICES)}")
        if self.ring_slots < 2 * len(feeds) + RETRANSMIT_SLOTS:
            raise ValueError(f"ring_slots must be >= {2 * len(feeds) + RETRANSMIT_SLOTS}")


def _set_rcvbuf(sock: socket.socket, rcvbuf: int) -> None:
    try:  # past net.core.rmem_max when privileged: bursts at max speed need a deep socket buffer
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), rcvbuf)
    except OSError:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)


def _open_feed_socket(name: str, address: tuple[str, int], interface: str, rcvbuf: int) -> socket.socket:
    host, port = address
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    multicast = ipaddress.ip_address(host).is_multicast
    if multicast:  # several receivers of one group each get every datagram: sharing the port is safe
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # unicast: no SO_REUSEADDR/SO_REUSEPORT, the kernel would split the datagrams between two handlers
    _set_rcvbuf(sock, rcvbuf)
    try:
        sock.bind((host, port))  # multicast: only this group's datagrams
    except OSError as exc:
        sock.close()
        error = bind_error(exc, (host, port))
        if exc.errno == errno.EADDRINUSE:  # who is likely there
            error = type(exc)(exc.errno, f"feed {name}: unicast ports are never shared (another feed handler?): "
                                         f"{error.strerror}")
        raise error from exc
    if multicast:
        membership = socket.inet_aton(host) + socket.inet_aton(interface)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
    sock.setblocking(False)
    return sock


class FeedHandler:
    """Runs the receive → arbitrate → publish loop; ``run()`` until ``stop()`` (or end of session)."""

    def __init__(self, config: FeedHandlerConfig, client: Client | None = None) -> None:
        self.config = config
        self._own_client = client is None
        # its own client's conductor runs on this thread, every COUNTER_PUBLISH_INTERVAL (keepalive, driver
        # checks): a conductor thread would wake 100 times a second and contend for the GIL
        self.client = client or connect(config.driver_directory, conductor_thread=False)
        self._next_conductor_ns = 0
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
        recovery = cfg.recovery if cfg.retransmit is not None else None
        seed = cfg.seed if cfg.seed is not None else random.getrandbits(64)
        arbiter_config = cfg.arbiter
        if cfg.join == "live":
            arbiter_config = _replace(arbiter_config, start_sequence=None)
        # where the last run stopped publishing: its checkpoint, and its log for an append it had in flight
        self.resumed: checkpoint.ResumePoint | None = None
        self._checkpoint: mmap.mmap | None = None
        self._checkpoint_file: checkpoint.CheckpointFile | None = None
        if cfg.checkpoint is not None:
            self.resumed = checkpoint.resume_point(checkpoint.load(cfg.checkpoint), self._image_positions)
            if self.resumed is not None:  # the same session resumes after what the last run published
                arbiter_config = _replace(arbiter_config,
                                          resume=(self.resumed.session, self.resumed.next_sequence))
        self.arbiter = Arbiter(arbiter_config, recovery=recovery, seed=seed)
        self.ring = RecvRing(capacity=cfg.ring_slots)
        for feed, address in ((Feed.A, cfg.feed_a), (Feed.B, cfg.feed_b)):
            if feed in cfg.mode.feeds and address is not None:
                self.sockets[feed] = _open_feed_socket(feed.name, address, cfg.interface, cfg.rcvbuf)
        if cfg.retransmit is not None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            _set_rcvbuf(sock, cfg.rcvbuf)  # a recovery burst is answered at the server's rate
            sock.connect(cfg.retransmit)  # answers come back to this socket, and only from the server
            sock.setblocking(False)
            self.sockets[Feed.RETRANSMIT] = sock
        # what the kernel granted (the smallest of the sockets): below --rcvbuf without CAP_NET_ADMIN
        self.rcvbuf_granted = min((s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2
                                   for s in self.sockets.values()), default=cfg.rcvbuf)
        if cfg.kernel_timestamps:
            for sock in self.sockets.values():
                enable_kernel_timestamps(sock)
        if cfg.udp_gro:  # the ring's slots hold any datagram, a coalesced run included (MAX_DATAGRAM)
            for feed, sock in self.sockets.items():
                if not enable_gro(sock):
                    raise FeedHandlerError(f"the kernel refused UDP_GRO on the {feed.name} socket (Linux >= 5.0 "
                                           "has it): run with --udp-gro off")
        # kernel drops are read per socket with the counters (SO_MEMINFO), not attached to every datagram
        # (SO_RXQ_OVFL): one control message less per packet; where SO_MEMINFO is missing, SO_RXQ_OVFL it is
        self._drops_on_demand = all(socket_drops(sock) is not None for sock in self.sockets.values())
        self._kernel_drops: dict[Feed, int] = {}
        if not self._drops_on_demand:
            for sock in self.sockets.values():
                with contextlib.suppress(OSError):  # not every kernel reports drops; the counter then stays 0
                    enable_drop_counts(sock)
        # slots per socket per receive: A and B share fairly, answers get what is left
        live = [f for f in self.sockets if f != Feed.RETRANSMIT]
        reserved = RETRANSMIT_SLOTS if Feed.RETRANSMIT in self.sockets else 0
        per_live = max(1, (cfg.ring_slots - reserved) // max(1, len(live)))
        self._slots: dict[Feed, int] = {f: per_live for f in live}
        if Feed.RETRANSMIT in self.sockets:
            self._slots[Feed.RETRANSMIT] = max(0, cfg.ring_slots - per_live * len(live))
        if cfg.checkpoint is not None:  # once the ports are this run's: a refused second handler touches nothing
            try:
                self._checkpoint_file = checkpoint.CheckpointFile(cfg.checkpoint)
            except OSError as exc:
                raise FeedHandlerError(f"cannot open the checkpoint {cfg.checkpoint}: {exc.strerror}") from None
            self._checkpoint = self._checkpoint_file.mapping
        client = self.client
        self.messages = client.add_exclusive_publication(cfg.channel, cfg.messages_stream)
        self.events = client.add_exclusive_publication(cfg.channel, cfg.events_stream)
        self.capture = (
            client.add_exclusive_publication(cfg.channel, cfg.capture_stream) if cfg.capture_stream is not None else None
        )
        if self._checkpoint is not None:
            # this run's log in the slot the last record does not name, then one record naming it: until then a
            # restart still reads the last run's log
            log = self.messages.log
            slot = checkpoint.name_log(self._checkpoint, self.messages.registration_id, self.messages.session_id,
                                       self.messages.stream_id, str(log.path))
            resumed = self.resumed
            checkpoint.commit(self._checkpoint, resumed.session if resumed else bytes(checkpoint.SESSION_LENGTH),
                              resumed.next_sequence if resumed else 0,
                              lib.lb_exclusive_position(self.messages.native_struct()), slot)
        # best effort: the first lap of the log then takes no page faults. On a thread of its own (the native call
        # releases the GIL; populating pages writes nothing, so the loop may append meanwhile): backing large
        # terms takes seconds on a loaded machine, and this thread must keep the driver's keepalive going
        structs = [p.native_struct() for p in (self.messages, self.capture) if p is not None]
        self._prefault = threading.Thread(target=_prefault, args=(structs,), name="logbuf-feed-prefault",
                                          daemon=True)
        self._prefault.start()
        self._epoch_offset_ns = time.time_ns() - monotonic_ns()
        self._session = b""
        self._events_back_pressure_waits = 0  # the events publication's (Python appends those records)
        self.end_of_session = False
        self._idle = BackoffIdleStrategy(max_spins=100, max_yields=50, max_park_ns=100_000)
        # the retransmission server refused (ECONNREFUSED: nothing listens there): requests pause, then retry
        self.retransmit_unreachable = 0
        self.cpu_ns = 0  # CPU time of the receive/arbitrate/publish loop
        self.cpu_user_ns = self.cpu_sys_ns = 0  # the same split into user and kernel time (rusage)
        self._round_span_ns = int(cfg.max_block_s * NANOS_PER_SECOND)  # Python's turn at least this often
        self.lost_by_reason = dict.fromkeys(GapReason, 0)  # messages declared unrecoverable, by why
        self._unreachable_until_ns = 0
        self._unreachable_backoff_ns = UNREACHABLE_BACKOFF_NS[0]
        # wire-to-log latency: packet arrival (kernel stamp) to its messages committed in the log, sampled by C
        # once per appended delivery run into a ring (the first message of the run: the longest wait in it)
        self.latency_samples_ns = np.zeros(LATENCY_SAMPLES, dtype=np.int64)
        # the whole round in C: receive, arbitrate, append runs, capture rows (Python: events, pacing, idling)
        self._round = NativeRound(
            self.ring, self.arbiter.c, self.messages.native_struct(),
            None if self.capture is None else self.capture.native_struct(),
            {feed: sock.fileno() for feed, sock in self.sockets.items()}, self._slots, self.latency_samples_ns,
            max_block_ns=int(cfg.max_block_s * NANOS_PER_SECOND), batch_wait_ns=int(cfg.batch_wait_s * NANOS_PER_SECOND),
            epoch_offset_ns=self._epoch_offset_ns, counters_interval_ns=COUNTER_PUBLISH_INTERVAL_NS,
            checkpoint=self._checkpoint,
        )
        self._r = self._round.c
        for name in self.counter_values():
            self.counters[name] = client.add_counter(FEED_HANDLER_COUNTER_TYPE_ID, f"feed: {name}", name.encode()[:100])

    def _image_positions(self, session_id: int, stream_id: int) -> list[int]:
        """The subscriber positions (sub-pos counters) of the images of a publication's session and stream."""
        positions = []
        for info in self.client.counters:
            if info.type_id == SUBSCRIBER_POSITION_TYPE_ID:
                with contextlib.suppress(ValueError):  # a key that is not a stream position's: not one of them
                    _, session, stream, _ = decode_stream_position_key(info.key)
                    if (session, stream) == (session_id, stream_id):
                        positions.append(info.value)
        return positions

    # -- counters of the native round ------------------------------------------------------------------

    @property
    def published(self) -> int:
        """Messages appended to the messages stream."""
        return int(self._r.published)

    @property
    def unpublished(self) -> int:
        """Messages not appended because no subscriber was connected."""
        return int(self._r.unpublished)

    @property
    def back_pressure_waits(self) -> int:
        """Times an append found a publication full (the handler idled, then went on)."""
        return int(self._r.back_pressure_waits) + self._events_back_pressure_waits

    @property
    def rounds(self) -> int:
        """Receive/arbitrate/publish rounds that received something."""
        return int(self._r.rounds)

    @property
    def latency_count(self) -> int:
        """Wire-to-log latency samples taken (the last ``LATENCY_SAMPLES`` are kept)."""
        return int(self._r.latency_count)

    @property
    def drained(self) -> bool:
        """The last round read every feed socket to the end."""
        return bool(self._r.drained)

    # -- the loop --------------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def run(self, duration_s: float | None = None) -> None:
        cfg = self.config
        deadline = None if duration_s is None else time.monotonic() + duration_s
        if cfg.wait_for_subscriber_s > 0:
            until = time.monotonic() + cfg.wait_for_subscriber_s
            while not self.messages.is_connected and time.monotonic() < until and not self._stop.is_set():
                self._client_work()
                time.sleep(0.005)
            if not self.messages.is_connected and not self._stop.is_set():
                raise FeedHandlerError(
                    f"no subscriber on {cfg.channel} stream {cfg.messages_stream} after "
                    f"{cfg.wait_for_subscriber_s:g} s: start one first, or publish regardless with "
                    "--wait-for-subscriber 0")
        stopping = self._stop.is_set
        native_rounds = lib.lbf_round_run
        span_ns = self._round_span_ns
        r = self._r
        cpu_started = time.process_time_ns()  # the process CPU (rusage) while the loop runs
        usage_started = resource.getrusage(resource.RUSAGE_SELF)
        try:
            while not stopping():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                # rounds in C until one needs Python, or for max_block at most (a stop request is seen within
                # it); a round that follows one that read every socket to the end first sleeps (batch_wait
                # while traffic flows, else in ppoll(2) until a datagram or the engine's next deadline)
                status = native_rounds(r, span_ns)
                if status:
                    self._finish_round(status)
                # the session has ended once the stream reached its end and no hole is being recovered (the
                # give-up timeout bounds that)
                if self.end_of_session and cfg.stop_at_end_of_session and not self.arbiter.recovering:
                    break
        finally:
            self.cpu_ns += time.process_time_ns() - cpu_started
            usage = resource.getrusage(resource.RUSAGE_SELF)
            self.cpu_user_ns += round((usage.ru_utime - usage_started.ru_utime) * NANOS_PER_SECOND)
            self.cpu_sys_ns += round((usage.ru_stime - usage_started.ru_stime) * NANOS_PER_SECOND)
        if self.end_of_session and self._checkpoint is not None:
            # the session was published to its end: nothing to resume (replaying it again starts afresh)
            checkpoint.commit(self._checkpoint, bytes(checkpoint.SESSION_LENGTH), 0,
                              lib.lb_exclusive_position(self.messages.native_struct()))
        self.publish_counters()

    def do_work(self) -> int:
        """One receive/arbitrate/publish round without sleeping; returns packets received + events handled."""
        status = lib.lbf_round(self._r, 0)
        handled = self._finish_round(status) if status else 0
        return int(self._r.received) + handled

    def _finish_round(self, status: int) -> int:
        """What the native round needs Python for, until the round is over; returns the events handled."""
        r = self._r
        handled = 0
        idled = False
        while True:
            if status < 0:
                self._round_failed()
            if status & ROUND_REFUSED:
                self._note_unreachable()
            if status & ROUND_COUNTERS:
                self._client_work()
                self._check_open()
                self.publish_counters()
            kind = status & ROUND_KIND_MASK
            if kind == ROUND_BACK_PRESSURED:  # the subscribers are slower than the feed: wait, never drop
                self._client_work()
                self._check_open()
                self._idle.idle(0)
                idled = True
            else:
                if idled:
                    self._idle.reset()
                    idled = False
                if kind == ROUND_DONE:
                    return handled
                if kind == ROUND_EVENTS:  # records for the events stream (the round sent the requests)
                    for event, next_sequence in self.arbiter.round_events(int(r.event_next), int(r.event_end)):
                        if not isinstance(event, RecoveryRequest):
                            self._publish_event(event, next_sequence)
                        handled += 1
            status = lib.lbf_round_resume(r)

    def _round_failed(self) -> None:
        r = self._r
        kind, code = int(r.fail_kind), int(r.fail_code)
        if kind == lib.LBF_FAIL_RECEIVE:
            feed = Feed(int(r.fail_feed)).name
            raise FeedHandlerError(f"receiving from feed {feed} failed: {os.strerror(-code)}")
        if kind == lib.LBF_FAIL_REQUESTS:
            raise OSError(-code, f"sending re-requests: {os.strerror(-code)}")
        if kind == lib.LBF_FAIL_ENGINE:
            raise MemoryError(f"the arbitration engine failed ({code})")
        if kind in (lib.LBF_FAIL_MESSAGES, lib.LBF_FAIL_CAPTURE):
            if code == CLOSED:
                raise FeedHandlerError("publication closed (the driver went away?)")
            if code == INVALID_BATCH:
                raise FeedHandlerError("a message is longer than the publication's maximum message length")
            which = "messages" if kind == lib.LBF_FAIL_MESSAGES else "capture"
            raise FeedHandlerError(f"appending to the {which} stream failed ({code})")
        raise FeedHandlerError(f"the native round failed (kind {kind}, code {code})")

    def _client_work(self) -> None:
        """The client conductor's duty cycle, when this handler owns the client (at most every 100 ms)."""
        if not self._own_client:
            return
        now = monotonic_ns()
        if now >= self._next_conductor_ns:
            self._next_conductor_ns = now + COUNTER_PUBLISH_INTERVAL_NS
            self.client.do_work()

    def _check_open(self) -> None:
        if self.messages.is_closed or (self.capture is not None and self.capture.is_closed):
            raise FeedHandlerError("publication closed (the driver went away?)")

    def _note_unreachable(self) -> None:
        r = self._r
        if r.requests_sent_ok:  # the round's own sends went out since: the back-off starts again
            r.requests_sent_ok = 0
            self._unreachable_backoff_ns = UNREACHABLE_BACKOFF_NS[0]
        self.retransmit_unreachable += 1
        now = monotonic_ns()
        if now >= self._unreachable_until_ns:
            self._unreachable_until_ns = now + self._unreachable_backoff_ns
            self._unreachable_backoff_ns = min(2 * self._unreachable_backoff_ns, UNREACHABLE_BACKOFF_NS[1])
            r.requests_paused_until_ns = self._unreachable_until_ns  # the round sends none before

    # -- events ----------------------------------------------------------------------------------------

    def _publish_event(self, event: Event, next_sequence: int) -> None:
        """One record on the events stream; its reserved value is ``next_sequence``, the sequence of the next
        message on the messages stream (so a GAP_UNRECOVERABLE is placed exactly in it)."""
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
        self._offer(self.events, record.encode(), reserved_value(next_sequence))

    def _offer(self, publication: Publication, data: bytes | memoryview, reserved_value: int) -> None:
        while True:
            result = publication.offer(data, reserved_value)
            if result > 0 or result == NOT_CONNECTED:
                self._idle.reset()
                return
            if result == CLOSED:
                raise FeedHandlerError("publication closed (the driver went away?)")
            if result == BACK_PRESSURED:
                self._events_back_pressure_waits += 1
            self._client_work()
            self._idle.idle(0)

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
        values["cpu_user_us"] = self.cpu_user_ns // NANOS_PER_MICRO
        values["cpu_sys_us"] = self.cpu_sys_ns // NANOS_PER_MICRO
        values["rounds"] = self.rounds
        arbiter = self.arbiter  # the engine's pacing: requests answered, held back by the rate, the answer size
        values["requests_answered"] = arbiter.requests_answered
        values["requests_paced"] = arbiter.requests_paced
        values["request_chunk"] = arbiter.request_chunk or 0
        for reason, lost in self.lost_by_reason.items():
            values[f"lost.{reason.name.lower()}"] = lost
        for feed in Feed:  # datagrams the kernel dropped for a full socket buffer
            if not self._drops_on_demand:
                values[f"{feed.name}.kernel_drops"] = int(self.ring.kernel_drops[feed])
                continue
            sock = self.sockets.get(feed)  # closed: the last count read stays
            drops = socket_drops(sock) if sock is not None else None
            if drops is not None:
                self._kernel_drops[feed] = drops
            values[f"{feed.name}.kernel_drops"] = self._kernel_drops.get(feed, 0)
        return values

    def publish_counters(self) -> None:
        for name, value in self.counter_values().items():
            counter = self.counters.get(name)
            if counter is not None:
                counter.set(int(value))

    def close(self) -> None:
        prefault = getattr(self, "_prefault", None)
        if prefault is not None:  # the publications it backs must outlive it
            prefault.join()
        native_round = getattr(self, "_round", None)
        if native_round is not None:  # before the sockets: their descriptor numbers may be reused
            native_round.close()
        checkpoint_file = getattr(self, "_checkpoint_file", None)
        if checkpoint_file is not None:
            checkpoint_file.close()
            self._checkpoint_file = None
            self._checkpoint = None
        for sock in self.sockets.values():
            sock.close()
        self.sockets.clear()
        if self._own_client:
            self.client.close()

    def __enter__(self) -> FeedHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _prefault(publications: list[Any]) -> None:
    for publication in publications:
        lib.lbf_prefault_terms(publication)


def _replace(config: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(config, **changes)

