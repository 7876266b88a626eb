"""Test rig: publishes what the feed handler publishes (messages, events, capture) and remembers the truth.

:class:`FeedScript` turns a synthetic ITCH day into a deterministic script of "packets" (which feed, which
messages, arrival time), gaps and session changes; :class:`FeedPublisher` plays it into logbuf in the
handler's order (PACKET rows, then the messages, then their DELIVERED rows, events in between), retrying
on back-pressure the way the handler does.  The expected datasets come from the script, and ITCH fields are
checked with the scalar codec (``itch.decode``), independent of the recorder's vectorised decoder.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import numpy as np

import logbuf
from logbuf.exchange.dayfile import LENGTH_PREFIX_SIZE, scan_frames
from logbuf.exchange.synth import SynthConfig, SyntheticDay
from logbuf.feed import published as out
from logbuf.marketdata import itch

T0_NS = 1_767_600_000_000_000_000  # 2026-01-05 08:00 UTC


@dataclass
class Day:
    data: np.ndarray  # framed day bytes (uint8)
    offsets: np.ndarray  # message offsets (int64)
    lengths: np.ndarray  # int32

    def message(self, i: int) -> bytes:
        start = int(self.offsets[i])
        return self.data[start : start + int(self.lengths[i])].tobytes()

    @property
    def count(self) -> int:
        return int(self.offsets.size)


def synth_day(messages: int, seed: int = 3) -> Day:
    chunks = [frames for frames, _ in SyntheticDay(SynthConfig(messages=messages, seed=seed)).chunks()]
    data = np.concatenate(chunks)
    frames, end = scan_frames(memoryview(data), 0, messages + 1)
    assert end == data.size
    offsets = frames + LENGTH_PREFIX_SIZE
    lengths = np.diff(np.append(frames, end)) - LENGTH_PREFIX_SIZE
    return Day(data, offsets.astype(np.int64), lengths.astype(np.int32))


@dataclass
class Step:
    """One thing the handler publishes: a delivered packet, an event, or a packet that delivers nothing."""

    kind: str  # "deliver", "packet", "event"
    session: str = ""
    feed: str = "A"
    first_seq: int = 0
    indices: np.ndarray | None = None  # day message indices delivered
    arrival_ns: int = 0
    event: out.FeedEvent | None = None


@dataclass
class FeedScript:
    steps: list[Step] = field(default_factory=list)
    # truth
    messages: dict[tuple[str, int], tuple[int, str, int]] = field(default_factory=dict)  # (session, seq) -> (day index, feed, arrival)
    packets: list[tuple[str, str, int, int, int, int]] = field(default_factory=list)  # session, feed, arrival, seq, count, bytes
    gaps: list[tuple[str, int, int, int, int | None]] = field(default_factory=list)  # session, first, last, detected, recovered
    end_ns: int = T0_NS  # the latest time it stamps on anything: a script that follows starts there


def make_script(day: Day, sessions: list[tuple[str, int]], *, seed: int = 5, gap_every: int = 0,
                end_of_session: bool = True, start_ns: int = T0_NS) -> FeedScript:
    """``sessions``: (name, message count) in order; each restarts sequences at 1.  Every ``gap_every``
    packets a gap is declared: alternately recovered (re-delivered from feed R) and unrecoverable.  Times
    start after ``start_ns`` (a later run of the handler starts after the ``end_ns`` of the one before: the
    recorder labels packets with sessions by time)."""
    rng = np.random.default_rng(seed)
    script = FeedScript()
    now = start_ns
    index = 0
    packet_no = 0
    for session, count in sessions:
        now += 1_000_000
        script.steps.append(Step("event", event=out.FeedEvent(out.SESSION_CHANGED, 0, 1, 0, now, session.encode())))
        seq = 1
        last_seq = count
        recover_next = True
        while seq <= last_seq:
            now += int(rng.integers(1_000, 200_000))
            n = min(int(rng.integers(1, 12)), last_seq - seq + 1)
            feed = "AB"[int(rng.integers(0, 2))]
            packet_no += 1
            if gap_every and packet_no % gap_every == 0 and seq + n <= last_seq:
                # the packet [seq, seq+n) is lost on both feeds: detected, then recovered or given up
                detected = now + 10_000
                script.steps.append(Step("event", event=out.FeedEvent(out.GAP_DETECTED, 1, seq, seq + n - 1,
                                                                      detected, session.encode())))
                if recover_next:
                    arrival = now + 50_000
                    idx = np.arange(index, index + n)
                    script.steps.append(Step("deliver", session, "R", seq, idx, arrival))
                    for k, s in enumerate(range(seq, seq + n)):
                        script.messages[(session, s)] = (int(idx[k]), "R", arrival)
                    recovered = arrival + 5_000
                    script.steps.append(Step("event", event=out.FeedEvent(out.GAP_RECOVERED, 0, seq, seq + n - 1,
                                                                          recovered, session.encode())))
                    script.gaps.append((session, seq, seq + n - 1, detected, recovered))
                    script.packets.append((session, "R", arrival, seq, n, 20 + 2 * n + int(day.lengths[idx].sum())))
                    index += n
                else:
                    lost_at = now + 80_000
                    script.steps.append(Step("event", event=out.FeedEvent(out.GAP_UNRECOVERABLE, 4, seq, seq + n - 1,
                                                                          lost_at, session.encode())))
                    script.gaps.append((session, seq, seq + n - 1, detected, None))
                    index += n  # those day messages are never delivered
                recover_next = not recover_next
                now += 100_000
                seq += n
                continue
            idx = np.arange(index, index + n)
            size = 20 + 2 * n + int(day.lengths[idx].sum())
            script.steps.append(Step("deliver", session, feed, seq, idx, now))
            script.packets.append((session, feed, now, seq, n, size))
            for k, s in enumerate(range(seq, seq + n)):
                script.messages[(session, s)] = (int(idx[k]), feed, now)
            # the other feed's copy arrives later and delivers nothing
            other = "B" if feed == "A" else "A"
            late = now + 30_000
            script.steps.append(Step("packet", session, other, seq, idx, late))
            script.packets.append((session, other, late, seq, n, size))
            index += n
            seq += n
        if end_of_session:
            now += 1_000_000
            script.steps.append(Step("event", event=out.FeedEvent(out.END_OF_SESSION, 0, last_seq + 1, 0, now,
                                                                  session.encode())))
    script.end_ns = max([now, *(p[2] for p in script.packets)])  # (the other feed's copy comes 30 us later)
    return script


class _Stopped(Exception):
    pass


class FeedPublisher:
    def __init__(self, client: logbuf.Client, channel: str = "aeron:ipc", deadline_s: float = 60.0,
                 stopped: threading.Event | None = None) -> None:
        self.messages = client.add_exclusive_publication(channel, out.MESSAGES_STREAM)
        self.events = client.add_exclusive_publication(channel, out.EVENTS_STREAM)
        self.capture = client.add_exclusive_publication(channel, out.CAPTURE_STREAM)
        self.deadline_s = deadline_s
        self.published = 0
        # set by a failing test (or given: a failing recorder's): play() returns before the driver goes
        self.stopped = stopped or threading.Event()

    def wait_connected(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not (self.messages.is_connected and self.events.is_connected and self.capture.is_connected):
            if time.monotonic() > deadline:
                raise AssertionError("the recorder did not subscribe")
            time.sleep(0.005)

    def _offer(self, publication: logbuf.Publication, data: bytes, reserved: int) -> None:
        deadline = time.monotonic() + self.deadline_s
        while True:
            if self.stopped.is_set():
                raise _Stopped
            result = publication.offer(data, reserved)
            if result > 0:
                return
            if result == logbuf.CLOSED or time.monotonic() > deadline:
                raise AssertionError(f"offer failed: {result}")
            time.sleep(0.0005)  # back-pressured (the recorder holds the window) or not connected (restarting)

    def play(self, day: Day, steps: list[Step], pause_every: int = 0, pause_s: float = 0.0,
             delivered_every: int = 1) -> None:
        """Publishes the steps.  DELIVERED rows go out every ``delivered_every`` delivering steps, in one frame
        (as the handler does per receive batch), and always before an event."""
        with contextlib.suppress(_Stopped):
            self._play(day, steps, pause_every, pause_s, delivered_every)

    def _play(self, day: Day, steps: list[Step], pause_every: int, pause_s: float, delivered_every: int) -> None:
        pending: list[np.ndarray] = []

        def flush_delivered() -> None:
            if pending:
                rows = np.concatenate(pending, dtype=out.DELIVERED_ROW)  # (without dtype numpy packs the rows)
                self._offer(self.capture, rows.tobytes(), out.CAPTURE_DELIVERED)
                pending.clear()

        for number, step in enumerate(steps, 1):
            if step.kind == "event":
                assert step.event is not None
                flush_delivered()
                self._offer(self.events, step.event.encode(), step.event.first)
            else:
                assert step.indices is not None
                n = int(step.indices.size)
                size = 20 + 2 * n + int(day.lengths[step.indices].sum())
                row = np.zeros(1, dtype=out.PACKET_ROW)
                row["feed"], row["bytes"], row["arrival_ns"] = ord(step.feed), size, step.arrival_ns
                row["sequence"], row["count"] = step.first_seq, n
                self._offer(self.capture, row.tobytes(), out.CAPTURE_PACKETS)
                if step.kind == "deliver":
                    for k, i in enumerate(step.indices.tolist()):
                        self._offer(self.messages, day.message(i), step.first_seq + k)
                        self.published += 1
                    seqs = np.arange(step.first_seq, step.first_seq + n, dtype=np.int64)
                    pending.append(out.delivered_runs(seqs, np.full(n, ord(step.feed), np.uint8),
                                                      np.full(n, step.arrival_ns, np.int64)))
                    if len(pending) >= delivered_every:
                        flush_delivered()
            if pause_every and number % pause_every == 0:
                time.sleep(pause_s)
        flush_delivered()

    def close(self) -> None:
        for publication in (self.messages, self.events, self.capture):
            publication.close()


def expected_columns(raw: bytes) -> dict[str, object]:
    """The ``messages`` columns of one ITCH message, from the scalar codec."""
    message = itch.decode(raw)
    code = itch.message_type(message).decode()
    fields = message._asdict()
    row: dict[str, object] = {"type": code, "stock_locate": message.stock_locate, "itch_ns": message.timestamp,
                              "order_ref": None, "new_order_ref": None, "side": None, "shares": None, "price": None,
                              "stock": None}
    if code in "AFECXDP":
        row["order_ref"] = fields["order_ref"]
    if code == "U":
        row["order_ref"], row["new_order_ref"] = fields["original_order_ref"], fields["new_order_ref"]
    if code in "AFP":
        row["side"] = fields["side"].decode()
    if code in "AFPQU":
        row["shares"] = fields["shares"]
    elif code in "EC":
        row["shares"] = fields["executed_shares"]
    elif code == "X":
        row["shares"] = fields["cancelled_shares"]
    if code in "AFPU":
        row["price"] = fields["price"]
    elif code == "C":
        row["price"] = fields["execution_price"]
    elif code == "Q":
        row["price"] = fields["cross_price"]
    if "stock" in fields:
        row["stock"] = fields["stock"].decode().rstrip(" ")
    return row
