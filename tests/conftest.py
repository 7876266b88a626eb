"""Shared fixtures: log buffers in a private /dev/shm directory, removed after each test; clean-up of what
SIGKILLed test drivers leave behind; tshark when the machine has it; a network namespace of the test's own.
The helpers behind them (waiting, stopping processes, reading lines) are in ``tests/support``.

Tests never install system packages: ``scripts/ensure-*.sh`` install only when ``./run`` calls them, and this
file sets ``LOGBUF_NO_INSTALL=1`` so that a test calling one of them merely checks (and skips if absent).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from log_pipe import Pipe
from logbuf import LogBuffers
from logbuf.directory import wake_semaphore_prefix
from support import network_namespace, require_tool

os.environ.setdefault("LOGBUF_NO_INSTALL", "1")  # inherited by every script and process the tests start

# A suite started in the background (`nohup`, `&` in a script) inherits SIGINT ignored, and every process it
# starts would too: a test that interrupts a child (as Ctrl-C would) needs SIGINT's default disposition there.
# A handler here becomes the default again in each exec'd child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Property tests assert behaviour, never speed: no per-example deadline (an example under the sanitizers on a
# machine whose cores are busy takes several times its quiet time), and a slow data generator is no failure.
settings.register_profile("logbuf", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("logbuf")

# driver directories the tests created outside pytest's temporary tree (``shm_dir``, ``owned_directory``)
_CREATED_DIRECTORIES: set[str] = set()


def own_directory(path: str | os.PathLike[str]) -> str:
    """Declares ``path`` a driver directory this test session created: if a driver of it is killed, the
    session removes its wake-up semaphores.  Directories under pytest's ``tmp_path`` need no declaring."""
    real = os.path.realpath(path)
    _CREATED_DIRECTORIES.add(real)
    return real


def _wake_semaphores() -> set[str]:
    prefix = f"sem.logbuf.{os.getuid()}."
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}
    except FileNotFoundError:
        return set()


def _directories_under(base: Path) -> Iterator[str]:
    for directory, _, _ in os.walk(base):
        yield os.path.realpath(directory)


def semaphores_to_remove(new: set[str], directories: set[str]) -> set[str]:
    """Of the wake-up semaphores ``new`` (``sem.`` names in /dev/shm) those of a driver directory in
    ``directories``; any other belongs to a driver the tests did not start and is left alone."""
    prefixes = tuple("sem." + wake_semaphore_prefix(d).lstrip("/") for d in directories)
    return {name for name in new if name.startswith(prefixes)} if prefixes else set()


@pytest.fixture(scope="session", autouse=True)
def no_leftover_wake_semaphores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Drivers the tests SIGKILL cannot unlink their stream semaphores: remove those of the directories this
    session created (pytest's temporary tree and declared ones), never another driver's."""
    import posix_ipc

    before = _wake_semaphores()
    yield
    new = _wake_semaphores() - before
    if not new:
        return
    directories = set(_directories_under(tmp_path_factory.getbasetemp())) | _CREATED_DIRECTORIES
    for name in semaphores_to_remove(new, directories):
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_semaphore("/" + name[len("sem.") :])


@pytest.fixture
def owned_directory() -> Callable[[str | os.PathLike[str]], str]:
    """``own_directory`` as a fixture, for tests that create a driver directory outside ``tmp_path``."""
    return own_directory


@pytest.fixture(scope="session")
def tshark() -> str:
    """The ``tshark`` on PATH (``./run test`` installs it through scripts/ensure-tshark.sh); else skip."""
    return require_tool("tshark")


@pytest.fixture
def multicast_netns() -> Iterator[str]:
    """A network namespace made for this test (loopback up, multicast routed on it), deleted after it; the
    test is skipped with the reason where namespaces cannot be made."""
    with network_namespace("mc") as name:
        yield name


@pytest.fixture
def threading_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The threading mode of every driver the test starts with no mode given, embedded or in a process
    (``$LOGBUF_THREADING_MODE``, inherited by child processes), when parametrised indirectly
    (``@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)``, the modes from
    ``logbuf.driver.agents``); else None: the environment's default."""
    mode: str | None = getattr(request, "param", None)
    if mode is not None:
        monkeypatch.setenv("LOGBUF_THREADING_MODE", mode)
    return mode


@pytest.fixture
def shm_dir() -> Iterator[str]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = own_directory(tempfile.mkdtemp(prefix="logbuf-test-", dir=base))
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
