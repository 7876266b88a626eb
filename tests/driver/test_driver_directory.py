"""The driver owns only what it created: foreign directories are refused untouched, a directory it created
goes on stop, an empty one it was given is left as found, a dead driver's is taken over only with force."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import logbuf
from logbuf.directory import CNC_FILE, MARKER_FILE
from logbuf.driver.media_driver import DriverDirectoryError


def snapshot(directory: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``directory`` with its mode and (for files) its bytes."""
    out: dict[str, tuple[int, bytes | None]] = {".": (stat.S_IMODE(directory.stat().st_mode), None)}
    for path in sorted(directory.rglob("*")):
        out[str(path.relative_to(directory))] = (stat.S_IMODE(path.stat().st_mode),
                                                 path.read_bytes() if path.is_file() else None)
    return out


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    directory = tmp_path / "thesis"
    (directory / "publications").mkdir(parents=True)
    (directory / CNC_FILE).write_text("my data")
    (directory / "publications" / "thesis.txt").write_text("chapter 1")
    directory.chmod(0o755)
    return directory


@pytest.mark.parametrize("force", [False, True])
def test_a_foreign_directory_is_refused_and_left_untouched(foreign: Path, force: bool) -> None:
    before = snapshot(foreign)
    with pytest.raises(DriverDirectoryError, match="not a logbuf driver directory") as info:
        logbuf.MediaDriver(directory=foreign, force=force)
    assert "\n" not in str(info.value) and "nothing was changed" in str(info.value)
    assert snapshot(foreign) == before


def test_the_cli_refuses_a_foreign_directory_in_one_line(foreign: Path) -> None:
    before = snapshot(foreign)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run([sys.executable, "-c", "import sys; from logbuf.cli import main; sys.exit(main())",
                             "driver", "--dir", str(foreign), "--force"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("logbuf driver: ")
    assert "Traceback" not in result.stderr
    assert snapshot(foreign) == before


def test_a_directory_the_driver_created_goes_on_stop(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "drv"
    with logbuf.MediaDriver.launch(directory) as driver:
        assert (directory / MARKER_FILE).is_file() and (directory / CNC_FILE).is_file()
        assert stat.S_IMODE(directory.stat().st_mode) == driver.ctx.dir_mode
    assert not directory.exists() and not (tmp_path / "a").exists()  # the parent it made goes too
    assert tmp_path.is_dir()  # what was there before stays


def test_a_parent_someone_filled_meanwhile_stays(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b" / "drv"
    with logbuf.MediaDriver.launch(directory):
        (tmp_path / "a" / "notes.txt").write_text("mine")
    assert not (tmp_path / "a" / "b").exists() and (tmp_path / "a" / "notes.txt").is_file()


def test_an_empty_directory_it_was_given_stays_as_it_was(tmp_path: Path) -> None:
    directory = tmp_path / "given"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    with logbuf.MediaDriver.launch(directory):
        (directory / "notes.txt").write_text("mine")  # someone puts a file there while it runs
        assert (directory / MARKER_FILE).is_file()
    assert sorted(os.listdir(directory)) == ["notes.txt"]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755


def test_a_driver_directory_with_a_live_driver_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    with logbuf.MediaDriver.launch(directory):
        for force in (False, True):
            with pytest.raises(logbuf.ActiveDriverError, match="already running"):
                logbuf.MediaDriver(directory=directory, force=force)
        assert (directory / CNC_FILE).is_file()  # the live driver's files are untouched
