"""Shared fixtures: log buffers in a private /dev/shm directory, removed after each test."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

from logbuf import ConcurrentPublication, ExclusivePublication, Image, LogBuffers, Position


@pytest.fixture
def shm_dir() -> Iterator[str]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = tempfile.mkdtemp(prefix="logbuf-test-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_log(shm_dir: str) -> Iterator[Callable[..., LogBuffers]]:
    logs: list[LogBuffers] = []

    def factory(name: str | None = None, **kwargs: object) -> LogBuffers:
        name = name or f"{len(logs)}.logbuffer"
        kwargs.setdefault("term_length", 64 * 1024)
        kwargs.setdefault("session_id", 77)
        kwargs.setdefault("stream_id", 1001)
        kwargs.setdefault("initial_term_id", 5)
        log = LogBuffers.create(os.path.join(shm_dir, name), **kwargs)
        logs.append(log)
        return log

    yield factory
    for log in logs:
        log.close()


class Pipe:
    """A log with one publication and one image, flow control left wide open unless a test narrows it."""

    def __init__(self, log: LogBuffers, exclusive: bool = False) -> None:
        self.log = log
        self.limit = Position.standalone(1 << 62)
        self.sub_pos = Position.standalone(0)
        log.is_connected = True
        cls = ExclusivePublication if exclusive else ConcurrentPublication
        self.pub = cls(log, self.limit)
        self.image = Image(log, self.sub_pos)

    def drain(self, limit: int = 1 << 30) -> list[tuple[bytes, int, int]]:
        got: list[tuple[bytes, int, int]] = []
        while True:
            before = self.image.position
            n = self.image.poll(lambda b, h: got.append((bytes(b), h.reserved_value, h.flags)), 1000)
            if (n == 0 and self.image.position == before) or len(got) >= limit:
                return got


@pytest.fixture
def pipe(make_log: Callable[..., LogBuffers]) -> Callable[..., Pipe]:
    def factory(exclusive: bool = False, **kwargs: object) -> Pipe:
        return Pipe(make_log(**kwargs), exclusive=exclusive)

    return factory
