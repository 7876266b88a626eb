"""Publisher process -> subscriber process over one log buffer: throughput and ping-pong rigs.

``throughput()`` measures messages/s one way (per-message ``offer``/``poll``, or ``offer_batch``/
``batch_poll``); ``ping_pong()`` measures round-trip times over two logs.  Each role runs in its own spawned
process.  Two set-ups with the same data path:

* driver-less (default): the parent creates the logs and runs the conductor's flow-control duty itself;
* ``via_driver=True``: the parent launches an embedded :class:`MediaDriver` and every role connects with
  ``logbuf.connect()`` and ``add_exclusive_publication`` / ``add_subscription``, as an application would.

Every process started here is stopped by PID before returning.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from logbuf.client.image import Image
from logbuf.client.publication import (
    ExclusivePublication,
)
from logbuf.driver.ipc_publication import IpcPublicationDuty
from logbuf.idle import BackoffIdleStrategy
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.position import Position, SharedPositions

CTX = multiprocessing.get_context("spawn")
DEFAULT_TERM_LENGTH = 16 * 1024 * 1024
DRIVER_TERM_LENGTH = "16m"
BATCH = 256  # messages per offer_batch / fragments per poll

# slots in the positions file, per log: pub-lmt, sub-pos, pub-pos
_SLOTS = 3


@dataclass
class ThroughputResult:
    mode: str
    size: int
    messages: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    cpu_s_per_million: float  # producer + consumer CPU seconds per million messages

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RttResult:
    size: int
    samples: int
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- process roles ------------------------------------------------------------------------------------


def _open(directory: str, log_index: int) -> tuple[LogBuffers, SharedPositions]:
    log = LogBuffers.open(os.path.join(directory, f"{log_index}.logbuffer"))
    return log, SharedPositions(os.path.join(directory, "positions"), slots=_SLOTS * 2)


_clients: list[Any] = []  # driver mode: the role's client stays open for the life of the process


def _driver_publication(directory: str, stream_index: int) -> ExclusivePublication:
    from logbuf.client.client import connect

    if not _clients:
        _clients.append(connect(directory[len("driver:"):]))
    term = _clients[0].add_exclusive_publication(f"aeron:ipc?term-length={DRIVER_TERM_LENGTH}", 1001 + stream_index)
    deadline = time.monotonic() + 30
    while not term.is_connected:
        if time.monotonic() > deadline:
            raise TimeoutError("no subscriber joined within 30 s")
        time.sleep(0.001)
    return term


def _driver_image(directory: str, stream_index: int, sub: Any = None) -> Image:
    from logbuf.client.client import connect

    if not _clients:
        _clients.append(connect(directory[len("driver:"):]))
    if sub is None:
        sub = _clients[0].add_subscription("aeron:ipc", 1001 + stream_index)
    deadline = time.monotonic() + 30
    while not sub.images:
        if time.monotonic() > deadline:
            raise TimeoutError("no publication within 30 s")
        time.sleep(0.001)
    return sub.images[0]


def _publication(directory: str, log_index: int, slot: int) -> ExclusivePublication:
    if directory.startswith("driver:"):
        return _driver_publication(directory, log_index)
    log, positions = _open(directory, log_index)
    return ExclusivePublication(log, positions.position(slot))


def _image(directory: str, log_index: int, slot: int) -> Image:
    if directory.startswith("driver:"):
        return _driver_image(directory, log_index)
    log, positions = _open(directory, log_index)
    return Image(log, positions.position(slot))


def _pub_and_image(directory: str, pub_index: int, pub_slot: int, image_index: int, image_slot: int
                   ) -> tuple[ExclusivePublication, Image]:
    """Both ends of a ping-pong role.  Through the driver: subscribe first, so the peer's publication can
    connect, then publish, then wait for the peer's image (either order alone would deadlock)."""
    if not directory.startswith("driver:"):
        return _publication(directory, pub_index, pub_slot), _image(directory, image_index, image_slot)
    from logbuf.client.client import connect

    if not _clients:
        _clients.append(connect(directory[len("driver:"):]))
    sub = _clients[0].add_subscription("aeron:ipc", 1001 + image_index)
    pub = _driver_publication(directory, pub_index)
    return pub, _driver_image(directory, image_index, sub)


def _producer(directory: str, size: int, count: int, batch: bool, results: Any) -> None:
    pub = _publication(directory, 0, 0)
    idle = BackoffIdleStrategy()
    cpu0 = _cpu_seconds()
    start = time.monotonic_ns()
    if batch:
        data = np.zeros(size * BATCH, dtype=np.uint8)
        lengths = np.full(BATCH, size, dtype=np.int32)
        sent = 0
        while sent < count:
            n = min(BATCH, count - sent)
            r = pub.offer_batch(data[: n * size], lengths[:n])
            sent += r.appended
            idle.idle(r.appended)
    else:
        message = bytes(size)
        offer = pub.offer
        sent = 0
        while sent < count:
            if offer(message) > 0:
                sent += 1
            else:
                idle.idle(0)
    results.put(("producer", start, time.monotonic_ns(), _cpu_seconds() - cpu0))


def _consumer(directory: str, count: int, batch: bool, results: Any) -> None:
    image = _image(directory, 0, 1)
    idle = BackoffIdleStrategy()
    cpu0 = _cpu_seconds()
    received = 0
    if batch:
        while received < count:
            with image.batch_poll(BATCH * 4) as fragments:
                received += fragments.count
                idle.idle(fragments.count)
    else:
        counter = [0]

        def on_fragment(buffer: memoryview, header: Any) -> None:
            counter[0] += 1

        poll = image.poll
        while counter[0] < count:
            idle.idle(poll(on_fragment, BATCH))
        received = counter[0]
    results.put(("consumer", 0, time.monotonic_ns(), _cpu_seconds() - cpu0))


def _pinger(directory: str, size: int, count: int, warmup: int, results: Any) -> None:
    pub, image = _pub_and_image(directory, 0, 0, 1, _SLOTS + 1)
    idle = BackoffIdleStrategy(max_spins=10_000, max_yields=100)
    message = bytes(size)
    got = [0]

    def on_pong(buffer: memoryview, header: Any) -> None:
        got[0] += 1

    rtts = np.empty(count, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(warmup + count):
        t0 = clock()
        while pub.offer(message) < 0:
            idle.idle(0)
        idle.reset()
        while got[0] <= i:
            idle.idle(image.poll(on_pong, 1))
        if i >= warmup:
            rtts[i - warmup] = clock() - t0
    results.put(("pinger", rtts))


def _ponger(directory: str, count: int, results: Any) -> None:
    pub, image = _pub_and_image(directory, 1, _SLOTS, 0, 1)
    idle = BackoffIdleStrategy(max_spins=10_000, max_yields=100)
    echoed = [0]

    def on_ping(buffer: memoryview, header: Any) -> None:
        while pub.offer(buffer) < 0:
            idle.idle(0)
        echoed[0] += 1

    while echoed[0] < count:
        idle.idle(image.poll(on_ping, 1))
    results.put(("ponger", echoed[0]))


# -- the rig ------------------------------------------------------------------------------------------


def _only(position: Position) -> Callable[[], Sequence[Position]]:
    """A duty's subscriber positions when there is exactly one, fixed subscriber."""
    return lambda: [position]


@contextmanager
def _rig(logs: int, term_length: int) -> Iterator[tuple[str, list[IpcPublicationDuty]]]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(prefix="logbuf-ipc-", dir=base)
    opened: list[LogBuffers] = []
    positions = SharedPositions(os.path.join(directory, "positions"), slots=_SLOTS * 2, create=True)
    try:
        duties = []
        for i in range(logs):
            log = LogBuffers.create(
                os.path.join(directory, f"{i}.logbuffer"), term_length=term_length, stream_id=1001 + i,
                pre_touch=True,
            )
            opened.append(log)
            limit, sub_pos, pub_pos = (positions.position(_SLOTS * i + k) for k in range(_SLOTS))
            duties.append(IpcPublicationDuty(log, pub_pos, limit, _only(sub_pos)))
        yield directory, duties
    finally:
        positions.close()
        for log in opened:
            log.close()
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def _driver_rig() -> Iterator[tuple[str, list[IpcPublicationDuty]]]:
    from logbuf.driver.media_driver import MediaDriver

    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(prefix="logbuf-drv-", dir=base)
    driver = MediaDriver.launch(os.path.join(directory, "driver"), pre_touch=True)
    try:
        yield "driver:" + str(driver.directory), []
    finally:
        driver.close()
        shutil.rmtree(directory, ignore_errors=True)


def _run(processes: list[Any], duties: list[IpcPublicationDuty], results: Any, expected: int, timeout: float) -> list:
    """Starts the processes, runs the conductor duty until every result is in, stops everything by PID."""
    out: list = []
    deadline = time.monotonic() + timeout
    idle = BackoffIdleStrategy(max_park_ns=1_000_000)
    try:
        for duty in duties:
            duty.update()
        for proc in processes:
            proc.start()
        while len(out) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"IPC sample did not finish in {timeout:.0f} s")
            work = sum(duty.update() for duty in duties)
            while not results.empty():
                out.append(results.get_nowait())
                work += 1
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a sample process failed: " + ", ".join(f"{p.name}={p.exitcode}" for p in processes))
            idle.idle(work)
        for proc in processes:
            proc.join(timeout=10)
    finally:
        for proc in processes:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(timeout=5)
    return out


def throughput(size: int, count: int, *, batch: bool = False, term_length: int = DEFAULT_TERM_LENGTH,
               timeout: float = 120.0, via_driver: bool = False) -> ThroughputResult:
    """One publisher process -> one subscriber process: ``count`` messages of ``size`` bytes."""
    with _driver_rig() if via_driver else _rig(1, term_length) as (directory, duties):
        results = CTX.Queue()
        procs = [
            CTX.Process(target=_consumer, args=(directory, count, batch, results), name="consumer"),
            CTX.Process(target=_producer, args=(directory, size, count, batch, results), name="producer"),
        ]
        out = {r[0]: r for r in _run(procs, duties, results, 2, timeout)}
    start, end = out["producer"][1], out["consumer"][2]
    seconds = (end - start) / 1e9
    cpu = out["producer"][3] + out["consumer"][3]
    return ThroughputResult(
        mode=("batch" if batch else "per-message") + (" via driver" if via_driver else ""),
        size=size,
        messages=count,
        seconds=seconds,
        msgs_per_s=count / seconds,
        mb_per_s=count * size / seconds / 1e6,
        cpu_s_per_million=cpu / count * 1e6,
    )


def ping_pong(size: int, count: int, *, warmup: int = 10_000, term_length: int = DEFAULT_TERM_LENGTH,
              timeout: float = 120.0, via_driver: bool = False) -> RttResult:
    """Round-trip times: pinger offers, ponger echoes on a second log, pinger waits for the echo."""
    with _driver_rig() if via_driver else _rig(2, term_length) as (directory, duties):
        results = CTX.Queue()
        procs = [
            CTX.Process(target=_ponger, args=(directory, warmup + count, results), name="ponger"),
            CTX.Process(target=_pinger, args=(directory, size, count, warmup, results), name="pinger"),
        ]
        out = {r[0]: r for r in _run(procs, duties, results, 2, timeout)}
    rtts = out["pinger"][1] / 1000.0
    p50, p99, p999 = np.percentile(rtts, [50, 99, 99.9])
    return RttResult(size, count, float(p50), float(p99), float(p999), float(rtts.max()))
