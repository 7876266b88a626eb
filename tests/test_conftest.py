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


def test_a_semaphore_counts_as_held_while_a_process_has_it_open(tmp_path: Path) -> None:
    import posix_ipc

    name = wake_semaphore_name(tmp_path, 1001)
    semaphore = posix_ipc.Semaphore(name, posix_ipc.O_CREX, initial_value=0)
    try:
        assert _file(tmp_path, 1001) in root_conftest.mapped_wake_semaphores()
        semaphore.close()  # as a SIGKILLed driver's: the file stays, nobody maps it
        assert _file(tmp_path, 1001) not in root_conftest.mapped_wake_semaphores()
    finally:
        posix_ipc.unlink_semaphore(name)


def test_directories_made_in_dev_shm_since_the_start_are_found(tmp_path: Path) -> None:
    import shutil
    import tempfile
    import time

    if not os.path.isdir("/dev/shm"):
        return
    start = time.time() - 1  # file system timestamps are coarser than time.time()
    made = tempfile.mkdtemp(prefix="logbuf-conftest-", dir="/dev/shm")
    try:
        os.mkdir(os.path.join(made, "driver"))
        found = set(root_conftest._shm_directories_since(start))
        assert os.path.join(made, "driver") in found
        assert made not in set(root_conftest._shm_directories_since(time.time() + 60))
    finally:
        shutil.rmtree(made)


class _Item:
    def __init__(self, markers: tuple[str, ...], fixturenames: tuple[str, ...] = ()) -> None:
        self.markers, self.fixturenames = markers, fixturenames

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_parallel_runs_keep_stress_tests_and_the_shared_spark_session_on_one_worker_each() -> None:
    assert root_conftest.xdist_group_of(_Item(("spark", "slow"))) == "slow"
    assert root_conftest.xdist_group_of(_Item(("spark",))) == "spark"
    assert root_conftest.xdist_group_of(_Item((), ("tmp_path", "analysis"))) == "spark"
    assert root_conftest.xdist_group_of(_Item(("spark", "slow"), ("analysis",))) == "spark"  # the cluster's
    assert root_conftest.xdist_group_of(_Item(("slow", "timeout"))) == "slow"
    assert root_conftest.xdist_group_of(_Item(("timeout",), ("tmp_path",))) is None
