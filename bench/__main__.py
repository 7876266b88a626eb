"""``python -m bench [peers|transport|profile] [options]``: runs a benchmark harness, writes bench/results/.

    transport  logbuf's own rigs (per-message, batch, ping-pong), interleaved rounds -> transport.{json,md}
    peers      logbuf against multiprocessing, faster-fifo, pyzmq, posix_ipc and iceoryx2 -> peers.{json,md,png}
    profile    where logbuf's per-message path spends its time -> profile.json (see PROFILE.md)
    callgrind  exact instruction counts per offer / per polled fragment (valgrind), printed
    aeron-udp  Aeron's C samples over UDP through two logbuf drivers and two aeronmd -> aeron_udp.{json,md}
"""

from __future__ import annotations

import sys

from bench import aeron_udp, callgrind_calls, profile, suite, transport

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
