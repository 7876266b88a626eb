"""A late start through the real processes: the market-open profile (``bench_profile.py``: the replay sender
with A/B at 20 k packets/s of 40 messages, 0.5 % loss, 150 ms freezes of A every 10 s, a retransmission server
process, the media driver, ``logbuf feed`` and a checking subscriber) with the handler started ``--late-start``
seconds into the session and ``--join from-start``: it recovers the past from the server while the live stream
queues.

    PYTHONPATH=src .venv/bin/python bench/feed/bench_late_real.py --late-start 20 --duration 60
    PYTHONPATH=src .venv/bin/python bench/feed/bench_late_real.py                       # 60 s late, 100 s session

Reported (one JSON line, then a short summary): messages delivered / sent, unrecoverable, when the handler
caught up with live (the subscriber within 100 ms of the live edge; null when not before the session ended)
and when the subscriber had every message, counted from the handler's start, the server's
answers per second (the handler's ``requests_answered`` counter sampled every 0.2 s: the mean from the first
answer until 95 % of them had come, and the best second), the peak of the handler's out-of-order queue
(``queued_packets`` × the datagram size), and the load average before and after. The handler's pacing is set for the server's measured
speed: ``--request-rate`` under what the server answers on this machine, a window of requests in flight, and a
queue in memory for the live stream meanwhile (``--queue-bytes``); change them with ``--request-rate``,
``--max-outstanding``, ``--queue-mib`` or pass more with ``--handler-arg``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_profile  # noqa: E402

FEED_COUNTER_TYPE = bench_profile.HANDLER_COUNTER_TYPE
DATAGRAM_BYTES = bench_profile.BUDGET  # every packet of the profile carries 40 messages: 1,540 bytes
SAMPLED = (b"queued_packets", b"requests_answered", b"recovery_requests", b"published")


class CounterSampler:
    """The handler's counters every ``interval`` seconds from a client of the bench's driver (a thread)."""

    def __init__(self, directory: object, interval: float = 0.2) -> None:
        self.directory = directory
        self.interval = interval
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import logbuf

        with logbuf.connect(self.directory) as client:
            ids: dict[str, int] = {}
            while not self._stop.wait(self.interval):
                counters = client.counters
                if len(ids) < len(SAMPLED):  # the handler starts late: look for its counters until found
                    ids = {info.key.rstrip(b"\0").decode(): info.counter_id for info in counters
                           if info.type_id == FEED_COUNTER_TYPE and info.key.rstrip(b"\0") in SAMPLED}
                    continue
                self.samples.append((time.monotonic(), {k: counters.counter_value(i) for k, i in ids.items()}))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def summarize(samples: list[tuple[float, dict[str, int]]]) -> dict:
    """Peak queue, the server's answers per second (mean over the recovery, best one-second window)."""
    if not samples:
        return {}
    peak_queue = max(s["queued_packets"] for _, s in samples)
    answered = [(t, s["requests_answered"]) for t, s in samples]
    moving = [(t, n) for (t, n), (_, before) in zip(answered[1:], answered, strict=False) if n > before]
    best = 0.0
    j = 0
    for i in range(len(answered)):  # the best window of >= 1 s
        while j < i and answered[i][0] - answered[j + 1][0] >= 1.0:
            j += 1
        span = answered[i][0] - answered[j][0]
        if span >= 1.0:
            best = max(best, (answered[i][1] - answered[j][1]) / span)
    # the mean over the recovery of the backlog: from the first answer until 95 % of all answers had come
    # (afterwards only the live stream's few holes are fetched)
    mean = 0.0
    if moving:
        before = [(t, n) for t, n in answered if t < moving[0][0]]
        start_t, start_n = before[-1] if before else (answered[0][0] - 0.2, 0)
        target = start_n + 0.95 * (answered[-1][1] - start_n)
        end_t, end_n = next((t, n) for t, n in answered if n >= target)
        mean = (end_n - start_n) / max(0.2, end_t - start_t)
    return {"peak_queued_packets": peak_queue, "peak_queue_mib": round(peak_queue * DATAGRAM_BYTES / 2**20, 1),
            "requests_answered": answered[-1][1], "server_answers_per_s_mean": round(mean),
            "server_answers_per_s_best": round(best),
            "recovery_requests": samples[-1][1]["recovery_requests"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--late-start", type=float, default=60.0, help="seconds into the session (default 60)")
    parser.add_argument("--duration", type=float, default=100.0, help="seconds of traffic (default 100)")
    parser.add_argument("--rate", type=float, default=20_000, help="packets per second per feed (default 20000)")
    parser.add_argument("--request-rate", type=float, default=30_000,
                        help="the handler's re-requests per second (under the server's measured speed)")
    parser.add_argument("--max-outstanding", type=int, default=512, help="the handler's requests in flight")
    parser.add_argument("--queue-mib", type=int, default=1024,
                        help="the handler's out-of-order queue (--queue-bytes) in MiB (default 1024: ~35 s of live)")
    parser.add_argument("--retransmit-rate", type=float, default=50_000.0,
                        help="the server's per-client limit, answers per second (default 50000)")
    parser.add_argument("--ring-bits", type=int, default=0,
                        help="the server keeps the last 2**BITS messages (default: enough for the session)")
    parser.add_argument("--linger", type=float, default=180.0, help="seconds the handler may take after the end")
    parser.add_argument("--busy-cores", type=int, default=0, help="processes keeping a core busy meanwhile")
    parser.add_argument("--handler-arg", action="append", default=[], metavar="ARG",
                        help="more arguments for logbuf feed (repeat)")
    parser.add_argument("--work-dir", default=None, help="where the day file goes (default: a temporary directory)")
    args = parser.parse_args(argv)
    messages = int(args.rate * args.duration) * bench_profile.MESSAGES_PER_PACKET
    ring_bits = args.ring_bits or max(20, (messages - 1).bit_length())
    profile = argparse.Namespace(
        duration=args.duration, loss=0.005, freeze_every=10.0, freeze_ms=150.0, b_lag=5, linger=args.linger,
        seed=1, term_mib=64, ring_bits=ring_bits, retransmit_rate=args.retransmit_rate, no_segment=False,
        no_prebuild=False, batch_us=250.0, busy_cores=args.busy_cores, late_start=args.late_start, stall=60.0,
        handler_arg=["--join=from-start", f"--request-rate={args.request_rate:g}",
                     f"--max-outstanding={args.max_outstanding}", f"--queue-bytes={args.queue_mib << 20}",
                     f"--queue-packets={max(1 << 20, (args.queue_mib << 20) // DATAGRAM_BYTES)}",
                     *args.handler_arg])
    samplers: list[CounterSampler] = []

    def watch(directory: object) -> CounterSampler:
        samplers.append(CounterSampler(directory))
        return samplers[-1]

    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="bench-late-real-") as work:
        result = bench_profile.run_profile(profile, args.rate, Path(work), watch=watch)
    result.update(summarize(samplers[0].samples if samplers else []))
    # caught up with live while the session ran (the subscriber within 100 ms of the live edge), or else only
    # once the session ended: when the subscriber had everything, counted from the handler's start
    result["complete_after_start_s"] = round(result["complete_after_s"] - result["late_start_s"], 1)
    result["complete_after_session_end_s"] = round(result["complete_after_s"] - args.duration, 1)
    result.update(sent=result["expected"], load_before=[round(x, 2) for x in load_before],
                  load_after=[round(x, 2) for x in os.getloadavg()], wall_s=round(time.monotonic() - started, 1),
                  handler_args=profile.handler_arg, ring_bits=ring_bits)
    print(json.dumps(result), flush=True)
    print(f"late start {args.late_start:g} s into {args.rate:,.0f} packets/s per feed: delivered "
          f"{result['delivered']:,} / {result['expected']:,}, unrecoverable {result['unrecoverable']:,}, caught up "
          f"with live {result.get('caught_up_after_start_s')} s after the start (None: not while it ran), "
          f"everything {result['complete_after_start_s']} s after the start "
          f"({result['complete_after_session_end_s']} s after the session's end), server "
          f"{result.get('server_answers_per_s_mean', 0):,} answers/s (best second "
          f"{result.get('server_answers_per_s_best', 0):,}), peak queue {result.get('peak_queue_mib', 0)} MiB, "
          f"load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
