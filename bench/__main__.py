"""``python -m bench [peers|transport|profile] [options]``: runs a benchmark harness, writes bench/results/.

From the repository root, ``python -m bench``; from anywhere, ``python /path/to/repo/bench`` or
``/path/to/repo/run bench`` (both find the repository themselves).

    transport  logbuf's own rigs (per-message, batch, ping-pong), interleaved rounds -> transport.{json,md}
    peers      logbuf against multiprocessing, faster-fifo, pyzmq, posix_ipc and iceoryx2 -> peers.{json,md,png}
    profile    where logbuf's per-message path spends its time -> profile.json (see PROFILE.md)
    callgrind  exact instruction counts per offer / per polled fragment (valgrind), printed
    aeron-udp  Aeron's C samples over UDP through two logbuf drivers and two aeronmd -> aeron_udp.{json,md}
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as ``python path/to/bench``: Python put bench/ itself first on the path, where
    # bench/profile.py would shadow the standard library's; the repository root makes ``bench`` importable
    here = Path(__file__).resolve().parent
    sys.path[:] = [str(here.parent)] + [p for p in sys.path if Path(p or ".").resolve() != here]

from bench import aeron_udp, callgrind_calls, profile, suite, transport  # noqa: E402

HARNESSES = {
    "transport": transport.main,
    "peers": suite.main,
    "profile": profile.main,
    "callgrind": callgrind_calls.main,
    "aeron-udp": aeron_udp.main,
}
DEFAULT = "peers"  # `./run bench` with no harness named


def main() -> int:
    argv = sys.argv[1:]
    name = argv[0] if argv and not argv[0].startswith("-") else DEFAULT
    if argv and argv[0] == name:
        argv = argv[1:]
    if name not in HARNESSES:
        print(f"unknown benchmark {name!r}; choose from {', '.join(HARNESSES)}", file=sys.stderr)
        return 2
    return HARNESSES[name](argv)


if __name__ == "__main__":
    sys.exit(main())
