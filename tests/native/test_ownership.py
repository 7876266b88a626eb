"""Using publications, images, claims and payload views after their log (or they) closed: each case runs in a
child process, so a crash (SIGSEGV) fails the test by exit status instead of killing the test session.

Every case asserts the documented answer: ``CLOSED`` from offer/try_claim, 0 from poll, ClosedError from the
positions, "closed" in repr, UnboundHeaderError from a header read after its callback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from logbuf.native import INTERNALS_ENV
from support.internals import INTERNALS_MODES

SETUP = """
import os, sys, tempfile
from logbuf import ConcurrentPublication, ExclusivePublication, Image, LogBuffers
from logbuf.position import SharedPositions
from logbuf.errors import ClosedError, UnboundHeaderError
from logbuf.client.publication import CLOSED
directory = sys.argv[1]
log = LogBuffers.create(os.path.join(directory, "log"), term_length=64 * 1024, session_id=7, stream_id=9)
positions = SharedPositions(os.path.join(directory, "positions"), slots=2, create=True)
positions.position(0).set(1 << 40)
pub = ConcurrentPublication(log, positions.position(0))
image = Image(log, positions.position(1))
assert pub.offer(b"hello") > 0

def expect_closed(what, fn):
    try:
        fn()
    except ClosedError:
        return
    raise AssertionError(f"{what}: no ClosedError")
"""


def run_child(body: str, tmp_path) -> str:
    script = SETUP + textwrap.dedent(body) + '\nprint("OK")\n'
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                            timeout=60, env=env, check=False)
    assert result.returncode == 0, f"child exited with {result.returncode}:\n{result.stderr[-3000:]}"
    assert result.stdout.strip().endswith("OK"), result.stdout
    return result.stdout


@pytest.fixture(autouse=True, params=INTERNALS_MODES)
def internals_mode(request, monkeypatch) -> str:
    """Every case runs with the client's CPython-internals fast paths and with the portable path."""
    monkeypatch.setenv(INTERNALS_ENV, request.param)
    return request.param


@pytest.fixture
def tmp_path_shm():
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="logbuf-own-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_offer_after_log_close_returns_closed(tmp_path_shm) -> None:
    run_child("""
        log.close()
        assert pub.offer(b"after") == CLOSED
        assert not pub.try_claim(8)
        assert pub.try_claim(8).result == CLOSED
        assert pub.offer_batch([b"a", b"b"]).result == CLOSED
        assert pub.is_closed
    """, tmp_path_shm)


def test_publication_state_after_log_and_counters_close_raises_closed(tmp_path_shm) -> None:
    run_child("""
        log.close()
        positions.close()
        expect_closed("position", lambda: pub.position)
        expect_closed("position_limit_value", lambda: pub.position_limit_value)
        expect_closed("available_window", pub.available_window)
        assert "closed" in repr(pub), repr(pub)
        assert not pub.is_connected
    """, tmp_path_shm)


def test_publication_state_after_publication_close(tmp_path_shm) -> None:
    run_child("""
        pub.close()
        positions.close()
        assert pub.offer(b"x") == CLOSED
        expect_closed("position", lambda: pub.position)
        expect_closed("position_limit_value", lambda: pub.position_limit_value)
        assert "closed" in repr(pub)
    """, tmp_path_shm)


def test_exclusive_publication_after_log_close(tmp_path_shm) -> None:
    run_child("""
        ex = ExclusivePublication(log, positions.position(0))
        log.close()
        assert ex.offer(b"x") == CLOSED
        expect_closed("position", lambda: ex.position)
        assert "closed" in repr(ex)
    """, tmp_path_shm)


def test_image_after_log_and_counters_close(tmp_path_shm) -> None:
    run_child("""
        log.close()
        positions.close()
        expect_closed("released_position", lambda: image.released_position)
        assert image.poll(lambda b, h: None) == 0
        assert image.controlled_poll(lambda b, h: None) == 0
        assert not image.is_data_available()
        assert len(image.batch_poll()) == 0
        assert "closed" in repr(image)
    """, tmp_path_shm)


def test_image_after_image_close(tmp_path_shm) -> None:
    run_child("""
        image.close()
        assert image.poll(lambda b, h: None) == 0
        expect_closed("released_position", lambda: image.released_position)
        assert "closed" in repr(image)
    """, tmp_path_shm)


def test_claim_commit_after_log_close_raises_closed(tmp_path_shm) -> None:
    run_child("""
        claim = pub.try_claim(16)
        assert claim
        buffer = claim.buffer
        log.close()
        expect_closed("commit", claim.commit)
        buffer[:4] = b"abcd"   # the mapping is still held by the view: writing cannot fault
        pub.close()
    """, tmp_path_shm)


def test_payload_view_and_header_after_the_callback(tmp_path_shm) -> None:
    run_child("""
        kept = []
        assert image.poll(lambda b, h: kept.append((b, h))) == 1
        view, header = kept[0]
        try:
            bytes(view)
        except ValueError:
            pass
        else:
            raise AssertionError("a payload view kept past its callback is still usable")
        try:
            header.position
        except UnboundHeaderError:
            pass
        else:
            raise AssertionError("a header read after its callback did not raise")
        assert "unbound" in repr(header)
        sliced = []
        pub.offer(b"world")
        assert image.poll(lambda b, h: sliced.append(b[1:3])) == 1
        image.close()
        log.close()
        positions.close()
        assert bytes(sliced[0]) == b"or"   # a slice keeps the mapping: still readable, never a fault
    """, tmp_path_shm)


def test_handler_closing_its_image_and_log_mid_poll(tmp_path_shm) -> None:
    run_child("""
        for i in range(5):
            pub.offer(b"m%d" % i)
        seen = []
        def handler(buffer, header):
            seen.append(bytes(buffer))
            image.close()
            log.close()
        assert image.poll(handler, 10) == 1
        assert seen == [b"hello"]
        assert image.poll(handler, 10) == 0
    """, tmp_path_shm)


def test_poll_from_inside_a_handler_is_refused(tmp_path_shm) -> None:
    run_child("""
        from logbuf.errors import ReentrantPollError
        for i in range(4):
            pub.offer(b"n%d" % i)
        outer, refused = [], []
        def inner_handler(buffer, header):
            raise AssertionError("delivered twice")
        def outer_handler(buffer, header):
            outer.append(bytes(buffer))
            for poll in (image.poll, image.controlled_poll):
                try:
                    poll(inner_handler, 2)
                except ReentrantPollError:
                    refused.append(poll.__name__)
        assert image.poll(outer_handler, 10) == 5
        assert outer == [b"hello", b"n0", b"n1", b"n2", b"n3"], outer
        assert len(refused) == 10
        assert image.position == log.producer_position()
    """, tmp_path_shm)


def test_closing_everything_unmaps_the_log(tmp_path_shm) -> None:
    run_child("""
        mapping = log.mapping
        image.poll(lambda b, h: None)
        image.close()
        pub.close()
        log.close()
        assert mapping.closed, "the last holder did not unmap the log"
    """, tmp_path_shm)


def test_log_close_first_then_the_holders_unmap(tmp_path_shm) -> None:
    run_child("""
        mapping = log.mapping
        log.close()
        assert not mapping.closed   # the publication and the image still hold it
        image.close()
        pub.close()
        assert mapping.closed
    """, tmp_path_shm)
