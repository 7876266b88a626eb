"""Where a media driver lives: its directory, and the files inside it.

One driver owns one directory::

    /dev/shm/logbuf-<user>/            0700, owned by the user running the driver
        logbuf-driver                  marker: a logbuf driver owns this directory (and whether it created it)
        cnc.dat                        command-and-control file (header, rings, counters, error log)
        loss-report.dat                one entry per image that lost data (Aeron's layout)
        publications/<regId>.logbuffer  log buffers the driver created for publications
        images/<corrId>.logbuffer       (UDP) images rebuilt by the receiver

The directory is chosen by, in order: an explicit argument, the ``LOGBUF_DIR`` environment variable, then
``/dev/shm/logbuf-<user>`` (``<tmp>/logbuf-<user>`` where ``/dev/shm`` does not exist).
"""

from __future__ import annotations

import errno
import getpass
import hashlib
import os
import tempfile
from pathlib import Path

from logbuf.errors import StorageSpaceError

ENV_DIR = "LOGBUF_DIR"
CNC_FILE = "cnc.dat"
LOSS_REPORT_FILE = "loss-report.dat"
MARKER_FILE = "logbuf-driver"
LOCK_FILE = "driver.lock"
PUBLICATIONS_DIR = "publications"
IMAGES_DIR = "images"
LOG_SUFFIX = ".logbuffer"
DEFAULT_STORAGE_RESERVE = 8 * 1024 * 1024  # free space a driver leaves on its file system when it creates logs


def default_directory() -> Path:
    """``$LOGBUF_DIR`` or ``/dev/shm/logbuf-<user>``."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    base = Path("/dev/shm")
    if not base.is_dir():
        base = Path(tempfile.gettempdir())
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): fall back to the uid
        user = str(os.getuid())
    return base / f"logbuf-{user}"


def resolve_directory(directory: str | os.PathLike[str] | None = None) -> Path:
    """The driver directory for an optional explicit choice (see the module doc for the order)."""
    return Path(directory) if directory else default_directory()


def cnc_path(directory: str | os.PathLike[str] | None = None) -> Path:
    return resolve_directory(directory) / CNC_FILE


def loss_report_path(directory: str | os.PathLike[str] | None = None) -> Path:
    return resolve_directory(directory) / LOSS_REPORT_FILE


def wake_semaphore_name(directory: str | os.PathLike[str], stream_id: int) -> str:
    """The named POSIX semaphore subscribers of ``stream_id`` sleep on (one per stream and driver).

    Named semaphores live in one flat namespace: the name carries the uid and a hash of the directory so
    two drivers (or users) never share one.
    """
    digest = hashlib.sha1(os.path.realpath(directory).encode()).hexdigest()[:12]
    return f"/logbuf.{os.getuid()}.{digest}.{stream_id & 0xFFFFFFFF:08x}"


def wake_semaphore_prefix(directory: str | os.PathLike[str]) -> str:
    """The common prefix of every wake-up semaphore of one driver directory (for cleaning up)."""
    return wake_semaphore_name(directory, 0).rsplit(".", 1)[0] + "."


def usable_space(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still allocate on the file system holding ``path``."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def check_storage(path: str | os.PathLike[str], length: int, reserve: int) -> None:
    """Raises :class:`~logbuf.errors.StorageSpaceError` unless a new file of ``length`` bytes beside ``path``
    leaves at least ``reserve`` bytes free (Aeron's storage check, with a reserve on top)."""
    folder = os.path.dirname(os.fspath(path)) or "."
    usable = usable_space(folder)
    if usable < length + reserve:
        raise StorageSpaceError(
            f"insufficient usable storage for new log of length={length} usable={usable} in {folder} "
            f"(reserve {reserve})"
        )


def allocate(fd: int, length: int, path: str | os.PathLike[str]) -> None:
    """Sizes the file of ``fd`` to ``length`` bytes *with storage behind every byte* before anyone maps it.

    A sparse file (``ftruncate`` alone) maps fine and then kills the first process that touches a page the
    file system cannot supply (SIGBUS); allocating now turns a full disk into an error here instead.
    """
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise StorageSpaceError(f"cannot allocate {length} bytes for {os.fspath(path)}: {exc.strerror}") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # a file system without fallocate: size it, then write a byte into each block so it is backed
        os.ftruncate(fd, length)
        block = max(4096, os.fstat(fd).st_blksize)
        try:
            for offset in range(0, length, block):
                os.pwrite(fd, b"\0", offset)
        except OSError as write_error:
            if write_error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StorageSpaceError(
                    f"cannot allocate {length} bytes for {os.fspath(path)}: {write_error.strerror}"
                ) from None
            raise


def set_mode(fd: int, mode: int) -> None:
    """Gives a new file exactly ``mode`` (the umask narrows what ``open`` grants; group access needs 0660)."""
    os.fchmod(fd, mode)
