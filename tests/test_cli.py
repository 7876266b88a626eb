"""The ``logbuf`` command line's shared behaviour: version, descriptions, logging options, one-line errors,
Ctrl-C, lazy command loading, and the shared argument types of ``logbuf.cli_args``."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from logbuf import cli
from logbuf.cli_args import count, duration, off_or
from logbuf.errors import LogbufError, UsageError

SRC = Path(__file__).resolve().parents[1] / "src"

# -- a stand-in command module: this test module registers ``logbuf boom`` --------------------------------

_log = logging.getLogger("logbuf.test_cli")


class _Failure(LogbufError):
    exit_code = 7


def _boom(args: argparse.Namespace) -> int:
    if args.what == "logbuf-error":
        raise LogbufError("the driver at /x is not running")
    if args.what == "exit-code":
        raise _Failure("carries its own exit status")
    if args.what == "usage":
        raise UsageError("--a and --b exclude each other")
    if args.what == "missing-file":
        raise FileNotFoundError(2, "No such file or directory", "/no/such/day")
    if args.what == "interrupt":
        raise KeyboardInterrupt
    if args.what == "bug":
        raise ZeroDivisionError("a programming error")
    _log.info("an info record")
    _log.warning("a warning record")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("boom", help="a test command that fails on request")
    p.add_argument("what", nargs="?", default="log", help="what to do (default: log)")
    p.set_defaults(func=_boom)


@pytest.fixture
def boom(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_COMMANDS", {**cli._COMMANDS, "boom": __name__})
    monkeypatch.setattr(cli, "_COMMAND_MODULES", (*cli._COMMAND_MODULES, __name__))
    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)
    yield
    logging.getLogger("logbuf").handlers.clear()  # main() configured logging onto pytest's captured stderr


# -- version, help ---------------------------------------------------------------------------------------


def test_version_is_the_installed_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"logbuf {importlib.metadata.version('logbuf')}\n"


def test_every_command_has_a_description_and_the_logging_options() -> None:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) >= set(cli._COMMANDS)
    for name, parser in sub.choices.items():
        assert parser.description, name
        options = parser._option_string_actions
        assert "-v" in options and ("-q" in options or "--quiet" in options), name


def test_the_command_table_names_every_command_where_it_is_registered() -> None:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert name in cli._COMMANDS, f"{name} missing from logbuf.cli._COMMANDS (it would load every module)"
        registered_by = parser._defaults["func"].__module__
        assert registered_by == cli._COMMANDS[name] or registered_by.startswith(cli._COMMANDS[name]), name


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for name in cli._COMMANDS:
        assert f"    {name} " in out, name


def test_no_help_shows_a_python_value_as_a_default() -> None:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        text = " ".join(parser.format_help().split())  # argparse wraps lines
        for repr_start in ("default: (", "default: [", "default: None", "default: {"):
            assert repr_start not in text, f"logbuf {name} --help shows {repr_start}...: say it in the user's terms"


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


# -- errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "status", "line"),
    [
        ("logbuf-error", 1, "logbuf boom: error: the driver at /x is not running"),
        ("exit-code", 7, "logbuf boom: error: carries its own exit status"),
        ("usage", 2, "logbuf boom: error: --a and --b exclude each other"),
        ("missing-file", 1, "logbuf boom: error: /no/such/day: No such file or directory"),
        ("interrupt", 130, "logbuf boom: interrupted"),
    ],
)
def test_an_error_is_one_line_and_a_status(boom, capsys, what: str, status: int, line: str) -> None:
    assert cli.main(["boom", what]) == status
    out, err = capsys.readouterr()
    assert (out, err) == ("", line + "\n")


def test_logbuf_traceback_shows_the_exception(boom, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    with pytest.raises(LogbufError, match="not running"):
        cli.main(["boom", "logbuf-error"])


def test_a_programming_error_keeps_its_traceback(boom) -> None:
    with pytest.raises(ZeroDivisionError):
        cli.main(["boom", "bug"])


def test_a_bad_argument_is_argparses_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["stat", "--interval", "soon"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "logbuf stat: error: argument --interval: 'soon' is not a number"
    )


# -- logging options -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["boom"], ["WARNING: a warning record"]),
        (["-v", "boom"], ["INFO: an info record", "WARNING: a warning record"]),
        (["boom", "-v"], ["INFO: an info record", "WARNING: a warning record"]),
        (["-q", "boom"], []),
        (["boom", "--quiet"], []),
    ],
)
def test_verbose_and_quiet_set_the_library_log_level(boom, capsys, argv: list[str], shown: list[str]) -> None:
    assert cli.main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [f"logbuf boom: {line}" for line in shown]


# -- start-up: only the chosen command's module is imported ----------------------------------------------


def test_a_real_run_of_logbuf_stat_without_driver_is_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    env.pop(cli.TRACEBACK_ENV, None)
    code = "import sys; from logbuf.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, "stat", "--dir", str(tmp_path / "none")],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 3
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("logbuf stat: ")


# -- shared argument types -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [("5000", 5000), ("300k", 300_000), ("2M", 2_000_000), ("1_000", 1000)])
def test_count_accepts_size_suffixes(text: str, value: int) -> None:
    assert count(text) == value


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "lots", "2x"])
def test_count_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        count(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30.0), ("2.5", 2.5), ("500ms", 0.5), ("250us", 250e-6), ("2m", 120.0), ("1h", 3600.0), ("5 s", 5.0)],
)
def test_duration_is_seconds(text: str, seconds: float) -> None:
    assert duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "-1", "soon", "5 weeks", ""])
def test_duration_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


def test_off_or_turns_off_into_none_and_a_parse_error_into_a_usage_message() -> None:
    from logbuf.channel import parse_endpoint

    address = off_or(parse_endpoint)
    assert address("off") is None and address("OFF") is None
    assert address("[::1]:80") == ("::1", 80)
    with pytest.raises(argparse.ArgumentTypeError, match="must be host:port"):
        address("::1:80")


def test_usage_error_is_a_logbuf_error_with_the_usage_status() -> None:
    assert issubclass(UsageError, LogbufError)
    assert UsageError.exit_code == 2


@pytest.mark.parametrize("text", ["127.0.0.1:\u0663", "127.0.0.1:\u00b2", "127.0.0.1:\uff18\uff10"])
def test_an_endpoint_port_is_ascii_digits(text: str) -> None:
    """str.isdigit takes other scripts' digits (\u0663 read as port 3) and superscripts (int() then fails)."""
    from logbuf.channel import InvalidChannelError, parse_endpoint

    with pytest.raises(InvalidChannelError, match="must be host:port"):
        parse_endpoint(text)
