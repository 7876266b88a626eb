"""``python -m bench callgrind``: exact instruction counts of the per-message API under callgrind.

Counts, per call, what a Python program pays for ``pub.offer(msg)`` (32 B, the calling ``for`` loop over
``itertools.repeat`` included, as ``timeit`` runs it; ``offer`` on an ExclusivePublication, ``offer-concurrent``
on a ConcurrentPublication)
and, per fragment, for ``image.poll(handler)`` delivering to a trivial Python handler (fragment limit 10).
Each case runs in a child Python under ``valgrind --tool=callgrind`` twice, with N and 2N iterations after
the same setup; the difference divided by N is the cost of one iteration, free of interpreter start-up and
setup.  Instruction counts are exact and repeatable, unlike timings on a shared machine.

Targets: ``offer`` <= 700 instructions per call, ``poll`` <= 700 per fragment.  The command exits non-zero
when a case misses its target.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile

TARGET = 700
PAYLOAD = 32
TERM_LENGTH = 16 * 1024 * 1024  # 2N appends of 64-byte frames stay inside the first term
FRAGMENT_LIMIT = 10
CASES = ("offer", "offer-concurrent", "poll")


def _child(case: str, n: int, total: int) -> None:
    """The measured program: setup for ``total`` iterations, then ``n`` iterations of ``case``."""
    from logbuf import ConcurrentPublication, ExclusivePublication, Image, LogBuffers, Position

    directory = tempfile.mkdtemp(prefix="logbuf-callgrind-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        log = LogBuffers.create(os.path.join(directory, "log"), term_length=TERM_LENGTH, session_id=1, stream_id=2,
                                initial_term_id=0)
        cls = ConcurrentPublication if case == "offer-concurrent" else ExclusivePublication
        pub = cls(log, Position.standalone(log.max_possible_position - 1))
        image = Image(log, Position.standalone(0))
        msg = b"x" * PAYLOAD
        # the calling loop is timeit's (itertools.repeat: no int object per iteration)
        if case != "poll":
            for _ in itertools.repeat(None, n):
                pub.offer(msg)
        else:
            for _ in itertools.repeat(None, total):
                pub.offer(msg)

            def handler(buffer: memoryview, header: object) -> None:
                pass

            delivered = 0
            while delivered < n:
                delivered += image.poll(handler, FRAGMENT_LIMIT)
        image.close()
        pub.close()
        log.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _instructions(case: str, n: int, total: int) -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
               "bench.callgrind_calls", "--child", case, str(n), str(total)]
        # deterministic runs: no hash randomisation, no BLAS helper threads (callgrind counts every thread)
        env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, env=env)
        if result.returncode != 0:
            raise SystemExit(f"callgrind run failed ({result.returncode}):\n{result.stderr[-2000:]}")
        match = re.search(r"Collected\s*:\s*(\d+)", result.stderr)
        if match is None:
            raise SystemExit(f"no instruction count in callgrind's output:\n{result.stderr[-2000:]}")
        return int(match.group(1))


def measure(case: str, n: int) -> float:
    """Instructions per iteration of ``case``: (count at 2N - count at N) / N."""
    once = _instructions(case, n, 2 * n)
    twice = _instructions(case, 2 * n, 2 * n)
    return (twice - once) / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench callgrind", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--iterations", type=int, default=20_000,
                        help="N: iterations of the shorter run (the longer runs 2N) (default: 20000)")
    parser.add_argument("--case", choices=CASES, action="append",
                        help="measure only this case (repeatable; default: every case)")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "N", "TOTAL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        case, n, total = args.child
        _child(case, int(n), int(total))
        return 0
    if args.iterations <= 0:
        parser.error("--iterations must be positive")
    failed = False
    for case in args.case or CASES:
        per = measure(case, args.iterations)
        unit = "fragment" if case == "poll" else "call"
        verdict = "ok" if per <= TARGET else f"over the target of {TARGET}"
        failed |= per > TARGET
        print(f"{case:16s} {per:6.0f} instructions per {unit} ({PAYLOAD} B, N={args.iterations}; {verdict})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
