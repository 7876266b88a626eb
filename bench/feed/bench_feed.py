"""Feed benchmarks (not part of the test run): synth msg/s, replay packets/s on loopback, retransmission answers/s.

    PYTHONPATH=src .venv/bin/python bench/feed/bench_feed.py [--messages 5M] [--runs 3]

Each figure is the median of ``--runs`` runs; the machine has 2 vCPUs whose placement moves (see
/work/shared/reference/benchmarking.md), so expect +-20-40 % between runs.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from logbuf.feed import moldudp64  # noqa: E402
from logbuf.feed.dayfile import DayFileReader  # noqa: E402
from logbuf.feed.replay import FeedConfig, ReplayConfig, ReplayCore, ReplayServer  # noqa: E402
from logbuf.feed.retransmit import MessageRing, RetransmitCore, RetransmitServer  # noqa: E402
from logbuf.feed.synth import SynthConfig, write_day  # noqa: E402

SESSION = "BENCH0001"


def bench_synth(path: str, messages: int) -> float:
    started = time.perf_counter()
    write_day(SynthConfig(messages=messages, seed=1), path, progress=False)
    return messages / (time.perf_counter() - started)


def bench_replay(path: str, feeds: int) -> tuple[float, float, float]:
    """(packets/s, messages/s, messages per packet) at max speed to discard sockets on 127.0.0.1."""
    sinks = []
    for _ in range(feeds):
        sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sink.bind(("127.0.0.1", 0))  # nobody reads: the kernel drops what overflows, the sender is not slowed
        sinks.append(sink)
    config = ReplayConfig(session=SESSION, speed=None, end_of_session_count=1, end_of_session_interval_ns=0,
                          feeds=tuple(FeedConfig(name) for name in "AB"[:feeds]))
    with DayFileReader(path) as reader:
        server = ReplayServer(ReplayCore(reader, config), [s.getsockname() for s in sinks])
        try:
            summary = server.run()
        finally:
            server.close()
    for sink in sinks:
        sink.close()
    return summary.packets / summary.seconds, summary.messages / summary.seconds, summary.messages / summary.packets


def bench_retransmit_core(path: str, requests: int) -> float:
    with DayFileReader(path) as reader:
        ring = MessageRing(22)
        for block in reader.blocks():
            ring.publish(ring.next_sequence, block.frames)
        core = RetransmitCore(SESSION, ring, reader.buffer)
        low, span = ring.lowest_sequence(), ring.next_sequence - ring.lowest_sequence() - 100  # retained only
        reqs = [moldudp64.encode_request(SESSION, low + (i * 7919) % span, 40) for i in range(requests)]
        started = time.perf_counter()
        for i, req in enumerate(reqs):
            core.handle(req, ("c", 1), i)
        return requests / (time.perf_counter() - started)


def bench_retransmit_loopback(path: str, requests: int, window: int = 32) -> float:
    """Answers/s seen by one client keeping ``window`` requests in flight against 2 workers."""
    with DayFileReader(path) as reader:
        ring = MessageRing(22)
        for block in reader.blocks():
            ring.publish(ring.next_sequence, block.frames)
        server = RetransmitServer(lambda: RetransmitCore(SESSION, ring, reader.buffer), workers=2).start()
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        client.settimeout(0.05)  # an answer lost on loopback costs this much, not a second
        low, span = ring.lowest_sequence(), ring.next_sequence - ring.lowest_sequence() - 100  # retained only
        try:
            sent = received = 0
            started = time.perf_counter()
            while received < requests:
                while sent < requests and sent - received < window:
                    client.sendto(moldudp64.encode_request(SESSION, low + (sent * 7919) % span, 40),
                                  server.address)
                    sent += 1
                try:
                    client.recv(65536)
                    received += 1
                except TimeoutError:
                    received = sent  # lost on loopback: count it and move on
            return requests / (time.perf_counter() - started)
        finally:
            client.close()
            server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=float, default=5e6)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    messages = int(args.messages)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "day.itch")
        synth = [bench_synth(path, messages) for _ in range(args.runs)]
        print(f"synth      {messages:>11,} msgs  median {statistics.median(synth) / 1e6:6.2f} M msg/s   "
              f"runs {[round(x / 1e6, 2) for x in synth]}")
        for feeds in (1, 2):
            runs = [bench_replay(path, feeds) for _ in range(args.runs)]
            pps = statistics.median(r[0] for r in runs)
            mps = statistics.median(r[1] for r in runs)
            print(f"replay     {feeds} feed(s) max speed  median {pps:9,.0f} packets/s  {mps:10,.0f} msg/s  "
                  f"({runs[0][2]:.2f} msg/packet)   runs {[round(r[0]) for r in runs]}")
        core = [bench_retransmit_core(path, 100_000) for _ in range(args.runs)]
        print(f"retransmit core (40-msg requests)   median {statistics.median(core):9,.0f} answers/s")
        loop = [bench_retransmit_loopback(path, 50_000) for _ in range(args.runs)]
        print(f"retransmit loopback, 2 workers      median {statistics.median(loop):9,.0f} answers/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
