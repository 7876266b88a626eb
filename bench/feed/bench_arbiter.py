"""Arbitration throughput of pre-built MoldUDP64 packets (not part of the test run).

    PYTHONPATH=src .venv/bin/python bench/feed/bench_arbiter.py [--messages 2000000] [--runs 5] [--window 64]

Packets are built once (ITCH 5.0 message-size mix of the open, greedy 1400-byte packets: ~38 messages each) and
laid out in one big receive ring, so only arbitration is timed, in windows of ``--window`` slots (one recvmmsg
batch each). Rows:

- ``C engine``: ``Arbiter.process`` once per window (the C engine; the Python cost is per window: the
  ``DeliverBatch`` objects);
- ``specification``: ``SpecArbiter.on_packet`` per packet (the pure-Python statement of the rules, for scale);
- ``A+B``: both feeds, packed differently, B two packets behind (half the wire messages are duplicates);
- ``A+B, A loses 1%``: B 32 packets behind, so every A loss opens a hole for ~32 packets; the packets ahead
  are queued (in C) until B fills the hole.

msg/s counts *delivered* messages per CPU second (process time: the machine is shared); "wire" counts every
message received on either feed. Medians of ``--runs``;
the machine has 2 noisy vCPUs: expect +-20-40 % between runs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from logbuf.feed.arbiter import Arbiter, ArbiterConfig  # noqa: E402
from logbuf.feed.events import DeliverBatch, Feed, FeedMode  # noqa: E402
from logbuf.feed.feed_native import RecvRing  # noqa: E402
from logbuf.feed.spec import SpecArbiter  # noqa: E402
from logbuf.marketdata import moldudp64  # noqa: E402

SESSION = "BENCH0001"
SLOT = 2048
# (length, share) of the open's mix: A 36.7 %, U 22.5 %, F 19.3 %, D 16.7 %, E 2.8 %, X/I/P/Q the rest
MIX = [(36, 0.367), (35, 0.225), (40, 0.193), (19, 0.167), (31, 0.028), (23, 0.006), (50, 0.004), (44, 0.004),
       (40, 0.006)]


def make_messages(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    lengths = rng.choices([x for x, _ in MIX], weights=[w for _, w in MIX], k=n)
    return [bytes([65 + i % 26]) * length for i, length in enumerate(lengths)]


def packetise(messages: list[bytes], budget: int, seed: int) -> list[bytes]:
    """Greedy packets of at most ``budget`` bytes; a random budget cut per packet varies the boundaries."""
    rng = random.Random(seed)
    packets, seq, i = [], 1, 0
    while i < len(messages):
        builder = moldudp64.PacketBuilder(SESSION, seq, budget - rng.randrange(0, 200))
        while i < len(messages) and builder.try_append(messages[i]):
            i += 1
        seq += builder.count
        packets.append(builder.build())
    return packets


def interleave(a: list[bytes], b: list[bytes], lag: int, lose_a: float = 0.0, seed: int = 3
               ) -> list[tuple[Feed, bytes]]:
    """A's packets with B's ``lag`` packets behind; A loses a share ``lose_a`` of its packets."""
    rng = random.Random(seed)
    out: list[tuple[Feed, bytes]] = []
    for k in range(max(len(a), len(b) + lag)):
        if k < len(a) and rng.random() >= lose_a:
            out.append((Feed.A, a[k]))
        if 0 <= k - lag < len(b):
            out.append((Feed.B, b[k - lag]))
    return out


def load_ring(packets: list[tuple[Feed, bytes]]) -> RecvRing:
    ring = RecvRing(len(packets), SLOT)
    for slot, (feed, data) in enumerate(packets):
        ring.load(slot, data, feed, slot * 1_000)
    return ring


def fresh_arbiter(mode: FeedMode, spec: bool = False) -> Arbiter | SpecArbiter:
    config = ArbiterConfig(mode=mode, session=SESSION, out_of_order_max_interval=1_000)
    arb = SpecArbiter(config) if spec else Arbiter(config)
    arb.on_packet(Feed.A if mode != FeedMode.B_ONLY else Feed.B, moldudp64.encode_heartbeat(SESSION, 1), 0)
    return arb  # joined


def run_engine(ring: RecvRing, mode: FeedMode, window: int) -> tuple[float, int]:
    arb = fresh_arbiter(mode)
    delivered, n = 0, ring.capacity
    started = time.process_time_ns()
    for start in range(0, n, window):
        for event in arb.process(ring, start, min(start + window, n)):
            if isinstance(event, DeliverBatch):
                delivered += len(event)
    return (time.process_time_ns() - started) / 1e9, delivered


def run_pure(packets: list[tuple[Feed, bytes]], mode: FeedMode) -> tuple[float, int]:
    arb = fresh_arbiter(mode, spec=True)
    delivered = 0
    started = time.process_time_ns()
    for k, (feed, data) in enumerate(packets):
        delivered += sum(1 for e in arb.on_packet(feed, data, k * 1_000) if type(e).__name__ == "Deliver")
    return (time.process_time_ns() - started) / 1e9, delivered


def median_rate(fn: Callable[[], tuple[float, int]], runs: int) -> tuple[float, int]:
    results = [fn() for _ in range(runs)]
    return statistics.median(d / s for s, d in results), results[0][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=float, default=2e6)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--window", type=int, default=64, help="slots per recvmmsg batch")
    args = parser.parse_args()
    n = int(args.messages)
    messages = make_messages(n)
    a, b = packetise(messages, moldudp64.DEFAULT_PAYLOAD_BUDGET, 1), packetise(messages, 1400, 2)
    one = [(Feed.A, p) for p in a]
    two = interleave(a, b, lag=2)
    lossy = interleave(a, b, lag=32, lose_a=0.01)
    wire_two = sum(moldudp64.decode_header(p)[2] for _, p in two)
    print(f"{n:,} messages, {len(a):,} packets on A ({n / len(a):.1f} msg/packet), window {args.window}, "
          f"median of {args.runs}; load average {os.getloadavg()[0]:.2f} at start")
    rows = []
    ring_one, ring_two, ring_lossy = load_ring(one), load_ring(two), load_ring(lossy)
    for label, ring, mode in (("A", ring_one, FeedMode.A_ONLY), ("A+B", ring_two, FeedMode.A_AND_B),
                              ("A+B, A loses 1%", ring_lossy, FeedMode.A_AND_B)):
        rate, got = median_rate(lambda r=ring, m=mode: run_engine(r, m, args.window), args.runs)
        assert got == n, (label, got)
        rows.append((f"C engine, {label}", rate, got))
    cut = max(1, len(one) // 20)
    rate, got = median_rate(lambda: run_pure(one[:cut], FeedMode.A_ONLY), max(1, args.runs // 2))
    rows.append(("specification (pure Python), A (1/20)", rate, got))
    for label, rate, _ in rows:
        wire = f"  ({rate * wire_two / n / 1e6:6.2f} M wire msg/s)" if label.endswith("A+B") else ""
        print(f"  {label:40s} {rate / 1e6:7.2f} M msg/s delivered{wire}")


if __name__ == "__main__":
    main()
