"""Native agents: the driver's data-plane duties on native threads that hold no GIL (Aeron's agent runners).

A duty is a C function ``int32_t fn(void *state, int64_t now_ns)`` returning the work it did (0: idle), given
here as a pair ``(cffi function pointer, cffi void *state)`` - :data:`NativeDuty`.  A :class:`NativeAgent` runs
its duties on one pthread, each cycle on one ``CLOCK_MONOTONIC`` reading (Python's ``time.monotonic_ns()``),
then its idle strategy when none did work.  The control plane never touches a duty's state: it talks to it
through the duty's own queues, so any duty may run on any agent.

Threading modes (Aeron's, for the data plane; the Python conductor - commands, lifecycle, counter allocation,
cnc.dat - always runs on its own Python thread, and no native duty ever runs on it):

* ``shared``: one native agent runs the sender, the receiver and the native conductor duties;
* ``shared-network``: sender and receiver on one native agent, the native conductor duties on another;
* ``dedicated``: the sender, the receiver and the native conductor duties on a native agent each.

Idle strategies (:class:`IdleSpec`, one text form, validated by name): ``backoff`` (the default:
``backoff:spins=10,yields=20,min-park=1us,max-park=1ms``; any of the four may be given, the rest keep these
values), ``sleep:park=1ms``, ``yield``, ``spin`` and ``noop`` (the last two never give the core away: for a
core of the agent's own only).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from logbuf.native import ffi, lib
from logbuf.position import Position
from logbuf.units import NANOS_PER_MILLI, NANOS_PER_SECOND, NANOS_PER_UNIT

#: a native duty: (cffi ``int32_t (*)(void *, int64_t)`` function pointer, cffi ``void *`` state)
NativeDuty = tuple[Any, Any]

THREADING_MODES = ("shared", "shared-network", "dedicated")
#: the mode's name as Aeron writes it in its counters' labels
AERON_THREADING_MODE = {"shared": "SHARED", "shared-network": "SHARED_NETWORK", "dedicated": "DEDICATED"}
#: the agents each mode runs: agent name -> the roles (duties) it runs, in duty order
MODE_AGENTS: dict[str, dict[str, tuple[str, ...]]] = {
    "shared": {"lb-shared": ("sender", "receiver", "conductor")},
    "shared-network": {"lb-network": ("sender", "receiver"), "lb-conductor": ("conductor",)},
    "dedicated": {"lb-sender": ("sender",), "lb-receiver": ("receiver",), "lb-conductor": ("conductor",)},
}
ROLES = ("sender", "receiver", "conductor")

DEFAULT_AGENT_IDLE = "backoff:spins=10,yields=20,min-park=1us,max-park=1ms"


#: the environment variable that sets the default threading mode (as Aeron's ``AERON_THREADING_MODE``)
THREADING_MODE_ENV = "LOGBUF_THREADING_MODE"


def default_threading_mode(cpu_count: int | None = None) -> str:
    """``$LOGBUF_THREADING_MODE`` where set (refused by name unless one of :data:`THREADING_MODES`), else
    ``dedicated`` with 4 or more cores, ``shared`` otherwise."""
    named = os.environ.get(THREADING_MODE_ENV, "").strip()
    if named:
        if named not in THREADING_MODES:
            raise ValueError(f"{THREADING_MODE_ENV}={named!r}: expected one of {', '.join(THREADING_MODES)}")
        return named
    cores = os.cpu_count() if cpu_count is None else cpu_count
    return "dedicated" if (cores or 1) >= 4 else "shared"


def check_threading_mode(mode: str) -> str:
    if mode not in THREADING_MODES:
        raise ValueError(f"threading mode {mode!r}: expected one of {', '.join(THREADING_MODES)}")
    return mode


_DURATION = re.compile(r"^(\d+)(ns|us|ms|s)?$")


def parse_duration_ns(text: str, what: str) -> int:
    """``1us``, ``250ms``, ``2s`` or a bare number of ns."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"{what}={text!r}: expected a whole number with ns, us, ms or s (e.g. 1ms)")
    return int(match.group(1)) * NANOS_PER_UNIT[match.group(2) or "ns"]


def _format_ns(ns: int) -> str:
    for unit in ("s", "ms", "us"):
        if ns % NANOS_PER_UNIT[unit] == 0 and ns >= NANOS_PER_UNIT[unit]:
            return f"{ns // NANOS_PER_UNIT[unit]}{unit}"
    return f"{ns}ns"


_KINDS = {
    "noop": lib.LB_IDLE_NOOP,
    "spin": lib.LB_IDLE_SPIN,
    "yield": lib.LB_IDLE_YIELD,
    "sleep": lib.LB_IDLE_SLEEP,
    "backoff": lib.LB_IDLE_BACKOFF,
}
_PARAMS = {"backoff": ("spins", "yields", "min-park", "max-park"), "sleep": ("park",)}


@dataclass(frozen=True)
class IdleSpec:
    """An agent's idle strategy (see the module docstring for the text form)."""

    kind: str = "backoff"
    max_spins: int = 10
    max_yields: int = 20  # Aeron's back-off: 10 spins, 20 yields, then parks from 1 µs doubling to 1 ms
    min_park_ns: int = 1_000
    max_park_ns: int = NANOS_PER_MILLI

    @classmethod
    def parse(cls, text: str) -> IdleSpec:
        """``backoff[:spins=N,yields=N,min-park=D,max-park=D]``, ``sleep[:park=D]``, ``yield``, ``spin`` or
        ``noop``; anything else is refused by name."""
        kind, colon, rest = text.strip().partition(":")
        if kind not in _KINDS:
            raise ValueError(f"idle strategy {text!r}: unknown kind {kind!r} (expected {', '.join(_KINDS)})")
        allowed = _PARAMS.get(kind, ())
        values: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))) if rest else ():
            name, sep, value = item.partition("=")
            if not sep or name not in allowed:
                expected = f"parameters {', '.join(allowed)}" if allowed else "no parameters"
                raise ValueError(f"idle strategy {text!r}: unknown parameter {item!r} ({kind} takes {expected})")
            if name in values:
                raise ValueError(f"idle strategy {text!r}: {name} given twice")
            values[name] = value
        if colon and not values:
            raise ValueError(f"idle strategy {text!r}: empty parameter list")
        if kind == "backoff":
            defaults = cls()
            spec = cls(
                kind,
                _count(values, "spins", defaults.max_spins, text),
                _count(values, "yields", defaults.max_yields, text),
                parse_duration_ns(values["min-park"], "min-park") if "min-park" in values else defaults.min_park_ns,
                parse_duration_ns(values["max-park"], "max-park") if "max-park" in values else defaults.max_park_ns,
            )
        elif kind == "sleep":
            park = parse_duration_ns(values["park"], "park") if "park" in values else NANOS_PER_MILLI
            spec = cls(kind, 0, 0, park, park)
        else:
            spec = cls(kind, 0, 0, 0, 0)
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"idle strategy kind {self.kind!r} unknown")
        if self.max_spins < 0 or self.max_yields < 0:
            raise ValueError("idle strategy: spins and yields must be >= 0")
        if self.kind in ("sleep", "backoff") and not 0 < self.min_park_ns <= self.max_park_ns <= NANOS_PER_SECOND:
            raise ValueError("idle strategy: need 0 < min-park <= max-park <= 1s")

    def __str__(self) -> str:
        if self.kind == "backoff":
            return (f"backoff:spins={self.max_spins},yields={self.max_yields},"
                    f"min-park={_format_ns(self.min_park_ns)},max-park={_format_ns(self.max_park_ns)}")
        if self.kind == "sleep":
            return f"sleep:park={_format_ns(self.min_park_ns)}"
        return self.kind


def _count(values: dict[str, str], name: str, default: int, text: str) -> int:
    if name not in values:
        return default
    value = values[name]
    if not value.isdigit() or int(value) > 1_000_000:
        raise ValueError(f"idle strategy {text!r}: {name}={value!r} must be a whole number 0..1000000")
    return int(value)


def check_duty(duty: NativeDuty) -> NativeDuty:
    """``(function pointer, state)`` as a native agent accepts it; anything else raises TypeError/ValueError."""
    if not isinstance(duty, tuple) or len(duty) != 2:
        raise TypeError(f"a native duty is a (function pointer, state) pair, got {duty!r}")
    fn, state = duty
    if not isinstance(fn, ffi.CData) or not _is_duty_type(ffi.typeof(fn)):
        raise TypeError(f"a native duty's function must be a cffi int32_t(*)(void *, int64_t), got {fn!r}")
    if fn == ffi.NULL:
        raise ValueError("a native duty's function pointer is NULL")
    if not isinstance(state, ffi.CData) or ffi.typeof(state).kind != "pointer":
        raise TypeError(f"a native duty's state must be a cffi pointer, got {state!r}")
    if state == ffi.NULL:
        raise ValueError("a native duty's state is NULL")
    return ffi.cast("lb_duty_fn", fn), ffi.cast("void *", state)


def _is_duty_type(ctype: Any) -> bool:
    # int32_t (*)(T *, int64_t): a duty may declare its state's own pointer type (the call passes it as is)
    if ctype is ffi.typeof("lb_duty_fn"):
        return True
    return (ctype.kind == "function" and not ctype.ellipsis and ctype.result is ffi.typeof("int32_t")
            and len(ctype.args) == 2 and ctype.args[0].kind == "pointer" and ctype.args[1] is ffi.typeof("int64_t"))


def _counter_pointer(position: Position | None) -> Any:
    return ffi.NULL if position is None else ffi.cast("int64_t *", position.pointer)


def propose_max(position: Position, value: int) -> bool:
    """Raises a counter shared with native agents to ``value`` if that is more (compare-and-swap)."""
    pointer = position.pointer
    while True:
        current = position.get()
        if value <= current:
            return False
        if lib.lb_cas_i64(pointer, current, value):
            return True


def add(position: Position, delta: int = 1) -> None:
    """Adds to a counter shared with native agents (atomic)."""
    lib.lb_get_and_add_i64(position.pointer, delta)


class NativeAgent:
    """One native thread running a list of duties (``lb_agent``); duties are added before :meth:`start`.

    Whatever a duty's state points into (its owner object, counters) must outlive the agent: pass it as
    ``owner`` and the agent keeps a reference until :meth:`close`."""

    def __init__(self, name: str, idle: IdleSpec | str = DEFAULT_AGENT_IDLE,
                 cycle_threshold_ns: int = NANOS_PER_MILLI) -> None:
        spec = IdleSpec.parse(idle) if isinstance(idle, str) else idle
        spec.validate()
        if not name or len(name.encode()) > 15 or not name.isascii():
            raise ValueError(f"agent name {name!r}: 1..15 ASCII characters (a thread name)")
        if cycle_threshold_ns <= 0:
            raise ValueError("cycle_threshold_ns must be positive")
        self.name = name
        self.idle = spec
        self.roles: list[str] = []
        self._keep: list[Any] = []
        agent = lib.lb_agent_new(name.encode(), _KINDS[spec.kind], spec.max_spins, spec.max_yields,
                                 spec.min_park_ns, spec.max_park_ns, cycle_threshold_ns)
        if agent == ffi.NULL:
            raise MemoryError(f"lb_agent_new({name!r}) failed")
        self._agent: Any = agent
        self._started = False

    def add_duty(self, duty: NativeDuty, *, role: str = "", max_cycle_time: Position | None = None,
                 threshold_exceeded: Position | None = None, owner: object = None) -> None:
        """Adds a duty; ``max_cycle_time`` / ``threshold_exceeded``: the counters this agent writes for it."""
        agent = self._live()
        if self._started:
            raise RuntimeError(f"agent {self.name}: duties are added before start")
        fn, state = check_duty(duty)
        if lib.lb_agent_add_duty(agent, fn, state, _counter_pointer(max_cycle_time),
                                 _counter_pointer(threshold_exceeded)) < 0:
            raise ValueError(f"agent {self.name}: at most {lib.LB_AGENT_MAX_DUTIES} duties")
        self.roles.append(role)
        self._keep.extend((duty, max_cycle_time, threshold_exceeded, owner))

    def start(self) -> None:
        """Starts the thread."""
        agent = self._live()
        if not self.roles:
            raise RuntimeError(f"agent {self.name}: no duties to run")
        if self._started:
            raise RuntimeError(f"agent {self.name}: already started")
        rc = lib.lb_agent_start(agent)
        if rc != 0:
            raise OSError(rc, f"agent {self.name}: cannot start its thread")
        self._started = True

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stops and joins the thread within ``timeout_s``; False when it is still running."""
        if self._agent is None:
            return True
        return lib.lb_agent_stop(self._agent, int(timeout_s * NANOS_PER_SECOND)) == 0

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the thread and frees the agent.  A thread that does not stop in time is left running with
        everything it uses (never freed under it) and RuntimeError says so."""
        if self._agent is None:
            return
        if not self.stop(timeout_s) or lib.lb_agent_free(self._agent) != 0:
            raise RuntimeError(f"agent {self.name}: its thread did not stop within {timeout_s} s")
        self._agent = None
        self._keep.clear()

    def do_work(self, now_ns: int) -> int:
        """One duty cycle on the calling thread (an agent that is not started)."""
        agent = self._live()
        if self._started:
            raise RuntimeError(f"agent {self.name}: its own thread runs its duties")
        return int(lib.lb_agent_do_work(agent, now_ns))

    def _live(self) -> Any:
        if self._agent is None:
            raise RuntimeError(f"agent {self.name} is closed")
        return self._agent

    @property
    def is_running(self) -> bool:
        return self._agent is not None and bool(lib.lb_agent_is_running(self._agent))

    @property
    def cycles(self) -> int:
        """Duty cycles run."""
        return int(lib.lb_agent_cycles(self._live()))

    @property
    def work_cycles(self) -> int:
        """Duty cycles in which some duty did work."""
        return int(lib.lb_agent_work_cycles(self._live()))

    @property
    def errors(self) -> int:
        """Duty calls that returned an error (negative)."""
        return int(lib.lb_agent_errors(self._live()))

    @property
    def max_duty_ns(self) -> int:
        """The longest run of one duty that did work (ns)."""
        return int(lib.lb_agent_max_duty_ns(self._live()))

    def __repr__(self) -> str:
        return f"NativeAgent({self.name!r}, roles={self.roles}, idle={self.idle}, running={self.is_running})"


def plan_agents(mode: str, available: set[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The agents a threading mode runs for the roles that have a native duty: ``[(name, roles), ...]``,
    agents left without a duty omitted."""
    check_threading_mode(mode)
    plan = []
    for name, roles in MODE_AGENTS[mode].items():
        present = tuple(role for role in roles if role in available)
        if present:
            plan.append((name, present))
    return plan


def monotonic_ns() -> int:
    """CLOCK_MONOTONIC as the agents read it."""
    return int(lib.lb_monotonic_ns())
