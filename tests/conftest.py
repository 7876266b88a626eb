"""Shared fixtures: log buffers in a private /dev/shm directory, removed after each test; clean-up of what
SIGKILLed test drivers leave behind; tshark when the machine has it; a network namespace of the test's own.
The helpers behind them (waiting, stopping processes, reading lines) are in ``tests/support``.

Tests never install system packages: ``scripts/ensure-*.sh`` install only when ``./run`` calls them, and this
file sets ``LOGBUF_NO_INSTALL=1`` so that a test calling one of them merely checks (and skips if absent).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
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
# The suite draws the same examples on every run (derandomize: each test's own fixed seed), so a run's verdict
# is reproducible; ``LOGBUF_HYPOTHESIS=explore`` draws new ones on each run (with ``--hypothesis-seed=N`` to
# repeat one), which is how the examples kept with ``@example`` were found.
settings.register_profile("logbuf", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("explore" if os.environ.get("LOGBUF_HYPOTHESIS") == "explore" else "logbuf")

# Parallel runs (pytest-xdist, ``--dist loadgroup``): the tests of the shared SparkSession run one after the other
# on one worker (one JVM, and the shared analysis, made once), and so do the other tests marked ``slow``
# (multi-process stress tests, the demo); every other test goes to whichever worker is free.  xdist's own
# ``xdist_group`` mark travels in the test's id, which pytest 9.2 no longer lets a plugin change: here each worker
# writes the groups it collected to a file and the controller's scheduler reads them
# (``pytest_xdist_make_scheduler``).
XDIST_GROUPS = (("slow", "slow"), ("spark", "spark"))  # (mark, group), the first that applies
SPARK_FIXTURE_NAMES = frozenset({"spark", "analysis"})
_GROUPS_DIR_VARIABLE = "LOGBUF_TEST_GROUPS_DIR"


def xdist_group_of(item: pytest.Item) -> str | None:
    """The parallel-run group of ``item``: ``spark`` for a test of the shared session (whatever its marks: the
    session is started once per worker), else ``slow`` for a test marked so, ``spark`` for one marked
    ``spark``, else None (any worker)."""
    if SPARK_FIXTURE_NAMES & set(getattr(item, "fixturenames", ())):
        return "spark"
    for marker, group in XDIST_GROUPS:
        if item.get_closest_marker(marker) is not None:
            return group
    return None


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist") \
            and config.getoption("dist", "no") == "loadgroup" and config.getoption("numprocesses", None):
        os.environ[_GROUPS_DIR_VARIABLE] = tempfile.mkdtemp(prefix="logbuf-test-groups-")  # the workers inherit it


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and _GROUPS_DIR_VARIABLE in os.environ:
        shutil.rmtree(os.environ.pop(_GROUPS_DIR_VARIABLE), ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    groups_dir = os.environ.get(_GROUPS_DIR_VARIABLE)
    if workerinput is None or groups_dir is None:
        return
    groups = {item.nodeid: group for item in items if (group := xdist_group_of(item)) is not None}
    target = Path(groups_dir) / f"{workerinput['workerid']}.json"
    target.with_suffix(".part").write_text(json.dumps(groups))
    target.with_suffix(".part").rename(target)  # whole or absent


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # (a hook of xdist: absent with -p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` with the groups the workers collected (see above)."""
    groups_dir = os.environ.get(_GROUPS_DIR_VARIABLE)
    if config.getoption("dist", "no") != "loadgroup" or groups_dir is None:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first asked once every worker has collected (and written its file)
                self.groups = {}
                for path in Path(groups_dir).glob("*.json"):
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


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


def _shm_directories_since(start: float) -> Iterator[str]:
    """Driver directories in temporary directories ``logbuf-*`` that were made in /dev/shm since ``start``
    (``mkdtemp`` there by a test or by a command it runs, the demo's say), with everything under them."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir("/dev/shm"):
            with contextlib.suppress(OSError):
                if (entry.name.startswith("logbuf-") and entry.is_dir(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_ctime >= start):
                    yield from _directories_under(Path(entry.path))


def mapped_wake_semaphores() -> set[str]:
    """The wake-up semaphores (``sem.`` names) some live process has open: glibc maps a named semaphore's
    file, so one that no process maps is a leftover of a process that died without unlinking it.  (By inode:
    the creator maps a temporary file that glibc then links under the semaphore's name.)"""
    inodes: dict[int, str] = {}
    for name in _wake_semaphores():
        with contextlib.suppress(OSError):
            inodes[os.stat(f"/dev/shm/{name}").st_ino] = name
    mapped: set[str] = set()
    for pid in os.listdir("/proc"):
        if not inodes or not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    if "/dev/shm/sem." in line:  # address perms offset dev inode path
                        name = inodes.pop(int(line.split()[4]), None)
                        if name is not None:
                            mapped.add(name)
        except (OSError, ValueError, IndexError):  # ended meanwhile, or not ours to read
            continue
    return mapped


def _remove_semaphores(names: set[str]) -> None:
    import posix_ipc

    for name in names:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_semaphore("/" + name[len("sem.") :])


# what /dev/shm held when this test process (or, in a parallel run, the controller) started
_SESSION_START = time.time()
_SEMAPHORES_AT_START = _wake_semaphores()


@pytest.fixture(scope="session", autouse=True)
def no_leftover_wake_semaphores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Drivers the tests SIGKILL cannot unlink their stream semaphores: remove those of the directories this
    session created (pytest's temporary tree, declared ones, ``logbuf-*`` made in /dev/shm since the start),
    never another driver's.  (At the very end the session checks for leftovers: ``pytest_sessionfinish``.)"""
    yield
    new = _wake_semaphores() - _SEMAPHORES_AT_START
    if not new:
        return
    directories = set(_directories_under(tmp_path_factory.getbasetemp())) | _CREATED_DIRECTORIES
    _remove_semaphores(semaphores_to_remove(new, directories))
    # a directory in /dev/shm made meanwhile may be a driver's that another run still uses: only the dead ones
    made_in_shm = set(_shm_directories_since(_SESSION_START))
    _remove_semaphores(semaphores_to_remove(new, made_in_shm) - mapped_wake_semaphores())


_LEFTOVER_REPORT: list[str] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every test (in a parallel run: every worker) has ended, wake-up semaphores made since the start
    that no live process holds are leftovers of a killed driver: those of a directory of this session fail
    the run (the clean-up missed them; they are removed now); others (a driver this session cannot name,
    another user's) are reported and left alone."""
    config = session.config
    if hasattr(config, "workerinput"):
        return  # a parallel run's worker: its controller checks once all of them have ended
    leftovers = (_wake_semaphores() - _SEMAPHORES_AT_START) - mapped_wake_semaphores()
    if not leftovers:
        return
    directories = (set(_directories_under(config._tmp_path_factory.getbasetemp()))  # type: ignore[attr-defined]
                   | _CREATED_DIRECTORIES | set(_shm_directories_since(_SESSION_START)))
    ours = semaphores_to_remove(leftovers, directories)
    if ours:
        _LEFTOVER_REPORT.append(f"FAILED: {len(ours)} of this session's driver directories were left (removed "
                                f"now): {sorted(ours)[:10]}")
        _remove_semaphores(ours)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if leftovers - ours:
        _LEFTOVER_REPORT.append(f"{len(leftovers - ours)} made during the run by a process that died without "
                                f"removing them, of a directory this session did not create (left alone): "
                                f"{sorted(leftovers - ours)[:10]}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LEFTOVER_REPORT:
        terminalreporter.section("wake-up semaphores left in /dev/shm")
        for line in _LEFTOVER_REPORT:
            terminalreporter.write_line(line, red=line.startswith("FAILED"), yellow=not line.startswith("FAILED"))


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
