"""What a sender puts in its next datagram: whole committed frames from snd-pos, never a split frame, up to
``min(snd-lmt - snd-pos, MTU, end of term)``; and the datagrams that answer a NAK.

The frame walk is the native term scanner (:func:`logbuf.logbuffer.term_scanner.scan_for_availability`): it
stops at an uncommitted frame, at a frame that would not fit, and takes a PAD frame only as the first frame -
then only the PAD's 32-byte header is sent and its body is skipped (the header's length tells the receiver
how much term it covers).

Counts: a send that moved fewer bytes than planned is a *short send* and snd-pos stays.  ``snd_bpe`` (snd-bpe,
and the system counter "Sender flow control limits applied") counts the times committed data was held back by
snd-lmt - the window used up, or too small for the next frame - once per episode: the next successful send
re-arms it.  (Aeron counts only a window of exactly zero, which frames that do not divide the window rarely
produce; holding data back is what the counter is for.)
"""

from __future__ import annotations

from typing import NamedTuple

from logbuf.driver.udp.counters import SenderCounters
from logbuf.errors import LogCorruptedError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.frame import FRAME_ALIGNMENT, HEADER_LENGTH
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.logbuffer.term_scanner import scan_for_availability
from logbuf.native import ffi, lib

_MAX_SCAN = (1 << 31) - 1
_MAX_BATCH = 64


class SendPlan(NamedTuple):
    """One datagram of term bytes: ``buffer`` is a view into the publication's term (valid until the term is
    cleaned, one term behind snd-pos)."""

    position: int  # stream position of the first byte
    term_id: int
    term_offset: int
    length: int  # bytes to send: whole frames
    padding: int  # bytes of PAD body skipped after them (not sent)
    buffer: memoryview

    @property
    def next_position(self) -> int:
        return self.position + self.length + self.padding


class SendPlanner:
    """Plans data datagrams for one network publication and keeps its sender position (snd-pos)."""

    def __init__(
        self,
        log: LogBuffers,
        *,
        mtu: int | None = None,
        position: int | None = None,
        counters: SenderCounters | None = None,
    ) -> None:
        self.log = log
        self.mtu = log.mtu if mtu is None else mtu
        if not HEADER_LENGTH < self.mtu <= log.mtu or self.mtu % FRAME_ALIGNMENT:
            raise ValueError(f"mtu {self.mtu} must be a multiple of {FRAME_ALIGNMENT} in ({HEADER_LENGTH}, log mtu {log.mtu}]")
        self.term_length = log.term_length
        self.position_bits = log.position_bits
        self.initial_term_id = log.initial_term_id
        self.position = log.producer_position() if position is None else position
        self.counters = SenderCounters() if counters is None else counters
        self.snd_bpe = 0
        self._track_limits = True
        self._terms = [log.term_pointer(i) for i in range(d.PARTITION_COUNT)]
        view = log.terms.view
        T = self.term_length
        self._term_views = [view[i * T : (i + 1) * T] for i in range(d.PARTITION_COUNT)]
        self._term_words = [v.cast("i") for v in self._term_views]
        self._out = ffi.new("int32_t[]", 3 * _MAX_BATCH)  # offsets, lengths, paddings of lbn_plan_batch

    def plan(self, snd_lmt: int, position: int | None = None) -> SendPlan | None:
        """The next datagram from snd-pos (or from ``position``, to plan a batch ahead of confirmations) within
        ``snd_lmt``, or None (nothing committed, or no window)."""
        if position is None:
            position = self.position
        window = snd_lmt - position
        plan = self._scan(position, min(window, self.mtu, _MAX_SCAN)) if window > 0 else None
        if plan is None and position == self.position and self._track_limits and self.frame_waiting(position):
            self._track_limits = False
            self.snd_bpe += 1
            self.counters.flow_control_limits += 1
        return plan

    def plan_batch(self, snd_lmt: int, max_datagrams: int) -> list[SendPlan]:
        """Up to ``max_datagrams`` datagrams from snd-pos within ``snd_lmt``: what as many :meth:`plan` calls
        would return one after the other, planned natively a term at a time (one call, not one per datagram).
        Counts a flow-control limit as :meth:`plan` does when nothing could be planned."""
        plans: list[SendPlan] = []
        position = self.position
        T = self.term_length
        out = self._out
        max_datagrams = min(max_datagrams, _MAX_BATCH)
        while len(plans) < max_datagrams and snd_lmt > position:
            index = d.index_by_position(position, self.position_bits)
            term_offset = position & (T - 1)
            n = lib.lbn_plan_batch(self._terms[index], T, term_offset, snd_lmt - position, self.mtu,
                                   max_datagrams - len(plans), out, out + _MAX_BATCH, out + 2 * _MAX_BATCH)
            if n == lib.LB_CORRUPT_FRAME:
                raise LogCorruptedError(f"corrupted frame header at term offset {term_offset}", term_offset)
            if n <= 0:
                break
            term_id = d.compute_term_id_from_position(position, self.position_bits, self.initial_term_id)
            view = self._term_views[index]
            term_begin = position - term_offset
            for i in range(n):
                offset, length, padding = out[i], out[_MAX_BATCH + i], out[2 * _MAX_BATCH + i]
                plans.append(SendPlan(term_begin + offset, term_id, offset, length, padding,
                                      view[offset : offset + length]))
            position = term_begin + offset + length + padding
            if position - term_begin < T:
                break  # stopped inside the term: nothing more is committed (or the window is used)
        if not plans:
            self.note_nothing_planned()
        return plans

    def note_nothing_planned(self) -> None:
        """Nothing could be planned from snd-pos: if a committed frame waits there, the window held it back
        (counted once per episode, as :meth:`plan` counts)."""
        if self._track_limits and self.frame_waiting(self.position):
            self._track_limits = False
            self.snd_bpe += 1
            self.counters.flow_control_limits += 1

    def on_sent_natively(self, next_position: int, bytes_sent: int) -> None:
        """Datagrams planned and sent by one native call (the driver's ``lbn_send_term``) went whole:
        snd-pos moves to ``next_position`` (padding skipped included), as :meth:`on_sent` would move it."""
        if next_position <= self.position:
            raise ValueError(f"snd-pos {self.position} cannot move to {next_position}")
        self.position = next_position
        self.counters.bytes_sent += bytes_sent
        self._track_limits = True

    @property
    def term_pointers(self) -> list:
        """``uint8_t *`` of each partition's term (for a native planner)."""
        return self._terms

    def frame_waiting(self, position: int) -> bool:
        """A committed frame at ``position`` (a hint - for counting, and for a duty cycle to skip a sender
        with nothing new - the scanner re-reads with acquire)."""
        term_offset = position & (self.term_length - 1)
        return self._term_words[d.index_by_position(position, self.position_bits)][term_offset >> 2] > 0

    def on_sent(self, plan: SendPlan, bytes_sent: int) -> bool:
        """Reports how many bytes the socket took; True when the whole datagram went and snd-pos moved."""
        if plan.position != self.position:
            return False  # planned before an earlier datagram of the batch failed: it will be planned again
        if bytes_sent != plan.length:
            self.counters.short_sends += 1
            return False
        self.position = plan.next_position
        self.counters.bytes_sent += bytes_sent
        self._track_limits = True
        return True

    def resend_plans(self, term_id: int, term_offset: int, length: int) -> list[SendPlan]:
        """Datagrams covering ``length`` bytes from ``(term_id, term_offset)``, never past snd-pos nor the term
        end (the caller, :class:`RetransmitHandler`, has checked the range is retained)."""
        start = d.compute_position(term_id, term_offset, self.position_bits, self.initial_term_id)
        end = min(start + length, self.position, start - term_offset + self.term_length)
        plans: list[SendPlan] = []
        position = start
        while position < end:
            plan = self._scan(position, min(self.mtu, end - position))
            if plan is None:
                break
            plans.append(plan)
            position = plan.next_position
        return plans

    def _scan(self, position: int, max_length: int) -> SendPlan | None:
        term_offset = position & (self.term_length - 1)
        index = d.index_by_position(position, self.position_bits)
        available, padding = scan_for_availability(self._terms[index], self.term_length, term_offset, max_length)
        if available == 0:
            return None
        term_id = d.compute_term_id_from_position(position, self.position_bits, self.initial_term_id)
        view = self._term_views[index][term_offset : term_offset + available]
        return SendPlan(position, term_id, term_offset, available, padding, view)
