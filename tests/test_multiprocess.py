"""Several processes on one log: exactly-once under contention, and a publisher killed mid-claim."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import zlib

import pytest

import mp_workers as w
from logbuf import ConcurrentPublication, Image, LogBuffers
from logbuf.driver.ipc_publication import IpcPublicationDuty
from logbuf.idle import BackoffIdleStrategy
from logbuf.position import SharedPositions
from support import stop_process

CTX = multiprocessing.get_context("spawn")


@pytest.fixture
def shared(shm_dir):
    log_path = os.path.join(shm_dir, "stress.logbuffer")
    positions_path = os.path.join(shm_dir, "positions")
    log = LogBuffers.create(log_path, term_length=1024 * 1024, session_id=1, stream_id=2)
    positions = SharedPositions(positions_path, create=True)
    yield log, positions, log_path, positions_path
    positions.close()
    log.close()


def _conductor(log, positions, unblock_timeout_ns=15_000_000_000):
    return IpcPublicationDuty(
        log,
        positions.position(w.PUB_POS_SLOT),
        positions.position(w.LIMIT_SLOT),
        lambda: [positions.position(w.SUB_POS_SLOT)],
        unblock_timeout_ns=unblock_timeout_ns,
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_four_publisher_processes_exactly_once_in_order(shared) -> None:
    log, positions, log_path, positions_path = shared
    # 4 x 50k messages of 64..128 bytes cross a 1 MiB term ~16 times: contention and rotations, in seconds
    publishers, count = 4, 50_000
    deadline = time.monotonic() + 150
    duty = _conductor(log, positions)
    duty.update()
    results = CTX.Queue()
    sub = CTX.Process(target=w.subscriber, args=(log_path, positions_path, publishers, count, deadline, results))
    pubs = [
        CTX.Process(target=w.publisher, args=(log_path, positions_path, i, count, deadline))
        for i in range(publishers)
    ]
    procs = [sub, *pubs]
    try:
        for proc in procs:
            proc.start()
        idle = BackoffIdleStrategy(max_park_ns=200_000)
        while sub.is_alive() and time.monotonic() < deadline:
            idle.idle(duty.update())
        outcome = results.get(timeout=10)
        for proc in procs:
            proc.join(timeout=10)
            assert proc.exitcode == 0, f"{proc.name} exited with {proc.exitcode}"
    finally:
        for proc in procs:
            stop_process(proc, signal.SIGKILL)
    assert outcome["torn"] == 0
    assert outcome["out_of_order"] == 0
    assert outcome["received"] == publishers * count
    assert outcome["expected"] == [count] * publishers
    # the checksum of every payload, in each publisher's order, equals that of what was sent
    for i in range(publishers):
        crc = 0
        for seq in range(count):
            crc = zlib.crc32(w.message(i, seq), crc)
        assert outcome["crcs"][i] == crc
    assert log.active_term_count > 10  # the run really crossed many rotations


@pytest.mark.timeout(60)
def test_publisher_killed_mid_claim_is_unblocked_and_nothing_committed_is_lost(shared) -> None:
    log, positions, log_path, positions_path = shared
    duty = _conductor(log, positions, unblock_timeout_ns=300_000_000)
    duty.update()
    ready = CTX.Event()
    victim = CTX.Process(target=w.claim_then_hang, args=(log_path, positions_path, 50, ready))
    try:
        victim.start()
        assert ready.wait(timeout=30), "the victim never opened its claim"
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=10)
        assert victim.exitcode == -signal.SIGKILL
    finally:
        stop_process(victim, signal.SIGKILL)

    survivor = ConcurrentPublication(log, positions.position(w.LIMIT_SLOT))
    for seq in range(50):
        assert survivor.offer(w.message(1, seq)) > 0
    image = Image(log, positions.position(w.SUB_POS_SLOT))
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    idle = BackoffIdleStrategy()
    while len(got) < 100 and time.monotonic() < deadline:
        work = image.poll(lambda b, h: got.append(bytes(b)), 100)
        work += duty.update()
        duty.check_for_blocked_publisher(time.monotonic_ns())
        idle.idle(work)
    assert duty.unblocked_count == 1
    assert got == [w.message(9, s) for s in range(50)] + [w.message(1, s) for s in range(50)]
    assert zlib.crc32(b"".join(got)) == zlib.crc32(
        b"".join([w.message(9, s) for s in range(50)] + [w.message(1, s) for s in range(50)])
    )
