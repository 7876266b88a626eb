"""``logbuf analyze`` and ``logbuf scenario``: argument parsing and wiring only.

Nothing here imports pyspark, pyarrow or matplotlib at import time, so ``logbuf`` starts (and its other
commands work) without the ``analytics`` extra; those two commands say what is missing when run.
User errors print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from logbuf.cli_args import count
from logbuf.errors import USAGE_EXIT_STATUS, LogbufError

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
_EXTRA_HINT = "install the analytics extra: pip install -e '.[analytics]'"




def _range(text: str) -> tuple[int, int]:
    if text.lower() == "none":
        return (0, 0)
    first, sep, last = text.partition("-")
    if not first.isdigit() or (sep and not last.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a sequence range FIRST-LAST (or 'none')")
    low, high = int(first), int(last) if sep else int(first)
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"range {text!r} must satisfy 1 <= FIRST <= LAST")
    return low, high


def _guard(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ModuleNotFoundError as exc:
            print(f"logbuf {args.command}: error: {exc.name} is not installed ({_EXTRA_HINT})", file=sys.stderr)
            return USAGE_EXIT_STATUS
        except (LogbufError, ValueError, OSError, RuntimeError) as exc:
            print(f"logbuf {args.command}: error: {exc}", file=sys.stderr)
            return USAGE_EXIT_STATUS

    return run


def _interrupted(exc: BaseException | None) -> bool:
    """A KeyboardInterrupt, or an error raised while handling one: PySpark's SIGINT handler cancels every
    job and raises KeyboardInterrupt inside a py4j call, whose clean-up then fails with the cancelled job's
    Py4JJavaError (a Java stack trace)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__context__ or exc.__cause__
    return False


def _cmd_analyze(args: argparse.Namespace) -> int:
    from logbuf.pipeline.job import run_from_args

    try:
        return run_from_args(args)
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        print(f"\nlogbuf analyze: interrupted; {args.out} may be incomplete", file=sys.stderr)
        return INTERRUPTED


def _cmd_scenario(args: argparse.Namespace) -> int:
    from logbuf.pipeline.scenario import FreezeSpec, ScenarioConfig, generate

    freezes = () if args.no_freeze else (FreezeSpec(feed=args.freeze_feed,
                                                     duration_ns=int(args.freeze_ms * 1_000_000),
                                                     shared_stamps=args.shared_stamps),)
    config = ScenarioConfig(
        messages=args.messages, seed=args.seed, session=args.session, date=args.date,
        b_delay_ns=int(args.b_delay_ms * 1_000_000), jitter_ns=int(args.jitter_us * 1_000),
        loss_a=args.loss_a, loss_b=args.loss_b, freezes=freezes, both_lost=args.both_lost,
        unrecovered=args.unrecovered,
    )
    started = time.perf_counter()
    truth = generate(config, args.output, progress=None if not args.quiet else False)
    if not args.quiet:
        seconds = time.perf_counter() - started
        print(f"scenario: {truth.sequences} messages ({truth.delivered} delivered) in {seconds:.1f} s -> "
              f"{args.output}", file=sys.stderr)
        for f in truth.freezes:
            print(f"  freeze on {f.feed}: silent {(f.resume_ns - f.silence_start_ns) / 1e6:.1f} ms, catch-up "
                  f"{f.catch_up_packets} packets / {f.catch_up_messages} messages", file=sys.stderr)
        for g in truth.both_gaps:
            state = "recovered" if g.recovered_ns is not None else "unrecovered"
            print(f"  lost on both feeds: {g.first}-{g.last} ({state})", file=sys.stderr)
        print(f"  lost packets: A {truth.lost_packets['A']}, B {truth.lost_packets['B']}; truth in "
              f"{args.output}/_scenario_truth.json", file=sys.stderr)
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from logbuf.pipeline import options

    p = subparsers.add_parser(
        "analyze", help="feed-quality analytics of a recording (PySpark): tables, plots, report",
        description="Analyse a recording with Spark: A-B delay (exact percentiles), win share, gaps per feed "
                    "and on both feeds, message rate and messages per packet, head-end freezes and catch-up "
                    "bursts, ITCH type mix, most active symbols. Writes OUT/report.md, OUT/plots/*.png, "
                    "OUT/tables/*.{parquet,csv} and OUT/summary.json. The same job runs on a cluster: "
                    "spark-submit --master spark://HOST:7077 src/logbuf/pipeline/job.py RECORDING OUT.")
    options.add_arguments(p)
    p.set_defaults(func=_guard(_cmd_analyze))

    p = subparsers.add_parser(
        "scenario", help="write a synthetic recording with known faults (for analyze)",
        description="Write a recording of a synthetic ITCH day as feeds A and B would have delivered it, with "
                    "known faults: a head-end freeze with catch-up, random packet losses on each feed, a range "
                    "lost on both feeds and recovered by re-request, B delayed behind A, jitter. The truth is "
                    "saved as OUTPUT/_scenario_truth.json.")
    p.add_argument("output", help="recording directory to create")
    p.add_argument("-n", "--messages", type=count, default=200_000, metavar="N",
                   help="messages in the day, e.g. 300k or 2M (default: 200k)")
    p.add_argument("--seed", type=int, default=7, help="random seed: the same seed, the same recording "
                                                       "(default: %(default)s)")
    p.add_argument("--session", default="SYNTH0001", help="MoldUDP64 session name (default: %(default)s)")
    p.add_argument("--date", default="2026-01-05", help="UTC date of the arrival clock (default: %(default)s)")
    p.add_argument("--b-delay-ms", type=float, default=5.0, metavar="MS",
                   help="how much later feed B arrives than feed A, in ms (default: %(default)s)")
    p.add_argument("--jitter-us", type=float, default=300.0, metavar="US",
                   help="arrival jitter of each feed, in microseconds (default: %(default)s)")
    p.add_argument("--loss-a", type=float, default=0.002, metavar="P",
                   help="probability a packet is lost on feed A (default: %(default)s)")
    p.add_argument("--loss-b", type=float, default=0.002, metavar="P",
                   help="probability a packet is lost on feed B (default: %(default)s)")
    p.add_argument("--freeze-feed", choices=("A", "B"), default="A",
                   help="the feed whose head end freezes (default: %(default)s)")
    p.add_argument("--freeze-ms", type=float, default=150.0, metavar="MS",
                   help="how long the freeze lasts, in ms (default: %(default)s)")
    p.add_argument("--shared-stamps", type=count, default=1, metavar="N",
                   help="catch-up packets share one arrival stamp in groups of N, as from a receiver that stamps "
                        "a batch of datagrams at once (default: %(default)s, every packet its own)")
    p.add_argument("--no-freeze", action="store_true", help="no head-end freeze (default: one freeze)")
    p.add_argument("--both-lost", type=_range, default=None, metavar="FIRST-LAST|none",
                   help="lost on both feeds, recovered by re-request (default: 25 messages at 60%% of the day)")
    p.add_argument("--unrecovered", type=_range, default=(0, 0), metavar="FIRST-LAST|none",
                   help="lost on both feeds and never recovered (default: none)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary (default: off)")
    p.set_defaults(func=_guard(_cmd_scenario))
