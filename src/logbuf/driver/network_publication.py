"""``NetworkPublication``: a publication whose log the driver sends over UDP (Aeron's NetworkPublication).

Publishers append to the log exactly as for IPC.  Every data-plane duty on it runs in the native sender agent
(:class:`~logbuf.driver.sender.Sender`, ``native/drv_sender.c``), which the conductor hands the publication
once (:meth:`fill_add_command`: pointers to the log and its five counters, the destination, the flow control
and retransmit settings):

- SETUP until a receiver's first status message (and when one asks), whole committed frames from snd-pos
  within snd-lmt (``sendmmsg``), heartbeats when idle, retransmits from NAKs (delay / linger), RTTM replies;
- flow control from status messages (unicast / ``fc=max``, ``fc=min`` with receivers timing out, ``fc=tagged``);
- multi-destination-cast: on an MDC endpoint every frame goes to each of the endpoint's destinations;
- snd-pos, snd-lmt, snd-bpe; pub-pos; and while a receiver is connected ``pub-lmt = snd-pos + window`` (with
  the trip-gain hysteresis of IPC) after cleaning the log up to ``snd-pos - T`` (one term behind the sender
  stays intact for retransmits), else ``pub-lmt = snd-pos`` and isConnected false.  The agent moves pub-lmt
  itself, so a starved conductor never holds a publisher back.

The Python state machines in :mod:`logbuf.driver.udp` (``PublicationSender`` and its parts) are the executable
specification the agent follows; property tests compare the two.

Spies (``aeron-spy:`` subscriptions of the same channel and stream) read the log as IPC subscribers do: each
is a :class:`SubscriberLink` whose sub-pos counter the agent reads (:meth:`add_spy`); while the publication has
subscribers pub-lmt is the slowest of snd-pos and the included spies plus the window.  With
spies-simulate-connection (``ssc``) an included spy alone makes the publication connected and snd-pos follows the
fastest spy while no receiver is there.  An untethered spy (``tether=false``) goes through the IPC publication's
:class:`TetherState` steps, measured against snd-pos (Aeron's window limit for spies: a quarter window of slack),
and rejoins at snd-pos.

A publisher that dies mid-claim leaves the sender waiting at snd-pos: on the conductor's timer, a concurrent
publication whose snd-pos sat behind the producer for the unblock timeout has that claim padded
(:meth:`on_timer`, Aeron's rule), so the stream goes on.

When its last publisher leaves, the publication drains: the end of stream is where the producer stopped; the
agent's heartbeats carry the EOS flag once snd-pos is there, and it reports the publication drained when every
receiver acknowledged it (an SM with the EOS flag), when no receiver is connected, or after the linger timeout;
the publication then waits for its spies to read to the end of stream (as aeronmd, without a deadline).
"""

from __future__ import annotations

from typing import Any

from logbuf.driver.ipc_publication import (
    DEFAULT_UNBLOCK_TIMEOUT_NS,
    SubscriberLink,
    UntetheredEvent,
    advance_untethered,
)
from logbuf.driver.lifecycle import PublicationEvent, PublicationLifecycle, PublicationState
from logbuf.driver.sender import Sender
from logbuf.driver.udp.flow_control import FlowControl, MinMulticastFlowControl, TaggedFlowControl
from logbuf.driver.udp.retransmit import RetransmitHandler
from logbuf.driver.udp.sender_schedule import DEFAULT_HEARTBEAT_INTERVAL_NS, DEFAULT_SETUP_INTERVAL_NS
from logbuf.driver.windows import check_publication_window, trip_gain, untethered_window_limit
from logbuf.logbuffer.frame import FRAME_ALIGNMENT
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.logbuffer.term_unblocker import unblock
from logbuf.native import ffi, lib
from logbuf.position import Position

DRAINED_EOS_ACKNOWLEDGED = 1  # every receiver sent an SM with the EOS flag
DRAINED_LINGER = 2  # the linger timeout passed
DRAINED_NO_RECEIVER = 3  # no receiver was connected


class NetworkPublicationPositions:
    """The five counters of a network publication (cnc.dat positions and their ids)."""

    __slots__ = ("pub_pos", "pub_lmt", "snd_pos", "snd_lmt", "snd_bpe")

    def __init__(self, pub_pos: Position, pub_lmt: Position, snd_pos: Position, snd_lmt: Position,
                 snd_bpe: Position) -> None:
        self.pub_pos = pub_pos
        self.pub_lmt = pub_lmt
        self.snd_pos = snd_pos
        self.snd_lmt = snd_lmt
        self.snd_bpe = snd_bpe

    @property
    def counter_ids(self) -> list[int]:
        return [p.counter_id for p in (self.pub_pos, self.pub_lmt, self.snd_pos, self.snd_lmt, self.snd_bpe)]


class NetworkPublication(PublicationLifecycle):
    """The conductor's view of a network publication: its log, counters, publishers and life cycle (the
    sender agent owns everything that moves)."""

    is_network = True

    def __init__(
        self,
        *,
        registration_id: int,
        channel: str,
        is_exclusive: bool,
        log: LogBuffers,
        sender: Sender,
        endpoint_key: str,
        endpoint_id: int,
        destination: bytes,
        channel_status_id: int,
        positions: NetworkPublicationPositions,
        window_length: int,
        max_datagrams: int,
        flow_control: FlowControl,
        retransmit: RetransmitHandler,
        now_ns: int,
        mtu: int | None = None,
        ttl: int = 0,
        setup_interval_ns: int = DEFAULT_SETUP_INTERVAL_NS,
        heartbeat_interval_ns: int = DEFAULT_HEARTBEAT_INTERVAL_NS,
        spies_simulate_connection: bool = False,
        untethered_window_limit_timeout_ns: int = 5_000_000_000,
        untethered_resting_timeout_ns: int = 10_000_000_000,
        unblock_timeout_ns: int = DEFAULT_UNBLOCK_TIMEOUT_NS,
    ) -> None:
        check_publication_window(window_length, log.term_length, network=True)
        if not 0 <= len(destination) <= lib.LBN_ADDRESS_SLOT:  # empty: a multi-destination-cast endpoint's
            raise ValueError(f"destination sockaddr of {len(destination)} bytes")
        self.registration_id = registration_id
        self.channel = channel
        self.is_exclusive = is_exclusive
        self.log = log
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.endpoint_key = endpoint_key
        self.endpoint_id = endpoint_id
        self.destination = destination
        self.positions = positions
        self.pub_lmt_counter_id = positions.pub_lmt.counter_id
        self.window_length = window_length
        self.max_datagrams = max_datagrams
        self.mtu = log.mtu if mtu is None else mtu
        self.ttl = ttl
        self.flow_control = flow_control
        self.retransmit = retransmit
        self.setup_interval_ns = setup_interval_ns
        self.heartbeat_interval_ns = heartbeat_interval_ns
        self.created_ns = now_ns
        self.initial_position = log.producer_position()
        self.channel_status_id = channel_status_id
        self.publishers: dict[int, int] = {}  # publication link registration id -> client id
        self.subscribers: dict[int, SubscriberLink] = {}  # spies, by subscription registration id
        self.spies_simulate_connection = spies_simulate_connection
        self.untethered_window_limit_timeout_ns = untethered_window_limit_timeout_ns
        self.untethered_resting_timeout_ns = untethered_resting_timeout_ns
        self.unblock_timeout_ns = unblock_timeout_ns
        # the agent's snd-pos, kept where no client can write (the snd-pos counter lives in cnc.dat): what the
        # unblocker pads at and where spies join must be the sender's real position, on a frame boundary
        self._snd_pos_own = ffi.new("int64_t *", self.initial_position)
        self._last_snd_pos = self.initial_position
        self._time_of_last_snd_move_ns = now_ns
        self.drain_deadline_ns = 0
        self.end_of_stream_position: int | None = None
        self.drained_reason = 0  # DRAINED_*, once the agent reported it
        self._sender = sender
        self._linger_ns = 0
        positions.pub_lmt.set(self.initial_position)

    def fill_add_command(self, command: Any) -> None:
        """Fills an ``LBD_SND_ADD_PUBLICATION`` command for the sender agent."""
        log = self.log
        fc = self.flow_control
        rtx = self.retransmit
        p = self.positions
        command.type = lib.LBD_SND_ADD_PUBLICATION
        command.endpoint_id = self.endpoint_id
        command.publication_id = self.registration_id
        command.terms = log.terms.pointer(0)
        command.meta = log.meta.pointer(0)
        counter = ffi.cast
        command.pub_pos = counter("int64_t *", p.pub_pos.pointer)
        command.pub_lmt = counter("int64_t *", p.pub_lmt.pointer)
        command.snd_pos = counter("int64_t *", p.snd_pos.pointer)
        command.snd_lmt = counter("int64_t *", p.snd_lmt.pointer)
        command.snd_bpe = counter("int64_t *", p.snd_bpe.pointer)
        command.term_length = log.term_length
        command.initial_term_id = log.initial_term_id
        command.session_id = log.session_id
        command.stream_id = log.stream_id
        command.mtu = self.mtu
        command.ttl = self.ttl
        command.window_length = self.window_length
        command.trip_gain = trip_gain(self.window_length)
        command.max_datagrams = self.max_datagrams
        if isinstance(fc, TaggedFlowControl):
            command.flow_control = lib.LBD_FC_TAGGED
            command.group_tag = fc.group_tag
            command.group_min_size = fc.group_min_size
        else:
            command.flow_control = lib.LBD_FC_MIN if isinstance(fc, MinMulticastFlowControl) else lib.LBD_FC_UNICAST
        command.receiver_timeout_ns = fc.receiver_timeout_ns  # type: ignore[attr-defined]
        command.retransmit_max_actions = rtx.max_actions
        command.retransmit_group = 1 if rtx.group_semantics else 0
        command.retransmit_delay_ns = rtx.delay_ns
        command.retransmit_linger_ns = rtx.linger_ns
        command.retained_window = rtx.retained_window
        command.setup_interval_ns = self.setup_interval_ns
        command.heartbeat_interval_ns = self.heartbeat_interval_ns
        command.position = self.initial_position
        command.now_ns = self.created_ns
        command.destination_length = len(self.destination)
        command.destination[0 : len(self.destination)] = self.destination
        command.spies_simulate_connection = 1 if self.spies_simulate_connection else 0
        command.snd_pos_own = self._snd_pos_own

    # -- spies -----------------------------------------------------------------------------------------

    def _spy_command(self, command_type: int, link: SubscriberLink) -> Any:
        command = self._sender.new_command(command_type)
        command.endpoint_id = self.endpoint_id
        command.publication_id = self.registration_id
        command.subscription_id = link.subscription_id
        command.spy_included = 1 if link.included_in_limit else 0
        return command

    def add_spy(self, link: SubscriberLink) -> None:
        """A spy reads the log from now on: its sub-pos counts toward pub-lmt (the agent reads it)."""
        self.subscribers[link.subscription_id] = link
        command = self._spy_command(lib.LBD_SND_ADD_SPY, link)
        command.spy_pos = ffi.cast("int64_t *", link.position.pointer)
        self._sender.offer(command)

    def remove_spy(self, subscription_id: int) -> SubscriberLink | None:
        """The spy leaves; once the agent took the command it no longer reads the counter."""
        link = self.subscribers.pop(subscription_id, None)
        if link is not None:
            self._sender.offer(self._spy_command(lib.LBD_SND_REMOVE_SPY, link))
        return link

    @property
    def spy_count(self) -> int:
        return len(self.subscribers)

    def check_untethered(self, now_ns: int) -> list[UntetheredEvent]:
        """Untethered spies through active -> linger -> resting -> active (Aeron's rule for spies: behind
        ``snd-pos - window + window/4`` for the window-limit timeout; they rejoin at snd-pos); the agent learns
        whether each changed link counts toward pub-lmt."""
        untethered = [link for link in self.subscribers.values() if not link.is_tether]
        if not untethered:
            return []
        snd_pos = self.snd_pos
        window_limit = untethered_window_limit(snd_pos, self.window_length, network=True)
        events = advance_untethered(untethered, now_ns, window_limit, snd_pos,
                                    self.untethered_window_limit_timeout_ns, self.untethered_resting_timeout_ns)
        for event in events:
            if event.available is not False:
                self._sender.offer(self._spy_command(lib.LBD_SND_SET_SPY_INCLUDED, event.link))
        return events

    def spies_caught_up(self, end_position: int) -> bool:
        """Every spy that holds the publication back has read to ``end_position``."""
        return all(link.position.get() >= end_position for link in self.subscribers.values()
                   if link.included_in_limit)

    # -- conductor duty --------------------------------------------------------------------------------

    def update(self) -> int:
        """Nothing left for the conductor's cycle: the sender agent keeps pub-pos, pub-lmt and cleaning."""
        return 0

    def on_timer(self, now_ns: int) -> bool:
        """Timer duty (Aeron's): the sender waits at snd-pos for a frame to be committed; a concurrent
        publication whose snd-pos sat still behind the producer for the unblock timeout - a publisher died
        mid-claim - has the claim there padded; a draining one at once.  True when something was unblocked."""
        snd_pos = self.snd_pos
        producer = self.log.producer_position()
        if snd_pos < 0 or snd_pos % FRAME_ALIGNMENT:
            return False  # (the agent only ever stops on a frame boundary: defensive)
        if self.state == PublicationState.DRAINING:
            return producer > snd_pos and unblock(self.log, snd_pos)
        if self.is_exclusive or self.state != PublicationState.ACTIVE:
            return False
        if snd_pos != self._last_snd_pos or producer <= snd_pos:
            self._last_snd_pos = snd_pos
            self._time_of_last_snd_move_ns = now_ns
            return False
        if now_ns - self._time_of_last_snd_move_ns <= self.unblock_timeout_ns:
            return False
        if unblock(self.log, snd_pos):
            self._time_of_last_snd_move_ns = now_ns
            return True
        return False

    def join_position(self) -> int:
        return self.log.producer_position()

    @property
    def snd_pos(self) -> int:
        """The sender agent's position (its own copy, not the client-writable snd-pos counter)."""
        return int(self._snd_pos_own[0])

    # -- life cycle ------------------------------------------------------------------------------------

    def start_draining(self, now_ns: int, linger_ns: int) -> None:
        """No publisher is left: the stream ends where the producer stopped; the agent drains it."""
        self._transition(PublicationEvent.DRAIN)
        end = self.log.producer_position()
        self.end_of_stream_position = end
        self.log.end_of_stream_position = end
        self.drain_deadline_ns = now_ns + linger_ns
        self._linger_ns = linger_ns
        command = self._sender.new_command(lib.LBD_SND_DRAIN_PUBLICATION)
        command.endpoint_id = self.endpoint_id
        command.publication_id = self.registration_id
        command.end_position = end
        command.deadline_ns = self.drain_deadline_ns
        self._sender.offer(command)

    def on_drained(self, reason: int) -> None:
        self.drained_reason = reason

    def is_drained(self, now_ns: int) -> bool:
        """The agent reported it drained (should it never answer: once the linger passed twice over) and every
        spy that holds the publication back read to the end of stream.  As aeronmd, no deadline cuts a spy's
        tail off: a spy's client that dies loses its spy, and an untethered spy that stalls rests."""
        if not self.drained_reason and now_ns < self.drain_deadline_ns + self._linger_ns:
            return False
        end = self.end_of_stream_position
        return end is None or self.spies_caught_up(end)

    @property
    def counter_ids(self) -> list[int]:
        return self.positions.counter_ids

    def __repr__(self) -> str:
        return (f"NetworkPublication({self.registration_id}, session {self.session_id}, stream {self.stream_id}, "
                f"{self.channel}, snd-pos {self.snd_pos})")
