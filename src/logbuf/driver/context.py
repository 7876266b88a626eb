"""``DriverContext``: every setting of a media driver, with Aeron's defaults, validated in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from logbuf.directory import DEFAULT_STORAGE_RESERVE, resolve_directory
from logbuf.driver.agents import DEFAULT_AGENT_IDLE, IdleSpec, check_threading_mode, default_threading_mode
from logbuf.driver.ipc_publication import DEFAULT_UNBLOCK_TIMEOUT_NS
from logbuf.driver.udp.flow_control import DEFAULT_RECEIVER_TIMEOUT_NS
from logbuf.driver.udp.image_receiver import DEFAULT_IMAGE_LIVENESS_TIMEOUT_NS
from logbuf.driver.udp.impairment import Impairment
from logbuf.driver.udp.loss_detector import DEFAULT_MULTICAST_MAX_BACKOFF_NS, DEFAULT_UNICAST_NAK_DELAY_NS
from logbuf.driver.windows import max_publication_window
from logbuf.idle import idle_strategy
from logbuf.logbuffer import descriptor as d
from logbuf.units import NANOS_PER_MILLI, NANOS_PER_SECOND


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass
class DriverContext:
    directory: Path = field(default_factory=resolve_directory)
    ipc_term_length: int = d.DEFAULT_IPC_TERM_LENGTH
    network_term_length: int = d.DEFAULT_NETWORK_TERM_LENGTH
    mtu: int = d.DEFAULT_MTU
    ipc_publication_window: int = 0  # 0: half a term (Aeron); the rules: logbuf.driver.windows
    unblock_timeout_ns: int = DEFAULT_UNBLOCK_TIMEOUT_NS
    client_liveness_timeout_ns: int = 10 * NANOS_PER_SECOND
    publication_linger_timeout_ns: int = 5 * NANOS_PER_SECOND
    timer_interval_ns: int = 1 * NANOS_PER_SECOND
    # the Python conductor's loop: parks up to 4 ms when idle (a Python duty cycle costs tens of µs, so a 1 ms
    # park alone is ~4% of a core); only commands wait on it (pub-lmt moves on a native agent)
    idle_strategy: str = "backoff:4000000"
    to_driver_capacity: int = 1024 * 1024
    to_clients_capacity: int = 1024 * 1024
    counters_values_length: int = 1024 * 1024  # 8192 counters of 128 bytes
    error_log_length: int = 1024 * 1024
    loss_report_length: int = 1024 * 1024  # loss-report.dat (Aeron's default)
    force: bool = False  # take over the directory of a driver that died (never a directory that is not a driver's)
    group_access: bool = False  # directory 0770 / files 0660 instead of 0700 / 0600
    pre_touch: bool = False  # fault log pages in when a log is created (no page faults on the first lap)
    storage_reserve: int = DEFAULT_STORAGE_RESERVE  # bytes left free on the directory's file system: new logs
    # that would eat into it are refused (STORAGE_SPACE), as are logs the file system cannot back at all
    terminate_token: bytes | None = None  # TERMINATE_DRIVER is honoured only with this token
    # -- UDP (network publications and images) --
    # the native agents that run the data plane (agents.py): shared, shared-network or dedicated; dedicated
    # where there are 4 cores or more, shared otherwise; $LOGBUF_THREADING_MODE, where set, is the default
    threading_mode: str = field(default_factory=default_threading_mode)
    # each native agent's idle strategy (IdleSpec text); an agent running several roles takes its first
    # role's (shared: the sender's; shared-network: the sender's for sender+receiver)
    sender_idle: str = DEFAULT_AGENT_IDLE
    receiver_idle: str = DEFAULT_AGENT_IDLE
    conductor_idle: str = DEFAULT_AGENT_IDLE
    conductor_interval_ns: int = NANOS_PER_MILLI  # shared mode: the conductor's duty runs at most this often
    network_publication_window: int = 0  # 0: half a term; pub-lmt = snd-pos + this window
    spies_simulate_connection: bool = False  # a network publication read only by spies is connected (Aeron's)
    receiver_window: int = 0  # 0: min(128 KiB, T/2); what SMs offer the sender
    image_liveness_timeout_ns: int = DEFAULT_IMAGE_LIVENESS_TIMEOUT_NS  # an image silent this long is removed
    # a receiver silent this long stops holding a sender
    flow_control_receiver_timeout_ns: int = DEFAULT_RECEIVER_TIMEOUT_NS
    nak_unicast_delay_ns: int = DEFAULT_UNICAST_NAK_DELAY_NS  # unicast: first NAK after 100 us, retries every 100x that
    nak_multicast_max_backoff_ns: int = DEFAULT_MULTICAST_MAX_BACKOFF_NS  # multicast: randomised NAK delay up to this
    nak_multicast_group_size: int = 10  # expected receivers (shapes the multicast NAK delay)
    loss_give_up_ns: int | None = None  # a gap open this long is filled with PAD (None: never)
    socket_rcvbuf: int = 2 * 1024 * 1024  # asked for; the kernel caps it at net.core.rmem_max (0: OS default)
    socket_sndbuf: int = 2 * 1024 * 1024
    send_batch: int = 16  # data datagrams a publication sends per duty cycle (one sendmmsg)
    receive_batch: int = 32  # datagrams per recvmmsg
    send_impairment: str | None = None  # tests: e.g. "drop=0.05,reorder=0.05,seed=7" on every datagram sent
    receive_impairment: str | None = None  # ... and on every datagram received
    # -- images a remote sender may make this driver create (SETUPs are unauthenticated) --
    max_images: int = 1024  # images in total
    max_images_per_channel: int = 256  # images per receive channel
    max_images_per_source: int = 64  # images from one source (address and port)
    max_image_term_length: int = 64 * 1024 * 1024  # the largest term a remote SETUP may ask for

    @classmethod
    def build(cls, **options: Any) -> DriverContext:
        """A context from keyword options (``None`` means the default); validated."""
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise TypeError(f"unknown driver option(s): {', '.join(sorted(unknown))}")
        values = {k: v for k, v in options.items() if v is not None}
        if "directory" in values:
            values["directory"] = resolve_directory(values["directory"])
        ctx = cls(**values)
        ctx.validate()
        return ctx

    def with_options(self, **options: Any) -> DriverContext:
        ctx = replace(self, **options)
        ctx.validate()
        return ctx

    def validate(self) -> None:
        self.directory = Path(os.path.abspath(self.directory))
        for name in ("ipc_term_length", "network_term_length"):
            try:
                d.check_term_length(getattr(self, name))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        try:
            d.check_mtu(self.mtu, min(self.ipc_term_length, self.network_term_length))
        except ValueError as exc:
            raise ValueError(f"mtu: {exc}") from None
        if not 0 <= self.ipc_publication_window <= max_publication_window(self.ipc_term_length, network=False):
            raise ValueError("ipc_publication_window must be 0 (half a term) or at most one term")
        for name in (
            "unblock_timeout_ns",
            "client_liveness_timeout_ns",
            "publication_linger_timeout_ns",
            "timer_interval_ns",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("to_driver_capacity", "to_clients_capacity", "error_log_length"):
            if not _power_of_two(getattr(self, name)) or getattr(self, name) < 4096:
                raise ValueError(f"{name} must be a power of two >= 4096")
        if self.loss_report_length < 4096 or self.loss_report_length % 4096:
            raise ValueError("loss_report_length must be a multiple of 4096")
        if self.counters_values_length < 64 * 128 or self.counters_values_length % 128:
            raise ValueError("counters_values_length must hold at least 64 counters of 128 bytes")
        if self.storage_reserve < 0:
            raise ValueError("storage_reserve must be >= 0")
        idle_strategy(self.idle_strategy)  # raises for an unknown name
        check_threading_mode(self.threading_mode)
        for name in ("sender_idle", "receiver_idle", "conductor_idle"):
            try:
                IdleSpec.parse(getattr(self, name))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        for name in ("network_publication_window", "receiver_window", "socket_rcvbuf", "socket_sndbuf",
                     "conductor_interval_ns"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in (
            "image_liveness_timeout_ns",
            "flow_control_receiver_timeout_ns",
            "nak_multicast_max_backoff_ns",
            "nak_multicast_group_size",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.nak_unicast_delay_ns < 0:
            raise ValueError("nak_unicast_delay_ns must be >= 0")
        if self.loss_give_up_ns is not None and self.loss_give_up_ns < 0:
            raise ValueError("loss_give_up_ns must be None (never) or >= 0")
        for name in ("max_images", "max_images_per_channel", "max_images_per_source"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        try:
            d.check_term_length(self.max_image_term_length)
        except ValueError as exc:
            raise ValueError(f"max_image_term_length: {exc}") from None
        if not 1 <= self.send_batch <= 64 or not 1 <= self.receive_batch <= 64:
            raise ValueError("send_batch and receive_batch must be in 1..64")
        for name in ("send_impairment", "receive_impairment"):
            spec = getattr(self, name)
            if spec is not None:
                try:
                    Impairment.from_spec(spec)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None

    @property
    def dir_mode(self) -> int:
        return 0o770 if self.group_access else 0o700

    @property
    def file_mode(self) -> int:
        return 0o660 if self.group_access else 0o600

    def agent_idle(self, role: str) -> IdleSpec:
        """The idle strategy of the native agent whose first role is ``role``."""
        return IdleSpec.parse(getattr(self, f"{role}_idle"))

    def impairment(self, which: str, index: int) -> Impairment | None:
        """A fresh impairment for the ``index``-th transport from the ``send`` / ``receive`` spec, or None."""
        spec = self.send_impairment if which == "send" else self.receive_impairment
        return None if spec is None else Impairment.from_spec(spec, seed_offset=7919 * index)
