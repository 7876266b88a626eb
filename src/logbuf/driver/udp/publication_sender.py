"""``PublicationSender``: the sender side of one network publication, sans-IO - the executable specification
of the driver's native sender agent (``native/drv_sender.c``, whose state machines property tests compare
with :class:`SenderSchedule`, the flow controls and :class:`RetransmitHandler`).

It composes the pieces - :class:`SenderSchedule` (SETUP / heartbeats), :class:`SendPlanner` (data datagrams
within snd-lmt), a flow control (:mod:`flow_control`) and :class:`RetransmitHandler` (NAKs) - over the
publication's log.  A sender duty cycle does::

    for frame in received control frames for this publication:
        sender.on_status_message(sm, now) / out += sender.on_nak(nak, now) / sender.on_rtt_measurement(...)
    out += sender.poll(now, max_datagrams=n)          # SETUP, data, heartbeat, delayed retransmits
    for item in out:                                   # in order; sendmmsg-friendly
        if not sender.on_sent(item, socket.send(item.buffer), now) and item.kind is OutgoingKind.DATA:
            break                                      # short send: the rest of the batch is re-planned later
    counters: snd-pos = sender.snd_pos, snd-lmt = sender.snd_lmt, snd-bpe = sender.snd_bpe

and ``pub-lmt = snd-pos + window`` while ``sender.is_connected``, after cleaning to ``snd-pos - T`` (the
native agent does this too, so a starved conductor never holds a publisher back).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from logbuf.driver.udp.counters import SenderCounters
from logbuf.driver.udp.flow_control import FlowControl, UnicastFlowControl
from logbuf.driver.udp.retransmit import RetransmitHandler
from logbuf.driver.udp.send_planner import SendPlan, SendPlanner
from logbuf.driver.udp.sender_schedule import (
    DEFAULT_HEARTBEAT_INTERVAL_NS,
    DEFAULT_SETUP_INTERVAL_NS,
    SenderSchedule,
)
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.protocol.data import DataHeader
from logbuf.protocol.error_frame import ErrorFrame
from logbuf.protocol.nak import Nak
from logbuf.protocol.rttm import RttMeasurement
from logbuf.protocol.setup import SetupFrame
from logbuf.protocol.status_message import StatusMessage


class OutgoingKind(enum.Enum):
    SETUP = 1
    DATA = 2
    HEARTBEAT = 3
    RETRANSMIT = 4
    RTTM = 5


class Outgoing(NamedTuple):
    kind: OutgoingKind
    buffer: bytes | memoryview  # what to put in the datagram
    plan: SendPlan | None = None  # for DATA and RETRANSMIT


class PublicationSender:
    def __init__(
        self,
        log: LogBuffers,
        now_ns: int,
        *,
        flow_control: FlowControl | None = None,
        mtu: int | None = None,
        ttl: int = 0,
        position: int | None = None,
        counters: SenderCounters | None = None,
        retransmit: RetransmitHandler | None = None,
        setup_interval_ns: int = DEFAULT_SETUP_INTERVAL_NS,
        heartbeat_interval_ns: int = DEFAULT_HEARTBEAT_INTERVAL_NS,
    ) -> None:
        self.log = log
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self.position_bits = log.position_bits
        self.ttl = ttl
        self.counters = SenderCounters() if counters is None else counters
        self.flow_control: FlowControl = UnicastFlowControl() if flow_control is None else flow_control
        self.planner = SendPlanner(log, mtu=mtu, position=position, counters=self.counters)
        self.mtu = self.planner.mtu
        self.retransmit = retransmit or RetransmitHandler(log.term_length, log.initial_term_id, counters=self.counters)
        self.schedule = SenderSchedule(
            now_ns, setup_interval_ns=setup_interval_ns, heartbeat_interval_ns=heartbeat_interval_ns
        )
        self.snd_lmt = self.planner.position  # nothing may be sent before a receiver's first status message
        self.end_of_stream_position: int | None = None  # set by the conductor when the publication closes
        self.last_error: ErrorFrame | None = None

    # -- state ---------------------------------------------------------------------------------------

    @property
    def snd_pos(self) -> int:
        return self.planner.position

    @property
    def snd_bpe(self) -> int:
        return self.planner.snd_bpe

    @property
    def is_connected(self) -> bool:
        """A receiver has sent a status message within the flow control's receiver timeout (tagged: and the
        group has its minimum size)."""
        return self.flow_control.is_connected

    def _term_id_and_offset(self) -> tuple[int, int]:
        position = self.planner.position
        return (
            d.compute_term_id_from_position(position, self.position_bits, self.initial_term_id),
            d.compute_term_offset_from_position(position, self.position_bits),
        )

    # -- input from receivers ------------------------------------------------------------------------

    def on_status_message(self, sm: StatusMessage, now_ns: int) -> None:
        self.counters.status_messages_received += 1
        self.schedule.on_status_message(now_ns, setup_requested=sm.is_setup_requested)
        if not sm.is_setup_requested:
            self.snd_lmt = self.flow_control.on_status_message(
                sm, self.snd_lmt, self.position_bits, self.initial_term_id, now_ns
            )

    def on_nak(self, nak: Nak, now_ns: int) -> list[Outgoing]:
        """Datagrams to resend now (possibly none: invalid, out of the retained window, or lingering)."""
        self.counters.naks_received += 1
        return self._resend(self.retransmit.on_nak(nak, now_ns, self.planner.position))

    def on_rtt_measurement(self, rttm: RttMeasurement, now_ns: int) -> Outgoing | None:
        """A receiver's RTT request (REPLY flag set: "please reply") is echoed back at once."""
        if not rttm.is_reply:
            return None
        reply = RttMeasurement(self.session_id, self.stream_id, rttm.echo_timestamp_ns, 0, rttm.receiver_id, 0)
        return Outgoing(OutgoingKind.RTTM, reply.encode())

    def on_error_frame(self, error: ErrorFrame, now_ns: int) -> None:
        """A receiver rejected the image: counted, and it leaves flow control (no longer holding the sender
        back; the last one gone, the publication is not connected), as aeronmd."""
        self.counters.error_frames_received += 1
        self.last_error = error
        self.flow_control.on_error(error.receiver_id)

    # -- duty cycle ----------------------------------------------------------------------------------

    def poll(self, now_ns: int, max_datagrams: int = 1) -> list[Outgoing]:
        """What to send now: SETUP if due, up to ``max_datagrams`` data datagrams, else (and no SETUP) a
        heartbeat if due; plus delayed retransmits that fell due.  Nothing changes until :meth:`on_sent`
        confirms a send."""
        out: list[Outgoing] = []
        setup = self.schedule.setup_due(now_ns)
        if setup:
            out.append(Outgoing(OutgoingKind.SETUP, self.setup_frame().encode()))
        plans = self.planner.plan_batch(self.snd_lmt, max_datagrams)
        for plan in plans:
            out.append(Outgoing(OutgoingKind.DATA, plan.buffer, plan))
        if not plans and not setup and self.schedule.heartbeat_due(now_ns):  # a SETUP says as much
            out.append(Outgoing(OutgoingKind.HEARTBEAT, self.heartbeat_header().encode()))
        self.snd_lmt = self.flow_control.on_idle(now_ns, self.snd_lmt, self.planner.position)
        out.extend(self._resend(self.retransmit.on_timer(now_ns, self.planner.position)))
        return out

    def on_sent(self, item: Outgoing, bytes_sent: int, now_ns: int) -> bool:
        """Reports what the socket did with ``item``; True when the whole datagram went."""
        if item.kind is OutgoingKind.DATA:
            assert item.plan is not None
            if self.planner.on_sent(item.plan, bytes_sent):
                self.schedule.on_data_sent(now_ns)
                return True
            return False
        if bytes_sent != len(item.buffer):
            self.counters.short_sends += 1
            return False
        self.counters.bytes_sent += bytes_sent
        if item.kind is OutgoingKind.SETUP:
            self.counters.setups_sent += 1
            self.schedule.on_setup_sent(now_ns)
        elif item.kind is OutgoingKind.HEARTBEAT:
            self.counters.heartbeats_sent += 1
            self.schedule.on_heartbeat_sent(now_ns)
        elif item.kind is OutgoingKind.RETRANSMIT:
            self.counters.retransmitted_bytes += bytes_sent
        return True

    def on_data_sent(self, next_position: int, bytes_sent: int, now_ns: int) -> None:
        """Data datagrams planned and sent outside :meth:`poll` (the driver's native send of a batch, used when
        no timer is due) went whole: snd-pos moves to ``next_position``."""
        self.planner.on_sent_natively(next_position, bytes_sent)
        self.schedule.on_data_sent(now_ns)

    def next_deadline_ns(self) -> int:
        """When a timer (SETUP, heartbeat, delayed retransmit, linger) next needs a poll."""
        deadline = self.schedule.next_deadline_ns()
        retransmit = self.retransmit.next_deadline_ns()
        return deadline if retransmit is None else min(deadline, retransmit)

    # -- frames --------------------------------------------------------------------------------------

    def setup_frame(self) -> SetupFrame:
        term_id, term_offset = self._term_id_and_offset()
        return SetupFrame(term_offset, self.session_id, self.stream_id, self.initial_term_id, term_id,
                          self.term_length, self.mtu, self.ttl)

    def heartbeat_header(self) -> DataHeader:
        term_id, term_offset = self._term_id_and_offset()
        eos = self.end_of_stream_position is not None and self.planner.position >= self.end_of_stream_position
        return DataHeader.heartbeat(self.session_id, self.stream_id, term_id, term_offset, end_of_stream=eos)

    def _resend(self, resends: list) -> list[Outgoing]:
        out: list[Outgoing] = []
        for r in resends:
            self.counters.retransmits_sent += 1
            out.extend(Outgoing(OutgoingKind.RETRANSMIT, p.buffer, p)
                       for p in self.planner.resend_plans(r.term_id, r.term_offset, r.length))
        return out
