"""``logbuf synth``, ``logbuf replay`` and ``logbuf retransmit``: argument parsing and wiring only.

User errors (missing file, bad host:port, bad numbers) end in one line on stderr and exit status 2, runtime
errors (a busy port, a failing send) in one line and 1, both printed by ``logbuf.cli``;
SIGINT and SIGTERM stop the replay and the retransmission workers cleanly: a stopped run still prints its
summary, then Ctrl-C (SIGINT) ends with ``logbuf <command>: interrupted`` and status 130, SIGTERM with 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from logbuf.channel import parse_endpoint
from logbuf.cli_args import count, off_or, stop_on_signals, stopped_status, value_errors_as_usage
from logbuf.errors import UsageError
from logbuf.marketdata import moldudp64

_host_port = off_or(parse_endpoint)  # HOST:PORT, [v6]:PORT or off


def _endpoint_text(address: tuple[str, int]) -> str:
    """``host:port``, ``[v6]:port``: what --listen/--retransmit read back."""
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"



def _speed(text: str) -> float | None:
    if text.lower() == "max":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"speed {text!r} must be a positive number or 'max'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("speed must be positive")
    return value


def _seq_range(text: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    if not first.isdigit() or (sep and not last.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a sequence range FIRST-LAST (or one sequence)")
    low, high = int(first), int(last) if sep else int(first)
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"range {text!r} must satisfy 1 <= FIRST <= LAST")
    return low, high


def _session(text: str) -> str:
    try:
        moldudp64.encode_session(text)
    except (moldudp64.MoldUDP64Error, UnicodeEncodeError):
        raise argparse.ArgumentTypeError(f"session {text!r} must be at most 10 ASCII characters") from None
    return text


_FAULT_KEYS = {"loss": "loss", "dup": "duplicate", "duplicate": "duplicate", "reorder": "reorder",
               "freeze": "freeze"}


def _faults(text: str) -> dict:
    """``loss=0.01,dup=0.001,reorder=0.001,freeze=0.0005,freeze-every=10000,freeze-ms=100-200,freeze-packets=64``
    (``freeze``: a chance per packet; ``freeze-every``: a scheduled freeze every this many ms of feed time)."""
    out: dict = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            if key in _FAULT_KEYS:
                out[_FAULT_KEYS[key]] = float(value)
            elif key == "freeze-ms":
                low, _, high = value.partition("-")
                out["freeze_ms"] = (float(low), float(high or low))
            elif key == "freeze-every":
                out["freeze_every_ms"] = float(value)
            elif key == "freeze-packets":
                out["freeze_max_packets"] = int(value)
            elif key == "catch-up-budget":
                out["catch_up_budget"] = int(value)
            else:
                raise argparse.ArgumentTypeError(
                    f"unknown fault {key!r}: use loss, dup, reorder, freeze, freeze-every, freeze-ms, "
                    "freeze-packets, catch-up-budget"
                )
        except ValueError:
            raise argparse.ArgumentTypeError(f"fault {item!r} needs a number") from None
        if not sep:
            raise argparse.ArgumentTypeError(f"fault {item!r} must be KEY=VALUE")
    return out


def _existing_file(path: str) -> str:
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    return path

def _progress_enabled(args: argparse.Namespace) -> bool:
    return not args.quiet and sys.stderr.isatty()


# ---- synth ----------------------------------------------------------------------------------------------


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def _positive(text: str) -> float:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _non_negative_int(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 0")
    return int(text)


def _ring_bits(text: str) -> int:
    from logbuf.exchange.retransmit.ring import MAX_RING_BITS, MIN_RING_BITS

    value = _non_negative_int(text)
    if not MIN_RING_BITS <= value <= MAX_RING_BITS:
        raise argparse.ArgumentTypeError(f"ring bits must be within {MIN_RING_BITS}..{MAX_RING_BITS}")
    return value


def _rcvbuf(text: str) -> int:
    value = _non_negative_int(text)
    if not 4_096 <= value <= 1 << 30:
        raise argparse.ArgumentTypeError(f"receive buffer {value} bytes must be within 4096..{1 << 30}")
    return value


def _budget(text: str) -> int:
    from logbuf.exchange.retransmit.core import MAX_UDP_PAYLOAD

    value = _non_negative_int(text)
    low = moldudp64.HEADER_LENGTH + moldudp64.BLOCK_LENGTH_SIZE + 1
    if not low <= value <= MAX_UDP_PAYLOAD:
        raise argparse.ArgumentTypeError(f"budget must be within {low}..{MAX_UDP_PAYLOAD} bytes")
    return value


def _output_path(path: str) -> str:
    """A file we may create: its directory exists (checked before any work starts)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"no such directory: {directory}")
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory")
    return path


def _write_json(path: str, value: object) -> None:
    """Write JSON under a temporary name next to ``path``, then rename: never a half-written summary."""
    import contextlib
    import tempfile

    directory, name = os.path.split(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, indent=2)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt like Ctrl-C while the block runs, so cleanup code runs for both."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _cmd_synth(args: argparse.Namespace) -> int:
    from logbuf.exchange.synth import SynthConfig, SyntheticDay, write_day

    config = SynthConfig(messages=args.messages, seed=args.seed, symbols=args.symbols,
                         orders_per_symbol=args.orders_per_symbol, mix=args.mix)
    SyntheticDay(config)  # a configuration error ends here, before any file exists
    _output_path(args.output)
    started = time.perf_counter()
    try:
        with _sigterm_interrupts():
            written = write_day(config, args.output, progress=_progress_enabled(args))
    except KeyboardInterrupt:
        print(f"logbuf synth: interrupted; {args.output} was not written", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - started
    if not args.quiet:
        size = os.path.getsize(args.output)
        print(f"synth: {written} messages, {size} bytes, {config.symbol_count()} symbols in {seconds:.2f} s "
              f"({written / seconds / 1e6:.2f} M msg/s) -> {args.output}", file=sys.stderr)
    return 0


# ---- replay ---------------------------------------------------------------------------------------------


def _cmd_replay(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from logbuf.exchange.dayfile import DayFileReader
    from logbuf.exchange.replay.config import FaultConfig, FeedConfig, ReplayConfig
    from logbuf.exchange.replay.core import ReplayCore
    from logbuf.exchange.replay.sender import ReplayServer
    from logbuf.exchange.retransmit.process import RetransmitProcess

    _existing_file(args.file)
    if args.summary_json:
        _output_path(args.summary_json)
    feeds: list[FeedConfig] = []
    destinations: list[tuple[str, int]] = []
    for name, dest, faults, drops, delay_ms, jitter_ms in (
        ("A", args.feed_a, args.faults_a, args.drop_a, 0.0, 0.0),
        ("B", args.feed_b, args.faults_b, args.drop_b, args.b_delay_ms, args.b_jitter_ms),
    ):
        if dest is None:
            continue
        ranges = tuple(sorted((drops or []) + (args.drop_both or [])))
        feeds.append(FeedConfig(name, int(delay_ms * 1e6), int(jitter_ms * 1e6),
                                FaultConfig(drop_ranges=ranges, **(faults or {}))))
        destinations.append(dest)
    if not feeds:
        raise UsageError("both feeds are off: give --feed-a and/or --feed-b a host:port")
    config = ReplayConfig(
        session=args.session, speed=args.speed, packet_rate=args.packet_rate, start=args.start, budget=args.budget,
        flush_gap_ns=int(args.flush_gap_us * 1_000), heartbeat_ns=max(1, int(args.heartbeat_interval * 1e9)),
        end_of_session_count=args.eos_count, end_of_session_interval_ns=int(args.eos_interval * 1e9),
        seed=args.seed, feeds=tuple(feeds),
    )
    with DayFileReader(args.file) as reader:
        reader.verify()  # a truncated day fails here, before anything is sent or started
        retransmit = None
        if args.retransmit is not None:  # binds the port now: a busy port fails before anything starts
            retransmit = RetransmitProcess(args.file, *args.retransmit, session=args.session, budget=args.budget,
                                           ring_bits=args.ring_bits, rate=args.rate, burst=args.burst,
                                           queue=args.queue, rcvbuf=args.rcvbuf)
        retransmit_stats = None
        with stop_on_signals() as stop:
            try:
                if retransmit is not None:
                    retransmit.start()
                    if not args.quiet:
                        print(f"replay: retransmission on {_endpoint_text(retransmit.address)} "
                              f"(pid {retransmit.pid})", file=sys.stderr, flush=True)
                bar = tqdm(unit="msg", unit_scale=True, file=sys.stderr, disable=not _progress_enabled(args),
                           desc="replay")
                server = ReplayServer(ReplayCore(reader, config), destinations,
                                      publish=None if retransmit is None else retransmit.ring.publish, stop=stop,
                                      progress=bar.update)
                try:
                    summary = server.run()
                    bar.close()
                    linger_until = time.monotonic() + args.linger
                    while retransmit is not None and not stop.is_set() and time.monotonic() < linger_until:
                        stop.wait(min(0.2, max(0.0, linger_until - time.monotonic())))
                finally:
                    server.close()
            finally:
                if retransmit is not None:
                    retransmit_stats = retransmit.stop()
        report = summary.as_dict()
        if retransmit is not None:
            report["retransmit"] = {"pid": retransmit.pid, **(vars(retransmit_stats) if retransmit_stats else {})}
    if args.summary_json:
        _write_json(args.summary_json, report)
    if not args.quiet:
        print(f"replay: {report['packets']} packets, {report['messages']} messages in {report['seconds']:.3f} s "
              f"({report['packets_per_second']:.0f} packets/s, {report['messages_per_second']:.0f} msg/s); "
              f"first sequence {report['first_sequence']}, next {report['next_sequence']}, "
              f"skipped {report['skipped_messages']}; {report['late_packets']} packets sent > 1 ms late "
              f"(max {report['max_late_ms']:.1f} ms)", file=sys.stderr)
        for name, stats in report["feeds"].items():
            print(f"  feed {name}: " + ", ".join(f"{k}={v}" for k, v in stats.items()), file=sys.stderr)
        if "retransmit" in report:
            print("  retransmit: " + ", ".join(f"{k}={v}" for k, v in report["retransmit"].items()),
                  file=sys.stderr)
    return stopped_status("replay", stop)


# ---- retransmit -----------------------------------------------------------------------------------------


def _cmd_retransmit(args: argparse.Namespace) -> int:
    from logbuf.exchange.dayfile import DayFileReader
    from logbuf.exchange.retransmit.ring import MessageRing
    from logbuf.exchange.retransmit.server import make_server

    _existing_file(args.file)
    with DayFileReader(args.file) as reader, stop_on_signals() as stop:
        ring = MessageRing(args.ring_bits)
        for block in reader.blocks():  # standalone: every message of the file counts as sent
            ring.publish(ring.next_sequence, block.frames)
        host, port = args.listen
        server = make_server(args.session, ring, reader.buffer, budget=args.budget, rate=args.rate,
                             burst=args.burst, queue=args.queue, host=host, port=port, rcvbuf=args.rcvbuf)
        if not args.quiet:
            print(f"retransmit: {ring.next_sequence - 1} messages (ring keeps {ring.capacity}), listening on "
                  f"{_endpoint_text(server.address)}", file=sys.stderr, flush=True)
        deadline = None if args.duration is None else time.monotonic() + args.duration
        try:
            server.run(lambda: stop.is_set() or (deadline is not None and time.monotonic() >= deadline))
        finally:
            server.close()
        if not args.quiet:
            print("retransmit: " + ", ".join(f"{k}={v}" for k, v in vars(server.stats).items()), file=sys.stderr)
    return stopped_status("retransmit", stop)


# ---- registration ---------------------------------------------------------------------------------------


def _add_retransmit_options(p: argparse.ArgumentParser) -> None:
    from logbuf.exchange.retransmit.fair import DEFAULT_QUEUE
    from logbuf.exchange.retransmit.rate import DEFAULT_BURST, DEFAULT_RATE
    from logbuf.exchange.retransmit.ring import DEFAULT_RING_BITS
    from logbuf.exchange.retransmit.server import DEFAULT_RCVBUF

    p.add_argument("--budget", type=_budget, default=moldudp64.DEFAULT_PAYLOAD_BUDGET,
                   help="UDP payload bytes of a packet or an answer, header included (default: %(default)s)")
    p.add_argument("--ring-bits", type=_ring_bits, default=DEFAULT_RING_BITS,
                   help="the retransmission ring keeps the last 2**BITS messages (default: %(default)s)")
    p.add_argument("--rate", type=_positive, default=DEFAULT_RATE,
                   help="re-requests answered per second per client (default: %(default)s)")
    p.add_argument("--burst", type=_positive, default=DEFAULT_BURST,
                   help="token bucket depth per client, in requests (default: %(default)s)")
    p.add_argument("--queue", type=count, default=DEFAULT_QUEUE,
                   help="admitted requests waiting per client; more are dropped (default: %(default)s)")
    p.add_argument("--rcvbuf", type=_rcvbuf, default=DEFAULT_RCVBUF,
                   help="receive buffer of the server's socket in bytes: requests queued while it answers "
                        "(default: %(default)s)")


def _hidden_alias(p: argparse.ArgumentParser, old: str, dest: str, kind: Callable[[str], object]) -> None:
    """An older spelling still accepted, not shown (one spelling per idea in the help)."""
    p.add_argument(old, dest=dest, type=kind, help=argparse.SUPPRESS)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("synth", help="write a synthetic ITCH 5.0 day file",
                              description="Write a synthetic ITCH 5.0 day file, the same bytes for the same "
                                          "--seed. The file appears only once complete.")
    p.add_argument("output", help="day file to write (replaced only when the new one is complete)")
    p.add_argument("--messages", "-n", type=count, default=1_000_000,
                   help="total messages, e.g. 5000, 300k, 2M (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="seed of the random generator (default: %(default)s)")
    p.add_argument("--symbols", type=count, default=None,
                   help="symbols (default: scaled with --messages, 4..1000)")
    p.add_argument("--orders-per-symbol", type=count, default=64,
                   help="live orders tracked per symbol (default: %(default)s)")
    p.add_argument("--mix", choices=("open", "balanced"), default="open",
                   help="order-flow message mix (default: %(default)s)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=value_errors_as_usage(_cmd_synth))

    p = subparsers.add_parser("replay", help="replay a day file as a MoldUDP64 feed (A/B) over UDP",
                              description="Replay an ITCH day file as MoldUDP64 downstream packets on feeds A "
                                          "and B. Messages skipped by --start keep their sequence numbers. With "
                                          "--retransmit, a retransmission server runs in a process of its own.")
    p.add_argument("file", help="day file to replay")
    p.add_argument("--session", type=_session, default="SYNTH0001",
                   help="MoldUDP64 session, up to 10 ASCII characters (default: %(default)s)")
    p.add_argument("--feed-a", type=_host_port, default=("127.0.0.1", 30001), metavar="HOST:PORT|off",
                   help="where feed A goes (default: 127.0.0.1:30001)")
    p.add_argument("--feed-b", type=_host_port, default=("127.0.0.1", 30002), metavar="HOST:PORT|off",
                   help="where feed B goes (default: 127.0.0.1:30002)")
    p.add_argument("--b-delay-ms", type=_non_negative, default=5.0,
                   help="feed B lags feed A by this much (default: %(default)s)")
    p.add_argument("--b-jitter-ms", type=_non_negative, default=1.0,
                   help="plus up to this much random jitter (default: %(default)s)")
    p.add_argument("--speed", type=_speed, default=1000.0,
                   help="replay the timestamps this many times faster: 1 = real time (a synthetic day spans 17 h), "
                        "1000 = that day in about a minute, or max: as fast as the sockets take it "
                        "(default: %(default)g)")
    p.add_argument("--packet-rate", type=_positive, default=None, metavar="PER_SECOND",
                   help="a load profile: this many packets per second per feed, each filled to --budget; "
                        "--speed and --flush-gap-us are then ignored (default: off, follow the timestamps)")
    p.add_argument("--start", choices=("pre-open", "open", "close"), default="pre-open",
                   help="first message sent: the day's start, 09:30 or 16:00 (default: %(default)s)")
    p.add_argument("--flush-gap-us", type=_non_negative, default=50.0,
                   help="flush a packet when the next message is later than this, feed time (default: %(default)s)")
    p.add_argument("--heartbeat-interval", type=_positive, default=1.0,
                   help="seconds of silence before a heartbeat (default: %(default)s)")
    _hidden_alias(p, "--heartbeat-s", "heartbeat_interval", _positive)
    p.add_argument("--eos-count", type=_non_negative_int, default=3,
                   help="end-of-session packets at the end (default: %(default)s)")
    p.add_argument("--eos-interval", type=_non_negative, default=1.0,
                   help="seconds between the end-of-session packets (default: %(default)s)")
    _hidden_alias(p, "--eos-interval-s", "eos_interval", _non_negative)
    p.add_argument("--seed", type=int, default=1, help="seed of the fault injection (default: %(default)s)")
    p.add_argument("--faults-a", type=_faults, default=None, metavar="SPEC",
                   help="faults on feed A, e.g. loss=0.01,dup=0.001,reorder=0.001,freeze=0.0005,freeze-ms=100-200 "
                        "(freeze: a chance per packet; freeze-every=MS: a freeze every MS of feed time) "
                        "(default: none)")
    p.add_argument("--faults-b", type=_faults, default=None, metavar="SPEC",
                   help="faults on feed B, same keys (default: none)")
    p.add_argument("--drop-a", type=_seq_range, action="append", metavar="FIRST-LAST",
                   help="never send these message sequences on feed A; repeatable (default: none)")
    p.add_argument("--drop-b", type=_seq_range, action="append", metavar="FIRST-LAST",
                   help="never send these message sequences on feed B; repeatable (default: none)")
    p.add_argument("--drop-both", type=_seq_range, action="append", metavar="FIRST-LAST",
                   help="never send these message sequences on either feed; repeatable (default: none)")
    p.add_argument("--retransmit", type=_host_port, default=None, metavar="HOST:PORT",
                   help="also serve re-requests on this address, from a process of its own (default: off)")
    _add_retransmit_options(p)
    p.add_argument("--linger", type=_non_negative, default=0.0,
                   help="seconds to keep serving re-requests after the end (default: %(default)s)")
    _hidden_alias(p, "--linger-s", "linger", _non_negative)
    p.add_argument("--summary-json", default=None, metavar="PATH",
                   help="write the final summary as JSON (default: none)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=value_errors_as_usage(_cmd_replay))

    p = subparsers.add_parser("retransmit", help="serve MoldUDP64 re-requests for a day file",
                              description="Answer MoldUDP64 re-requests from a day file (every message counts "
                                          "as sent; the ring keeps the last 2**--ring-bits). Each client is "
                                          "rate-limited and served in turn, so one client's flood does not "
                                          "starve the others.")
    p.add_argument("file", help="day file to serve")
    p.add_argument("--session", type=_session, default="SYNTH0001",
                   help="MoldUDP64 session, up to 10 ASCII characters (default: %(default)s)")
    p.add_argument("--listen", type=_host_port, default=("127.0.0.1", 30010), metavar="HOST:PORT",
                   help="address to serve on (default: 127.0.0.1:30010)")
    _add_retransmit_options(p)
    p.add_argument("--duration", type=_positive, default=None,
                   help="stop after this many seconds (default: until Ctrl-C or SIGTERM)")
    _hidden_alias(p, "--duration-s", "duration", _positive)
    p.add_argument("--quiet", "-q", action="store_true", help="no summary")
    p.set_defaults(func=value_errors_as_usage(_cmd_retransmit))
