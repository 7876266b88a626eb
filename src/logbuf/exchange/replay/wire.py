"""A batch of sends built into one buffer: each packet's bytes once, shared by the feeds that send it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from logbuf.exchange.replay.plans import PlanColumns
from logbuf.exchange.replay.schedule import SendEvent
from logbuf.marketdata.moldudp64 import HEADER_LENGTH

_WIRE_HEADER = np.dtype([("session", "S10"), ("sequence", ">u8"), ("count", ">u2")])  # MoldUDP64, 20 bytes


class FeedBatch(NamedTuple):
    """One feed's packets of a :class:`SendBatch` in send order: packet i is ``offsets[i]``, ``lengths[i]`` into
    the batch's wire buffer, due ``times[i]`` ns after the start, carrying ``counts[i]`` messages, the next
    message after it being ``ends[i]`` (a heartbeat's: the sequence it announces)."""

    times: np.ndarray  # int64, non-decreasing
    offsets: np.ndarray  # int32
    lengths: np.ndarray  # int32
    counts: np.ndarray  # int64
    ends: np.ndarray  # int64


class SendBatch(NamedTuple):
    """Packets for every feed built into one buffer, and the ring publications that must precede them."""

    wire: np.ndarray  # uint8: every packet of the batch, back to back
    feeds: list[FeedBatch]  # index: ReplayConfig.feeds
    publish: list[tuple[int, np.ndarray]]  # (first sequence, frame offsets) for the retransmission ring
    horizon: int  # every packet due at or before this (ns after the start) is in this batch or an earlier one


def build_batch(session: bytes, source: memoryview, plans: PlanColumns | None,
                sends: list[list[tuple[np.ndarray, np.ndarray] | list[SendEvent]]],
                publish: list[tuple[int, np.ndarray]], horizon: int) -> SendBatch:
    """Builds every packet of ``plans`` once (A and B share them), their bodies sliced from ``source`` (the day
    file), and the events' packets after them; ``sends``: per feed, what :meth:`FeedScheduler.schedule` returned."""
    packet_count = 0 if plans is None else len(plans.sequence)
    sizes = np.zeros(packet_count, dtype=np.int64) if plans is None else plans.end - plans.start + HEADER_LENGTH
    extra = [e.data for feed in sends for part in feed if isinstance(part, list) for e in part]
    offsets = np.zeros(packet_count + len(extra), dtype=np.int64)
    all_sizes = np.concatenate([sizes, np.fromiter((len(d) for d in extra), np.int64, len(extra))])  # type: ignore[arg-type]
    if all_sizes.size > 1:
        np.cumsum(all_sizes[:-1], out=offsets[1:])
    wire = np.empty(int(all_sizes.sum()), dtype=np.uint8)
    if plans is not None and packet_count:
        headers = np.empty(packet_count, dtype=_WIRE_HEADER)
        headers["session"] = session
        headers["sequence"] = plans.sequence
        headers["count"] = plans.count
        at = offsets[:packet_count]
        wire[(at[:, None] + np.arange(HEADER_LENGTH)).ravel()] = headers.view(np.uint8)
        target = wire.data  # memoryview slices copy fastest here
        for o, start, end in zip((at + HEADER_LENGTH).tolist(), plans.start.tolist(), plans.end.tolist(),
                                 strict=True):
            target[o : o + end - start] = source[start:end]
    for o, data in zip(offsets[packet_count:].tolist(), extra, strict=True):
        wire[o : o + len(data)] = np.frombuffer(data, dtype=np.uint8)  # type: ignore[arg-type]
    feeds: list[FeedBatch] = []
    next_extra = packet_count
    for parts in sends:
        times: list[np.ndarray] = []
        index: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        for part in parts:
            if isinstance(part, list):
                times.append(np.fromiter((e.time_ns for e in part), np.int64, len(part)))
                index.append(np.arange(next_extra, next_extra + len(part)))
                counts.append(np.fromiter((e.count for e in part), np.int64, len(part)))
                ends.append(np.fromiter((e.sequence + e.count for e in part), np.int64, len(part)))
                next_extra += len(part)
            else:
                assert plans is not None
                index.append(part[0])
                times.append(part[1])
                counts.append(plans.count[part[0]])
                ends.append(plans.sequence[part[0]] + plans.count[part[0]])
        at = np.concatenate(index) if index else np.empty(0, dtype=np.int64)
        empty = np.empty(0, dtype=np.int64)
        feeds.append(FeedBatch(
            np.concatenate(times) if times else empty, offsets[at].astype(np.int32),
            all_sizes[at].astype(np.int32), np.concatenate(counts) if counts else empty,
            np.concatenate(ends).astype(np.int64) if ends else empty))
    return SendBatch(wire, feeds, publish, horizon)
