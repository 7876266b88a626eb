"""The client extension's CPython-specific fast paths and their portable fallback behave the same.

``logbuf._client`` re-points the payload memoryview it hands to handlers in place (writing the view's
internals) and gives Python subclasses their own method descriptors (``specialize``).  Both are compiled only
for the CPython versions they were checked against; ``LOGBUF_CPYTHON_INTERNALS=0`` (or
``_use_cpython_internals(False)``) selects the portable path everywhere else.  Each case here runs in a child
process under both settings, and asserts the same answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from logbuf import _client
from logbuf.native import INTERNALS_ENV
from support.internals import INTERNALS_MODES as MODES

SETUP = """
import os, sys
from logbuf import ConcurrentPublication, ExclusivePublication, FragmentAssembler, Image, LogBuffers, Position
from logbuf import _client
from logbuf.client.image import ControlledPollAction
directory = sys.argv[1]
log = LogBuffers.create(os.path.join(directory, "log"), term_length=64 * 1024, session_id=7, stream_id=9)
pub = ConcurrentPublication(log, Position.standalone(1 << 40))
image = Image(log, Position.standalone(0))
"""


def run_child(body: str, mode: str) -> None:
    directory = tempfile.mkdtemp(prefix="logbuf-internals-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        script = SETUP + textwrap.dedent(body) + '\nprint("OK")\n'
        env = {**os.environ, INTERNALS_ENV: mode}
        result = subprocess.run([sys.executable, "-c", script, directory], capture_output=True, text=True,
                                timeout=60, env=env, check=False)
    finally:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    assert result.returncode == 0, f"child exited with {result.returncode}:\n{result.stderr[-3000:]}"
    assert result.stdout.strip().endswith("OK"), result.stdout


@pytest.mark.parametrize("mode", MODES)
def test_poll_hands_each_payload_and_releases_a_kept_view(mode: str) -> None:
    run_child("""
        for i in range(5):
            assert pub.offer(b"m%d" % i) > 0
        seen, kept, slices = [], [], []
        def handler(buffer, header):
            seen.append(bytes(buffer))
            kept.append(buffer)
            slices.append(buffer[:2])
        assert image.poll(handler, 10) == 5
        assert seen == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        for view in kept:   # valid only inside the callback: released after it
            try:
                bytes(view)
            except ValueError:
                continue
            raise AssertionError("a kept payload view is still usable")
        assert [bytes(s) for s in slices] == [b"m0", b"m1", b"m2", b"m3", b"m4"]  # exports of it stay readable
    """, mode)


@pytest.mark.parametrize("mode", MODES)
def test_controlled_poll_and_the_assembler(mode: str) -> None:
    run_child("""
        assert pub.offer(b"a") > 0 and pub.offer(b"b") > 0
        got = []
        def handler(buffer, header):
            got.append(bytes(buffer))
            return ControlledPollAction.ABORT if len(got) == 2 else ControlledPollAction.CONTINUE
        assert image.controlled_poll(handler, 10) == 1    # the second fragment is aborted: delivered again
        assert image.controlled_poll(lambda b, h: got.append(bytes(b)), 10) == 1
        assert got == [b"a", b"b", b"b"]
        whole = []
        big = bytes(range(256)) * 20   # more than one frame: fragmented, then assembled
        assert pub.offer(big) > 0
        assembler = FragmentAssembler(lambda buffer, header: whole.append(bytes(buffer)))
        while image.poll(assembler, 10):
            pass
        assert whole == [big]
    """, mode)


@pytest.mark.parametrize("mode", MODES)
def test_claims_write_through_their_payload_view(mode: str) -> None:
    run_child("""
        for publication in (pub, ExclusivePublication(log, Position.standalone(1 << 40))):
            claim = publication.try_claim(4)
            assert claim
            claim.buffer[:] = b"abcd"
            claim.commit()
        got = []
        assert image.poll(lambda buffer, header: got.append(bytes(buffer)), 10) >= 1
        assert got[0] == b"abcd"
    """, mode)


@pytest.mark.parametrize("mode", MODES)
def test_subclasses_get_own_descriptors_only_with_the_internals(mode: str) -> None:
    run_child(f"""
        class Mine(ConcurrentPublication):
            pass
        own = "offer" in vars(Mine)
        expected = {mode == "1"} and sys.version_info >= (3, 11)
        assert own == expected, (own, expected)
        mine = Mine(log, Position.standalone(1 << 40))
        assert mine.offer(b"x") > 0   # the same method either way
        got = []
        assert image.poll(lambda buffer, header: got.append(bytes(buffer)), 10) == 1 and got == [b"x"]
    """, mode)


def test_the_switch_reports_and_refuses() -> None:
    previous = _client._use_cpython_internals(False)
    try:
        assert _client._use_cpython_internals(False) is False
        if not _client.CPYTHON_INTERNALS:
            with pytest.raises(ValueError):
                _client._use_cpython_internals(True)
    finally:
        if previous:
            _client._use_cpython_internals(True)


def test_an_unknown_setting_is_refused_by_name() -> None:
    result = subprocess.run([sys.executable, "-c", "import logbuf.native"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, INTERNALS_ENV: "yes"}, check=False)
    assert result.returncode != 0 and f"{INTERNALS_ENV}='yes'" in result.stderr
