"""Nothing a full disk, another process or another thread does may kill a process.

Each scenario runs in a child process whose exit status is checked (a SIGBUS shows as -7 / 135), and prints
what it saw for the test to assert.  Scenarios that need a small file system mount a tmpfs inside a private
mount namespace (``unshare -m``, root only) and are skipped with the reason where that is not possible.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from driver_rig import start_driver, wait_for_driver

from logbuf.directory import (
    IMAGES_DIR,
    LOCK_FILE,
    LOSS_REPORT_FILE,
    MARKER_FILE,
    PUBLICATIONS_DIR,
    wake_semaphore_prefix,
)
from support import child_env, stop_process

pytestmark = pytest.mark.timeout(180)

PRELUDE = """
import gc, os, sys, threading, time
import logbuf
from logbuf.driver.media_driver import MediaDriver
from logbuf.errors import *

def wait_for(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)
"""


def _run(script: str, *args: str, timeout: float = 120, tmpfs_size: str | None = None,
         mount_point: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", PRELUDE + textwrap.dedent(script), *args]
    if tmpfs_size is not None:
        assert mount_point is not None
        command = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"', "sh",
                   tmpfs_size, str(mount_point), *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=child_env())


def _ok(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, (
        f"child exited {result.returncode}"
        f"{' (SIGBUS)' if result.returncode in (-signal.SIGBUS, 128 + signal.SIGBUS) else ''}:\n"
        f"{result.stdout}\n{result.stderr}"
    )
    return result.stdout.splitlines()


def _mount_namespace_reason() -> str | None:
    if os.geteuid() != 0:
        return "a tmpfs in a private mount namespace needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare -m is not permitted here: {probe.stderr.strip()}"
    return None


needs_tmpfs = pytest.mark.skipif(bool(_mount_namespace_reason()), reason=str(_mount_namespace_reason()))


# -- a full file system ---------------------------------------------------------------------------------------------


@needs_tmpfs
@pytest.mark.parametrize("pre_touch", [False, True])
def test_full_tmpfs_refuses_the_publication_with_storage_space_instead_of_sigbus(tmp_path: Path,
                                                                                  pre_touch: bool) -> None:
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    lines = _ok(_run("""
        directory, pre_touch = sys.argv[1], sys.argv[2] == "True"
        # 1 MiB terms: 3 MiB logs on a 24 MiB file system that also holds cnc.dat and the loss report
        with MediaDriver.launch(directory, ipc_term_length=1024 * 1024, storage_reserve=0, pre_touch=pre_touch):
            with logbuf.connect(directory) as client:
                publications, refused = [], None
                for stream in range(1, 40):
                    try:
                        publications.append(client.add_exclusive_publication("aeron:ipc", stream))
                    except RegistrationError as exc:
                        refused = exc
                        break
                assert refused is not None, "the file system never filled up"
                print("made", len(publications))
                print("code", refused.code)
                print("message", refused)
                # the logs that were made are backed: filling one (a full lap of its term) cannot fault
                sub = client.add_subscription("aeron:ipc", 1)
                wait_for(lambda: publications[0].is_connected, what="the first publication to connect")
                sent = 0
                while sent < 3 * 1024 and publications[0].offer(b"x" * 1000) > 0:
                    sent += 1
                    sub.poll(lambda b, h: None, 100)
                print("offered", sent)
        print("exit clean")
    """, str(mount_point / "drv"), str(pre_touch), tmpfs_size="24m", mount_point=mount_point))
    values = dict(line.split(" ", 1) for line in lines)
    assert 1 <= int(values["made"]) < 8
    assert values["code"] == "12"  # Aeron's STORAGE_SPACE
    assert "insufficient usable storage for new log of length=" in values["message"]
    assert int(values["offered"]) > 0
    assert values["exit"] == "clean"


@needs_tmpfs
def test_free_space_reserve_refuses_logs_that_would_eat_into_it(tmp_path: Path) -> None:
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    lines = _ok(_run("""
        directory = sys.argv[1]
        with MediaDriver.launch(directory, ipc_term_length=1024 * 1024, storage_reserve=20 * 1024 * 1024):
            with logbuf.connect(directory) as client:
                try:
                    client.add_publication("aeron:ipc", 1)
                except RegistrationError as exc:
                    print("refused", exc.code, "reserve" in str(exc))
                else:
                    print("accepted")
                print("logs", len(os.listdir(os.path.join(directory, "publications"))))
    """, str(mount_point / "drv"), tmpfs_size="24m", mount_point=mount_point))
    # 3 MiB + a 20 MiB reserve do not fit the ~22 MiB left: refused, and no file is left behind
    assert lines == ["refused 12 True", "logs 0"]


@needs_tmpfs
def test_an_image_the_file_system_cannot_hold_is_refused_counted_and_logged(tmp_path: Path) -> None:
    from udp_rig import free_udp_port

    mount_point = tmp_path / "small"
    mount_point.mkdir()
    lines = _ok(_run("""
        from logbuf.cnc import counters as c
        directory, port = sys.argv[1], sys.argv[2]
        channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
        # 4 MiB terms: the publication's 12 MiB log fits the 24 MiB file system, its image's 12 MiB does not
        with MediaDriver.launch(directory, network_term_length=4 * 1024 * 1024, storage_reserve=0) as driver:
            with logbuf.connect(directory) as client:
                sub = client.add_subscription(channel, 11)
                pub = client.add_publication(channel, 11)
                errors = lambda: client.counters.counter_value(c.SystemCounter.ERRORS)  # system counter ids are fixed
                wait_for(lambda: errors() > 0, what="the refused image to be counted")
                texts = [o.text for o in driver.cnc.error_log_reader()]
                print("logged", any("insufficient usable storage" in t for t in texts))
                print("images", len(sub.images), "driver", driver.is_running)
    """, str(mount_point / "drv"), str(free_udp_port()), tmpfs_size="24m", mount_point=mount_point))
    assert lines == ["logged True", "images 0 driver True"]


@needs_tmpfs
def test_a_setup_flood_on_a_small_tmpfs_leaves_the_driver_alive_and_a_valid_stream_intact(tmp_path: Path) -> None:
    from udp_rig import free_udp_port

    mount_point = tmp_path / "small"
    mount_point.mkdir()
    lines = _ok(_run("""
        import collections, socket, struct
        from logbuf.cnc import counters as c
        from logbuf.protocol import SetupFrame, encode_data_frame
        directory, port = sys.argv[1], int(sys.argv[2])
        STREAM, LIMIT = 1001, 4 * 1024 * 1024
        channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"

        def message(seq):
            return struct.pack("<Q", seq) + bytes((seq * 31 + i) & 0xFF for i in range(192))

        # 4 MiB terms are within the limit (12 MiB logs: a few fit the 48 MiB file system); 1 GiB terms are not
        with MediaDriver.launch(directory, storage_reserve=0, max_images_per_source=4,
                                max_image_term_length=LIMIT, idle_strategy="backoff:1000000") as driver:
            with logbuf.connect(directory) as client:
                sub = client.add_subscription(channel, STREAM)
                pub = client.add_publication(channel, STREAM)
                wait_for(lambda: pub.is_connected and any(i.session_id == pub.session_id for i in sub.images),
                         what="the valid stream's image")
                image = next(i for i in sub.images if i.session_id == pub.session_id)
                got, corrupt = [], []
                def on_fragment(buffer, header):
                    data = bytes(buffer)
                    seq = struct.unpack_from("<Q", data)[0]
                    (got if data == message(seq) else corrupt).append(seq)
                def offer(seq):
                    deadline = time.monotonic() + 30
                    while pub.offer(message(seq)) < 0:
                        image.poll(on_fragment, 100)
                        if time.monotonic() > deadline:
                            raise SystemExit(f"the valid stream is stuck at {seq}")
                        time.sleep(0.0002)
                    image.poll(on_fragment, 100)

                sources = []
                for host in range(2, 10):  # eight source addresses, two ports each
                    for _ in range(2):
                        raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                        raw.bind((f"127.0.0.{host}", 0))
                        sources.append(raw)
                seq = 0
                for round in range(3):
                    for index, raw in enumerate(sources):
                        # six sessions per source, over its limit of 4: three small, then two within the term
                        # limit (only the first few fit the file system) and one beyond it
                        for k, term in enumerate((64 * 1024, 64 * 1024, 64 * 1024, LIMIT, 1 << 30, LIMIT)):
                            session = 10_000 + 100 * index + k
                            raw.sendto(SetupFrame(0, session, STREAM, 7, 7, term, 1408, 0).encode(),
                                       ("127.0.0.1", port))
                            for offset in range(0, 3 * 1024 * 1024, 512 * 1024):  # DATA across the term
                                raw.sendto(encode_data_frame(b"f" * 1000, term_offset=offset, session_id=session,
                                                             stream_id=STREAM, term_id=7), ("127.0.0.1", port))
                        offer(seq)
                        seq += 1

                def storage_refused():
                    return any("insufficient usable storage" in o.text for o in driver.cnc.error_log_reader())

                # senders repeat their SETUPs: the images within the term limit keep being asked for until the
                # file system cannot back another one (how many the rounds above made depends on timing)
                deadline = time.monotonic() + 60
                while not storage_refused() and time.monotonic() < deadline:
                    for index, raw in enumerate(sources):
                        for k in (3, 5):
                            raw.sendto(SetupFrame(0, 10_000 + 100 * index + k, STREAM, 7, 7, LIMIT, 1408, 0).encode(),
                                       ("127.0.0.1", port))
                    offer(seq)
                    seq += 1
                    time.sleep(0.01)
                for _ in range(200):  # after the flood
                    offer(seq)
                    seq += 1
                def drained():
                    # every message offered has arrived: a poll that returns fragments is no sign of that (the
                    # receiver may still be behind under load), so the count alone ends the wait
                    image.poll(on_fragment, 100)
                    return len(got) + len(corrupt) >= seq
                wait_for(drained, timeout=30, what="the valid stream's messages")
                print("valid", got == list(range(seq)), "corrupt", len(corrupt))
                if got != list(range(seq)):  # what went wrong, for the assertion's message
                    counts = collections.Counter(got)
                    print("offered", seq, "got", len(got), "duplicated", sorted(k for k, v in counts.items() if v > 1)[:10],
                          "missing", sorted(set(range(seq)) - set(counts))[:10],
                          "out of order", [got[i] for i in range(1, len(got)) if got[i] < got[i - 1]][:10])
                texts = [o.text for o in driver.cnc.error_log_reader()]
                observations = sum(o.count for o in driver.cnc.error_log_reader())
                print("storage refused", any("insufficient usable storage" in t for t in texts))
                print("term refused", any(f"term length {1 << 30} is over the limit" in t for t in texts))
                print("source refused", any("limit of 4 images" in t for t in texts))
                print("counted", client.counters.counter_value(c.SystemCounter.ERRORS) >= observations >= 3)
                # every image log the driver made is backed (nothing sparse reached the receiver agent)
                images_dir = os.path.join(directory, "images")
                logs = [os.stat(os.path.join(images_dir, n)) for n in os.listdir(images_dir)]
                print("backed", all(st.st_blocks * 512 >= st.st_size for st in logs))
                print("big logs", sum(1 for st in logs if st.st_size > 3 * LIMIT) <= 3, "driver", driver.is_running)
                for raw in sources:
                    raw.close()
        print("exit clean")
    """, str(mount_point / "drv"), str(free_udp_port()), tmpfs_size="48m", mount_point=mount_point, timeout=170))
    assert lines == ["valid True corrupt 0", "storage refused True", "term refused True", "source refused True",
                     "counted True", "backed True", "big logs True driver True", "exit clean"], lines


@needs_tmpfs
def test_a_driver_whose_cnc_file_cannot_be_backed_refuses_to_start(tmp_path: Path) -> None:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    lines = _ok(_run("""
        directory = sys.argv[1]
        try:
            MediaDriver(directory=directory)  # cnc.dat alone is several MiB
        except StorageSpaceError as exc:
            print("refused", isinstance(exc, OSError), sorted(os.listdir(directory)) if os.path.isdir(directory) else [])
    """, str(mount_point / "drv"), tmpfs_size="1m", mount_point=mount_point))
    assert lines == ["refused True []"]


# -- truncation of a live log ---------------------------------------------------------------------------------------


def test_truncating_a_live_log_closes_its_stream_not_the_processes(tmp_path: Path) -> None:
    lines = _ok(_run("""
        directory = sys.argv[1]
        errors = []
        with MediaDriver.launch(directory, ipc_term_length=64 * 1024) as driver:
            with logbuf.connect(directory, error_handler=errors.append) as client:
                pub = client.add_publication("aeron:ipc", 7)
                sub = client.add_subscription("aeron:ipc", 7)
                wait_for(lambda: pub.is_connected, what="connected")
                for _ in range(100):
                    pub.offer(b"x" * 100)
                sub.poll(lambda b, h: None, 1000)
                (name,) = os.listdir(os.path.join(directory, "publications"))
                os.truncate(os.path.join(directory, "publications", name), 4096)  # metadata and terms gone
                # publisher, subscriber and driver touch the lost pages at once: none of them may die
                results = {pub.offer(b"y" * 100) for _ in range(2000)}
                sub.poll(lambda b, h: None, 1000)
                wait_for(lambda: pub.is_closed and not sub.images and errors, what="the stream to close")
                print("closed", pub.offer(b"z") == logbuf.PublicationResult.CLOSED)
                # "truncated" where the native guard already recovered a fault, "shrank" where the stat saw it first
                print("error", type(errors[0]).__name__, any(w in str(errors[0]) for w in ("truncated", "shrank")))
                # the driver goes on serving other streams
                other = client.add_publication("aeron:ipc", 8)
                other_sub = client.add_subscription("aeron:ipc", 8)
                wait_for(lambda: other.is_connected, what="another stream")
                wait_for(lambda: other.offer(b"fine") > 0, what="an offer on another stream")
                got = []
                wait_for(lambda: other_sub.poll(lambda b, h: got.append(bytes(b)), 10) or got, what="delivery")
                print("other", got[0].decode(), driver.is_running)
    """, str(tmp_path / "drv")))
    assert lines == ["closed True", "error InvalidLogBufferError True", "other fine True"]


@pytest.mark.parametrize("threading_mode", ["shared", "shared-network", "dedicated"])
def test_the_driver_itself_closes_a_stream_whose_log_was_truncated(tmp_path: Path, threading_mode: str) -> None:
    """The driver does not wait for clients to notice: on its timer it finds the shrunk publication log and the
    shrunk image log, closes each of those streams through its agents with one error-log entry, and serves on."""
    from udp_rig import free_udp_port

    lines = _ok(_run("""
        directory, port, mode = sys.argv[1], sys.argv[2], sys.argv[3]
        udp = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
        # the native agents (IPC duty, sender, receiver) use the mappings from their own threads in every mode
        with MediaDriver.launch(directory, ipc_term_length=64 * 1024, threading_mode=mode) as driver:
            conductor = driver.conductor
            with logbuf.connect(directory, error_handler=lambda e: None) as client:
                ipc_pub = client.add_publication("aeron:ipc", 7)
                ipc_sub = client.add_subscription("aeron:ipc", 7)
                udp_sub = client.add_subscription(udp, 9)
                udp_pub = client.add_publication(udp, 9)
                net_pub = client.add_publication(udp, 10)  # its publication log is the one cut on this stream
                wait_for(lambda: ipc_pub.is_connected and udp_pub.is_connected and udp_sub.images, what="connected")
                ipc_id, net_id = ipc_pub.registration_id, net_pub.registration_id
                (image_id,) = [i.correlation_id for i in udp_sub.images]
                driver_images = lambda: {i for e in conductor.network.receive_endpoints.values() for i in e.images}
                assert image_id in driver_images()
                ipc_log = next(p.log.path for p in conductor.ipc.publications if p.registration_id == ipc_id)
                image_log = os.path.join(directory, "images", f"{image_id}.logbuffer")
                net_log = next(p.log.path for p in conductor.network.publications if p.registration_id == net_id)
                for path in (ipc_log, image_log, net_log):
                    os.truncate(path, 4096)
                wait_for(lambda: all(p.registration_id != ipc_id for p in conductor.ipc.publications)
                         and all(p.registration_id != net_id for p in conductor.network.publications)
                         and image_id not in driver_images(), what="the driver to close the three streams")
                wait_for(lambda: not any(os.path.exists(p) for p in (ipc_log, image_log, net_log)),
                         what="the agents to let go and the logs to be deleted")
                texts = [(o.count, o.text) for o in driver.cnc.error_log_reader()]
                print("publication", [n for n, t in texts if f"publication {ipc_id} " in t and "closed" in t])
                print("network publication", [n for n, t in texts if f"publication {net_id} " in t and "closed" in t])
                print("image", [n for n, t in texts if f"image {image_id} " in t and "closed" in t])
                wait_for(lambda: ipc_pub.is_closed and net_pub.is_closed
                         and all(i.correlation_id != image_id for i in udp_sub.images),
                         what="the clients to see the streams closed")
                # the driver serves on: a new IPC stream, and the UDP publication's stream gets a fresh image
                other = client.add_publication("aeron:ipc", 8)
                other_sub = client.add_subscription("aeron:ipc", 8)
                wait_for(lambda: other.is_connected and other.offer(b"fine") > 0, what="another stream")
                got = []
                wait_for(lambda: other_sub.poll(lambda b, h: got.append(bytes(b)), 10) or got, what="delivery")
                print("other", got[0].decode(), driver.is_running)
        print("exit clean")
    """, str(tmp_path / "drv"), str(free_udp_port()), threading_mode))
    assert lines == ["publication [1]", "network publication [1]", "image [1]", "other fine True", "exit clean"], lines


def test_a_client_that_slept_through_the_truncation_still_closes_its_publication(tmp_path: Path) -> None:
    """The driver may close the publication and delete its shrunk log before the client's conductor runs (a
    starved thread): the name is gone, so the client learns it from the publisher-limit counter the driver freed."""
    lines = _ok(_run("""
        directory = sys.argv[1]
        errors = []
        with MediaDriver.launch(directory, ipc_term_length=64 * 1024) as driver:
            # no conductor thread: this client does no work until the test says so, as a starved one would not
            with logbuf.connect(directory, conductor_thread=False, error_handler=errors.append) as client:
                pub = client.add_publication("aeron:ipc", 7)
                log = next(p.log.path for p in driver.conductor.ipc.publications
                           if p.registration_id == pub.registration_id)
                os.truncate(log, 4096)
                wait_for(lambda: not os.path.exists(log), timeout=60, what="the driver to close and delete the log")
                print("open before work", not pub.is_closed)
                wait_for(lambda: client.do_work() >= 0 and pub.is_closed, timeout=60, what="the client to close it")
                print("closed", pub.offer(b"x") == -4, [type(e).__name__ for e in errors])
    """, str(tmp_path / "drv")))
    assert lines == ["open before work True", "closed True ['InvalidLogBufferError']"], lines


def test_truncating_cnc_dat_loses_the_driver_for_its_clients_without_killing_anyone(tmp_path: Path) -> None:
    lines = _ok(_run("""
        directory = sys.argv[1]
        errors = []
        with MediaDriver.launch(directory, ipc_term_length=64 * 1024) as driver:
            client = logbuf.connect(directory, error_handler=errors.append, driver_timeout_ms=1000)
            pub = client.add_publication("aeron:ipc", 7)
            os.truncate(os.path.join(directory, "cnc.dat"), 0)
            wait_for(lambda: client.is_closed, what="the client to lose its driver")
            try:
                client.add_publication("aeron:ipc", 8)
            except DriverTimeout:
                print("driver timeout")
            print("closed", pub.is_closed, "driver thread alive", driver.is_running)
    """, str(tmp_path / "drv")))
    assert lines == ["driver timeout", "closed True driver thread alive True"]


# -- the client's lifecycle -----------------------------------------------------------------------------------------


def test_close_from_another_thread_lets_a_running_handler_finish(tmp_path: Path) -> None:
    lines = _ok(_run("""
        directory = sys.argv[1]
        failures, runs = [], 0
        with MediaDriver.launch(directory, ipc_term_length=64 * 1024):
            for _ in range(40):
                client = logbuf.connect(directory)
                pub = client.add_publication("aeron:ipc", 3)
                sub = client.add_subscription("aeron:ipc", 3)
                wait_for(lambda: pub.is_connected, what="connected")
                wait_for(lambda: pub.offer(b"m") > 0, what="offer")
                entered, proceed = threading.Event(), threading.Event()
                seen = []

                def handler(buffer, header):
                    entered.set()
                    proceed.wait(5)
                    seen.append((bytes(buffer), header.position))  # after the close on the other thread

                def closer():
                    entered.wait(5)
                    client.close()
                    proceed.set()

                thread = threading.Thread(target=closer)
                thread.start()
                try:
                    wait_for(lambda: sub.poll(handler, 1) or seen, what="the handler")
                except Exception as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
                thread.join(10)
                runs += 1
                if seen and seen[0][0] != b"m":
                    failures.append(f"payload {seen[0]!r}")
                if sub.poll(lambda b, h: None, 10) != 0:
                    failures.append("poll after close delivered")
        print("runs", runs, "failures", failures)
    """, str(tmp_path / "drv")))
    assert lines == ["runs 40 failures []"]


def test_dropped_clients_are_collected_and_freed_by_the_driver(tmp_path: Path) -> None:
    lines = _ok(_run("""
        from logbuf.cnc import counters as c
        directory = sys.argv[1]

        def fds():
            return len(os.listdir("/proc/self/fd"))

        with MediaDriver.launch(directory, ipc_term_length=64 * 1024) as driver:
            with logbuf.connect(directory) as watcher:
                def heartbeats():
                    return sum(1 for info in watcher.counters if info.type_id == c.CLIENT_HEARTBEAT_TYPE_ID)

                wait_for(lambda: heartbeats() == 1, what="the watcher's heartbeat")
                threads, files = threading.active_count(), fds()
                for i in range(100):
                    client = logbuf.connect(directory)
                    client.add_publication("aeron:ipc", 1000 + i)
                    client.add_subscription("aeron:ipc", 1000 + i)
                del client
                gc.collect()
                wait_for(lambda: threading.active_count() <= threads, what="the conductor threads to end")
                wait_for(lambda: heartbeats() == 1, what="the driver to free the dropped clients")
                wait_for(lambda: fds() <= files + 5, what="the fds to close")
                print("threads", threading.active_count() - threads, "heartbeats", heartbeats())
                # a client kept alive only by its publication is not collected under it
                pub = logbuf.connect(directory).add_publication("aeron:ipc", 5)
                gc.collect()
                print("kept", pub.is_closed)
    """, str(tmp_path / "drv")))
    assert lines == ["threads 0 heartbeats 1", "kept False"]


def test_a_forked_child_refuses_the_inherited_client_and_never_harms_the_parent(tmp_path: Path) -> None:
    lines = _ok(_run("""
        directory = sys.argv[1]
        with MediaDriver.launch(directory, ipc_term_length=64 * 1024):
            client = logbuf.connect(directory)
            pub = client.add_publication("aeron:ipc", 9)
            sub = client.add_subscription("aeron:ipc", 9)
            wait_for(lambda: pub.is_connected, what="connected")
            read, write = os.pipe()
            child = os.fork()
            if child == 0:
                status = 0
                try:
                    client.add_publication("aeron:ipc", 10)
                    status = 3
                except ClosedError as exc:
                    os.write(write, (f"refused {'fork' in str(exc)} {client.is_closed}\\n").encode())
                pub.close()
                sub.close()
                client.close()
                os._exit(status)
            _, status = os.waitpid(child, 0)
            print(os.read(read, 200).decode().strip())
            print("child", os.waitstatus_to_exitcode(status))
            time.sleep(0.5)  # what the child might have sent, the driver would have acted on by now
            wait_for(lambda: pub.offer(b"after fork") > 0, timeout=5, what="an offer in the parent")
            got = []
            wait_for(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) or got, timeout=5, what="delivery")
            print("parent", got[0].decode(), client.is_closed, pub.is_connected)
            client.close()
    """, str(tmp_path / "drv")))
    assert lines == ["refused True True", "child 0", "parent after fork False True"]


def test_a_poll_only_consumer_learns_that_the_driver_died(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    driver = start_driver(directory)
    try:
        wait_for_driver(directory, driver)
        consumer = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + textwrap.dedent("""
                directory = sys.argv[1]
                client = logbuf.connect(directory, driver_timeout_ms=1000)
                sub = client.add_subscription("aeron:ipc", 4)
                print("ready", flush=True)
                started = None
                try:
                    while True:
                        sub.poll(lambda b, h: None, 10)
                        if started is None and os.path.exists(directory + "/killed"):
                            started = time.monotonic()
                        time.sleep(0.001)
                except DriverTimeout as exc:
                    print("timeout", started is not None, round(time.monotonic() - (started or 0), 1), flush=True)
            """), str(directory)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
        )
        try:
            assert consumer.stdout is not None
            assert consumer.stdout.readline().strip() == "ready"
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait(10)
            (directory / "killed").touch()
            out, err = consumer.communicate(timeout=60)
        finally:
            stop_process(consumer)
        assert consumer.returncode == 0, err
        words = out.split()
        assert words[:2] == ["timeout", "True"], out
        assert float(words[2]) < 30  # the driver timeout is 1 s: well within, even on a loaded machine
    finally:
        stop_process(driver)


def test_connect_while_the_driver_starts_waits_for_its_cnc_file(tmp_path: Path) -> None:
    lines = _ok(_run("""
        base = sys.argv[1]
        failures = []
        for i in range(40):
            directory = os.path.join(base, str(i))
            starter = threading.Thread(target=lambda: drivers.append(MediaDriver.launch(directory,
                                                                                        ipc_term_length=64 * 1024)))
            drivers = []
            starter.start()
            try:
                with logbuf.connect(directory, connect_timeout=20):
                    pass
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
            starter.join(20)
            for driver in drivers:
                driver.close()
        # a cnc.dat that stays empty is waited for, then reported as not ready (not at once)
        os.makedirs(os.path.join(base, "empty"))
        open(os.path.join(base, "empty", "cnc.dat"), "wb").close()
        started = time.monotonic()
        try:
            logbuf.connect(os.path.join(base, "empty"), connect_timeout=0.3)
        except Exception as exc:
            print("empty", type(exc).__name__, time.monotonic() - started >= 0.3)
        print("failures", failures)
    """, str(tmp_path)))
    assert lines == ["empty CncNotReadyError True", "failures []"]


# -- the subscriber's length checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [0, -96, 64, 96, 200])
def test_a_rewritten_frame_length_in_the_backlog_is_never_skipped_silently(tmp_path: Path, length: int) -> None:
    lines = _ok(_run("""
        import struct
        from logbuf.logbuffer.log_buffers import LogBuffers
        directory, length = sys.argv[1], int(sys.argv[2])
        with MediaDriver.launch(directory, ipc_term_length=64 * 1024):
            with logbuf.connect(directory) as client:
                pub = client.add_publication("aeron:ipc", 6)
                sub = client.add_subscription("aeron:ipc", 6)
                wait_for(lambda: pub.is_connected and sub.images, what="connected, with the image")
                messages = [bytes([65 + i]) * 96 for i in range(20)]  # 128-byte frames
                for message in messages:
                    wait_for(lambda: pub.offer(message) > 0, what="offer")
                (name,) = os.listdir(os.path.join(directory, "publications"))
                log = LogBuffers.open(os.path.join(directory, "publications", name))
                log.terms.view[5 * 128 : 5 * 128 + 4] = struct.pack("<i", length)  # the 6th frame's length
                got, error = [], None
                try:
                    for _ in range(5):
                        sub.poll(lambda b, h: got.append(bytes(b)), 100)
                except LogCorruptedError as exc:
                    error = exc
                intact = got == messages[: len(got)]
                print("delivered", len(got), "intact", intact,
                      "error", None if error is None else error.position)
                log.close()
    """, str(tmp_path / "drv"), str(length)))
    assert len(lines) == 1, lines
    words = lines[0].split()
    # the five frames before it arrive intact; the rewritten one is neither delivered nor skipped
    assert words[:4] == ["delivered", "5", "intact", "True"], lines
    if length > 0:
        assert words[4:] == ["error", str(5 * 128)], lines  # a length that lands inside another frame: an error
    else:
        assert words[4:] == ["error", "None"], lines  # an uncommitted frame: the subscriber waits there


# -- wake-up semaphores ---------------------------------------------------------------------------------------------


def test_wake_up_semaphores_of_ephemeral_streams_stay_bounded(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    lines = _ok(_run("""
        directory = sys.argv[1]
        with MediaDriver.launch(directory, ipc_term_length=64 * 1024) as driver:
            with logbuf.connect(directory) as client:
                kept = client.add_subscription("aeron:ipc", 1)
                for stream in range(2, 1002):
                    client.add_subscription("aeron:ipc", stream).close()
                pub = client.add_publication("aeron:ipc", 1)
                wait_for(lambda: pub.is_connected, what="connected")
                print("semaphores", len(driver._semaphores))
                print("kept", 1 in driver._semaphores)
                # the stream still in use kept its semaphore: a waiter is woken by the publisher
                waiter = threading.Thread(target=lambda: woke.append(kept.wait(10)))
                woke = []
                waiter.start()
                time.sleep(0.2)
                pub.offer(b"wake")
                waiter.join(15)
                print("woke", woke)
                prefix = sys.argv[2][1:]
                print("files", len([n for n in os.listdir("/dev/shm") if n.startswith("sem." + prefix)]))
    """, str(directory), wake_semaphore_prefix(directory), timeout=170))
    values = dict(line.split(" ", 1) for line in lines)
    assert int(values["semaphores"]) <= 2 * 2 + 64 + 1
    assert int(values["files"]) <= 2 * 2 + 64 + 1
    assert values["kept"] == "True"
    assert values["woke"] == "[True]"


def test_wake_up_semaphores_are_reclaimed_on_the_timer_after_the_streams_linger(tmp_path: Path) -> None:
    """Far below the creation-time bound: the conductor's timer unlinks the semaphore of each stream unused for
    a publication linger, and keeps the one of a stream still in use."""
    directory = tmp_path / "drv"
    lines = _ok(_run("""
        directory, prefix = sys.argv[1], sys.argv[2][1:]
        files = lambda: sorted(n for n in os.listdir("/dev/shm") if n.startswith("sem." + prefix))
        linger_s = 2.0
        with MediaDriver.launch(directory, ipc_term_length=64 * 1024, timer_interval_ns=50_000_000,
                                publication_linger_timeout_ns=int(linger_s * 1e9)) as driver:
            with logbuf.connect(directory) as client:
                kept = client.add_subscription("aeron:ipc", 1)
                for stream in range(2, 12):
                    client.add_subscription("aeron:ipc", stream).close()
                closed_at = time.monotonic()
                count = len(driver._semaphores)
                # nothing goes before its linger (a slow machine may have let it pass already)
                print("during linger", count == 11 or time.monotonic() - closed_at >= linger_s)
                wait_for(lambda: set(driver._semaphores) == {1}, timeout=30, what="the unused streams' semaphores")
                print("reclaimed after", time.monotonic() - closed_at >= linger_s)
                print("files", len(files()))
                # the stream still in use kept its semaphore: a waiter is woken by the publisher
                pub = client.add_publication("aeron:ipc", 1)
                wait_for(lambda: pub.is_connected, what="connected")
                woke = []
                waiter = threading.Thread(target=lambda: woke.append(kept.wait(10)))
                waiter.start()
                pub.offer(b"wake")  # a post before the wait still wakes it
                waiter.join(15)
                print("woke", woke)
                # a stream used again gets a new semaphore
                client.add_subscription("aeron:ipc", 5)
                print("again", 5 in driver._semaphores)
    """, str(directory), wake_semaphore_prefix(directory), timeout=120))
    assert lines == ["during linger True", "reclaimed after True", "files 1", "woke [True]", "again True"], lines


# -- group access ---------------------------------------------------------------------------------------------------


def test_group_access_gives_every_directory_0770_and_every_file_0660_whatever_the_umask(tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    lines = _ok(_run("""
        directory = sys.argv[1]
        os.umask(0o077)
        with MediaDriver.launch(directory, group_access=True, ipc_term_length=64 * 1024):
            with logbuf.connect(directory) as client:
                pub = client.add_publication("aeron:ipc", 2)
                for root, dirs, files in os.walk(directory):
                    for name in dirs + files:
                        path = os.path.join(root, name)
                        print(os.path.relpath(path, directory), oct(os.stat(path).st_mode & 0o777))
                print(".", oct(os.stat(directory).st_mode & 0o777))
    """, str(directory)))
    modes = dict(line.split(" ") for line in lines)
    for name in (".", PUBLICATIONS_DIR, IMAGES_DIR):
        assert modes[name] == oct(0o770), (name, modes)
    for name in ("cnc.dat", LOSS_REPORT_FILE, LOCK_FILE, MARKER_FILE):
        assert modes[name] == oct(0o660), (name, modes)
    logs = [name for name in modes if name.startswith(PUBLICATIONS_DIR + "/")]
    assert logs and all(modes[name] == oct(0o660) for name in logs), modes
