"""``ImageReceiver``: the receiver side of one image (one remote publication session), sans-IO.

It composes :class:`TermRebuilder` (frames into the image's terms), :class:`LossDetector` (gaps, NAK timer,
give-up fills) and :class:`StatusMessageSchedule` over the image's log, and tracks liveness and end of stream.
The driver's receiver thread does::

    image.on_data(packet, datagram, now)              # for each classified DATA/PAD/heartbeat of this session
    for frame in image.poll(now, min_sub_pos):        # SM and NAK frames back to the sender
        send(frame.encode())
    counters: rcv-pos = image.rebuild_position, rcv-hwm = image.hwm_position
    if image.state is not ImageState.ACTIVE: tell subscribers the image is gone, remove it

Packets are checked against the window the receiver offered, as Aeron does: data that starts before the
position of the last SM is old (a flow control *under-run*: already consumed, its space may be cleaned), data
that ends past that position + window is a flow control *over-run*; both are dropped and counted.

Aeron's per-subscription settings: ``reliable=False`` (``reliable=false``) fills a gap with a PAD frame when
its NAK would fall due, instead of NAKing it (counted as a loss gap fill, reported as a loss); :meth:`reject`
(REJECT_IMAGE) makes the image take no more data and answer with ERR frames (IMAGE_REJECTED, the reason) where
its SMs went, once per SM timeout, until its liveness runs out.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from logbuf.cnc.messages import ErrorCode
from logbuf.driver.udp.counters import ReceiverCounters
from logbuf.driver.udp.loss_detector import Gap, LossDetector, NakDelay
from logbuf.driver.udp.status_schedule import (
    DEFAULT_SM_TIMEOUT_NS,
    StatusMessageSchedule,
    receiver_window_length,
)
from logbuf.driver.udp.term_rebuilder import TermRebuilder
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.frame import FRAME_ALIGNMENT, HEADER_LENGTH
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.logbuffer.term_cleaner import LogCleaner
from logbuf.protocol.datagram import ControlFrame, DataPacket, PacketKind
from logbuf.protocol.error_frame import ErrorFrame
from logbuf.protocol.nak import Nak
from logbuf.protocol.rttm import REPLY_FLAG, RttMeasurement
from logbuf.protocol.setup import SetupFrame
from logbuf.protocol.status_message import END_OF_STREAM_FLAG, StatusMessage

DEFAULT_IMAGE_LIVENESS_TIMEOUT_NS = 10_000_000_000
IMAGE_REJECTED = int(ErrorCode.IMAGE_REJECTED)  # the ERR frame's error code


class ImageState(enum.Enum):
    ACTIVE = 1
    END_OF_STREAM = 2  # the sender ended the stream and subscribers consumed all of it
    TIMED_OUT = 3  # nothing from the sender for the liveness timeout
    REMOVED = 4  # its subscriptions went and the end-of-stream SMs that say so have been sent (drain)


# An image whose subscriptions went sends end-of-stream SMs for this many SM timeouts (aeronmd's image lingers
# in DRAINING as long), then ends: a min or tagged sender lets the receiver go at the first of them.
EOS_SM_TIMEOUTS = 5


class ImageReceiver:
    def __init__(
        self,
        log: LogBuffers,
        join_position: int,
        now_ns: int,
        *,
        receiver_id: int,
        window_length: int | None = None,
        nak_delay: NakDelay | None = None,
        give_up_ns: int | None = None,
        sm_timeout_ns: int = DEFAULT_SM_TIMEOUT_NS,
        liveness_timeout_ns: int = DEFAULT_IMAGE_LIVENESS_TIMEOUT_NS,
        counters: ReceiverCounters | None = None,
        on_loss: Callable[[Gap], None] | None = None,
        reliable: bool = True,
    ) -> None:
        """``on_loss`` is called with each gap a NAK goes out for, or that ``reliable=False`` fills (the
        driver's loss report)."""
        self.log = log
        self.on_loss = on_loss
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self.position_bits = log.position_bits
        self.receiver_id = receiver_id
        self.window_length = receiver_window_length(log.term_length) if window_length is None else window_length
        if not 0 < self.window_length <= log.term_length // 2:
            raise ValueError(f"receiver window {self.window_length} must be in (0, T/2]")
        self.liveness_timeout_ns = liveness_timeout_ns
        self.counters = ReceiverCounters() if counters is None else counters
        self.join_position = join_position
        self.rebuild_position = join_position  # rcv-pos
        self.hwm_position = join_position  # rcv-hwm
        self.end_of_stream_position: int | None = None
        self.state = ImageState.ACTIVE
        self.last_packet_ns = now_ns
        self.packets_heard = 0  # data-plane packets that fit the image (they keep it and its connection alive)
        self.rtt_ns: int | None = None
        self.reliable = reliable
        self.rejected_reason: str | None = None  # set by reject()
        self._last_error_ns: int | None = None
        self.draining_since_ns: int | None = None  # set by drain()
        self.rebuilder = TermRebuilder(log)
        self.loss = LossDetector(log, nak_delay, give_up_ns=give_up_ns)
        self.sm = StatusMessageSchedule(self.window_length, join_position, sm_timeout_ns=sm_timeout_ns)
        self._cleaner = LogCleaner(log, join_position)

    # -- input from the sender -----------------------------------------------------------------------

    def reject(self, reason: str) -> None:
        """REJECT_IMAGE: no more data is taken (the image times out) and :meth:`poll` sends ERR frames instead
        of SMs; ``reason`` is at most 1023 bytes of UTF-8."""
        if self.state is ImageState.ACTIVE and self.rejected_reason is None:
            self.rejected_reason = reason
            self._last_error_ns = self.sm.last_sm_ns

    def drain(self, now_ns: int) -> None:
        """Its stream's last subscription went: no more data is taken, and :meth:`poll` sends SMs with the
        end-of-stream flag at once and then every SM timeout, for ``EOS_SM_TIMEOUTS`` SM timeouts, after
        which the image is ``REMOVED``.  A rejected image (it sends no SMs) is ``REMOVED`` at once."""
        if self.state is not ImageState.ACTIVE or self.draining_since_ns is not None:
            return
        if self.rejected_reason is not None:
            self.state = ImageState.REMOVED
            return
        self.draining_since_ns = now_ns
        self.sm.force()

    def on_data(self, packet: DataPacket, datagram: bytes | memoryview, now_ns: int) -> int:
        """Takes one classified data-plane datagram of this session; returns the bytes put in the term."""
        if self.state is not ImageState.ACTIVE or self.rejected_reason is not None or self.draining_since_ns is not None:
            return 0
        header = packet.header
        if header.session_id != self.session_id or header.stream_id != self.stream_id:
            raise ValueError(f"packet of session {header.session_id} stream {header.stream_id} given to image "
                             f"{self.session_id}/{self.stream_id}")
        term_offset = header.term_offset
        if term_offset >= self.term_length or term_offset + packet.term_span > self.term_length:
            self.counters.invalid_packets += 1  # well formed, but not a fit for this image's terms
            return 0
        self.last_packet_ns = now_ns
        self.packets_heard += 1
        position = d.compute_position(header.term_id, term_offset, self.position_bits, self.initial_term_id)
        if position < self.sm.last_sm_position:
            self.counters.flow_control_under_runs += 1
            return 0
        # a PAD's header is all that travels; what it covers beyond the window is only zeros to skip
        if position + (packet.length if packet.kind is not PacketKind.HEARTBEAT else 0) > (
            self.sm.last_sm_position + self.window_length
        ):
            self.counters.flow_control_over_runs += 1
            return 0
        if packet.kind is PacketKind.HEARTBEAT:
            self.counters.heartbeats_received += 1
            if position > self.hwm_position:
                self.hwm_position = position
            if header.is_end_of_stream and self.end_of_stream_position is None:
                self.end_of_stream_position = position
                self.log.end_of_stream_position = position
            return 0
        skip = 0
        if position < self.rebuild_position:
            # below the rebuild position the term is complete: nothing is written there again (a forged frame
            # could land on payload bytes that happen to be zero); a datagram reaching past it is taken from
            # the first of its frames that starts there, or not at all
            if position + packet.term_span <= self.rebuild_position:
                return 0
            while skip < packet.length and position + skip < self.rebuild_position:
                frame_length = int.from_bytes(datagram[skip : skip + 4], "little", signed=True)
                skip += (max(frame_length, HEADER_LENGTH) + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            if skip >= packet.length or position + skip != self.rebuild_position:
                return 0
        index = d.index_by_position(position, self.position_bits)
        written = self.rebuilder.insert(index, term_offset + skip, memoryview(datagram)[skip:], packet.length - skip)
        end = position + packet.term_span
        if end > self.hwm_position:
            if position == self.hwm_position == self.rebuild_position:
                self.rebuild_position = end  # in order with nothing missing: contiguous, no gap scan needed
            self.hwm_position = end
        return written

    @property
    def in_order_limit(self) -> int | None:
        """For a caller that inserts in-order data itself (the driver's native receive path): None unless
        the image is active and has nothing missing; else where such data may end (last SM position + the
        window - past it is a flow control over-run).  The next in-order datagram starts at the rebuild
        position."""
        if self.state is not ImageState.ACTIVE or self.rebuild_position != self.hwm_position:
            return None
        return self.sm.last_sm_position + self.window_length

    def on_data_in_order(self, end_position: int, now_ns: int) -> None:
        """The caller put in-order DATA datagrams into the term as :meth:`on_data` would have (their
        session, stream and term fit, starting at the rebuild position, ending within
        :attr:`in_order_limit`): the rebuild position and the high-water mark move to ``end_position``."""
        if end_position <= self.rebuild_position or self.rebuild_position != self.hwm_position:
            raise ValueError(f"in-order data cannot end at {end_position}: rebuild {self.rebuild_position}, "
                             f"hwm {self.hwm_position}")
        self.last_packet_ns = now_ns
        self.rebuild_position = self.hwm_position = end_position

    @property
    def has_gap(self) -> bool:
        """Data beyond the rebuild position is missing (the loss detector has work)."""
        return self.rebuild_position < self.hwm_position

    def poll_needed(self, consumption_position: int) -> bool:
        """Whether :meth:`poll` with this consumption position could do anything but what its timers
        (:meth:`next_deadline_ns`) schedule: a gap to scan, an SM due by progress, space to clean, the end of
        the stream.  Lets a duty cycle skip a poll that would find nothing (the hot path of a busy image)."""
        return (
            self.rebuild_position < self.hwm_position
            or consumption_position - self.sm.last_sm_position > self.sm.threshold
            or consumption_position - self.term_length > self._cleaner.clean_position
            or self.end_of_stream_position is not None
            or self.state is not ImageState.ACTIVE
            or self.draining_since_ns is not None
        )

    def on_setup(self, setup: SetupFrame, now_ns: int) -> None:
        """A SETUP for an image we already have: the sender has not heard from us, so answer at once."""
        if self.state is ImageState.ACTIVE and self.rejected_reason is None:
            self.last_packet_ns = now_ns
            self.sm.force()

    def on_rtt_measurement(self, rttm: RttMeasurement, now_ns: int) -> None:
        if not rttm.is_reply and rttm.receiver_id == self.receiver_id:
            self.rtt_ns = max(0, now_ns - rttm.echo_timestamp_ns - rttm.reception_delta_ns)

    def rtt_request(self, now_ns: int) -> RttMeasurement:
        return RttMeasurement(self.session_id, self.stream_id, now_ns, 0, self.receiver_id, REPLY_FLAG)

    # -- duty cycle ----------------------------------------------------------------------------------

    def poll(self, now_ns: int, consumption_position: int) -> list[ControlFrame]:
        """Rebuild tracking, loss handling, cleaning, liveness and SMs; returns the frames to send back.

        ``consumption_position`` is the slowest subscriber's position (sub-pos)."""
        if self.state is not ImageState.ACTIVE:
            return []
        if self.draining_since_ns is not None:
            return self._poll_draining(now_ns)
        if now_ns - self.last_packet_ns > self.liveness_timeout_ns:
            self.state = ImageState.TIMED_OUT
            return []
        if self.rejected_reason is not None:
            last = self._last_error_ns
            if last is not None and now_ns - last < self.sm.sm_timeout_ns:
                return []
            self._last_error_ns = now_ns
            self.counters.error_frames_sent += 1
            return [ErrorFrame(self.session_id, self.stream_id, self.receiver_id, 0, IMAGE_REJECTED,
                               self.rejected_reason)]
        out: list[ControlFrame] = []
        for _ in range(4 if self.rebuild_position < self.hwm_position else 0):  # a give-up fill: the next gap
            scan = self.loss.scan(self.rebuild_position, self.hwm_position, now_ns)
            if scan.rebuild_position > self.rebuild_position:
                self.rebuild_position = scan.rebuild_position
            fill = scan.give_up
            if scan.nak is not None:
                gap = scan.nak
                if self.reliable:
                    out.append(Nak(self.session_id, self.stream_id, gap.term_id, gap.term_offset, gap.length))
                    self.counters.naks_sent += 1
                else:
                    fill = gap  # reliable=false: padded where a NAK would have gone
                    self.loss.active = None
                if self.on_loss is not None:
                    self.on_loss(gap)
            if fill is None:
                break
            gap = fill
            index = d.index_by_position(self.rebuild_position, self.position_bits)
            self.rebuilder.fill_gap(index, gap.term_id, gap.term_offset, gap.length)
            self.counters.loss_gap_fills += 1
        self._clean(consumption_position - self.term_length)
        flags = 0
        eos = self.end_of_stream_position
        if eos is not None and self.rebuild_position >= eos:
            flags = END_OF_STREAM_FLAG
            if consumption_position >= eos:
                self.state = ImageState.END_OF_STREAM
                self.sm.force()  # a last SM tells the sender this receiver is done
        if self.sm.due(now_ns, consumption_position):
            out.append(StatusMessage.at_position(
                self.session_id, self.stream_id, consumption_position, self.position_bits, self.initial_term_id,
                self.window_length, self.receiver_id, flags,
            ))
            self.sm.on_sent(now_ns, consumption_position)
            self.counters.status_messages_sent += 1
        return out

    def _poll_draining(self, now_ns: int) -> list[ControlFrame]:
        assert self.draining_since_ns is not None
        if now_ns - self.draining_since_ns >= EOS_SM_TIMEOUTS * self.sm.sm_timeout_ns:
            self.state = ImageState.REMOVED
            return []
        position = self.sm.last_sm_position
        if not self.sm.due(now_ns, position):
            return []
        self.sm.on_sent(now_ns, position)
        self.counters.status_messages_sent += 1
        return [StatusMessage.at_position(
            self.session_id, self.stream_id, position, self.position_bits, self.initial_term_id,
            self.window_length, self.receiver_id, END_OF_STREAM_FLAG,
        )]

    def next_deadline_ns(self) -> int:
        """The earliest time a timer (SM, NAK, give-up, liveness, the end of a drain) needs a poll."""
        if self.draining_since_ns is not None:
            return min(self.sm.next_deadline_ns(), self.draining_since_ns + EOS_SM_TIMEOUTS * self.sm.sm_timeout_ns)
        if self.rejected_reason is not None:
            errors = 0 if self._last_error_ns is None else self._last_error_ns + self.sm.sm_timeout_ns
            return min(self.last_packet_ns + self.liveness_timeout_ns, errors)
        deadline = min(self.last_packet_ns + self.liveness_timeout_ns, self.sm.next_deadline_ns())
        loss = self.loss.next_deadline_ns()  # None while no gap is active
        return deadline if loss is None else min(deadline, loss)

    def _clean(self, target: int) -> None:
        cleaner = self._cleaner
        for _ in range(3):  # one call zeroes at most to the end of a term
            if cleaner.clean_position >= target:
                return
            cleaner.clean_to(min(target, cleaner.clean_position + 3 * self.term_length))
