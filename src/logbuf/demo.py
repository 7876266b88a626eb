"""``logbuf demo``: a publisher process and a subscriber process on one log buffer, throughput and RTT printed.

(The full market-data story — driver, replay, feed handler, recorder, Spark report — replaces this as the
later layers land; ``logbuf demo transport`` will keep running this part.)
"""

from __future__ import annotations

import argparse
import sys

from logbuf.samples.ipc import ping_pong, throughput


def run_transport_demo(messages: int, sizes: list[int], rtt_samples: int, out=sys.stdout) -> int:
    print("logbuf transport demo: 1 publisher process -> 1 subscriber process, shared-memory log buffer", file=out)
    print(f"{'API':<14}{'size':>6}{'messages':>12}{'msg/s':>14}{'MB/s':>10}{'CPU s/M msg':>13}", file=out)
    for batch in (False, True):
        for size in sizes:
            count = messages * (5 if batch else 1)
            r = throughput(size, count, batch=batch)
            print(f"{r.mode:<14}{size:>6}{count:>12,}{r.msgs_per_s:>14,.0f}{r.mb_per_s:>10,.0f}"
                  f"{r.cpu_s_per_million:>13.2f}", file=out, flush=True)
    rtt = ping_pong(sizes[0], rtt_samples, warmup=min(10_000, rtt_samples))
    print(f"ping-pong RTT ({rtt.size} B, {rtt.samples:,} samples): p50 {rtt.p50_us:.1f} us, "
          f"p99 {rtt.p99_us:.1f} us, p99.9 {rtt.p999_us:.1f} us", file=out)
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.messages <= 0 or args.rtt_samples <= 0 or any(s < 0 for s in args.sizes):
        print("logbuf demo: --messages and --rtt-samples must be positive, sizes >= 0", file=sys.stderr)
        return 2
    return run_transport_demo(args.messages, args.sizes, args.rtt_samples)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the demo (publisher -> subscriber throughput and RTT)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per per-message run")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 256], help="payload sizes in bytes")
    parser.add_argument("--rtt-samples", type=int, default=100_000, help="ping-pong round trips to time")
    parser.set_defaults(func=_demo)
