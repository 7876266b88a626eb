"""`logbuf feed`'s settings as an operator meets them: every option comes from ``feed/config.py`` (one place for
each default and help text), a value out of range is one usage line naming the option (never a traceback), and
a setting the rest of the command line makes meaningless is refused by name instead of silently ignored.

All of it is decided before the handler touches a driver or a socket, so these run ``logbuf.cli.main`` in this
process (no driver, no interpreter start each)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from logbuf import cli
from logbuf.feed import config
from logbuf.feed import published as out
from logbuf.feed.handler import FeedHandlerConfig


class Ran(NamedTuple):
    returncode: int
    stderr: str


@pytest.fixture
def feed(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
         tmp_path: Path) -> Iterator[Callable[..., Ran]]:
    """``logbuf feed ARGS`` through ``logbuf.cli.main`` in this process (a driver directory nobody runs in)."""
    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)

    def run(*args: str) -> Ran:
        capsys.readouterr()
        try:
            code = cli.main(["feed", "--dir", str(tmp_path / "nodrv"), *args])
        except SystemExit as exit:  # argparse
            code = int(exit.code or 0)
        return Ran(code, capsys.readouterr().err)

    yield run
    logging.getLogger("logbuf").handlers.clear()


def usage_line(ran: Ran) -> str:
    lines = ran.stderr.splitlines()
    assert ran.returncode == 2, ran.stderr
    assert len(lines) == 1 and lines[0].startswith("logbuf feed: error: "), ran.stderr
    return lines[0]


SERVER = ("--retransmit", "127.0.0.1:9")


@pytest.mark.parametrize("args", [
    ("--queue-bytes", "1e20"),  # was: OverflowError traceback
    ("--queue-bytes", "1000"),
    ("--queue-packets", "1e19"),
    ("--rcvbuf", "99999999999999"),  # was: TypeError traceback from setsockopt
    ("--lost-packet-wait-ms", "inf"),  # was: OverflowError traceback
    ("--lost-packet-wait-ms", "1e30"),
    ("--lost-packet-wait-ms", "nan"),  # was: "cannot convert float NaN to integer", no option named
    ("--out-of-order-max-interval", "1e19"),
    ("--max-jump", "1e20"),
    ("--batch-wait-us", "nan"),
    (*SERVER, "--give-up", "inf"),
    (*SERVER, "--give-up", "nan"),
    (*SERVER, "--give-up", "1e30"),  # was: accepted, then an overflow in the engine's settings
    (*SERVER, "--retry-interval-ms", "1e30"),
    (*SERVER, "--initial-backoff-ms", "0"),
    (*SERVER, "--max-outstanding", "99999999999"),  # was: "does not fit 'int32_t'" traceback
    (*SERVER, "--request-rate", "nan"),
    (*SERVER, "--seed", "-1"),
    ("--wait-for-subscriber", "nan"),  # was: accepted (never waited)
    ("--duration", "nan"),  # was: accepted, ran forever
    ("--duration", "-1"),  # was: accepted, stopped at once
    ("--feed-a", "239.1.1.1:30001", "--interface", "bogus"),  # was: "illegal IP address string ...", status 1
    ("--stream", "1e3"),
])
def test_a_value_out_of_range_is_one_usage_line_naming_the_option(feed: Callable[..., Ran],
                                                                   args: tuple[str, ...]) -> None:
    option, value = args[-2:]
    line = usage_line(feed(*args))
    assert f"argument {option}: '{value}'" in line


@pytest.mark.parametrize(("args", "says"), [
    (("--no-recovery", *SERVER), "--retransmit and --no-recovery contradict"),
    (("--request-rate", "500"), "--request-rate: recovery is off (no --retransmit server)"),
    (("--no-recovery", "--give-up", "3", "--seed", "1"), "--give-up, --seed: recovery is off (--no-recovery)"),
    (("--no-recovery", "--max-outstanding", "8", "--retry-interval-ms", "50", "--initial-backoff-ms", "5"),
     "--max-outstanding, --initial-backoff-ms, --retry-interval-ms: recovery is off"),
    (("--mode", "a", "--feed-b", "127.0.0.1:30009"), "--feed-b is not read with --mode a"),
    (("--mode", "b", "--feed-a", "127.0.0.1:30009"), "--feed-a is not read with --mode b"),
    (("--capture-stream", "7"), "--capture-stream is only used with --capture"),
    (("--interface", "10.0.0.5"), "--interface is only used to join multicast groups"),
    (("--events-stream", "1001"), "--stream and --events-stream are both 1001"),
    (("--capture", "--capture-stream", "1002"), "--events-stream and --capture-stream are both 1002"),
    (("--summary-json", "/nonexistent-dir/feed.json"), "--summary-json /nonexistent-dir/feed.json: no directory"),
])
def test_a_setting_that_would_be_ignored_is_refused_by_name(feed: Callable[..., Ran], args: tuple[str, ...],
                                                            says: str) -> None:
    assert says in usage_line(feed(*args))


def test_a_checkpoint_that_is_a_directory_is_refused(feed: Callable[..., Ran], tmp_path: Path) -> None:
    assert f"--checkpoint {tmp_path} is a directory" in usage_line(feed("--checkpoint", str(tmp_path)))


def test_every_option_of_logbuf_feed_comes_from_the_config_with_its_default() -> None:
    feed_parser = next(action.choices["feed"] for action in cli.build_parser(["feed"])._actions
                       if isinstance(action, argparse._SubParsersAction))
    from_config = {option.dest: option for option in config.FEED_OPTIONS}
    own = {"help", "dir", "quiet", "sub_verbose"}  # argparse's, the driver directory (shared by every command), output
    for action in feed_parser._actions:
        if action.dest in own:
            continue
        assert action.dest in from_config, f"--{action.dest} is defined outside feed/config.py"
        assert action.default == from_config[action.dest].default
        assert action.help == from_config[action.dest].help
    assert set(from_config) <= {action.dest for action in feed_parser._actions}


def test_the_library_config_and_the_command_line_share_their_defaults() -> None:
    defaults = {option.dest: option.default for option in config.FEED_OPTIONS}
    handler = FeedHandlerConfig()
    assert handler.feed_a == defaults["feed_a"] and handler.feed_b == defaults["feed_b"]
    assert handler.interface == defaults["interface"] and handler.channel == defaults["channel"]
    assert (handler.messages_stream, handler.events_stream) == (defaults["stream"], defaults["events_stream"])
    assert (defaults["stream"], defaults["events_stream"], defaults["capture_stream"]) == (
        out.MESSAGES_STREAM, out.EVENTS_STREAM, out.CAPTURE_STREAM)
    assert handler.rcvbuf == defaults["rcvbuf"] and handler.join == defaults["join"]
    assert handler.mode == config.MODE_CHOICES[str(defaults["mode"])]  # the mode is stored once, in the arbiter's
    assert handler.arbiter.max_queue_bytes == defaults["queue_bytes"]
    assert handler.arbiter.max_jump == defaults["max_jump"]
    assert handler.recovery.request_rate == defaults["request_rate"]
    assert handler.recovery.max_outstanding == defaults["max_outstanding"]
    assert handler.recovery.give_up_ns == defaults["give_up"] * 1e9
