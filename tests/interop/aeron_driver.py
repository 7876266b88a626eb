"""Running a media driver for a differential test: logbuf's (embedded) or Aeron's ``aeronmd`` (a process).

Aeron's binaries are found at ``$AERON_BIN``, then ``<repo>/../shared/aeron-bin``; tests that need one skip
with the reason when neither is there.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import logbuf
from logbuf.cnc.cnc_file import CncFile
from support import ROOT, stop_process, wait_until

CANDIDATES = (os.environ.get("AERON_BIN"), str(ROOT.parent / "shared" / "aeron-bin"))


def aeron_bin() -> Path | None:
    """The directory holding Aeron's ``bin/aeronmd``, or None."""
    for candidate in CANDIDATES:
        if candidate and (Path(candidate) / "bin" / "aeronmd").is_file():
            return Path(candidate)
    return None


def require_aeron_bin() -> Path:
    found = aeron_bin()
    if found is None:
        pytest.skip("Aeron's aeronmd not found ($AERON_BIN, or ../shared/aeron-bin beside the repository): "
                    "these tests need the real driver")
    return found


@contextmanager
def running_aeronmd(directory: Path, **env: str) -> Iterator[Path]:
    """aeronmd on ``directory`` (shared threading, the directory removed on start and shutdown)."""
    binaries = require_aeron_bin()
    settings = dict(os.environ, AERON_DIR=str(directory), AERON_DIR_DELETE_ON_START="1",
                    AERON_DIR_DELETE_ON_SHUTDOWN="1", AERON_THREADING_MODE="SHARED", **env)
    proc = subprocess.Popen([str(binaries / "bin" / "aeronmd")], env=settings, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"aeronmd exited with {proc.returncode}")
            try:
                with CncFile.open(directory / "cnc.dat") as cnc:
                    return cnc.to_driver.consumer_heartbeat_time > 0
            except Exception:
                return False

        wait_until(ready, timeout=20, what="aeronmd's cnc.dat and heartbeat")
        yield directory
    finally:
        stop_process(proc)


@contextmanager
def running_logbuf(directory: Path, **options: object) -> Iterator[Path]:
    """logbuf's driver, embedded, on ``directory``."""
    driver = logbuf.MediaDriver.launch(directory, **options)
    try:
        yield driver.directory
    finally:
        driver.close()


@contextmanager
def running(kind: str, directory: Path) -> Iterator[Path]:
    """``kind``: ``logbuf`` or ``aeronmd``; both with a 64 KiB IPC term and 1 s timer, as configured here."""
    if kind == "aeronmd":
        with running_aeronmd(directory, AERON_IPC_TERM_BUFFER_LENGTH="65536", AERON_TERM_BUFFER_LENGTH="65536",
                             AERON_PUBLICATION_LINGER_TIMEOUT="1s") as path:
            yield path
    else:
        with running_logbuf(directory, ipc_term_length=64 * 1024, network_term_length=64 * 1024,
                            publication_linger_timeout_ns=1_000_000_000, idle_strategy="backoff:1000000") as path:
            yield path
