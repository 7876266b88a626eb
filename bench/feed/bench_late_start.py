"""A late start in simulated time: the C engine with its re-request pacing against a retransmission server with
a per-client limit, at full rate, without sockets or a scheduler in the way.

    PYTHONPATH=src .venv/bin/python bench/feed/bench_late_start.py --rate 20000 --late-start 60
    PYTHONPATH=src .venv/bin/python bench/feed/bench_late_start.py --rate 2000 --late-start 10 --request-rate 800
    PYTHONPATH=src .venv/bin/python bench/feed/bench_late_start.py --rate 20000 --late-start 60 --server-rate 5000
    PYTHONPATH=src .venv/bin/python bench/feed/bench_late_start.py --rate 20000 --late-start 60 --server-lacks 100000

A and B send ``--rate`` packets/s of ``--messages-per-packet`` messages each (B 1 ms behind A) from t = 0; the
handler joins at ``--late-start`` s (``--join from-start``: everything before is re-requested). The server
answers each request after ``--rtt-ms`` with one packet (at most ``--messages-per-packet`` of the asked
messages), at most ``--server-rate`` answers per second (requests past it are dropped, as a rate-limited server
does). ``--server-lacks N`` (or ``FIRST:LAST``): the server lacks sequences 1..N (FIRST..LAST): requests starting
there are answered from the first sequence past the range it asked for (nothing if none; ``--server-strict``:
never answered), as a server that no longer has old data, and an answer stops before the range.
``--server-answers-every K``: only every K-th request is answered (the others dropped). ``--server-silent-at T
--server-silent-for D``: the server answers nothing from T s after the handler started, for D s. The report
counts what was given up that the server had (``given_up_but_server_had``: must be 0). The engine runs with the handler's defaults except ``--request-rate``,
``--max-outstanding`` and ``--give-up``. Reports when the stream caught up with live (the next sequence within
100 ms of what A sent), when it was complete (every message of the session delivered or given up), whether
anything was given up and when first, and this process's CPU per datagram (building the packets included: an
upper bound of the engine's). Arrivals reach the engine through its receive ring a millisecond at a time, each
with its own time.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import struct
import time

import numpy as np

from logbuf.feed.arbiter import Arbiter
from logbuf.feed.config import ArbiterConfig, RecoveryConfig
from logbuf.feed.events import Feed, GapUnrecoverable, RecoveryRequest
from logbuf.feed.feed_native import RecvRing
from logbuf.marketdata import moldudp64 as m

SESSION = m.encode_session("LATE01")
MS = 1_000_000
NS = 1_000_000_000
STEP_NS = MS  # arrivals are handed to the engine through its receive ring one millisecond at a time
LIVE_SLACK_NS = 100 * MS  # "caught up": within this much of the live stream
MESSAGE_LENGTH = 36  # an Add Order
BLOCK = 2 + MESSAGE_LENGTH


def packets(first: int, count: int, per: int) -> list[bytes]:
    """Packets of ``per`` messages covering [first, first + count): each message 'A', its sequence, filler."""
    seqs = np.arange(first, first + count, dtype=">u8")
    blocks = np.zeros((count, BLOCK), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(struct.pack(">H", MESSAGE_LENGTH), np.uint8)
    blocks[:, 2] = ord("A")
    blocks[:, 3:11] = seqs.view(np.uint8).reshape(count, 8)
    raw = blocks.tobytes()
    out = []
    for start in range(0, count, per):
        n = min(per, count - start)
        out.append(struct.pack(">10sQH", SESSION, first + start, n) + raw[start * BLOCK : (start + n) * BLOCK])
    return out


def run(args: argparse.Namespace) -> dict:
    per = args.messages_per_packet
    period = NS / args.rate
    total = int(args.rate * args.duration)  # packets per feed
    late = int(args.late_start * NS)
    recovery = RecoveryConfig(request_rate=args.request_rate, max_outstanding=args.max_outstanding,
                              give_up_ns=int(args.give_up * NS))
    arb = Arbiter(ArbiterConfig(), recovery, seed=1)
    ring = RecvRing(1024, 2048)
    answers_due: list[tuple[int, int, int]] = []  # (time, first, count)
    first_live = -(-late // int(period))  # the first packet the handler hears (by its send time)
    k = first_live
    server_burst = args.server_rate / 10  # 100 ms worth
    server_tokens = server_burst
    answers = dropped = processed = unanswerable = received = silenced = 0
    lack_first, lack_last = args.lacks
    silent_from = late + int(args.server_silent_at * NS)
    silent_until = silent_from + int(args.server_silent_for * NS)
    given_up_had = 0  # messages given up that the server had
    last_give_up_ns = None
    caught_up_ns = None
    complete_ns = None  # when every message of the session had been delivered or given up
    first_give_up_ns = None  # when something was first given up (to 10 ms)
    cpu = time.process_time()
    now = late
    while True:
        end = now + STEP_NS
        batch: list[tuple[int, Feed, bytes]] = []
        k_end = k
        while k_end < total and int(k_end * period) < end - MS:  # B is 1 ms behind A
            k_end += 1
        if k_end > k:
            for i, data in enumerate(packets(k * per + 1, (k_end - k) * per, per)):
                t = int((k + i) * period)
                batch += [(t, Feed.A, data), (t + MS, Feed.B, data)]
            k = k_end
        while answers_due and answers_due[0][0] < end:
            t, first, count = heapq.heappop(answers_due)
            batch.append((t, Feed.RETRANSMIT, packets(first, count, per)[0]))
            answers += 1
        batch.sort(key=lambda a: a[0])
        out = []
        for start in range(0, len(batch), ring.capacity):
            part = batch[start : start + ring.capacity]
            for slot, (t, feed, data) in enumerate(part):
                ring.load(slot, data, feed, t)
            out += arb.process(ring, 0, len(part))
        processed += len(batch)
        out += arb.on_tick(end)
        server_tokens = min(server_burst, server_tokens + STEP_NS * args.server_rate / NS)
        for event in out:
            if isinstance(event, GapUnrecoverable):
                lacked = max(0, min(event.last, lack_last) - max(event.first, lack_first) + 1)
                given_up_had += event.last - event.first + 1 - lacked
                last_give_up_ns = now
            if isinstance(event, RecoveryRequest):
                start, stop = event.seq, event.seq + event.count  # what it asked: [start, stop)
                if lack_first <= start <= lack_last:  # the server no longer has the first: it answers from what
                    unanswerable += 1  # it has of the rest, if anything (--server-strict: nothing)
                    start = lack_last + 1
                    if start >= stop or args.server_strict:
                        continue
                received += 1
                if silent_from <= end < silent_until:  # the server answers nothing for a while
                    silenced += 1
                    continue
                if args.server_answers_every > 1 and received % args.server_answers_every:
                    dropped += 1  # the server answers only every K-th request
                    continue
                if server_tokens < 1:  # over the server's limit: dropped (the pacing asks again)
                    dropped += 1
                    continue
                server_tokens -= 1
                count = min(stop - start, per)
                if start < lack_first:  # an answer stops before what the server lacks
                    count = min(count, lack_first - start)
                heapq.heappush(answers_due, (end + int(args.rtt_ms * MS), start, count))
        now = end
        if first_give_up_ns is None and (now // STEP_NS) % 10 == 0 and arb.counter_values()["messages_unrecoverable"]:
            first_give_up_ns = now
        expected = arb.expected or 1
        if caught_up_ns is None and expected - 1 >= (now - LIVE_SLACK_NS) / period * per:
            caught_up_ns = now
        if k >= total and not answers_due and not arb.recovering:
            complete_ns = now  # the whole session delivered or given up, nothing left to recover
            break
    cpu = time.process_time() - cpu
    counters = arb.counter_values()
    return {
        "rate_per_feed": args.rate, "messages_per_packet": per, "late_start_s": args.late_start,
        "past_packets": first_live, "request_rate": args.request_rate, "max_outstanding": args.max_outstanding,
        "server_rate": args.server_rate,
        "caught_up_after_start_s": None if caught_up_ns is None else round((caught_up_ns - late) / NS, 2),
        "complete_after_start_s": None if complete_ns is None else round((complete_ns - late) / NS, 2),
        "delivered": (arb.expected or 1) - 1, "expected": total * per,
        "unrecoverable": counters["messages_unrecoverable"],
        "first_give_up_after_start_s": None if first_give_up_ns is None else round((first_give_up_ns - late) / NS, 2), "requests": arb.requests_sent,
        "given_up_but_server_had": given_up_had,
        "last_give_up_after_start_s": None if last_give_up_ns is None else round((last_give_up_ns - late) / NS, 2),
        "server_lacks": args.server_lacks, "requests_for_lacking_data": unanswerable,
        "server_strict": args.server_strict, "server_answers_every": args.server_answers_every, "requests_during_silence": silenced,
        "requests_dropped_by_server": dropped, "answers": answers, "request_chunk": arb.request_chunk,
        "shed_packets": counters["shed_packets"], "queue_overflows": counters["queue_overflows"],
        "cpu_us_per_packet": round(cpu * 1e6 / max(1, processed), 2), "load": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20_000, help="packets per second per feed")
    parser.add_argument("--messages-per-packet", type=int, default=40)
    parser.add_argument("--late-start", type=float, default=60.0, help="seconds into the session the handler joins")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="seconds of session (default: until well after the catch-up)")
    parser.add_argument("--request-rate", type=float, default=40_000.0, help="the handler's --request-rate")
    parser.add_argument("--max-outstanding", type=int, default=512, help="the handler's --max-outstanding")
    parser.add_argument("--give-up", type=float, default=10.0, help="the handler's --give-up (s)")
    parser.add_argument("--server-rate", type=float, default=50_000.0, help="answers per second the server allows")
    parser.add_argument("--server-lacks", default="0",
                        help="N: the server lacks sequences 1..N; FIRST:LAST: it lacks FIRST..LAST (requests starting "
                        "there are never answered)")
    parser.add_argument("--server-strict", action="store_true",
                        help="a request starting where the server lacks data is not answered at all")
    parser.add_argument("--server-answers-every", type=int, default=1,
                        help="the server answers only every K-th request it receives")
    parser.add_argument("--server-silent-at", type=float, default=0.0,
                        help="seconds after the handler's start the server goes silent (with --server-silent-for)")
    parser.add_argument("--server-silent-for", type=float, default=0.0, help="seconds the server answers nothing")
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="request to answer")
    args = parser.parse_args()
    first, _, last = args.server_lacks.partition(":")
    args.lacks = (int(first), int(last)) if last else (1, int(first))
    if not args.duration:
        args.duration = args.late_start * 3 + 10
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
