"""Runs one case of one peer in fresh spawned processes and measures it.

Throughput (``producers`` producer processes -> one consumer process)::

    parent: open the peer's Channel (files, queue, service), start the processes
    all:    open their end, wait at `ready`            (sockets connected, services opened)
    warm-up: each producer sends `warmup` messages; the consumer receives and checks them all
    all:    wait at `go`                               (nothing is in flight any more)
    measured: producers record start time and rusage, send `count` each, flush, record rusage
              the consumer receives producers*count, records end time and rusage
    parent: runs the channel's duty meanwhile (logbuf's conductor; its CPU counts as helper CPU)

msg/s = producers*count / (consumer end - earliest producer start), on CLOCK_MONOTONIC across processes.
CPU = the producers' + the consumer's + the helper's rusage over the measured part.  The consumer returns the
sum of the stamps it received; a run whose count or checksum is off is a failed run, never a number.

Ping-pong: a pinger sends one message on one channel, a ponger echoes its stamp on a second channel of the
same kind, the pinger times each round trip with ``perf_counter_ns`` and checks the echoed stamp.

Every process started here is stopped by its PID before returning, whatever happens.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import resource
import signal
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench import machine
from bench.peers import peer as peer_by_key
from bench.peers.base import RING_MASK, Channel, expected_checksum
from logbuf.idle import BackoffIdleStrategy

CTX = multiprocessing.get_context("spawn")
BARRIER_TIMEOUT_S = 60.0
DONE_TIMEOUT_S = 600.0
MIN_WINDOW_S = 0.25  # shortest window for which the others' CPU share is reported


class RunFailed(RuntimeError):
    """A run did not produce a trustworthy number (a process failed, data was wrong, or it timed out)."""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class ThroughputRun:
    peer: str
    size: int
    producers: int
    messages: int  # measured messages, all producers
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    cpu_producers: float  # CPU seconds over the measured part
    cpu_consumer: float
    cpu_helper: float  # the parent's duty cycle (logbuf's conductor) or an out-of-process driver
    cpu_s_per_million: float
    others_cpu: float  # share of the machine's CPU used by other processes during the run (0..1)
    steal: float  # share of the vCPUs' time the hypervisor gave to someone else

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RttRun:
    peer: str
    wait: str
    size: int
    samples: int
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float
    others_cpu: float
    steal: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Sync:
    """Barriers and events shared by the processes of one run (created from the spawn context)."""

    def __init__(self, parties: int) -> None:
        self.ready = CTX.Barrier(parties, timeout=BARRIER_TIMEOUT_S)
        self.go = CTX.Barrier(parties, timeout=BARRIER_TIMEOUT_S)
        self.measuring = CTX.Event()
        self.done = CTX.Event()  # the consumer has everything: producers may disconnect now

    def abort(self) -> None:
        self.ready.abort()
        self.go.abort()


# -- process roles ------------------------------------------------------------------------------------


def _guard(role: str, sync: _Sync, results: Any, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except BaseException:
        sync.abort()  # whoever waits at a barrier fails fast instead of timing out
        results.put(("error", role, traceback.format_exc()))
        raise SystemExit(1) from None


def _producer(key: str, spec: Any, producer: int, size: int, warmup: int, count: int, sync: _Sync,
              results: Any) -> None:
    tx = peer_by_key(key).sender(spec, producer, size)
    sync.ready.wait()
    tx.send(warmup)
    sync.go.wait()
    cpu0, t0 = _cpu(), time.monotonic_ns()
    tx.send(count)
    t1 = time.monotonic_ns()
    # stay connected until the consumer has everything: a pyzmq PULL drops what it has queued from a PUSH
    # that disconnects, and mp.Queue's feeder thread is still writing (its CPU counts too)
    if not sync.done.wait(DONE_TIMEOUT_S):
        raise TimeoutError("the consumer did not finish")
    cpu = _cpu() - cpu0
    tx.close()
    results.put(("producer", producer, t0, t1, cpu))


def _consumer(key: str, spec: Any, size: int, producers: int, warmup: int, count: int, sync: _Sync,
              results: Any) -> None:
    p = peer_by_key(key)
    rx = p.receiver(spec, size, p.wait)
    sync.ready.wait()
    warm_sum = rx.receive(producers * warmup)
    sync.go.wait()
    cpu0, t0 = _cpu(), time.monotonic_ns()
    sync.measuring.set()
    total = rx.receive(producers * count)
    t1 = time.monotonic_ns()
    cpu = _cpu() - cpu0
    sync.done.set()
    rx.close()
    results.put(("consumer", t0, t1, cpu, warm_sum, total))


def _ponger(key: str, ping: Any, pong: Any, size: int, rounds: int, wait: str, sync: _Sync, results: Any) -> None:
    p = peer_by_key(key)
    rx = p.receiver(ping, size, wait)
    tx = p.sender(pong, 0, size)
    sync.ready.wait()
    send_one, receive_one = tx.send_one, rx.receive_one
    cpu0 = _cpu()
    for _ in range(rounds):
        send_one(receive_one())
    cpu = _cpu() - cpu0
    if not sync.done.wait(DONE_TIMEOUT_S):  # the last echo must arrive before we disconnect
        raise TimeoutError("the pinger did not finish")
    tx.close()
    rx.close()
    results.put(("ponger", cpu, rounds))


def _pinger(key: str, ping: Any, pong: Any, size: int, warmup: int, count: int, wait: str, sync: _Sync,
            results: Any) -> None:
    p = peer_by_key(key)
    tx = p.sender(ping, 0, size)
    rx = p.receiver(pong, size, wait)
    sync.ready.wait()
    send_one, receive_one = tx.send_one, rx.receive_one
    bad = 0
    for i in range(warmup):
        send_one(i)
        bad += receive_one() != i & RING_MASK
    rtts = np.empty(count, dtype=np.int64)
    clock = time.perf_counter_ns
    sync.measuring.set()
    cpu0 = _cpu()
    for i in range(count):
        k = i & RING_MASK  # producer 0's stamp for ring message k is k
        t0 = clock()
        send_one(k)
        echoed = receive_one()
        rtts[i] = clock() - t0
        if echoed != k:
            bad += 1
    cpu = _cpu() - cpu0
    sync.done.set()
    tx.close()
    rx.close()
    results.put(("pinger", rtts, bad, cpu))


# -- the parent ---------------------------------------------------------------------------------------


def _stop(processes: list[Any]) -> None:
    for proc in processes:
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
    for proc in processes:
        if proc.pid is not None:
            proc.join(timeout=5)


class _Window:
    """The measured part as the parent sees it: helper CPU, the channel's driver CPU, and the system's CPU."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.started = False
        self.helper = 0.0
        self.system: dict[str, float] = {}

    def start(self) -> None:
        self.started = True
        self._cpu0 = _cpu()
        self._driver0 = self._channel.cpu_seconds()
        self._system = machine.SystemCpu()

    def stop(self) -> None:
        if not self.started:
            self.start()
        self.helper = _cpu() - self._cpu0
        driver1 = self._channel.cpu_seconds()
        if driver1 is not None and self._driver0 is not None:
            self.helper += driver1 - self._driver0
        self.system = self._system.stop()


def _collect(processes: list[Any], channel: Channel, sync: _Sync, results: Any, expected: int,
             timeout: float) -> tuple[dict[str, list[tuple]], _Window]:
    """Starts the processes and gathers ``expected`` results, running the channel's duty meanwhile."""
    out: dict[str, list[tuple]] = {}
    got = 0
    window = _Window(channel)
    idle = BackoffIdleStrategy(max_park_ns=1_000_000)
    deadline = time.monotonic() + timeout
    try:
        for proc in processes:
            proc.start()
        while got < expected:
            if time.monotonic() > deadline:
                raise RunFailed(f"timed out after {timeout:.0f} s")
            work = channel.duty() if channel.has_duty else 0
            # with a duty to run, only peek; otherwise block briefly so the window starts on time
            if not window.started and (sync.measuring.is_set() if channel.has_duty else sync.measuring.wait(0.02)):
                window.start()
            if channel.has_duty or not window.started:
                while not results.empty():
                    item = results.get_nowait()
                    out.setdefault(item[0], []).append(item[1:])
                    got += 1
                    work += 1
            else:
                try:
                    item = results.get(timeout=0.05)
                except queue.Empty:
                    pass
                else:
                    out.setdefault(item[0], []).append(item[1:])
                    got += 1
            if "error" in out:
                role, text = out["error"][0]
                raise RunFailed(f"{role} failed:\n{text}")
            failed = [p for p in processes if p.exitcode not in (None, 0)]
            if failed and results.empty():
                raise RunFailed("process failed: " + ", ".join(f"{p.name} exit {p.exitcode}" for p in failed))
            if channel.has_duty:
                idle.idle(work)
        window.stop()
        for proc in processes:
            proc.join(timeout=10)
    finally:
        _stop(processes)
    return out, window


def throughput(key: str, size: int, *, producers: int = 1, count: int, warmup: int = 1000, multi: bool = False,
               timeout: float = 300.0) -> ThroughputRun:
    """``producers`` processes send ``count`` measured messages each (after ``warmup``) to one consumer."""
    if producers < 1 or count < 1 or warmup < 0:
        raise ValueError("need producers >= 1, count >= 1, warmup >= 0")
    p = peer_by_key(key)
    reason = p.skip_reason(size, producers)
    if reason:
        raise RunFailed(f"{p.label} cannot run: {reason}")
    with p.channel(size, producers, multi=multi) as channel:
        sync = _Sync(producers + 1)
        results = CTX.Queue()
        spec = channel.spec
        processes = [CTX.Process(target=_guard, name="consumer", args=(
            "consumer", sync, results, _consumer, key, spec, size, producers, warmup, count, sync, results))]
        processes += [
            CTX.Process(target=_guard, name=f"producer-{i}", args=(
                f"producer {i}", sync, results, _producer, key, spec, i, size, warmup, count, sync, results))
            for i in range(producers)
        ]
        out, window = _collect(processes, channel, sync, results, producers + 1, timeout)
    (_, t1, cpu_consumer, warm_sum, total), = out["consumer"]
    if warm_sum != expected_checksum(producers, 0, warmup):
        raise RunFailed(f"{p.label}: warm-up checksum {warm_sum} != {expected_checksum(producers, 0, warmup)}")
    want = expected_checksum(producers, warmup, warmup + count)
    if total != want:
        raise RunFailed(f"{p.label}: checksum {total} != {want}: messages were lost, duplicated or corrupted")
    start = min(r[1] for r in out["producer"])
    seconds = (t1 - start) / 1e9
    messages = producers * count
    cpu_producers = sum(r[3] for r in out["producer"])
    cpu_total = cpu_producers + cpu_consumer + window.helper
    return ThroughputRun(
        peer=key, size=size, producers=producers, messages=messages, seconds=seconds,
        msgs_per_s=messages / seconds, mb_per_s=messages * size / seconds / 1e6,
        cpu_producers=cpu_producers, cpu_consumer=cpu_consumer, cpu_helper=window.helper,
        cpu_s_per_million=cpu_total / messages * 1e6,
        others_cpu=_others(window.system, cpu_total), steal=window.system.get("steal_share", 0.0),
    )


def ping_pong(key: str, size: int, *, wait: str, count: int, warmup: int = 1000, timeout: float = 300.0) -> RttRun:
    """Round-trip times of ``count`` ping-pongs (after ``warmup``) over two channels of the peer's kind."""
    p = peer_by_key(key)
    if wait not in p.rtt_waits:
        raise ValueError(f"{p.label} offers no {wait!r} wait for ping-pong (has {p.rtt_waits})")
    reason = p.skip_reason(size, 1)
    if reason:
        raise RunFailed(f"{p.label} cannot run: {reason}")
    with p.channel(size, 1) as ping, p.channel(size, 1) as pong:
        channel = _Pair(ping, pong)
        sync = _Sync(2)
        results = CTX.Queue()
        processes = [
            CTX.Process(target=_guard, name="ponger", args=(
                "ponger", sync, results, _ponger, key, ping.spec, pong.spec, size, warmup + count, wait, sync,
                results)),
            CTX.Process(target=_guard, name="pinger", args=(
                "pinger", sync, results, _pinger, key, ping.spec, pong.spec, size, warmup, count, wait, sync,
                results)),
        ]
        out, window = _collect(processes, channel, sync, results, 2, timeout)
    (rtts, bad, cpu_pinger), = out["pinger"]
    (cpu_ponger, rounds), = out["ponger"]
    # the ponger's CPU covers warm-up too: take its measured share
    ours = cpu_pinger + cpu_ponger * count / rounds + window.helper
    if bad:
        raise RunFailed(f"{p.label}: {bad} echoes carried the wrong stamp")
    us = rtts / 1000.0
    p50, p99, p999 = np.percentile(us, [50, 99, 99.9])
    return RttRun(peer=key, wait=wait, size=size, samples=count, p50_us=float(p50), p99_us=float(p99),
                  p999_us=float(p999), max_us=float(us.max()),
                  others_cpu=_others(window.system, ours), steal=window.system.get("steal_share", 0.0))


class _Pair(Channel):
    """Both directions of a ping-pong as one channel for the parent's duty loop."""

    def __init__(self, a: Channel, b: Channel) -> None:
        self._a, self._b = a, b
        self.has_duty = a.has_duty or b.has_duty

    def duty(self) -> int:
        return self._a.duty() + self._b.duty()

    def cpu_seconds(self) -> float | None:
        a, b = self._a.cpu_seconds(), self._b.cpu_seconds()
        return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def _others(system: dict[str, float], ours: float) -> float:
    """Share of the machine's CPU capacity that processes other than this run's used during the window
    (approximate: the processes' own measured windows and the parent's differ by a few milliseconds)."""
    if not system or system["seconds"] < MIN_WINDOW_S:
        return float("nan")  # /proc/stat counts 10 ms jiffies: too coarse for a shorter window
    return min(1.0, max(0.0, (system["busy_s"] - ours) / system["capacity_s"]))
