"""The native agent runner (``lb_agent``) and its Python wrapper: idle strategy specs, duties, start/stop,
the per-duty cycle counters, and the threading modes' agent plans."""

from __future__ import annotations

import pytest

from logbuf import Position
from logbuf.driver.agents import (
    DEFAULT_AGENT_IDLE,
    IdleSpec,
    NativeAgent,
    check_duty,
    default_threading_mode,
    monotonic_ns,
    plan_agents,
)
from logbuf.driver.native_ipc import PUBLICATION_REMOVED, NativeIpcDuty
from logbuf.native import ffi, lib
from support import wait_until


def test_idle_spec_parses_every_kind_and_prints_one_canonical_form() -> None:
    assert IdleSpec.parse("backoff") == IdleSpec()
    assert str(IdleSpec.parse(DEFAULT_AGENT_IDLE)) == DEFAULT_AGENT_IDLE
    spec = IdleSpec.parse("backoff:spins=0,yields=2,min-park=5us,max-park=2ms")
    assert (spec.max_spins, spec.max_yields, spec.min_park_ns, spec.max_park_ns) == (0, 2, 5_000, 2_000_000)
    assert str(spec) == "backoff:spins=0,yields=2,min-park=5us,max-park=2ms"
    assert IdleSpec.parse("backoff:max-park=4ms").max_park_ns == 4_000_000  # the rest keep the defaults
    assert IdleSpec.parse("sleep:park=250us").min_park_ns == 250_000
    for kind in ("yield", "spin", "noop"):
        assert IdleSpec.parse(kind).kind == kind


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("busy", "'busy'"),
        ("backoff:spin=3", "'spin=3'"),
        ("backoff:spins=-1", "spins"),
        ("backoff:min-park=2ms,max-park=1ms", "min-park <= max-park"),
        ("backoff:max-park=1 hour", "max-park"),
        ("backoff:spins=1,spins=2", "spins given twice"),
        ("yield:spins=3", "yield takes no parameters"),
        ("sleep:park=0", "min-park"),
        ("backoff:", "empty parameter list"),
    ],
)
def test_bad_idle_specs_are_refused_by_name(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        IdleSpec.parse(text)


def test_default_threading_mode_follows_the_core_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOGBUF_THREADING_MODE", raising=False)  # that would name the default
    assert default_threading_mode(16) == "dedicated"
    assert default_threading_mode(4) == "dedicated"
    assert default_threading_mode(2) == "shared"


def test_each_mode_plans_its_agents_for_the_duties_present() -> None:
    everything = {"sender", "receiver", "conductor"}
    assert plan_agents("shared", everything) == [("lb-shared", ("sender", "receiver", "conductor"))]
    assert plan_agents("shared-network", everything) == [("lb-network", ("sender", "receiver")),
                                                         ("lb-conductor", ("conductor",))]
    assert [roles for _, roles in plan_agents("dedicated", everything)] == [("sender",), ("receiver",),
                                                                            ("conductor",)]
    assert plan_agents("dedicated", {"conductor"}) == [("lb-conductor", ("conductor",))]
    with pytest.raises(ValueError, match="threading mode 'invoker'"):
        plan_agents("invoker", everything)


def test_a_duty_must_be_a_function_pointer_and_a_state() -> None:
    native = NativeIpcDuty(timer_interval_ns=1_000_000)
    try:
        check_duty(native.duty)
        with pytest.raises(TypeError):
            check_duty((lib.lbd_ipc_do_work, native.duty[1]))  # a Python callable, not a function pointer
        with pytest.raises(TypeError):
            check_duty((ffi.addressof(lib, "lb_agent_cycles"), native.duty[1]))  # the wrong signature
        with pytest.raises(TypeError):
            check_duty((ffi.addressof(lib, "lbd_ipc_poll_event"), native.duty[1]))  # (T *, U *): not a duty
        # int32_t (*)(T *, int64_t) is a duty too (a state of its own pointer type)
        typed = ffi.cast("int32_t (*)(lbd_ipc_t *, int64_t)", native.duty[0])
        fn, _ = check_duty((typed, native.duty[1]))
        assert ffi.typeof(fn) is ffi.typeof("lb_duty_fn")
        with pytest.raises(ValueError, match="NULL"):
            check_duty((native.duty[0], ffi.NULL))
        with pytest.raises(TypeError):
            check_duty(native.duty[0])  # type: ignore[arg-type]
    finally:
        native.close()


def test_agent_runs_its_duties_on_its_thread_and_stop_joins_it() -> None:
    native = NativeIpcDuty(timer_interval_ns=1_000_000)
    max_cycle, exceeded = Position.standalone(), Position.standalone()
    agent = NativeAgent("lb-test", "backoff:max-park=100us", cycle_threshold_ns=1)
    try:
        agent.add_duty(native.duty, role="conductor", max_cycle_time=max_cycle, threshold_exceeded=exceeded,
                       owner=native)
        agent.start()
        assert agent.is_running
        wait_until(lambda: agent.cycles > 10, timeout=10, what="agent cycles")
        with pytest.raises(RuntimeError, match="before start"):
            agent.add_duty(native.duty)
        with pytest.raises(RuntimeError, match="already started"):
            agent.start()
        # a command is work: the duty acknowledges it, and its cycle time reaches the counters
        native.remove_publication(42)
        events: list[tuple[int, int, int, int]] = []
        wait_until(lambda: bool(events.extend(native.poll_events()) or events), timeout=10, what="the ack")
        assert events == [(PUBLICATION_REMOVED, 42, 0, 0)]
        wait_until(lambda: agent.work_cycles >= 1, timeout=10, what="a working cycle")
        assert max_cycle.get() > 0 and exceeded.get() >= 1  # threshold 1 ns: every working cycle exceeds it
        assert agent.max_duty_ns >= max_cycle.get() > 0
        assert agent.errors == 0
        assert agent.stop(timeout_s=10)
        assert not agent.is_running
        cycles = agent.cycles
        assert agent.cycles == cycles  # stopped: no more cycles
    finally:
        agent.close()
        native.close()
    with pytest.raises(RuntimeError, match="closed"):
        agent.start()


def test_an_idle_agent_backs_off_rather_than_spinning() -> None:
    native = NativeIpcDuty(timer_interval_ns=1_000_000)
    agent = NativeAgent("lb-idle", "backoff:spins=1,yields=1,min-park=1ms,max-park=1ms")
    try:
        agent.add_duty(native.duty, owner=native)
        agent.start()
        start = monotonic_ns()
        wait_until(lambda: agent.cycles > 20, timeout=10, what="agent cycles")
        elapsed_ms = (monotonic_ns() - start) / 1e6
        # parked 1 ms per idle cycle: a bare spin would have run far more cycles than milliseconds elapsed
        assert agent.cycles <= elapsed_ms + 50
    finally:
        agent.close()
        native.close()


def test_an_agent_that_is_not_started_runs_a_cycle_on_the_caller() -> None:
    native = NativeIpcDuty(timer_interval_ns=1_000_000)
    agent = NativeAgent("lb-invoker", "yield")
    try:
        agent.add_duty(native.duty, owner=native)
        assert agent.do_work(monotonic_ns()) == 0
        native.remove_publication(7)
        assert agent.do_work(monotonic_ns()) == 1
        assert native.poll_events() == [(PUBLICATION_REMOVED, 7, 0, 0)]
        assert agent.cycles == 2 and agent.work_cycles == 1
        assert agent.stop()  # never started: nothing to join
    finally:
        agent.close()
        native.close()


def test_agent_arguments_are_checked_before_c() -> None:
    with pytest.raises(ValueError, match="1..15"):
        NativeAgent("a-much-too-long-agent-name")
    with pytest.raises(ValueError, match="unknown kind"):
        NativeAgent("lb-x", "hot")
    with pytest.raises(ValueError, match="cycle_threshold_ns"):
        NativeAgent("lb-x", cycle_threshold_ns=0)
    agent = NativeAgent("lb-x")
    with pytest.raises(RuntimeError, match="no duties"):
        agent.start()
    agent.close()
