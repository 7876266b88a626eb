"""The session clean-up removes only the wake-up semaphores of driver directories the tests created."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from logbuf.directory import wake_semaphore_name

_spec = importlib.util.spec_from_file_location("root_conftest", Path(__file__).with_name("conftest.py"))
assert _spec is not None and _spec.loader is not None
root_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root_conftest)


def _file(directory: Path, stream_id: int) -> str:
    return "sem." + wake_semaphore_name(directory, stream_id).lstrip("/")


def test_only_the_semaphores_of_created_directories_are_removed(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    new = {_file(ours, 1001), _file(ours, 7), _file(theirs, 1001)}  # theirs: a live driver elsewhere
    removed = root_conftest.semaphores_to_remove(new, {os.path.realpath(ours)})
    assert removed == {_file(ours, 1001), _file(ours, 7)}
    assert root_conftest.semaphores_to_remove(new, set()) == set()


def test_directories_under_pytests_tree_count_as_created(tmp_path: Path) -> None:
    driver = tmp_path / "a" / "drv"
    driver.mkdir(parents=True)
    assert os.path.realpath(driver) in set(root_conftest._directories_under(tmp_path))


def test_tests_never_install_system_packages() -> None:
    assert os.environ["LOGBUF_NO_INSTALL"] == "1"
