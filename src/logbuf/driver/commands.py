"""``logbuf driver``: the media driver as a foreground process (Ctrl-C / SIGTERM stop it cleanly)."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from typing import TYPE_CHECKING

from logbuf.channel import InvalidChannelError, parse_size
from logbuf.cli_args import add_driver_dir
from logbuf.driver.agents import THREADING_MODES
from logbuf.errors import INTERRUPTED_EXIT_STATUS, UsageError
from logbuf.units import NANOS_PER_MILLI, NANOS_PER_SECOND

if TYPE_CHECKING:
    from logbuf.driver.context import DriverContext
    from logbuf.driver.media_driver import MediaDriver


def _size(text: str) -> int:
    try:
        return parse_size(text, "size")
    except InvalidChannelError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return int(value * NANOS_PER_SECOND)


def _impairment(text: str) -> str:
    from logbuf.driver.udp.impairment import Impairment

    try:
        Impairment.from_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _idle(text: str) -> str:
    from logbuf.driver.agents import IdleSpec

    try:
        return str(IdleSpec.parse(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _batch(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError("must be 1..64")
    return int(text)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "driver",
        help="run a media driver in the foreground",
        description="Runs a media driver: owns cnc.dat and every log buffer of its directory. "
        "Ctrl-C or SIGTERM shut it down cleanly (clients see the driver go at once).",
    )
    add_driver_dir(p)
    p.add_argument("--ipc-term-length", type=_size, help="term length of IPC logs (default 64m)")
    p.add_argument("--mtu", type=_size, help="max frame length incl. header (default 1408)")
    p.add_argument("--publication-window", type=_size, help="IPC publication window (default half a term)")
    p.add_argument("--unblock-timeout", type=_seconds, help="seconds before a stalled claim is padded (15)")
    p.add_argument("--client-liveness-timeout", type=_seconds, help="seconds without a client heartbeat (10)")
    p.add_argument("--linger-timeout", type=_seconds, help="seconds a closed network publication waits for its receivers; subscribers always read to the end (5)")
    p.add_argument("--timer-interval", type=_seconds, help="seconds between timer duties (1)")
    p.add_argument("--idle", help="the Python conductor loop's idle strategy: backoff[:max_park_ns] "
                   "(default backoff:4000000), sleep[:ns], yield, spin")
    p.add_argument("--force", action="store_true",
                   help="take over the directory of a driver that died (never a directory that is not a "
                   "driver's; default: refuse)")
    p.add_argument("--group-access", action="store_true", help="directory 0770 and files 0660 (default 0700/0600)")
    p.add_argument("--pre-touch", action="store_true", help="fault log pages in when a log is created (default: off)")
    p.add_argument("--storage-reserve", type=_size,
                   help="free space to keep on the directory's file system: a new log that would leave less "
                   "is refused (default 8m; 0: refuse only logs that do not fit)")
    udp = p.add_argument_group("UDP (network publications and images)")
    agents = p.add_argument_group(
        "native agents (the data plane; the Python conductor always runs on its own thread)",
        "IDLE: backoff[:spins=N,yields=N,min-park=D,max-park=D] (default "
        "backoff:spins=10,yields=20,min-park=1us,max-park=1ms; D is a whole number with ns, us, ms or s), "
        "sleep[:park=D], yield, or spin / noop (these two never give the core away: a core of their own only)")
    agents.add_argument("--threading-mode", choices=list(THREADING_MODES),
                        help="shared: one native agent runs sender, receiver and the conductor's native duties; "
                        "shared-network: sender and receiver on one, the conductor's on another; dedicated: an "
                        "agent each (default: $LOGBUF_THREADING_MODE where set, else dedicated with 4 or more cores, "
                        "else shared)")
    agents.add_argument("--sender-idle", type=_idle, metavar="IDLE",
                        help="the sender agent's idle strategy (also the shared and shared-network agents')")
    agents.add_argument("--receiver-idle", type=_idle, metavar="IDLE", help="the receiver agent's idle strategy")
    agents.add_argument("--conductor-idle", type=_idle, metavar="IDLE",
                        help="the native conductor agent's idle strategy (shared-network, dedicated)")
    udp.add_argument("--network-term-length", type=_size, help="term length of network publications (16m)")
    udp.add_argument("--network-publication-window", type=_size, help="pub-lmt ahead of snd-pos (half a term)")
    udp.add_argument("--receiver-window", type=_size, help="window SMs offer senders (min(128k, T/2))")
    udp.add_argument("--spies-simulate-connection", action="store_true",
                     help="a network publication read only by aeron-spy: subscriptions counts as connected "
                     "(a channel's ssc= overrides it; default: off)")
    udp.add_argument("--image-liveness-timeout", type=_seconds, help="seconds before a silent image goes (10)")
    udp.add_argument("--flow-control-receiver-timeout", type=_seconds,
                     help="seconds before a silent receiver stops holding a sender back (5)")
    udp.add_argument("--loss-give-up", type=_seconds,
                     help="seconds a gap may stay open before it is filled with padding (default: never)")
    udp.add_argument("--socket-rcvbuf", type=_size, help="SO_RCVBUF asked for (2m; capped by rmem_max)")
    udp.add_argument("--socket-sndbuf", type=_size, help="SO_SNDBUF asked for (2m; capped by wmem_max)")
    udp.add_argument("--send-batch", type=_batch, help="data datagrams per publication per duty cycle (16)")
    udp.add_argument("--receive-batch", type=_batch, help="datagrams per recvmmsg (32)")
    udp.add_argument("--impair-send", type=_impairment, metavar="SPEC",
                     help="tests: impair every datagram sent, e.g. drop=0.05,reorder=0.05,delay=50us,seed=7 "
                     "(default: none)")
    udp.add_argument("--impair-receive", type=_impairment, metavar="SPEC",
                     help="tests: impair every datagram received (same SPEC syntax; default: none)")
    p.set_defaults(func=_run_driver)


def _run_driver(args: argparse.Namespace) -> int:
    from logbuf.driver.media_driver import MediaDriver

    try:
        driver = MediaDriver(
            directory=args.dir,
            ipc_term_length=args.ipc_term_length,
            mtu=args.mtu,
            ipc_publication_window=args.publication_window,
            unblock_timeout_ns=args.unblock_timeout,
            client_liveness_timeout_ns=args.client_liveness_timeout,
            publication_linger_timeout_ns=args.linger_timeout,
            timer_interval_ns=args.timer_interval,
            idle_strategy=args.idle,
            force=args.force or None,
            group_access=args.group_access or None,
            pre_touch=args.pre_touch or None,
            storage_reserve=args.storage_reserve,
            threading_mode=args.threading_mode,
            sender_idle=args.sender_idle,
            receiver_idle=args.receiver_idle,
            conductor_idle=args.conductor_idle,
            network_term_length=args.network_term_length,
            network_publication_window=args.network_publication_window,
            receiver_window=args.receiver_window,
            spies_simulate_connection=args.spies_simulate_connection or None,
            image_liveness_timeout_ns=args.image_liveness_timeout,
            flow_control_receiver_timeout_ns=args.flow_control_receiver_timeout,
            loss_give_up_ns=args.loss_give_up,
            socket_rcvbuf=args.socket_rcvbuf,
            socket_sndbuf=args.socket_sndbuf,
            send_batch=args.send_batch,
            receive_batch=args.receive_batch,
            send_impairment=args.impair_send,
            receive_impairment=args.impair_receive,
        )
    except ValueError as exc:  # a value the options let through but the driver cannot use: name the option
        raise UsageError(_option_names(str(exc), args)) from exc
    ctx = driver.ctx
    # until run_foreground takes the signals over, Ctrl-C or SIGTERM raise here, and the driver still closes
    # (with the exit status of the signal that came: SIGTERM is a clean stop, 0)
    terminated: list[int] = []

    def on_term(signum: int, frame: object) -> None:
        terminated.append(signum)
        raise KeyboardInterrupt

    previous_term = signal.signal(signal.SIGTERM, on_term)
    try:
        stopped_by = _announce_and_run(driver, ctx)
    except KeyboardInterrupt:
        driver.close()
        stopped_by = signal.SIGTERM if terminated else signal.SIGINT
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    if stopped_by == signal.SIGINT:
        print("logbuf driver: interrupted", file=sys.stderr, flush=True)  # after a clean shutdown
        return INTERRUPTED_EXIT_STATUS  # Ctrl-C, as for every command; SIGTERM is a clean stop (0)
    print("logbuf driver: stopped", file=sys.stderr, flush=True)
    return 0


def _announce_and_run(driver: MediaDriver, ctx: DriverContext) -> int | None:
    print(
        f"logbuf driver: pid {driver.cnc.layout.pid if driver.cnc else '?'} in {driver.directory} "
        f"(ipc term {ctx.ipc_term_length >> 10} KiB, network term {ctx.network_term_length >> 10} KiB, "
        f"mtu {ctx.mtu}, idle {ctx.idle_strategy}, {ctx.threading_mode} mode (sender idle {ctx.sender_idle}, "
        f"receiver idle {ctx.receiver_idle}, conductor idle {ctx.conductor_idle}), "
        f"client liveness {ctx.client_liveness_timeout_ns // NANOS_PER_MILLI} ms, "
        f"unblock {ctx.unblock_timeout_ns // NANOS_PER_MILLI} ms"
        + "".join(f", {name} impairment {spec}" for name, spec in (("send", ctx.send_impairment),
                                                                  ("receive", ctx.receive_impairment)) if spec)
        + "); Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    return driver.run_foreground()


# the driver's option names -> this command's options, for errors worded in the user's terms
_OPTION_OF = {
    "ipc_term_length": "--ipc-term-length", "mtu": "--mtu", "ipc_publication_window": "--publication-window",
    "unblock_timeout_ns": "--unblock-timeout", "client_liveness_timeout_ns": "--client-liveness-timeout",
    "publication_linger_timeout_ns": "--linger-timeout", "timer_interval_ns": "--timer-interval",
    "idle_strategy": "--idle", "threading_mode": "--threading-mode", "network_term_length": "--network-term-length",
    "network_publication_window": "--network-publication-window", "receiver_window": "--receiver-window",
    "image_liveness_timeout_ns": "--image-liveness-timeout",
    "flow_control_receiver_timeout_ns": "--flow-control-receiver-timeout", "loss_give_up_ns": "--loss-give-up",
    "socket_rcvbuf": "--socket-rcvbuf", "socket_sndbuf": "--socket-sndbuf", "send_batch": "--send-batch",
    "receive_batch": "--receive-batch", "send_impairment": "--impair-send", "receive_impairment": "--impair-receive",
    "storage_reserve": "--storage-reserve", "sender_idle": "--sender-idle", "receiver_idle": "--receiver-idle",
    "conductor_idle": "--conductor-idle",
}
_DRIVER_NAME = re.compile(r"\b(" + "|".join(sorted(_OPTION_OF, key=len, reverse=True)) + r")\b")


def _option_names(message: str, args: argparse.Namespace) -> str:
    """``ipc_term_length: term length ... must be a power of two`` -> ``--ipc-term-length: ...``."""
    return _DRIVER_NAME.sub(lambda match: _OPTION_OF[match.group(1)], message)
