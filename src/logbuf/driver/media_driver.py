"""``MediaDriver``: owns a directory, its cnc.dat, every log buffer, and runs the conductor's duty cycle.

Run it in the foreground (``logbuf driver``, or :meth:`MediaDriver.run`) or embedded in a process on a
thread (:meth:`MediaDriver.launch`, for tests and small apps).

Threads.  The Python conductor (commands, client lifecycle, counter allocation, cnc.dat) runs in
:meth:`MediaDriver.run`'s loop on the calling thread.  The data-plane duties that have a native form run on
native agents (:mod:`logbuf.driver.agents`), never on that thread, grouped by the threading mode: ``shared``
(one agent), ``shared-network`` (sender and receiver on one, the conductor's native duties on another) or
``dedicated`` (an agent each).  The agents start with :meth:`run` and are stopped and joined before it
returns, before any log is unmapped.

Claiming the directory (one driver per directory).  A driver owns only a directory it created, or one that
carries its marker file (``logbuf-driver``), or an empty one; anything else is refused with a one-line
message and left exactly as it was (nothing deleted, nothing chmod-ed):

1. create it 0700 (0770 with group access), or check that an existing one belongs to this user;
2. a directory with the marker (or only a driver's files around a valid cnc.dat: a driver without the marker,
   logbuf's or Aeron's) is a driver's: take an exclusive ``flock`` on ``driver.lock`` - held for the driver's
   life, released by the kernel when the process dies - and when it is held, refuse naming the live driver's
   pid and heartbeat age.  When it is free the driver there died: ``force`` takes its directory over (its
   logs, cnc.dat, loss report and stream wake-up semaphores are removed), otherwise refuse and say so;
3. write the marker (recording whether this driver created the directory) and a fresh cnc.dat.

On stop the driver removes what it created: its files, the marker, and the directory when it created it and
nothing else is left in it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import itertools
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import posix_ipc

from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.errors import CncFileError
from logbuf.cnc.loss_report import LossReportFile
from logbuf.directory import (
    CNC_FILE,
    IMAGES_DIR,
    LOCK_FILE,
    LOSS_REPORT_FILE,
    MARKER_FILE,
    PUBLICATIONS_DIR,
    wake_semaphore_name,
    wake_semaphore_prefix,
)
from logbuf.driver.agents import NativeAgent, plan_agents
from logbuf.driver.conductor import DriverConductor
from logbuf.driver.context import DriverContext
from logbuf.errors import LogbufError
from logbuf.idle import idle_strategy
from logbuf.units import epoch_ms

SEMAPHORE_SWEEP_SLACK = 64  # wake-up semaphores a driver may keep beyond twice the streams in use
_DRIVER_FILES = {CNC_FILE, LOSS_REPORT_FILE, LOCK_FILE, MARKER_FILE, PUBLICATIONS_DIR, IMAGES_DIR}
_MARKER_TEXT = "logbuf media driver directory\ncreated-by-driver: {}\n"


def _directory_kind(directory: Path) -> str:
    """``empty``, ``driver`` (its marker, or only a driver's files around a valid cnc.dat) or ``foreign``."""
    names = set(os.listdir(directory))
    if not names:
        return "empty"
    if MARKER_FILE in names:
        return "driver"
    if CNC_FILE in names and names <= _DRIVER_FILES:
        try:
            CncFile.open(directory / CNC_FILE).close()  # a logbuf or Aeron cnc.dat, not someone's data
        except (CncFileError, OSError):
            return "foreign"
        return "driver"
    return "foreign"


def _marker_says_created(directory: Path) -> bool:
    try:
        return "created-by-driver: yes" in (directory / MARKER_FILE).read_text()
    except (OSError, UnicodeDecodeError):
        return False


def _write_marker(directory: Path, created: bool, mode: int) -> None:
    """The marker, written atomically (a temporary name, then rename)."""
    temporary = directory / f".{MARKER_FILE}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # exactly the configured mode, whatever the umask
    with os.fdopen(fd, "w") as f:
        f.write(_MARKER_TEXT.format("yes" if created else "no"))
    os.replace(temporary, directory / MARKER_FILE)


class DriverDirectoryError(LogbufError):
    """The driver directory cannot be used (another live driver, another user's directory, …)."""


class ActiveDriverError(DriverDirectoryError):
    """Another driver is alive in this directory."""


def _describe_active_driver(directory: Path) -> str:
    try:
        with CncFile.open(directory / CNC_FILE) as cnc:
            pid = cnc.layout.pid
            age_ms = epoch_ms() - cnc.to_driver.consumer_heartbeat_time
        return f"pid {pid}, heartbeat {age_ms} ms ago"
    except CncFileError as exc:
        return f"its cnc.dat is not readable yet: {exc}"


class MediaDriver:
    def __init__(self, ctx: DriverContext | None = None, **options: Any) -> None:
        self.ctx = ctx.with_options(**options) if ctx is not None else DriverContext.build(**options)
        self.directory = Path(self.ctx.directory)
        self._lock_fd: int | None = None
        self._created_directory = False
        self._created_parents: list[Path] = []  # made for the directory (deepest first): they go with it
        self._semaphores: dict[int, posix_ipc.Semaphore] = {}
        self._sweep_floor = 0  # streams in use at the last reclaim: the next one runs at twice that (+ slack)
        self._unused_since: dict[int, int] = {}  # stream id -> when (ns) the timer first saw it unused
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: held by the Python conductor's loop for each duty cycle; holding it pauses the control plane (the
        #: native agents go on): tests use it to starve the conductor
        self.conductor_lock = threading.Lock()
        self.agents: list[NativeAgent] = []
        self._native_roles: set[str] = set()
        self._agents_stuck = False
        self.cnc: CncFile | None = None
        self.loss_report: LossReportFile | None = None
        self.conductor: DriverConductor | None = None
        self._claim_directory()
        try:
            self.cnc = CncFile.create(
                self.directory / CNC_FILE,
                self.ctx.to_driver_capacity,
                self.ctx.to_clients_capacity,
                self.ctx.counters_values_length,
                self.ctx.error_log_length,
                self.ctx.client_liveness_timeout_ns,
                os.getpid(),
                epoch_ms(),
                mode=self.ctx.file_mode,
                ready=False,  # clients wait until the conductor's system counters exist (signal_ready below)
            )
            self.loss_report = LossReportFile.create(self.directory / LOSS_REPORT_FILE, self.ctx.loss_report_length,
                                                     mode=self.ctx.file_mode)
            self.conductor = DriverConductor(
                self.ctx,
                self.cnc,
                loss_report=self.loss_report.report(),
                ensure_wake_semaphore=self._ensure_wake_semaphore,
                on_terminate=self._stop.set,
            )
            self.conductor.timer_hooks.append(self._sweep_wake_semaphores)
            self.cnc.signal_ready()
        except BaseException:
            self._release_directory()
            raise

    # -- the directory ---------------------------------------------------------------------------------

    def _claim_directory(self) -> None:
        directory = self.directory
        created = False
        if not directory.exists():
            missing = list(itertools.takewhile(lambda parent: not parent.exists(), directory.parents))
            try:
                directory.mkdir(mode=self.ctx.dir_mode, parents=True)
            except FileExistsError:
                pass  # another process made it meanwhile: judged below like any existing directory
            except OSError as exc:
                raise DriverDirectoryError(f"cannot create driver directory {directory}: {exc.strerror}") from exc
            else:
                created = True
                self._created_parents = missing
        if not directory.is_dir():
            raise DriverDirectoryError(f"{directory} is not a directory; choose another with --dir or LOGBUF_DIR")
        info = directory.stat()
        if info.st_uid != os.getuid():
            raise DriverDirectoryError(
                f"driver directory {directory} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}); "
                f"choose another with --dir or LOGBUF_DIR"
            )
        kind = "empty" if created else _directory_kind(directory)
        if kind == "foreign":
            names = sorted(os.listdir(directory))
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise DriverDirectoryError(
                f"{directory} is not a logbuf driver directory and not empty ({shown}); nothing was changed - "
                f"choose another with --dir or LOGBUF_DIR"
            )
        if kind == "driver":
            created = _marker_says_created(directory)
            if not self.ctx.force and not (directory / LOCK_FILE).exists():
                raise DriverDirectoryError(
                    f"{directory} holds the files of a driver that is no longer running "
                    f"({_describe_active_driver(directory)}); --force takes it over"
                )
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, self.ctx.file_mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.fchmod(fd, self.ctx.file_mode)  # ours now: exactly the configured mode, whatever the umask
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ActiveDriverError(
                    f"a media driver is already running in {directory} ({_describe_active_driver(directory)}); "
                    f"stop it first or use another directory (--dir / LOGBUF_DIR)"
                ) from None
            raise
        if kind == "driver" and not self.ctx.force:
            os.close(fd)
            raise DriverDirectoryError(
                f"{directory} holds the files of a driver that is no longer running "
                f"({_describe_active_driver(directory)}); --force takes it over"
            )
        self._lock_fd = fd
        if kind == "driver":  # a dead driver's: its files go, nothing else
            for name in (CNC_FILE, LOSS_REPORT_FILE):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)
            for sub in (PUBLICATIONS_DIR, IMAGES_DIR):
                shutil.rmtree(directory / sub, ignore_errors=True)
            self._unlink_stale_semaphores()
        if created or kind == "driver":
            os.chmod(directory, self.ctx.dir_mode)  # never wider (or narrower) than configured
        self._created_directory = created
        _write_marker(directory, created, self.ctx.file_mode)
        for sub in (PUBLICATIONS_DIR, IMAGES_DIR):
            (directory / sub).mkdir(mode=self.ctx.dir_mode)
            os.chmod(directory / sub, self.ctx.dir_mode)  # mkdir's mode is narrowed by the umask

    def _unlink_stale_semaphores(self) -> None:
        prefix = wake_semaphore_prefix(self.directory)
        # Linux keeps named semaphores as /dev/shm/sem.<name without the slash>
        for path in glob.glob(f"/dev/shm/sem.{glob.escape(prefix[1:])}*"):
            with contextlib.suppress(posix_ipc.ExistentialError):
                posix_ipc.unlink_semaphore("/" + os.path.basename(path)[len("sem.") :])

    def _ensure_wake_semaphore(self, stream_id: int) -> None:
        if stream_id in self._semaphores:
            return
        if len(self._semaphores) >= SEMAPHORE_SWEEP_SLACK + 2 * self._sweep_floor:
            self._reclaim_wake_semaphores()
        name = wake_semaphore_name(self.directory, stream_id)
        self._semaphores[stream_id] = posix_ipc.Semaphore(
            name, posix_ipc.O_CREAT, mode=self.ctx.file_mode, initial_value=0
        )
        with contextlib.suppress(OSError):  # Linux keeps it as /dev/shm/sem.<name>: give it the exact mode
            os.chmod(f"/dev/shm/sem.{name[1:]}", self.ctx.file_mode)

    def _streams_in_use(self) -> set[int]:
        """Stream ids that still have a publication (lingering ones included), subscription or image."""
        conductor = self.conductor
        if conductor is None:
            return set(self._semaphores)
        streams: set[int] = set()
        try:
            for owner in (conductor.ipc, conductor.network):
                streams.update(publication.stream_id for publication in owner.publications)
                streams.update(subscription.stream_id for subscription in owner.subscriptions.values())
            streams.update(subscription.stream_id for subscription in conductor.subscriptions.values())
            for endpoint in conductor.network.receive_endpoints.values():  # an image posts its stream's semaphore
                streams.update(image.stream_id for image in endpoint.images.values())
        except AttributeError:  # an entity that does not say its stream: reclaim nothing rather than guess
            return set(self._semaphores)
        return streams

    def _sweep_wake_semaphores(self, now_ns: int) -> int:
        """On the conductor's timer: unlinks the wake-up semaphore of each stream unused for a publication
        linger (no publication, subscription or image left), so ephemeral streams do not pile up between new
        ones; the number reclaimed."""
        in_use = self._streams_in_use()
        linger = self.ctx.publication_linger_timeout_ns
        reclaimed = 0
        for stream_id in list(self._semaphores):
            if stream_id in in_use:
                self._unused_since.pop(stream_id, None)
                continue
            since = self._unused_since.setdefault(stream_id, now_ns)
            if now_ns - since >= linger:
                self._unlink_wake_semaphore(stream_id)
                reclaimed += 1
        return reclaimed

    def _unlink_wake_semaphore(self, stream_id: int) -> None:
        self._unused_since.pop(stream_id, None)
        semaphore = self._semaphores.pop(stream_id)
        with contextlib.suppress(posix_ipc.ExistentialError):
            semaphore.unlink()
        semaphore.close()

    def _reclaim_wake_semaphores(self) -> int:
        """Unlinks the wake-up semaphores of streams nobody uses any more; the number reclaimed.

        Run when a new semaphore would push the count past twice the streams last seen in use (plus some
        slack), so a driver that sees ever new stream ids keeps a bounded number.  A process still holding a
        reclaimed semaphore keeps its handle; the next user of the stream gets a new one.
        """
        in_use = self._streams_in_use()
        reclaimed = 0
        for stream_id in [s for s in self._semaphores if s not in in_use]:
            self._unlink_wake_semaphore(stream_id)
            reclaimed += 1
        self._sweep_floor = len(self._semaphores)
        return reclaimed

    def _release_directory(self) -> None:
        if self._lock_fd is None:
            return  # the directory was never ours: nothing of it is touched
        for semaphore in self._semaphores.values():
            with contextlib.suppress(posix_ipc.ExistentialError):
                semaphore.unlink()
            semaphore.close()
        self._semaphores.clear()
        for name in (CNC_FILE, LOSS_REPORT_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / name)
        for sub in (PUBLICATIONS_DIR, IMAGES_DIR):
            shutil.rmtree(self.directory / sub, ignore_errors=True)
        if self._lock_fd is None:
            return  # the directory was never ours: nothing of it is touched
        for name in (MARKER_FILE, LOCK_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / name)
        os.close(self._lock_fd)  # releases the flock
        self._lock_fd = None
        if self._created_directory:
            try:  # only what is empty: never delete what someone else put there
                self.directory.rmdir()
                for parent in self._created_parents:
                    parent.rmdir()
            except OSError:
                pass

    # -- running ---------------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """The duty-cycle loop until ``stop`` (or a TERMINATE_DRIVER command) is set.

        The native agents of the threading mode start first and are stopped when the loop ends.  This loop
        runs the Python conductor at most every ``conductor_interval_ns`` (its Python cycle - ring, heartbeat,
        lifecycle - costs several µs and nothing in it needs µs latency) and, every cycle, the sender's and
        the receiver's duties that have no native form yet (for those that have one: their ``control_work``,
        if they define it), all on one clock reading and non-blocking sockets; the idle strategy runs only when no duty did work.  An exception escaping a duty (a bug) is
        recorded in the error log and the loop goes on."""
        stop = stop or self._stop
        conductor = self.conductor
        assert conductor is not None
        self._start_agents()
        try:
            self._run_loop(stop, conductor)
        finally:
            self._stop_agents()

    def _run_loop(self, stop: threading.Event, conductor: DriverConductor) -> None:
        # a role with a native duty no longer runs its do_work here, only its control_work when it has one
        # (the Python side of its queues: events read back, commands that waited for room)
        python_duties: list[Callable[[int], int]] = [conductor.do_work]
        for role, owner in (("sender", conductor.sender), ("receiver", conductor.receiver)):
            if role not in self._native_roles:
                python_duties.append(owner.do_work)
            elif hasattr(owner, "control_work"):
                python_duties.append(owner.control_work)
        idle = idle_strategy(self.ctx.idle_strategy)
        interval = self.ctx.conductor_interval_ns
        monotonic_ns = time.monotonic_ns
        lock = self.conductor_lock
        next_conductor_ns = 0
        while not stop.is_set() and not self._stop.is_set():
            with lock:
                start = monotonic_ns()
                work = 0
                for duty in python_duties:
                    if duty is python_duties[0]:
                        if start < next_conductor_ns:
                            continue
                        next_conductor_ns = start + interval
                    try:
                        work += duty(start)
                    except Exception as exc:  # a bug must not stop the driver: record it, go on with the next
                        conductor.on_duty_error(duty, exc)
                        work += 1
                if work:
                    conductor.record_cycle_time(monotonic_ns() - start)
            idle.idle(work)

    def _start_agents(self) -> None:
        """The threading mode's native agents, each running its roles' native duties."""
        conductor = self.conductor
        assert conductor is not None
        if self.agents:
            return
        duties = conductor.native_duties()
        counters = conductor.counters
        agents = []
        try:
            for name, roles in plan_agents(self.ctx.threading_mode, set(duties)):
                agent = NativeAgent(name, self.ctx.agent_idle(roles[0]))
                agents.append(agent)
                for role in roles:
                    max_cycle, exceeded = conductor.cycle_counters(role)
                    agent.add_duty(duties[role], role=role, max_cycle_time=counters.position(max_cycle),
                                   threshold_exceeded=counters.position(exceeded), owner=conductor)
            for agent in agents:
                agent.start()
        except BaseException:
            self.agents = agents
            self._stop_agents()
            raise
        self.agents = agents
        self._native_roles = set(duties)

    def _stop_agents(self) -> None:
        for agent in self.agents:
            try:
                agent.close(timeout_s=5.0)
            except RuntimeError as exc:
                # never unmap what a running agent uses: the mappings stay until the process exits
                self._agents_stuck = True
                if self.conductor is not None:
                    self.conductor.on_duty_error(agent, exc)
        if not self._agents_stuck:
            self.agents = []  # a later run() starts its own

    def run_foreground(self) -> int | None:
        """``logbuf driver``: runs until SIGINT/SIGTERM, then shuts down cleanly; returns the signal that
        stopped it (None: a TERMINATE_DRIVER command)."""
        previous = {}
        stopped_by: list[int] = []

        def request_stop(signum: int, frame: Any) -> None:
            stopped_by.append(signum)
            self._stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, request_stop)
        try:
            self.run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.close()
        return stopped_by[0] if stopped_by else None

    @classmethod
    def launch(cls, directory: str | os.PathLike[str] | None = None, **options: Any) -> MediaDriver:
        """An embedded driver running on a daemon thread of this process; ``close()`` stops it."""
        driver = cls(directory=directory, **options)
        driver._thread = threading.Thread(target=driver.run, name="logbuf-driver", daemon=True)
        driver._thread.start()
        return driver

    def stop(self) -> None:
        self._stop.set()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stops the duty cycle, tells clients (NULL heartbeat), deletes the logs, cnc.dat and the lock."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                self._agents_stuck = True  # its agents may still run: nothing they use is unmapped
        if not self._agents_stuck:
            self._stop_agents()  # (run() stops them too, but close() may come from another thread than run()'s)
        if not self._agents_stuck:
            if self.conductor is not None:
                self.conductor.close()
            if self.cnc is not None:
                self.cnc.close()
            if self.loss_report is not None:
                self.loss_report.close()
        self._release_directory()

    def __enter__(self) -> MediaDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MediaDriver(directory={str(self.directory)!r}, running={self.is_running})"
