"""The counters the UDP state machines keep, named after the system counters they feed (cnc.dat ids in
brackets, see aeron-formats.md §5).

The state machines only ever do ``counters.name += n``, so the driver may pass any object with these
attributes - e.g. one whose properties read and write counter records in cnc.dat - and share one object
between all publications (or images) of a driver, as the system counters are driver-wide.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SenderCounters:
    bytes_sent: int = 0  # [0] Bytes sent (data, retransmits, SETUP, heartbeats)
    naks_received: int = 0  # [6] NAKs received
    status_messages_received: int = 0  # [8] Status Messages received
    heartbeats_sent: int = 0  # [9] Heartbeats sent
    retransmits_sent: int = 0  # [11] Retransmits sent (one per resent NAK range)
    invalid_packets: int = 0  # [14] Invalid packets (e.g. a NAK outside the term)
    short_sends: int = 0  # [16] Short sends
    flow_control_limits: int = 0  # [18] Sender flow control limits applied (sum of every snd-bpe)
    retransmitted_bytes: int = 0  # [36] Retransmitted bytes
    retransmit_pool_overflow: int = 0  # [37] Retransmit Pool Overflow
    error_frames_received: int = 0  # [38] Error Frames received
    setups_sent: int = 0  # (no system counter)


@dataclass(slots=True)
class ReceiverCounters:
    bytes_received: int = 0  # [1] Bytes received
    naks_sent: int = 0  # [5] NAKs sent
    status_messages_sent: int = 0  # [7] Status Messages sent
    heartbeats_received: int = 0  # [10] Heartbeats received
    flow_control_under_runs: int = 0  # [12] Flow control under runs (data behind the last SM position)
    flow_control_over_runs: int = 0  # [13] Flow control over runs (data beyond the window)
    invalid_packets: int = 0  # [14] Invalid packets (malformed, or not fitting the image's term)
    loss_gap_fills: int = 0  # [23] Loss gap fills
    error_frames_sent: int = 0  # [39] Error Frames sent (the receiver rejecting a stream)
