"""docs/cli.md's error rules, walked for every command as a user meets them, on ephemeral ports and in the
test's own temporary directories.  Errors met before any work starts go through ``logbuf.cli.main`` in this
process (cheap: no interpreter start each); runs stopped by a signal, and the real entry point, are child
processes (``python -m logbuf.cli``) stopped by their PID.

* a usage error: exit status 2 and exactly one line, ``logbuf CMD: error: <message>``, in the user's words;
* a runtime error: one such line naming the file, directory or address, and a non-zero status;
* Ctrl-C (SIGINT) where it interrupts work: the command stops cleanly, then ``logbuf CMD: interrupted`` and
  exit status 130 (SIGTERM, a service manager's stop, keeps 0);
* ``LOGBUF_TRACEBACK=1`` shows the traceback behind a message instead.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from logbuf import cli
from logbuf.channel import parse_endpoint
from logbuf.driver.media_driver import MediaDriver
from logbuf.errors import LogbufError
from support import child_env, lines_of, stop_process

TIMEOUT = 60.0  # generous: these children start interpreters on a machine whose cores may all be busy


def _env(**extra: str) -> dict[str, str]:
    env = child_env()
    env.pop(cli.TRACEBACK_ENV, None)
    return {**env, **extra}


def logbuf(*args: str, timeout: float = TIMEOUT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "logbuf.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(**env))


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "logbuf.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env())


class Ran(NamedTuple):
    returncode: int
    stderr: str


@pytest.fixture
def main(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Ran]]:
    """``logbuf ARGS`` through ``logbuf.cli.main`` in this process: its status and its stderr."""
    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)

    def run(*args: str) -> Ran:
        capsys.readouterr()
        try:
            code = cli.main(list(args))
        except SystemExit as exit:  # argparse
            code = int(exit.code or 0)
        return Ran(code, capsys.readouterr().err)

    yield run
    logging.getLogger("logbuf").handlers.clear()  # main() pointed the library's log at pytest's stderr


def one_error_line(done: Ran | subprocess.CompletedProcess[str], command: str) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"logbuf {command}: error: "), done.stderr
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A UDP port of 127.0.0.1 this test holds (no SO_REUSEADDR/SO_REUSEPORT: nobody else can bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("day") / "day.itch"
    done = logbuf("synth", str(path), "--messages", "5000", "-q")
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture
def embedded_driver(tmp_path: Path) -> Iterator[Path]:
    """A media driver on a thread of this process, in a directory of this test."""
    with MediaDriver.launch(tmp_path / "embedded") as running:
        yield running.directory


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Path]:
    """A ``logbuf driver`` child in a directory of this test."""
    directory = tmp_path / "driver"
    proc = start("driver", "--dir", str(directory))
    try:
        lines_of(proc.stderr, "driver").read_until("Ctrl-C to stop", timeout=TIMEOUT)
        yield directory
    finally:
        stop_process(proc)


# -- usage errors: 2 and one line -------------------------------------------------------------------------


# the positional arguments each command needs (parsed before an unknown option is reported)
POSITIONALS = {"analyze": ["rec", "out"], "logdump": ["x.logbuffer"], "synth": ["day.itch"], "replay": ["day.itch"],
               "retransmit": ["day.itch"], "record": ["rec"], "scenario": ["out"]}


@pytest.mark.parametrize("command", sorted(cli._COMMANDS))
def test_an_unknown_option_is_one_line_from_the_command(command: str, main: Callable[..., Ran]) -> None:
    done = main(command, *POSITIONALS.get(command, []), "--no-such-option")
    assert done.returncode == 2
    assert one_error_line(done, command).endswith("unrecognized arguments: --no-such-option")


def test_the_installed_entry_point_says_the_same() -> None:
    done = logbuf("feed", "--no-such-option")
    assert (done.returncode, done.stderr) == (2, "logbuf feed: error: unrecognized arguments: --no-such-option\n")


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["driver", "--ipc-term-length", "3m"], "--ipc-term-length: term length 3145728 must be a power of two"),
        (["driver", "--receive-batch", "65"], "argument --receive-batch: must be 1..64"),
        (["stat", "--count", "2"], "--count needs --watch"),
        (["stat", "--type", "bogus"], "unknown counter type 'bogus'"),
        (["logdump", "x.logbuffer", "--frames", "some"], "argument --frames: 'some' is not a whole number"),
        (["synth", "/no/such/dir/day.itch"], "no such directory: /no/such/dir"),
        (["replay", "/no/such/day.itch"], "no such file: /no/such/day.itch"),
        (["retransmit", "day.itch", "--ring-bits", "99"], "argument --ring-bits: ring bits must be within"),
        (["feed", "--batch-wait-us", "-5"], "argument --batch-wait-us: '-5' must be within [0, 100000] us"),
        (["book", "--interval", "0"], "--interval and --duration must be > 0"),
        (["record", "out", "--duration", "1", "--until-end-of-session"], "not allowed with argument"),
        (["demo", "--speed", "max"], "speed 'max' must be a positive number"),
    ],
)
def test_a_usage_error_is_status_2_and_one_line_in_the_users_words(args: list[str], wanted: str,
                                                                   main: Callable[..., Ran]) -> None:
    done = main(*args)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done, args[0])
    assert wanted in line
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", line), line  # options by their names, not internal fields


def test_replay_with_both_feeds_off_is_a_usage_error(day: Path, main: Callable[..., Ran]) -> None:
    done = main("replay", str(day), "--feed-a", "off", "--feed-b", "off")
    assert done.returncode == 2
    assert "both feeds are off" in one_error_line(done, "replay")


# -- runtime errors: one line naming the thing ----------------------------------------------------------


@pytest.mark.parametrize(("command", "status"), [("stat", 3), ("errors", 3), ("loss", 3)])
def test_an_inspection_tool_without_a_driver_names_the_directory(command: str, status: int, tmp_path: Path,
                                                                 main: Callable[..., Ran]) -> None:
    absent = tmp_path / "absent"
    done = main(command, "--dir", str(absent))
    assert done.returncode == status
    assert str(absent) in one_error_line(done, command)


def test_logdump_names_the_missing_file(tmp_path: Path, main: Callable[..., Ran]) -> None:
    done = main("logdump", str(tmp_path / "gone.logbuffer"))
    assert done.returncode == 3
    assert str(tmp_path / "gone.logbuffer") in one_error_line(done, "logdump")


def test_the_driver_names_a_directory_it_cannot_use(tmp_path: Path, main: Callable[..., Ran]) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("not a directory")
    done = main("driver", "--dir", str(taken))
    assert done.returncode == 1
    assert str(taken) in one_error_line(done, "driver")


def test_logbuf_traceback_shows_a_driver_errors_traceback(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("not a directory")
    done = logbuf("driver", "--dir", str(taken), **{cli.TRACEBACK_ENV: "1"})
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "DriverDirectoryError" in done.stderr


def test_record_without_a_driver_names_the_directory(tmp_path: Path, main: Callable[..., Ran]) -> None:
    done = main("record", str(tmp_path / "rec"), "--dir", str(tmp_path / "nodrv"), "--connect-timeout", "0.2")
    assert done.returncode == 1
    assert str(tmp_path / "nodrv") in one_error_line(done, "record")


@pytest.mark.parametrize("command", ["retransmit", "replay"])
def test_a_busy_port_is_named(command: str, day: Path, busy_port: int, main: Callable[..., Ran]) -> None:
    option = "--listen" if command == "retransmit" else "--retransmit"
    done = main(command, str(day), option, f"127.0.0.1:{busy_port}")
    assert done.returncode == 1
    assert one_error_line(done, command).endswith(f"cannot bind 127.0.0.1:{busy_port}: Address already in use")


def test_the_feed_handler_names_its_busy_port(embedded_driver: Path, busy_port: int,
                                             main: Callable[..., Ran]) -> None:
    done = main("feed", "--dir", str(embedded_driver), "--feed-a", f"127.0.0.1:{busy_port}", "--feed-b", "off",
                  "--mode", "a", "--duration", "5")
    assert done.returncode == 1
    assert one_error_line(done, "feed").endswith(f"cannot bind 127.0.0.1:{busy_port}: Address already in use")


# -- Ctrl-C: a clean stop, one line, 130 -------------------------------------------------------------------


def interrupt(proc: subprocess.Popen[str], ready: str, sig: int = signal.SIGINT) -> tuple[int | None, list[str]]:
    """Waits for the line that says ``proc`` is at work, sends ``sig`` to its PID; its status and last lines."""
    reader = lines_of(proc.stderr, proc.args[3] if isinstance(proc.args, list) else "child")
    try:
        reader.read_until(ready, timeout=TIMEOUT)
        proc.send_signal(sig)
        rest = reader.read_to_end(timeout=TIMEOUT)
    finally:
        status = stop_process(proc)
    return status, rest


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_the_driver_stops_cleanly_on_ctrl_c_with_130_and_on_sigterm_with_0(sig: int, status: int,
                                                                          tmp_path: Path) -> None:
    directory = tmp_path / "drv"
    code, rest = interrupt(start("driver", "--dir", str(directory)), "Ctrl-C to stop", sig)
    assert code == status
    assert rest[-1] == ("logbuf driver: interrupted" if sig == signal.SIGINT else "logbuf driver: stopped")
    assert not directory.exists()  # a clean shutdown: the directory it made is gone


def test_retransmit_interrupted(day: Path) -> None:
    code, rest = interrupt(start("retransmit", str(day), "--listen", "127.0.0.1:0"), "listening on")
    assert code == 130
    assert rest[-2].startswith("retransmit: ") and rest[-1] == "logbuf retransmit: interrupted"


def test_an_interrupted_replays_summary_says_what_went(day: Path, tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        # real time: the synthetic day spans hours, so the replay is stopped with most of it unsent
        proc = start("replay", str(day), "--speed", "1", "--feed-a", f"127.0.0.1:{a.getsockname()[1]}",
                     "--feed-b", f"127.0.0.1:{b.getsockname()[1]}", "--retransmit", "127.0.0.1:0",
                     "--summary-json", str(summary))
        code, rest = interrupt(proc, "retransmission on")
    assert code == 130
    assert rest[-1] == "logbuf replay: interrupted"
    report = json.loads(summary.read_text())
    feeds = report["feeds"]
    for key in ("messages", "bytes"):
        assert report[key] == sum(feed[key] for feed in feeds.values()), key
    assert report["packets"] == sum(f["packets"] + f["heartbeats"] + f["end_of_session"] for f in feeds.values())
    assert report["first_sequence"] == 1
    # feed A (no faults, not delayed) sent every message up to the last one any packet carried
    assert report["next_sequence"] - report["first_sequence"] == feeds["A"]["messages"]
    assert feeds["A"]["end_of_session"] == 0 and report["next_sequence"] < 5001


def test_the_feed_handler_interrupted(driver: Path) -> None:
    proc = start("feed", "--dir", str(driver), "--feed-a", "127.0.0.1:0", "--feed-b", "127.0.0.1:0",
                 "--no-recovery")
    code, rest = interrupt(proc, "logbuf feed: A=")
    assert code == 130
    assert rest[-1] == "logbuf feed: interrupted"


@pytest.mark.slow  # the client notices a dead driver after its 10 s liveness
def test_the_feed_handler_writes_its_summary_when_the_driver_dies(tmp_path: Path) -> None:
    directory = tmp_path / "driver"
    drv = start("driver", "--dir", str(directory))
    try:
        lines_of(drv.stderr, "driver").read_until("Ctrl-C to stop", timeout=TIMEOUT)
        summary = tmp_path / "feed.json"
        proc = start("feed", "--dir", str(directory), "--feed-a", "127.0.0.1:0", "--feed-b", "127.0.0.1:0",
                     "--no-recovery", "--checkpoint", "off", "--wait-for-subscriber", "0", "--summary-json",
                     str(summary))
        reader = lines_of(proc.stderr, "feed")
        try:
            reader.read_until("logbuf feed: A=", timeout=TIMEOUT)
            drv.kill()  # by its PID: the driver is gone
            rest = reader.read_to_end(timeout=TIMEOUT + 30)
        finally:
            status = stop_process(proc)
        assert status == 1 and "error" in rest[-1]
        assert "published" in json.loads(summary.read_text())  # the run's counters up to the failure
    finally:
        stop_process(drv)


def test_the_recorder_interrupted(driver: Path, tmp_path: Path) -> None:
    proc = start("record", str(tmp_path / "rec"), "--dir", str(driver))
    code, rest = interrupt(proc, "until Ctrl-C")
    assert code == 130
    assert rest[-1] == "logbuf record: interrupted"


def test_logbuf_traceback_reraises_what_record_and_feed_print_themselves(
        tmp_path: Path, embedded_driver: Path, busy_port: int, main: Callable[..., Ran],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    with pytest.raises(LogbufError, match="no media driver"):
        main("record", str(tmp_path / "rec"), "--dir", str(tmp_path / "nodrv"), "--connect-timeout", "0.2")
    with pytest.raises(OSError, match=f"cannot bind 127.0.0.1:{busy_port}"):
        main("feed", "--dir", str(embedded_driver), "--feed-a", f"127.0.0.1:{busy_port}", "--feed-b", "off",
             "--mode", "a", "--duration", "5")


@pytest.mark.parametrize("option", ["--feed-a", "--feed-b", "--retransmit"])
def test_the_feed_handler_refuses_an_ipv6_address_by_name(option: str, main: Callable[..., Ran]) -> None:
    done = main("feed", "--dir", "/nonexistent", option, "[::1]:31501")
    assert done.returncode == 2
    assert one_error_line(done, "feed").endswith(f"{option}: [::1]:31501: the feed handler speaks IPv4 only")


def test_the_retransmission_server_says_its_ipv6_address_as_it_is_read_back(day: Path,
                                                                           main: Callable[..., Ran]) -> None:
    done = main("retransmit", str(day), "--listen", "[::1]:0", "--duration", "0.2")
    assert done.returncode == 0, done.stderr
    shown = re.search(r"listening on (\S+)", done.stderr)
    assert shown is not None, done.stderr
    host, port = parse_endpoint(shown.group(1))  # it was ::1:PORT, which no parser reads back
    assert host == "::1" and port > 0
