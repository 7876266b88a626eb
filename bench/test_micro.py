"""pytest-benchmark micro-benchmarks of single calls (in one process): ``pytest bench --benchmark-enable``."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from logbuf import ConcurrentPublication, ExclusivePublication, Image, LogBuffers, Position


@pytest.fixture
def log():
    directory = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    path = os.path.join(directory, "bench.logbuffer")
    log = LogBuffers.create(path, term_length=64 * 1024 * 1024, pre_touch=True)
    log.is_connected = True
    yield log
    log.close()
    os.unlink(path)
    os.rmdir(directory)


@pytest.mark.parametrize("cls", [ConcurrentPublication, ExclusivePublication])
def test_offer_32b(benchmark, log, cls) -> None:
    pub = cls(log, Position.standalone(1 << 62))
    message = bytes(32)
    benchmark.pedantic(pub.offer, args=(message,), iterations=10_000, rounds=20)


def test_offer_batch_256x32b(benchmark, log) -> None:
    pub = ExclusivePublication(log, Position.standalone(1 << 62))
    data = np.zeros(256 * 32, dtype=np.uint8)
    lengths = np.full(256, 32, dtype=np.int32)
    benchmark.pedantic(pub.offer_batch, args=(data, lengths), iterations=100, rounds=20)


def test_poll_256_fragments(benchmark, log) -> None:
    pub = ExclusivePublication(log, Position.standalone(1 << 62))
    image = Image(log, Position.standalone(0))
    data = np.zeros(256 * 32, dtype=np.uint8)
    lengths = np.full(256, 32, dtype=np.int32)

    def setup():
        pub.offer_batch(data, lengths)
        return (lambda b, h: None, 256), {}

    benchmark.pedantic(image.poll, setup=setup, rounds=200)
