"""``python -m bench [transport] [options]``: runs a benchmark harness and writes bench/results/."""

from __future__ import annotations

import sys

from bench import transport

HARNESSES = {"transport": transport.main}


def main() -> int:
    argv = sys.argv[1:]
    name = argv[0] if argv and not argv[0].startswith("-") else "transport"
    if argv and argv[0] == name:
        argv = argv[1:]
    if name not in HARNESSES:
        print(f"unknown benchmark {name!r}; choose from {', '.join(HARNESSES)}", file=sys.stderr)
        return 2
    return HARNESSES[name](argv)


if __name__ == "__main__":
    sys.exit(main())
