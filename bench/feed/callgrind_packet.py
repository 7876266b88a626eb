"""Exact instruction counts of the feed handler's user-space per-packet path, under callgrind.

    PYTHONPATH=src .venv/bin/python bench/feed/callgrind_packet.py [-n 200] [--case datagram|coalesced]

What it counts, per received packet (A and B copies both counted, as the market-open profile counts CPU per
packet received): the arbitration engine on a receive ring of prepared datagrams (``lbf_eng_process``: intake,
validation, the per-message walk, the A-B pairing) and the append of every delivered message into a log
(``lbf_eng_offer`` -> ``lb_offer_batch``: one frame per message, the sequence as the reserved value). No
sockets: the kernel's receive path is not counted (see ``perf stat`` for that). The traffic is the profile's:
40 Add Orders of 36 bytes per packet, every packet on A and on B, B 5 packets behind A; each iteration is one
round of ``--round`` packets per feed (the sequences and stamps in the ring advanced in place, as the next
round's datagrams would be), ``datagram``: one datagram per ring slot (a sender that sends each one by itself),
``coalesced``: runs of 8 datagrams per slot (UDP GRO), ``lossy``: one datagram per slot and A loses one packet per
round (~2 %: the next packets of A wait in the out-of-order queue until B's copy fills the hole, then go out as
copies).

Each case runs in a child Python under ``valgrind --tool=callgrind`` twice, with N and 2N rounds after the same
setup and warm-up; the difference divided by the packets of N rounds is the cost of one packet, free of
start-up and setup. The engine and append rows are the inclusive counts of ``lbf_eng_process`` and
``lbf_eng_offer`` (no Python in them); "whole" is the whole process's difference (the Python loop that drives
the rounds included). Instruction counts are exact and repeatable, unlike timings on a shared machine.

``--time`` runs the same children without valgrind (N and 6N rounds) and reports CPU µs per received packet:
noisy, but it shows what the counts do not, e.g. that with the profile's 64 MiB terms much of the append's time
is the memory traffic of writing log lines not in any cache (compare ``--term-mib 1``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

SESSION = "PROFILE01"
MESSAGES_PER_PACKET = 40
MESSAGE_LENGTH = 36
B_LAG = 5
INTERVAL_NS = 50_000  # 20 k packets/s per feed
TERM_MIB = 64  # the profile's --term-mib: three terms far larger than any cache, as in the handler
WARMUP_ROUNDS = 20
# datagrams per ring slot, and whether A loses one packet per round (B's copy fills the hole 5 packets later: the
# packets of A in between wait in the out-of-order queue, then go out as copies)
CASES = {"datagram": (1, False), "coalesced": (8, False), "lossy": (1, True)}
LOST_A_PACKET = 10  # the packet of each round A loses in the lossy case
MEASURED = ("lbf_eng_process", "lbf_eng_offer")


def _packet(first: int) -> bytes:
    """A MoldUDP64 packet of 40 Add Orders from ``first`` (as bench_profile.py builds them)."""
    from logbuf.marketdata import moldudp64

    builder = moldudp64.PacketBuilder(SESSION, first, 1 << 16)
    for seq in range(first, first + MESSAGES_PER_PACKET):
        body = b"A" + seq.to_bytes(8, "big") + bytes([seq % 251]) * (MESSAGE_LENGTH - 9)
        if not builder.try_append(body):
            raise AssertionError("a packet of 40 messages must fit")
    return builder.build()


def _child(case: str, rounds: int, per_round: int, term_mib: int = TERM_MIB) -> None:
    """The measured program: setup and warm-up, then ``rounds`` rounds of ``case``."""
    import numpy as np
    from logbuf._native import ffi, lib

    from logbuf import ExclusivePublication, LogBuffers, Position
    from logbuf.feed.arbiter import Arbiter, ArbiterConfig
    from logbuf.feed.config import RecoveryConfig
    from logbuf.feed.events import Feed
    from logbuf.feed.feed_native import RecvRing

    group, lossy = CASES[case]
    if per_round % group:
        raise SystemExit(f"--round must be a multiple of {group} for {case}")
    slots_per_feed = per_round // group
    ring = RecvRing(capacity=2 * slots_per_feed)
    step = per_round * MESSAGES_PER_PACKET
    # round 0: A's packets from sequence 1 + lag, B's from 1 (B lags); slots alternate A, B in arrival order
    for k in range(slots_per_feed):
        for f, feed in enumerate((Feed.A, Feed.B)):
            first = 1 + (k * group + (B_LAG if feed == Feed.A else 0)) * MESSAGES_PER_PACKET
            run = [_packet(first + d * MESSAGES_PER_PACKET) for d in range(group)]
            slot = 2 * k + f
            ring.load(slot, b"".join(run), feed, (2 * k + f) * INTERVAL_NS // 2)
            ring.segments[slot] = len(run[0]) if group > 1 else 0
    packet_length = len(_packet(1))
    # every datagram's sequence field (big-endian, unaligned) and every slot's stamp, advanced per round
    sequences = np.ndarray(shape=(2 * slots_per_feed, group), dtype=">u8", buffer=ring.slab, offset=10,
                           strides=(ring.slot_size, packet_length))
    arrivals = ring.arrivals
    directory = tempfile.mkdtemp(prefix="logbuf-callgrind-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        log = LogBuffers.create(os.path.join(directory, "log"), term_length=term_mib * 1024 * 1024, session_id=1,
                                stream_id=2, initial_term_id=0)
        pub = ExclusivePublication(log, Position.standalone(log.max_possible_position - 1))
        arbiter = Arbiter(ArbiterConfig(), RecoveryConfig(), seed=1)
        e, rx, native = arbiter.c, ring.c, pub.native_struct()
        slab = ffi.cast("uint8_t *", ring.slab.ctypes.data)
        slab_size = ring.slab.size
        appended = ffi.new("int32_t *")
        deliver, admin = lib.LBF_EV_DELIVER, lib.LB_ADMIN_ACTION
        slots = 2 * slots_per_feed
        # the slot ranges each round arbitrates (the lossy case skips A's lost slot)
        ranges = [(0, 2 * LOST_A_PACKET), (2 * LOST_A_PACKET + 1, slots)] if lossy else [(0, slots)]
        published = 0

        def one_round() -> int:
            lib.lbf_eng_clear_output(e)
            for start, end in ranges:
                if lib.lbf_eng_process(e, rx, start, end) != 0:
                    raise SystemExit("lbf_eng_process failed")
            done = 0
            for k in range(e.event_count):
                ev = e.events[k]
                if ev.kind != deliver:
                    continue
                skip, count = 0, ev.b - ev.a
                while skip < count:
                    result = lib.lbf_eng_offer(e, k, skip, slab, slab_size, native, 1, appended)
                    if result < 0 and result != admin:  # a term rotation: offer again
                        raise SystemExit(f"lbf_eng_offer failed: {result}")
                    skip += appended[0]
                done += count
            sequences[...] += step
            arrivals[...] += per_round * INTERVAL_NS
            return done

        for _ in range(WARMUP_ROUNDS):
            published += one_round()
        for _ in itertools.repeat(None, rounds):
            published += one_round()
        expected = ((WARMUP_ROUNDS + rounds) * per_round + B_LAG) * MESSAGES_PER_PACKET  # A leads B by B_LAG
        if published != expected:  # every message delivered once, nothing lost in the measured path
            raise SystemExit(f"published {published} messages, expected {expected}")
        pub.close()
        log.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _child_command(case: str, rounds: int, per_round: int, term_mib: int) -> list[str]:
    return [sys.executable, __file__, "--child", case, str(rounds), str(per_round), "--term-mib", str(term_mib)]


def _run(case: str, rounds: int, per_round: int) -> tuple[int, dict[str, int], dict[str, int]]:
    """(the whole count, inclusive counts of MEASURED, self counts of every function) of one child run."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}",
               *_child_command(case, rounds, per_round, TERM_MIB)]
        env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False, env=env)
        if result.returncode != 0:
            raise SystemExit(f"callgrind run failed ({result.returncode}):\n{result.stderr[-2000:]}")
        match = re.search(r"Collected\s*:\s*(\d+)", result.stderr)
        if match is None:
            raise SystemExit(f"no instruction count in callgrind's output:\n{result.stderr[-2000:]}")
        return int(match.group(1)), _annotate(out, inclusive=True), _annotate(out, inclusive=False)


_LINE = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(\S.*?)\s*$")


def _annotate(out: str, inclusive: bool) -> dict[str, int]:
    """Function -> instructions from callgrind_annotate's table. Inclusive: the function's own line (the one
    naming its object); self: that line plus the lines of code inlined into it from other files."""
    cmd = ["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}", "--threshold=100", out]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    counts: dict[str, int] = defaultdict(int)
    in_table = False
    for line in text.splitlines():
        if line.rstrip().endswith("file:function"):
            in_table = True
            continue
        if not in_table:
            continue
        if line.startswith("---"):
            if counts:
                break  # the table ends; the annotated sources follow
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        where, _, obj = m.group(2).partition(" [")
        if inclusive and not obj:
            continue
        name = where.rsplit(":", 1)[-1].split("'")[0]
        counts[name] += int(m.group(1).replace(",", ""))
    return counts


def measure(case: str, rounds: int, per_round: int, top: int) -> dict[str, float]:
    """Instructions per received packet: whole, engine, append, and the ``top`` costliest functions (self)."""
    once = _run(case, rounds, per_round)
    twice = _run(case, 2 * rounds, per_round)
    packets = rounds * (2 * per_round - (1 if CASES[case][1] else 0))  # A and B (less A's lost packets)
    rows = {"whole": (twice[0] - once[0]) / packets}
    for name in MEASURED:
        rows[name] = (twice[1].get(name, 0) - once[1].get(name, 0)) / packets
    selfs = {k: (twice[2].get(k, 0) - once[2].get(k, 0)) / packets for k in set(once[2]) | set(twice[2])}
    for name, value in sorted(selfs.items(), key=lambda kv: -kv[1])[:top]:
        rows[f"  self {name}"] = value
    return rows


def _cpu_seconds(case: str, rounds: int, per_round: int, term_mib: int) -> float:
    """CPU time (user + system) of one child run without valgrind."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(_child_command(case, rounds, per_round, term_mib), check=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def time_per_packet(case: str, rounds: int, per_round: int, term_mib: int, repeats: int) -> list[float]:
    """CPU µs per received packet, N vs 6N rounds without valgrind, ``repeats`` times (timings: noisy on a
    shared machine, unlike the counts)."""
    packets = 5 * rounds * (2 * per_round - (1 if CASES[case][1] else 0))
    return [(_cpu_seconds(case, 6 * rounds, per_round, term_mib) - _cpu_seconds(case, rounds, per_round, term_mib))
            / packets * 1e6 for _ in range(repeats)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--rounds", type=int, default=200,
                        help="N: rounds of the shorter run (the longer runs 2N) (default: 200)")
    parser.add_argument("--round", type=int, default=48, dest="per_round",
                        help="packets per feed per round (default: 48, the profile's rounds)")
    parser.add_argument("--case", choices=tuple(CASES), action="append",
                        help="measure only this case (repeatable; default: every case)")
    parser.add_argument("--top", type=int, default=12, help="functions listed by their own cost (default: 12)")
    parser.add_argument("--time", action="store_true",
                        help="instead of counting, time N vs 6N rounds without valgrind (CPU µs per packet)")
    parser.add_argument("--repeats", type=int, default=3, help="--time: runs of each case (default: 3)")
    parser.add_argument("--term-mib", type=int, default=TERM_MIB,
                        help=f"--time: the log's term length in MiB (default: {TERM_MIB}, the profile's)")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "ROUNDS", "PER_ROUND"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        case, rounds, per_round = args.child
        _child(case, int(rounds), int(per_round), args.term_mib)
        return 0
    if args.time:
        for case in args.case or CASES:
            times = time_per_packet(case, args.rounds, args.per_round, args.term_mib, args.repeats)
            print(f"{case}: {min(times):.3f}-{max(times):.3f} µs CPU per received packet (runs: "
                  f"{', '.join(f'{t:.3f}' for t in times)}; terms of {args.term_mib} MiB, N={args.rounds}, "
                  f"load {os.getloadavg()[0]:.1f})")
        return 0
    if args.rounds <= 0 or args.per_round <= 0:
        parser.error("--rounds and --round must be positive")
    for case in args.case or CASES:
        rows = measure(case, args.rounds, args.per_round, args.top)
        engine, append = rows["lbf_eng_process"], rows["lbf_eng_offer"]
        print(f"{case}: {engine + append:.0f} instructions per received packet in C (engine {engine:.0f}, "
              f"append {append:.0f}; whole process {rows['whole']:.0f}); {MESSAGES_PER_PACKET} messages of "
              f"{MESSAGE_LENGTH} B, A+B, rounds of {args.per_round} packets per feed, N={args.rounds}")
        for name, value in rows.items():
            if name.startswith("  "):
                print(f"{name:48s} {value:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
