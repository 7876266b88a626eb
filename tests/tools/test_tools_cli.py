"""``logbuf stat`` / ``logbuf errors`` through the command line: in-process (``logbuf.cli.main``) for output
and exit codes, and as real subprocesses (the installed entry point, a live ``--watch`` stopped by SIGINT)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fake_driver import FakeDriver, now_ms

from logbuf.cli import main
from logbuf.cnc import counters as c
from support import lines_of, stop_process

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
LOGBUF = Path(sys.executable).with_name("logbuf")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_stat_text(driver: FakeDriver, capsys):
    driver.set(driver.system[24], 2)  # Client liveness timeouts
    sub = driver.stream_counter(
        c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos", 9, 5, 1001, value=1_000_000, join_position=0
    )
    code, out, err = run(capsys, "stat", "--dir", str(driver.directory))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert f"logbuf stat (CnC v0.2.0), pid {os.getpid()}, heartbeat age " in lines[0]
    assert lines[1] == "=" * 70
    assert " 24:                    2 - Client liveness timeouts" in lines
    assert f"{sub:3d}:            1,000,000 - sub-pos: 9 5 1001 aeron:ipc @0" in lines
    assert len(lines) == 2 + len(c.SYSTEM_COUNTER_LABELS) + 1


def test_stat_uses_logbuf_dir_env(driver: FakeDriver, capsys, monkeypatch):
    monkeypatch.setenv("LOGBUF_DIR", str(driver.directory))
    code, out, _ = run(capsys, "stat", "--type", "system", "--label", "^Errors:")
    assert code == 0
    assert out.splitlines()[2:] == [" 15:                    0 - " + c.SYSTEM_COUNTER_LABELS[15]]


def test_stat_json_and_filters(driver: FakeDriver, capsys):
    pub = driver.stream_counter(c.PUBLISHER_POSITION_TYPE_ID, c.PUBLISHER_POSITION_NAME, 7, 5, 1001, value=64)
    lmt = driver.stream_counter(c.PUBLISHER_LIMIT_TYPE_ID, "pub-lmt", 7, 5, 1001, value=32_768)
    code, out, _ = run(capsys, "stat", "--dir", str(driver.directory), "--json", "--type", "12", "pub-lmt")
    assert code == 0
    data = json.loads(out)
    assert data["driver_pid"] == os.getpid() and data["driver_state"] == "active"
    assert [(x["id"], x["type"], x["value"]) for x in data["counters"]] == [
        (pub, "pub-pos", 64),
        (lmt, "pub-lmt", 32_768),
    ]
    assert data["counters"][0]["key"]["stream_id"] == 1001

    code, out, _ = run(
        capsys, "stat", "--dir", str(driver.directory), "--json", "--label", "^Bytes (sent|received)$"
    )
    assert [x["label"] for x in json.loads(out)["counters"]] == ["Bytes sent", "Bytes received"]


def test_stat_usage_errors(driver: FakeDriver, capsys):
    code, out, err = run(capsys, "stat", "--dir", str(driver.directory), "--type", "bogus")
    assert code == 2 and out == "" and "unknown counter type 'bogus'" in err
    code, _, err = run(capsys, "stat", "--dir", str(driver.directory), "--label", "[")
    assert code == 2 and "bad --label" in err
    code, _, err = run(capsys, "stat", "--dir", str(driver.directory), "--count", "2")
    assert code == 2 and "--count needs --watch" in err
    with pytest.raises(SystemExit) as info:
        main(["stat", "--interval", "0"])
    assert info.value.code == 2


def test_stat_exit_codes_for_missing_and_bad_files(tmp_path: Path, driver: FakeDriver, capsys):
    code, out, err = run(capsys, "stat", "--dir", str(tmp_path / "absent"))
    assert (code, out) == (3, "") and "no driver directory" in err and str(tmp_path / "absent") in err

    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "stat", "--dir", str(empty))
    assert code == 3 and "no cnc.dat in" in err

    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "cnc.dat").write_bytes(b"\x7fELF" + os.urandom(8_188))
    code, out, err = run(capsys, "stat", "--dir", str(garbage))
    assert (code, out) == (4, "") and err.startswith("logbuf stat: error: cannot use ")

    driver.close()
    os.truncate(driver.path, 100)
    code, _, err = run(capsys, "stat", "--dir", str(driver.directory))
    assert code == 4 and "truncated" in err


def test_stat_stale_heartbeat(driver: FakeDriver, capsys):
    driver.heartbeat(now_ms() - 60_000)
    code, out, err = run(capsys, "stat", "--dir", str(driver.directory))
    assert (code, out) == (5, "")
    assert re.search(r"is not alive: last heartbeat 1m0[0-2]s ago at \d{4}-\d\d-\d\dT", err), err
    assert "--force" in err

    code, out, err = run(capsys, "stat", "--dir", str(driver.directory), "--force")
    assert code == 5 and "is not alive" in err
    assert "STALE > 10,000 ms" in out.splitlines()[0] and "  0:                    0 - Bytes sent" in out

    code, out, _ = run(capsys, "stat", "--dir", str(driver.directory), "--force", "--json")
    assert code == 5 and json.loads(out)["driver_state"] == "stale"

    driver.heartbeat(now_ms() - 3_000)
    assert run(capsys, "stat", "--dir", str(driver.directory))[0] == 0
    code, _, err = run(capsys, "stat", "--dir", str(driver.directory), "--stale-ms", "1000")
    assert code == 5 and "(limit 1.0 s)" in err

    driver.heartbeat(0)
    code, _, err = run(capsys, "stat", "--dir", str(driver.directory))
    assert code == 5 and "has shut down" in err


def test_stat_watch_frames_when_not_a_tty(driver: FakeDriver, capsys):
    code, out, _ = run(
        capsys,
        "stat",
        "--dir",
        str(driver.directory),
        "--watch",
        "--interval",
        "0.02",
        "--count",
        "3",
        "--label",
        "^Errors:",
    )
    assert code == 0
    frames = out.split("\n\n")
    assert len(frames) == 3
    for frame in frames:
        lines = frame.strip("\n").splitlines()
        assert "logbuf stat (CnC v0.2.0)" in lines[0] and lines[1] == "=" * 70
        assert lines[2].startswith(" 15:                    0 ") and lines[2].endswith(" - " + c.SYSTEM_COUNTER_LABELS[15])
    assert "\x1b[" not in out


def test_stat_watch_json_lines(driver: FakeDriver, capsys):
    code, out, _ = run(
        capsys,
        "stat",
        "--dir",
        str(driver.directory),
        "--watch",
        "--json",
        "--interval",
        "0.02",
        "--count",
        "2",
        "--type",
        "system",
        "--label",
        "Unblocked Publications",
    )
    assert code == 0
    frames = [json.loads(line) for line in out.splitlines()]
    assert len(frames) == 2
    assert [x["label"] for x in frames[1]["counters"]] == ["Unblocked Publications"]
    assert frames[0]["counters"][0]["rate_per_s"] is None  # no previous frame
    assert frames[1]["counters"][0]["rate_per_s"] == 0.0


def test_stat_watch_without_driver_keeps_going(tmp_path: Path, capsys):
    code, out, _ = run(
        capsys, "stat", "--dir", str(tmp_path), "--watch", "--interval", "0.01", "--count", "2"
    )
    assert code == 0
    assert out.count("no cnc.dat in") == 2 and "(waiting; Ctrl-C to quit)" in out


def test_errors_command(driver: FakeDriver, capsys):
    driver.now_ms = 1_700_000_000_000
    driver.error_log.record("conductor: malformed command from client 3")
    driver.now_ms += 1_500
    driver.error_log.record("conductor: malformed command from client 3")
    code, out, err = run(capsys, "errors", "--dir", str(driver.directory))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "***"
    assert lines[1].startswith("2 observations from 2023-11-14 ") and lines[1].endswith("+0000 for:")
    assert lines[2] == " conductor: malformed command from client 3"
    assert lines[-1] == "1 distinct errors observed."

    code, out, _ = run(capsys, "errors", "--dir", str(driver.directory), "--json")
    data = json.loads(out)
    assert (code, data["distinct_errors"], data["observations"]) == (0, 1, 2)
    assert data["errors"][0]["first_observation_ms"] == 1_700_000_000_000
    assert data["errors"][0]["last_observation_ms"] == 1_700_000_001_500


def test_errors_of_a_dead_driver_are_still_printed(driver: FakeDriver, capsys):
    driver.error_log.record("sender: boom")
    driver.heartbeat(now_ms() - 3_600_000)
    code, out, err = run(capsys, "errors", "--dir", str(driver.directory))
    assert code == 0 and "\n sender: boom\n" in out and "is not alive: last heartbeat 1h00m ago" in err


def test_errors_exit_codes(tmp_path: Path, capsys):
    code, _, err = run(capsys, "errors", "--dir", str(tmp_path / "absent"))
    assert code == 3 and "logbuf errors: error: no driver directory" in err
    (tmp_path / "cnc.dat").write_bytes(b"short")
    code, _, err = run(capsys, "errors", "--dir", str(tmp_path))
    assert code == 4 and "truncated" in err


# -- real processes ------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LOGBUF_DIR", None)
    return env


def test_stat_subprocess(driver: FakeDriver):
    driver.set(driver.system[19], 1)
    proc = subprocess.run(
        [str(LOGBUF), "stat", "--dir", str(driver.directory), "--label", "Unblocked Publications"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"pid {os.getpid()}, heartbeat age" in lines[0]
    assert lines[2:] == [" 19:                    1 - Unblocked Publications"]

    proc = subprocess.run(
        [str(LOGBUF), "stat", "--dir", str(driver.directory / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert proc.returncode == 3 and "no driver directory" in proc.stderr


def test_stat_watch_subprocess_ctrl_c_exits_0(driver: FakeDriver):
    proc = subprocess.Popen(
        [
            str(LOGBUF),
            "stat",
            "--dir",
            str(driver.directory),
            "--watch",
            "--interval",
            "0.05",
            "--type",
            "system",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        first = lines_of(proc.stdout, "logbuf stat --watch").read_line(30) or ""  # the first frame's header
        assert "logbuf stat (CnC v0.2.0)" in first
        driver.set(driver.system[0], 10_000)  # changes between frames: a rate appears
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        stop_process(proc, signal.SIGKILL)
