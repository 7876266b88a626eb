"""Feed source benchmarks (not part of the test run): synth, replay, retransmission server.

    PYTHONPATH=src .venv/bin/python bench/feed/bench_feed.py [--messages 5M] [--runs 3] [--packet-rate 20000]

- synth: messages/s writing a day file;
- replay at max speed, 1 and 2 feeds, to sockets nobody reads: packets/s and messages/s;
- replay paced as a load profile (``--packet-rate`` packets per second per feed, full ~40-message packets,
  feeds A and B, 0.5% loss per feed): the rate achieved, the packets sent more than 1 ms late, the
  replay's CPU per second of replay (one core = 1.0) and per packet, packets per sendmmsg call — what it
  leaves to a feed handler on the same machine (``--packet-rate`` takes a list: ``20000,50000,100000``);
- the retransmission core (40-message requests) and the server on loopback.

Each figure is the median of ``--runs`` runs; the machine has 2 vCPUs shared with other work, so expect
+-20-40 % between runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from logbuf.cli_args import count  # noqa: E402
from logbuf.exchange.dayfile import DayFileReader  # noqa: E402
from logbuf.exchange.replay.config import FaultConfig, FeedConfig, ReplayConfig  # noqa: E402
from logbuf.exchange.replay.core import ReplayCore  # noqa: E402
from logbuf.exchange.replay.sender import ReplayServer  # noqa: E402
from logbuf.exchange.retransmit.core import RetransmitCore  # noqa: E402
from logbuf.exchange.retransmit.ring import MessageRing  # noqa: E402
from logbuf.exchange.retransmit.server import make_server  # noqa: E402
from logbuf.exchange.synth import SynthConfig, write_day  # noqa: E402
from logbuf.marketdata import moldudp64  # noqa: E402

SESSION = "BENCH0001"


def bench_synth(path: str, messages: int) -> float:
    started = time.perf_counter()
    write_day(SynthConfig(messages=messages, seed=1), path, progress=False)
    return messages / (time.perf_counter() - started)


def _sinks(n: int) -> list[socket.socket]:
    sinks = []
    for _ in range(n):
        sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sink.bind(("127.0.0.1", 0))  # nobody reads: the kernel drops what overflows, the sender is not slowed
        sinks.append(sink)
    return sinks


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_replay(path: str, feeds: int) -> tuple[float, float, float]:
    """(packets/s, messages/s, messages per packet) at max speed to discard sockets on 127.0.0.1."""
    sinks = _sinks(feeds)
    config = ReplayConfig(session=SESSION, speed=None, end_of_session_count=1, end_of_session_interval_ns=0,
                          feeds=tuple(FeedConfig(name) for name in "AB"[:feeds]))
    with DayFileReader(path) as reader:
        reader.verify()  # as `logbuf replay` does: the frame index, so nothing is scanned while sending
        server = ReplayServer(ReplayCore(reader, config), [s.getsockname() for s in sinks])
        try:
            summary = server.run()
        finally:
            server.close()
    for sink in sinks:
        sink.close()
    return summary.packets / summary.seconds, summary.messages / summary.seconds, summary.messages / summary.packets


def bench_replay_paced(path: str, packet_rate: float, seconds: float) -> dict[str, float]:
    """Feeds A and B at ``packet_rate`` packets/s each, 0.5% loss each, for at most ``seconds``."""
    sinks = _sinks(2)
    faults = FaultConfig(loss=0.005)
    config = ReplayConfig(session=SESSION, packet_rate=packet_rate, end_of_session_count=1,
                          end_of_session_interval_ns=0, feeds=(FeedConfig("A", faults=faults),
                                                               FeedConfig("B", delay_ns=1_000_000, faults=faults)))
    with DayFileReader(path) as reader:
        reader.verify()  # as `logbuf replay` does: the frame index, so nothing is scanned while sending
        server = ReplayServer(ReplayCore(reader, config), [s.getsockname() for s in sinks])
        deadline = time.monotonic() + seconds
        server.stop.clear()
        progress_stop = server.stop

        def progress(_: int) -> None:
            if time.monotonic() >= deadline:
                progress_stop.set()

        server.progress = progress
        cpu = _cpu_seconds()
        try:
            summary = server.run()
        finally:
            server.close()
        cpu = _cpu_seconds() - cpu
    for sink in sinks:
        sink.close()
    sent = sum(stats.packets for stats in summary.feeds.values())
    return {
        "seconds": summary.seconds,
        "cpu_us_per_packet": cpu * 1e6 / max(1, summary.packets),
        "packets_per_send_call": summary.packets / max(1, server.send_calls),
        "packets_per_second_per_feed": sent / 2 / summary.seconds,
        "messages_per_second": summary.feeds["A"].messages / summary.seconds / (1 - 0.005),
        "messages_per_packet": summary.messages / max(1, summary.packets),
        "late_fraction": summary.late_packets / max(1, summary.packets),
        "max_late_ms": summary.max_late_ms,
        "cpu_per_second": cpu / summary.seconds,
    }


def _full_ring(reader: DayFileReader) -> MessageRing:
    ring = MessageRing(22)
    for block in reader.blocks():
        ring.publish(ring.next_sequence, block.frames)
    return ring


def bench_retransmit_core(path: str, requests: int) -> float:
    with DayFileReader(path) as reader:
        ring = _full_ring(reader)
        core = RetransmitCore(SESSION, ring, reader.buffer)
        low, span = ring.lowest_sequence(), ring.next_sequence - ring.lowest_sequence() - 100  # retained only
        reqs = [moldudp64.encode_request(SESSION, low + (i * 7919) % span, 40) for i in range(requests)]
        started = time.perf_counter()
        for i, req in enumerate(reqs):
            core.handle(req, ("c", 1), i)
        return requests / (time.perf_counter() - started)


def bench_retransmit_loopback(path: str, requests: int, window: int = 32) -> float:
    """Answers/s seen by one client keeping ``window`` requests in flight (the server in a thread)."""
    with DayFileReader(path) as reader:
        ring = _full_ring(reader)
        server = make_server(SESSION, ring, reader.buffer, rate=1e9, burst=1e9, queue=window).start()
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
    parser.add_argument("--messages", type=count, default=5_000_000, help="messages in the day (default: 5M)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (default: 3)")
    parser.add_argument("--packet-rate", type=lambda text: [float(x) for x in text.split(",")], default=[20_000.0],
                        help="paced replay: packets per second per feed, one or a list (default: 20000)")
    parser.add_argument("--duration", type=float, default=5.0, help="paced replay: seconds per run (default: 5)")
    parser.add_argument("--only", choices=("synth", "replay", "paced", "retransmit"), default=None,
                        help="run one group only (default: all)")
    args = parser.parse_args()
    messages = args.messages
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "day.itch")
        synth = [bench_synth(path, messages) for _ in range(args.runs if args.only in (None, "synth") else 1)]
        print(f"synth      {messages:>11,} msgs  median {statistics.median(synth) / 1e6:6.2f} M msg/s   "
              f"runs {[round(x / 1e6, 2) for x in synth]}")
        if args.only in (None, "replay"):
            for feeds in (1, 2):
                runs = [bench_replay(path, feeds) for _ in range(args.runs)]
                pps = statistics.median(r[0] for r in runs)
                mps = statistics.median(r[1] for r in runs)
                print(f"replay     {feeds} feed(s) max speed  median {pps:9,.0f} packets/s  {mps:10,.0f} msg/s  "
                      f"({runs[0][2]:.2f} msg/packet)   runs {[round(r[0]) for r in runs]}")
        for packet_rate in (args.packet_rate if args.only in (None, "paced") else []):
            runs = [bench_replay_paced(path, packet_rate, args.duration) for _ in range(args.runs)]
            mid = sorted(runs, key=lambda r: r["packets_per_second_per_feed"])[len(runs) // 2]
            print(f"replay     A+B paced at {packet_rate:,.0f} packets/s/feed, 0.5% loss: median "
                  f"{mid['packets_per_second_per_feed']:,.0f} packets/s/feed, {mid['messages_per_second']:,.0f} msg/s "
                  f"({mid['messages_per_packet']:.1f} msg/packet), late > 1 ms {mid['late_fraction']:.2%} "
                  f"(max {mid['max_late_ms']:.1f} ms), CPU {mid['cpu_per_second']:.2f} core, "
                  f"{mid['cpu_us_per_packet']:.2f} us/packet, {mid['packets_per_send_call']:.1f} packets/sendmmsg   "
                  f"runs {[round(r['packets_per_second_per_feed']) for r in runs]}")
        if args.only in (None, "retransmit"):
            core = [bench_retransmit_core(path, 100_000) for _ in range(args.runs)]
            print(f"retransmit core (40-msg requests)   median {statistics.median(core):9,.0f} answers/s")
            loop = [bench_retransmit_loopback(path, 50_000) for _ in range(args.runs)]
            print(f"retransmit loopback, one client     median {statistics.median(loop):9,.0f} answers/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
