"""`logbuf scenario` / `logbuf analyze` command lines: wiring and user errors (no Spark started)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from logbuf.pipeline.options import AnalyzeConfig, add_arguments, config_from_args
from support import LineReader, stop_process

ROOT = Path(__file__).resolve().parents[2]


def _logbuf(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "logbuf.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})


def test_scenario_command_writes_a_recording(tmp_path):
    out = tmp_path / "rec"
    done = _logbuf("scenario", str(out), "--messages", "20k", "--unrecovered", "15000-15004", "--quiet")
    assert done.returncode == 0, done.stderr
    truth = json.loads((out / "_scenario_truth.json").read_text())
    assert truth["sequences"] == 20_000 and len(truth["both_gaps"]) == 2 and len(truth["freezes"]) == 1
    again = _logbuf("scenario", str(out), "--messages", "20k", "--quiet")
    assert again.returncode == 2 and "already holds a recording" in again.stderr


def test_analyze_rejects_what_is_not_a_recording_before_starting_spark(tmp_path):
    done = _logbuf("analyze", str(tmp_path), str(tmp_path / "out"), timeout=30)
    assert done.returncode == 2
    assert "not a logbuf recording" in done.stderr
    assert "starting Spark" not in done.stderr


def test_analyze_names_a_truncated_parquet_file_in_one_line_before_starting_spark(tmp_path):
    rec = tmp_path / "rec"
    made = _logbuf("scenario", str(rec), "--messages", "20k", "--quiet")
    assert made.returncode == 0, made.stderr
    victim = sorted((rec / "messages").rglob("part-*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # a crash mid-copy, a full disk
    done = _logbuf("analyze", str(rec), str(tmp_path / "out"), timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(victim) in lines[0] and "not a complete Parquet file" in lines[0], done.stderr
    assert "starting Spark" not in done.stderr and not (tmp_path / "out").exists()


def test_analyze_checks_its_output_directory_before_starting_spark(tmp_path):
    rec = tmp_path / "rec"
    made = _logbuf("scenario", str(rec), "--messages", "20k", "--no-freeze", "--quiet")
    assert made.returncode == 0, made.stderr
    occupied = tmp_path / "a-file"
    occupied.write_text("not a directory")
    done = _logbuf("analyze", str(rec), str(occupied), timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(occupied) in lines[0] and "not a directory" in lines[0], done.stderr
    assert "starting Spark" not in done.stderr
    blocked = occupied / "out"  # a path under a file cannot be created
    done = _logbuf("analyze", rec.as_uri(), str(blocked), timeout=30)  # file:// input accepted
    assert done.returncode == 2 and "cannot write there" in done.stderr and "starting Spark" not in done.stderr, (
        done.stderr)


def test_analyze_passes_spark_settings_through_and_refuses_malformed_ones():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["hdfs://nn:8020/rec", "s3a://bucket/out", "--conf", "spark.eventLog.enabled=true",
                              "--conf", "spark.eventLog.dir=file:///tmp/ev", "--driver-memory", "6g",
                              "--max-freezes", "200"])
    assert args.conf == [("spark.eventLog.enabled", "true"), ("spark.eventLog.dir", "file:///tmp/ev")]
    assert args.driver_memory == "6g" and config_from_args(args).freeze.max_freezes == 200
    for bad in (["--conf", "noequals"], ["--conf", "eventLog=true"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["rec", "out", *bad])


def test_analyze_options_parse_into_a_config():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["rec", "out", "--window", "250ms", "--percentiles", "50,99.9", "--min-silence",
                              "80ms", "--session", "S1"])
    config = config_from_args(args)
    assert config.window_ns == 250_000_000 and config.percentiles == (0.5, 0.999)
    assert config.freeze.min_silence_ns == 80_000_000 and config.session == "S1"
    for bad in (["--window", "5"], ["--percentiles", "101"], ["--min-silence", "-1ms"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["rec", "out", *bad])
    with pytest.raises(ValueError):
        AnalyzeConfig(bucket_size=10)


def test_the_cli_loads_without_the_analytics_extra():
    """`logbuf` (and `logbuf analyze --help`) must not need pyspark/pyarrow/pandas/matplotlib to start."""
    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.split('.')[0] in ('pandas', 'pyarrow', 'pyspark', 'matplotlib'):\n"
        "        raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "from logbuf import cli\n"
        "sys.exit(cli.main(['scenario', '/nonexistent/x', '--quiet']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert "is not installed" in done.stderr and "analytics" in done.stderr


@pytest.mark.spark
@pytest.mark.timeout(600)  # a JVM of its own: on two busy cores Spark alone can take minutes to start
def test_ctrl_c_during_analyze_prints_one_line_and_exits_130(scenario, tmp_path):
    """Ctrl-C reaches the whole foreground process group (a new session here stands for the terminal's)."""
    import os
    import signal

    pytest.importorskip("pyspark", reason="needs pyspark (analytics extra)")
    root, _ = scenario
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    process = subprocess.Popen([sys.executable, "-m", "logbuf.cli", "analyze", str(root), str(tmp_path / "out")],
                               stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stderr = LineReader(process.stderr, "logbuf analyze")
        # progress lines, one per finished stage: the first says Spark runs jobs (no fixed wait for it)
        before = stderr.read_until("analyze: read (", timeout=420)
        assert before[-1].startswith("analyze: read ("), "\n".join(before)
        os.killpg(process.pid, signal.SIGINT)  # during the sequence stage's Spark job
        after = "\n".join(stderr.read_to_end(timeout=150))
        process.wait(30)
    finally:
        stop_process(process, signal.SIGKILL, timeout=30, group=True)
    assert process.returncode == 130, after
    assert "Traceback" not in after and "Exception" not in after and " ERROR " not in after, after
    assert [line for line in after.splitlines() if "interrupted" in line] == [
        f"logbuf analyze: interrupted; {tmp_path / 'out'} may be incomplete"], after


def test_every_option_of_record_analyze_and_scenario_says_its_default():
    import argparse

    from logbuf.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("record", "analyze", "scenario"):
        options = [a for a in commands[name]._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
        assert options, name
        for action in options:
            assert action.help and "default" in action.help, (name, action.option_strings)
        spellings = {s for a in options for s in a.option_strings}
        assert "-q" in spellings and "--quiet" in spellings, name
        assert not {"--duration-s", "--interval-s", "--messages-stream"} & spellings, name
