"""``logbuf`` command line: each layer registers its own sub-commands (``add_commands(subparsers)``).

Start-up stays cheap: ``_COMMANDS`` says which module registers which command, so ``logbuf stat`` imports
only ``logbuf.tools.commands`` (not the driver, numpy or the UDP stack).  ``logbuf --help``, a bare
``logbuf`` and an unknown command import every module.  A new command (or command module) is added to
``_COMMANDS``; ``tests/test_cli.py`` fails while a registered command is missing from it.

Common behaviour lives here, not in each command:

* ``--version``; ``-v/--verbose`` and ``-q/--quiet`` set the ``logging`` level of the library (also
  accepted after the command name);
* an error the user can act on (a ``LogbufError``, an ``OSError``, an argument error raised late) ends in one
  line ``logbuf <command>: error: <message>`` and a non-zero exit status; ``LOGBUF_TRACEBACK=1`` shows
  the traceback instead;
* Ctrl-C ends with ``logbuf <command>: interrupted`` and exit status 130.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from typing import NoReturn

# command -> the module that registers it: each module exposes ``add_commands(subparsers)`` and every
# sub-command sets ``func`` (args -> exit status).  Only the chosen command's module is imported.
_COMMANDS = {
    "demo": "logbuf.demo",
    "driver": "logbuf.driver.commands",
    "stat": "logbuf.tools.commands",
    "errors": "logbuf.tools.commands",
    "logdump": "logbuf.tools.commands",
    "loss": "logbuf.tools.commands",
    "synth": "logbuf.exchange.commands",
    "replay": "logbuf.exchange.commands",
    "retransmit": "logbuf.exchange.commands",
    "feed": "logbuf.feed.commands",
    "book": "logbuf.samples.commands",
    "record": "logbuf.recorder.commands",
    "analyze": "logbuf.pipeline.commands",
    "scenario": "logbuf.pipeline.commands",
}
# every module, in the order ``logbuf --help`` lists their commands
_COMMAND_MODULES = tuple(dict.fromkeys(_COMMANDS.values()))

TRACEBACK_ENV = "LOGBUF_TRACEBACK"
INTERRUPTED_EXIT_STATUS = 130  # 128 + SIGINT, what shells report for Ctrl-C
ERROR_EXIT_STATUS = 1
USAGE_EXIT_STATUS = 2  # argparse's status for bad arguments

_log = logging.getLogger("logbuf")


class _VersionAction(argparse.Action):
    # reads the installed version only when asked (importlib.metadata costs start-up time)
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from logbuf import __version__

        print(f"{parser.prog} {__version__}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line, ``logbuf <command>: error: <message>`` (exit status 2), without the usage block
    (``--help`` shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT_STATUS, f"{self.prog}: error: {message}\n")


def _load(modules: Iterable[str], sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # a layer that is not installed (e.g. an optional one) simply adds no commands;
            # a missing dependency *inside* an existing layer is a real error
            if not exc.name or not (name == exc.name or name.startswith(exc.name + ".")):
                raise
            continue
        module.add_commands(sub)


def _chosen_command(argv: Sequence[str]) -> str | None:
    # the global options take no value, so the first word that is not an option names the command
    return next((word for word in argv if not word.startswith("-")), None)


def _add_common_options(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Every command gets a description (its one-line help if it has none) and the logging options."""
    helps = {action.dest: action.help for action in sub._choices_actions}
    for name, parser in sub.choices.items():
        if not parser.description and helps.get(name):
            text = str(helps[name])
            parser.description = text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
        taken = parser._option_string_actions
        if "-v" not in taken and "--verbose" not in taken:
            parser.add_argument(
                "-v", "--verbose", action="count", dest="sub_verbose", default=argparse.SUPPRESS,
                help="log more: INFO (-vv: DEBUG); default warnings",
            )
        if "-q" not in taken and "--quiet" not in taken:
            parser.add_argument(
                "-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                help="log errors only (default: warnings and errors)",
            )


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``logbuf`` parser; given ``argv``, only the module of the command it names is imported."""
    parser: argparse.ArgumentParser = _Parser(
        prog="logbuf",
        description="Aeron-style shared-memory log-buffer transport, with a MoldUDP64/ITCH feed handler, "
        "recorder and analytics.",
        epilog=f"{TRACEBACK_ENV}=1 shows the Python traceback behind an error message.",
    )
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more: INFO (-vv: DEBUG); default warnings"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", dest="global_quiet", help="log errors only (default: off)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen_command(argv) if argv is not None else None
    if chosen in _COMMANDS:
        _load([_COMMANDS[chosen]], sub)
    if chosen not in sub.choices:  # help, no command, or a command the table does not know
        _load([m for m in _COMMAND_MODULES if m != _COMMANDS.get(chosen or "")], sub)
    _add_common_options(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The sub-parser of ``command`` (``parser`` itself when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def _log_level(args: argparse.Namespace) -> int:
    verbose = args.verbose + getattr(args, "sub_verbose", 0)
    if args.global_quiet or getattr(args, "quiet", False):
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)


def configure_logging(level: int, command: str) -> None:
    """Log records from the library go to stderr as ``logbuf <command>: <level>: <message>``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"logbuf {command}: %(levelname)s: %(message)s"))
    root = logging.getLogger("logbuf")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _error_line(command: str, exc: BaseException) -> str:
    message = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:  # "/x/day: No such file or directory", not "[Errno 2] ..."
        names = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
        message = ": ".join([" -> ".join(names), exc.strerror] if names else [exc.strerror])
    return f"logbuf {command}: error: {message}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``logbuf`` command; returns its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the command's parser: "logbuf feed: error: unrecognized arguments: ..."
            _command_parser(parser, getattr(args, "command", None)).error(
                f"unrecognized arguments: {' '.join(extra)}"
            )
    except KeyboardInterrupt:  # Ctrl-C while the command's modules load
        print("logbuf: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_STATUS
    if not getattr(args, "func", None):
        parser.print_help()
        return USAGE_EXIT_STATUS
    command = args.command
    configure_logging(_log_level(args), command)
    show_traceback = os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"logbuf {command}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_STATUS
    except (argparse.ArgumentTypeError, argparse.ArgumentError) as exc:
        if show_traceback:
            raise
        print(_error_line(command, exc), file=sys.stderr)
        return USAGE_EXIT_STATUS
    except Exception as exc:
        from logbuf.errors import LogbufError

        if show_traceback or not isinstance(exc, (LogbufError, OSError)):
            raise
        print(_error_line(command, exc), file=sys.stderr)
        return int(getattr(exc, "exit_code", ERROR_EXIT_STATUS))


if __name__ == "__main__":
    sys.exit(main())
