"""Shared fixtures: log buffers in a private /dev/shm directory, removed after each test."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

from log_pipe import Pipe
from logbuf import LogBuffers


def _wake_semaphores() -> set[str]:
    prefix = f"sem.logbuf.{os.getuid()}."
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}
    except FileNotFoundError:
        return set()


@pytest.fixture(scope="session", autouse=True)
def no_leftover_wake_semaphores() -> Iterator[None]:
    """Drivers the tests SIGKILL cannot unlink their stream semaphores, and their temporary directories are
    never reused (a new driver would clean them): remove those this session created."""
    import posix_ipc

    before = _wake_semaphores()
    yield
    for name in _wake_semaphores() - before:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_semaphore("/" + name[len("sem.") :])


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


@pytest.fixture
def pipe(make_log: Callable[..., LogBuffers]) -> Callable[..., Pipe]:
    def factory(exclusive: bool = False, **kwargs: object) -> Pipe:
        return Pipe(make_log(**kwargs), exclusive=exclusive)

    return factory
