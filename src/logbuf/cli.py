"""``logbuf`` command line: each layer registers its own sub-commands (see ``_COMMAND_MODULES``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that expose ``add_commands(subparsers)``; each sub-command sets ``func`` (args -> exit code).
_COMMAND_MODULES = (
    "logbuf.demo",
    "logbuf.driver.commands",
    "logbuf.tools.commands",
    "logbuf.feed.commands",
    "logbuf.recorder.commands",
    "logbuf.pipeline.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="logbuf", description="Aeron-style shared-memory log-buffer transport")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # a layer that is not installed (e.g. an optional one) simply adds no commands;
            # a missing dependency *inside* an existing layer is a real error
            if not exc.name or not (name == exc.name or name.startswith(exc.name + ".")):
                raise
            continue
        module.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
