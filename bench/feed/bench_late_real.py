"""A late start through the real processes: the market-open profile (``bench_profile.py``: the replay sender
with A/B at 20 k packets/s of 40 messages, 0.5 % loss, 150 ms freezes of A every 10 s, a retransmission server
process, the media driver, ``logbuf feed`` and a checking subscriber) with the handler started ``--late-start``
seconds into the session and ``--join from-start``: it recovers the past from the server while the live stream
queues.

    PYTHONPATH=src .venv/bin/python bench/feed/bench_late_real.py --late-start 20 --duration 60
    PYTHONPATH=src .venv/bin/python bench/feed/bench_late_real.py                       # 60 s late, 100 s session

Reported (one JSON line, then a short summary): messages delivered / sent, unrecoverable, when the handler
caught up with live (``caught_up_live_s``, below; ``caught_up_after_start_s`` is bench_profile.py's first
moment the subscriber was within 100 ms of the live edge) and when the subscriber had every message, counted
from the handler's start, the server's
answers per second (the handler's ``requests_answered`` counter sampled every 0.2 s: the mean from the first
answer until 95 % of them had come, and the best second), the peak of the handler's out-of-order queue
(``queued_packets`` × the datagram size), and the load average before and after. The handler's pacing is set for the server's measured
speed: ``--request-rate`` under what the server answers on this machine, a window of requests in flight, and a
queue in memory for the live stream meanwhile (``--queue-bytes``); change them with ``--request-rate``,
``--max-outstanding``, ``--queue-mib`` or pass more with ``--handler-arg``.

Caught up with live (``caught_up_live_s``, from the handler's start): the first sample from which the handler's
expected sequence (its ``published`` counter + 1, refreshed every 100 ms) stays within ``--live-within`` seconds
(default 0.5) of the live edge (the sender's schedule: seconds since the session's first packet × packets/s ×
40) in every later sample until the session's last packet; null when it never does. Also reported: the lag at
the session's end and the largest lag after catching up. CPU per process (``cpu``): seconds of CPU (user +
system, from /proc) each process of the run used from the handler's start until it caught up (or the session
ended) and until the run's end, with the share of a core: the handler, the retransmission server (a child of
the sender), the sender, the subscriber, the driver (threads of this process; the sampler's own CPU taken
out), and the rest of the machine (``other``: /proc/stat's busy time minus ours, i.e. other people's work).
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
SAMPLED = (b"queued_packets", b"requests_answered", b"recovery_requests", b"published", b"shed_packets",
           b"back_pressure_waits", b"A.kernel_drops", b"B.kernel_drops", b"cpu_us")


ROLES = ("handler", "server", "sender", "subscriber", "driver", "busy", "other")
_TICK = os.sysconf("SC_CLK_TCK")


def _role(pid: int, me: int) -> str | None:
    """Which process of the run ``pid`` is (by its command line), None for one that is not ours to name."""
    if pid == me:
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    if b"logbuf.exchange.retransmit.process" in argv:
        return "server"
    if b"logbuf.cli" in argv and b"feed" in argv:
        return "handler"
    if b"--role" in argv:
        role = argv[argv.index(b"--role") + 1] if argv.index(b"--role") + 1 < len(argv) else b""
        return {b"sender": "sender", b"subscriber": "subscriber"}.get(role)
    return "busy" if argv and argv[0].endswith(b"yes") else None


def _machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / _TICK


class ProcessCpu:
    """CPU seconds per process of the run (this process and its descendants, by role), cumulative."""

    def __init__(self) -> None:
        self.me = os.getpid()
        self._seen: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, start time) -> (role, CPU seconds)
        self._roles: dict[int, str | None] = {}

    def sample(self, own_thread_cpu: float) -> dict[str, float]:
        parents: dict[int, int] = {}
        stats: dict[int, list[str]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            stats[int(entry)] = fields
        ours = {self.me}
        changed = True
        while changed:  # descendants of this process
            changed = False
            for pid, parent in parents.items():
                if parent in ours and pid not in ours:
                    ours.add(pid)
                    changed = True
        for pid in ours:
            if pid not in self._roles:
                self._roles[pid] = _role(pid, self.me)
            role = self._roles[pid]
            fields = stats.get(pid)
            if role is None or fields is None:
                continue
            cpu = (int(fields[11]) + int(fields[12])) / _TICK
            if pid == self.me:
                cpu = max(0.0, cpu - own_thread_cpu)  # the driver's threads, not the sampler's
            self._seen[(pid, int(fields[19]))] = (role, cpu)
        totals = dict.fromkeys(ROLES, 0.0)
        for role, cpu in self._seen.values():
            totals[role] += cpu
        totals["other"] = _machine_busy_seconds() - sum(totals.values()) - own_thread_cpu
        return totals


class CounterSampler:
    """The handler's counters every ``interval`` seconds from a client of the bench's driver, and the CPU of
    every process of the run every second (a thread)."""

    def __init__(self, directory: object, interval: float = 0.2) -> None:
        self.directory = directory
        self.interval = interval
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.cpu: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import logbuf

        processes = ProcessCpu()
        with logbuf.connect(self.directory) as client:
            ids: dict[str, int] = {}
            ticks = 0
            while not self._stop.wait(self.interval):
                if ticks % max(1, round(1.0 / self.interval)) == 0:
                    self.cpu.append((time.monotonic(), processes.sample(time.thread_time())))
                ticks += 1
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


def caught_up(samples: list[tuple[float, dict[str, int]]], started_at: float, handler_start: float,
              session_end: float, rate: float, within_s: float) -> dict:
    """When the handler's expected sequence reached the live edge and stayed within ``within_s`` of it until the
    session's end (see the module's docstring), the lag then, and the largest lag after catching up."""
    per_second = rate * bench_profile.MESSAGES_PER_PACKET
    lags = [(t, (t - started_at) - counters["published"] / per_second) for t, counters in samples
            if handler_start <= t <= session_end]
    if not lags:
        return {"caught_up_live_s": None}
    since = None
    for t, lag in lags:  # the start of the last run of samples within the bound
        if lag > within_s:
            since = None
        elif since is None:
            since = t
    after = [lag for t, lag in lags if since is not None and t >= since]
    return {"caught_up_live_s": None if since is None else round(since - handler_start, 1),
            "lag_at_session_end_s": round(lags[-1][1], 2),
            "max_lag_after_catching_up_s": round(max(after), 2) if after else None,
            "live_within_s": within_s}


def cpu_table(cpu: list[tuple[float, dict[str, float]]], handler_start: float, until: float) -> dict:
    """CPU seconds per role between ``handler_start`` and ``until`` (the nearest samples), and core shares."""
    if len(cpu) < 2:
        return {}
    first = min(cpu, key=lambda s: abs(s[0] - handler_start))
    last = min(cpu, key=lambda s: abs(s[0] - until))
    span = max(1e-9, last[0] - first[0])
    seconds = {role: round(last[1][role] - first[1][role], 1) for role in ROLES}
    return {"seconds": round(span, 1), "cpu_s": seconds,
            "cores": {role: round(v / span, 2) for role, v in seconds.items()}}


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
    parser.add_argument("--trace", default=None, metavar="FILE",
                        help="write the samples (counters every 0.2 s, CPU per process every second) as JSON")
    parser.add_argument("--live-within", type=float, default=0.5,
                        help="caught up: the expected sequence within this many seconds of the live edge (0.5)")
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
    sampler = samplers[0] if samplers else None
    result.update(summarize(sampler.samples if sampler else []))
    started_at = result.pop("started_at_monotonic", None)
    if sampler is not None and started_at is not None:
        handler_start = started_at + result["late_start_s"]
        session_end = started_at + args.duration
        live = caught_up(sampler.samples, started_at, handler_start, session_end, args.rate, args.live_within)
        result.update(live)
        until = (handler_start + live["caught_up_live_s"] if live.get("caught_up_live_s") is not None
                 else session_end)
        if args.trace:  # times from the session's first packet
            Path(args.trace).write_text(json.dumps({
                "late_start_s": result["late_start_s"], "rate": args.rate, "duration": args.duration,
                "counters": [(round(t - started_at, 2), c) for t, c in sampler.samples],
                "cpu": [(round(t - started_at, 2), {k: round(v, 2) for k, v in c.items()}) for t, c in sampler.cpu]}))
        result["cpu"] = {"until_caught_up_or_session_end": cpu_table(sampler.cpu, handler_start, until),
                         "until_run_end": cpu_table(sampler.cpu, handler_start, sampler.cpu[-1][0]
                                                    if sampler.cpu else handler_start)}
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
          f"with live {result.get('caught_up_live_s')} s after the start and stayed (None: not while the "
          f"session ran; lag at its end {result.get('lag_at_session_end_s')} s), "
          f"everything {result['complete_after_start_s']} s after the start "
          f"({result['complete_after_session_end_s']} s after the session's end), server "
          f"{result.get('server_answers_per_s_mean', 0):,} answers/s (best second "
          f"{result.get('server_answers_per_s_best', 0):,}), peak queue {result.get('peak_queue_mib', 0)} MiB, "
          f"load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    for window, table in result.get("cpu", {}).items():
        if table:
            print(f"CPU from the handler's start {window.replace('_', ' ')} ({table['seconds']} s): "
                  + ", ".join(f"{role} {table['cpu_s'][role]} s ({table['cores'][role]:.2f} core)" for role in ROLES),
                  flush=True)
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
