"""``NetworkPublication``: a publication whose log the driver sends over UDP (Aeron's NetworkPublication).

Publishers append to the log exactly as for IPC; the driver's duties on it are

- conductor (every duty cycle, :meth:`update`): pub-pos from the tail; while a receiver is connected
  ``pub-lmt = snd-pos + window`` (with the trip-gain hysteresis of IPC), else ``pub-lmt = snd-pos`` and
  isConnected false; clean the log up to ``snd-pos - T``, so one term behind the sender stays intact for
  retransmits.  The sender duty also runs it the moment snd-pos passes a trip point, so pub-lmt never waits
  for the conductor's rate-limited cycle;
- sender (every duty cycle, :meth:`send`): the :class:`~logbuf.driver.udp.PublicationSender` plans SETUP,
  data datagrams within snd-lmt, heartbeats and due retransmits; they go out in one ``sendmmsg`` and the
  sender learns what went (a datagram that did not go is planned again); snd-pos, snd-lmt and snd-bpe are
  published to their counters;
- control frames from receivers (:meth:`on_control`, routed by the send channel endpoint): SMs move snd-lmt,
  NAKs are answered from the term at once, RTT requests are echoed.

When its last publisher leaves, the publication drains: the end of stream is where the producer stopped; the
sender's heartbeats carry the EOS flag once snd-pos is there, and the publication closes when every receiver
acknowledged it (an SM with the EOS flag), when no receiver is connected, or after the linger timeout.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

from logbuf.driver.ipc_publication import PublicationState
from logbuf.driver.udp import Outgoing, PublicationSender
from logbuf.driver.udp_transport import UdpTransport
from logbuf.errors import LogCorruptedError
from logbuf.logbuffer.descriptor import PARTITION_COUNT
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.logbuffer.term_cleaner import LogCleaner
from logbuf.native import ffi, lib
from logbuf.position import Position
from logbuf.protocol import ErrorFrame, Nak, RttMeasurement, StatusMessage
from logbuf.protocol.datagram import ControlFrame


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


class NetworkPublication:
    is_network = True

    def __init__(
        self,
        *,
        registration_id: int,
        channel: str,
        is_exclusive: bool,
        log: LogBuffers,
        sender: PublicationSender,
        transport: UdpTransport,
        endpoint_key: str,
        channel_status_id: int,
        positions: NetworkPublicationPositions,
        window_length: int,
        max_datagrams: int,
    ) -> None:
        if not 0 < window_length <= log.term_length // 2:
            raise ValueError(f"publication window {window_length} must be in (0, T/2]")
        self.registration_id = registration_id
        self.channel = channel
        self.is_exclusive = is_exclusive
        self.log = log
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.sender = sender
        self.transport = transport  # the send channel endpoint's: data out, control frames in
        self.endpoint_key = endpoint_key
        self.positions = positions
        self.pub_lmt_counter_id = positions.pub_lmt.counter_id
        self.window_length = window_length
        self.trip_gain = window_length // 8
        self.max_datagrams = max_datagrams
        self.destination = transport.channel.data.sockaddr
        self._native_send = transport.send_impairment is None  # an impairment needs every datagram in Python
        self._fd = transport.send_fd
        self._destination_handle = transport.destination(self.destination)
        self._send_result = ffi.new("int64_t[4]")
        self.channel_status_id = channel_status_id
        self.publishers: dict[int, int] = {}  # publication link registration id -> client id
        self.subscribers: dict = {}  # IPC subscribers never link to a network publication
        self.state = PublicationState.ACTIVE
        self.drain_deadline_ns = 0
        self.end_of_stream_position: int | None = None
        self._cleaner = LogCleaner(log, sender.snd_pos)
        self._next_poll_ns = 0  # the sender's next timer (SETUP, heartbeat, retransmit); 0: poll now
        self._blocked_lmt: int | None = None  # snd-lmt at which committed data was last held back
        self._trip_limit = 0
        self._published = [-1, -1, -1, -1]  # pub-pos, snd-pos, snd-lmt, snd-bpe as last stored
        positions.pub_lmt.set(sender.snd_pos)

    # -- conductor duty --------------------------------------------------------------------------------

    def update(self) -> int:
        """pub-pos, pub-lmt, cleaning and isConnected; returns work done."""
        work = 0
        log = self.log
        producer = log.producer_position()
        if producer != self._published[0]:
            self._published[0] = producer
            self.positions.pub_pos.set(producer)
        snd_pos = self.sender.snd_pos
        if self.sender.is_connected:
            proposed = snd_pos + self.window_length
            if proposed > self._trip_limit:
                # retransmits read at most the retained window (< T) behind snd-pos: one term stays intact
                work += self._clean(snd_pos - log.term_length)
                self.positions.pub_lmt.set(proposed)
                self._trip_limit = proposed + self.trip_gain
                work += 1
            if not log.is_connected:
                log.is_connected = True
        else:
            if self.positions.pub_lmt.get() > snd_pos:
                self.positions.pub_lmt.set(snd_pos)
                self._trip_limit = snd_pos
                work += 1
            if log.is_connected:
                log.is_connected = False
        return work

    def _clean(self, target: int) -> int:
        """Zeroes the log up to ``target``; a call of the cleaner stops at a term's end, so a few calls."""
        cleaner = self._cleaner
        cleaned = 0
        for _ in range(3):
            if cleaner.clean_position >= target:
                break
            cleaned += cleaner.clean_to(min(target, cleaner.clean_position + 3 * self.log.term_length))
        return 1 if cleaned else 0

    def on_timer(self, now_ns: int) -> bool:
        return False  # a network publication's sender never waits on a claim: nothing to unblock

    def join_position(self) -> int:
        return self.log.producer_position()

    # -- sender duty -----------------------------------------------------------------------------------

    def send(self, now_ns: int) -> int:
        """One sender duty cycle; returns the datagrams sent.

        The sender is polled only when there is something for it: a committed frame at snd-pos that the
        window does not (still) hold back, a due timer, or a control frame since the last poll - so an idle
        or blocked publication costs one load per cycle, not a planning pass."""
        sender = self.sender
        if now_ns < self._next_poll_ns:
            if not sender.planner.frame_waiting(sender.snd_pos) or sender.snd_lmt == self._blocked_lmt:
                return 0
            if self._native_send:
                return self._send_data(now_ns)
        position = sender.snd_pos
        items = sender.poll(now_ns, self.max_datagrams)
        sent = self.transmit(items, now_ns) if items else 0
        # nothing went although a frame is there: the window holds it until an SM moves snd-lmt
        self._blocked_lmt = sender.snd_lmt if sender.snd_pos == position and sender.planner.frame_waiting(
            position) else None
        self._next_poll_ns = sender.next_deadline_ns()
        self._publish_sender_positions()
        return sent

    def _send_data(self, now_ns: int) -> int:
        """Data only (no timer due, no control frame since the last poll): one native call plans a batch
        of the term from snd-pos and sends it; the sender learns where snd-pos moved."""
        sender = self.sender
        planner = sender.planner
        position = planner.position
        T = planner.term_length
        term_offset = position & (T - 1)
        out = self._send_result
        rc = lib.lbn_send_term(self._fd, planner.term_pointers[(position >> planner.position_bits) % PARTITION_COUNT], T,
                               term_offset, sender.snd_lmt - position, planner.mtu, self.max_datagrams,
                               self._destination_handle, len(self.destination), out)
        if rc == lib.LB_CORRUPT_FRAME:
            raise LogCorruptedError(f"corrupted frame header at term offset {term_offset}", term_offset)
        planned, sent = out[0], out[1]
        if sent:
            sender.on_data_sent(position + out[3], out[2], now_ns)
        if planned == 0:
            planner.note_nothing_planned()
            self._blocked_lmt = sender.snd_lmt  # a frame waits (checked above) and the window holds it
        elif sent < planned:
            sender.counters.short_sends += 1  # the rest goes again next cycle
            if rc < 0 and -rc not in (errno.EAGAIN, errno.ENOBUFS):
                self.transport.send_errors += 1
        self._publish_sender_positions()
        return sent

    def transmit(self, items: Sequence[Outgoing], now_ns: int) -> int:
        """Sends ``items`` in order to the data address and tells the sender what went."""
        sent = self.transport.send([item.buffer for item in items], self.destination, now_ns)
        on_sent = self.sender.on_sent
        for item in items[:sent]:
            on_sent(item, len(item.buffer), now_ns)
        if sent < len(items):
            on_sent(items[sent], 0, now_ns)  # a short send; what follows is planned again
        return sent

    def _publish_sender_positions(self) -> None:
        sender, published, positions = self.sender, self._published, self.positions
        if sender.snd_pos + self.window_length > self._trip_limit:
            self.update()  # pub-lmt is due to move: at once, not at the conductor's next (rate-limited) cycle
        if sender.snd_pos != published[1]:
            published[1] = sender.snd_pos
            positions.snd_pos.set(sender.snd_pos)
        if sender.snd_lmt != published[2]:
            published[2] = sender.snd_lmt
            positions.snd_lmt.set(sender.snd_lmt)
        if sender.snd_bpe != published[3]:
            published[3] = sender.snd_bpe
            positions.snd_bpe.set(sender.snd_bpe)

    def on_control(self, frame: ControlFrame, source: bytes, now_ns: int) -> int:
        """A control frame from a receiver of this session; returns work done."""
        sender = self.sender
        self._next_poll_ns = 0  # an SM may open the window or ask for a SETUP: the sender runs next cycle
        if isinstance(frame, StatusMessage):
            sender.on_status_message(frame, now_ns)
            self._publish_sender_positions()
        elif isinstance(frame, Nak):
            resend = sender.on_nak(frame, now_ns)
            if resend:
                self.transmit(resend, now_ns)
        elif isinstance(frame, RttMeasurement):
            reply = sender.on_rtt_measurement(frame, now_ns)
            if reply is not None:
                self.transport.send([reply.buffer], source, now_ns)
        elif isinstance(frame, ErrorFrame):
            sender.on_error_frame(frame, now_ns)
        else:
            return 0
        return 1

    # -- life cycle ------------------------------------------------------------------------------------

    def start_draining(self, now_ns: int, linger_ns: int) -> None:
        """No publisher is left: the stream ends where the producer stopped."""
        self.state = PublicationState.DRAINING
        end = self.log.producer_position()
        self.end_of_stream_position = end
        self.log.end_of_stream_position = end
        self.sender.end_of_stream_position = end
        self.drain_deadline_ns = now_ns + linger_ns
        self._next_poll_ns = 0

    def is_drained(self, now_ns: int) -> bool:
        if now_ns >= self.drain_deadline_ns or not self.sender.is_connected:
            return True
        end = self.end_of_stream_position
        return (end is not None and self.sender.snd_pos >= end
                and self.sender.flow_control.receivers_at_end_of_stream)

    @property
    def counter_ids(self) -> list[int]:
        return self.positions.counter_ids

    def __repr__(self) -> str:
        return (f"NetworkPublication({self.registration_id}, session {self.session_id}, stream {self.stream_id}, "
                f"{self.channel}, snd-pos {self.sender.snd_pos})")
