"""Property tests: the native sender agent's state machines (``native/include/lb_snd_machines.h``, through the
test-only ``lbd_snd_model_*`` entry points) against their Python specifications in ``logbuf.driver.udp`` -
flow control (unicast, min multicast and tagged, receivers timing out, group tags and minimum group sizes), the
retransmit handler (NAK checks, delay, linger, pool overflow, max-resend with group semantics, unicast's one
reused action) and the SETUP / heartbeat schedule - fed the same random sequences of status
messages, NAKs, sender progress and clock ticks: every decision must be the same."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logbuf.driver.udp.flow_control import (
    FlowControl,
    MinMulticastFlowControl,
    TaggedFlowControl,
    UnicastFlowControl,
)
from logbuf.driver.udp.retransmit import RetransmitHandler
from logbuf.driver.udp.sender_schedule import SenderSchedule
from logbuf.driver.windows import trip_gain
from logbuf.logbuffer import descriptor as d
from logbuf.native import ffi, lib
from logbuf.protocol.nak import Nak
from logbuf.protocol.status_message import StatusMessage

T = 64 * 1024
BITS = d.position_bits_to_shift(T)
MS = 1_000_000
PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

GROUP_TAG = 5
# the SM's feedback: none, the group's tag, another tag, or a malformed extension (not 8 bytes)
sm_op = st.tuples(st.just("sm"), st.integers(1, 4), st.integers(-1, 3), st.integers(0, T // 32 - 1).map(lambda x: x * 32),
                  st.integers(0, T // 2), st.sampled_from([0, 0, 0x40, 0x80]),
                  st.sampled_from([b"", GROUP_TAG.to_bytes(8, "little"), (6).to_bytes(8, "little"), b"\x05\0\0\0"]))
nak_op = st.tuples(st.just("nak"), st.integers(-2, 1), st.integers(-1, T // 32).map(lambda x: x * 32),
                   st.integers(1, 5000))
tick_op = st.tuples(st.just("tick"), st.integers(0, 3000).map(lambda x: x * MS // 100))
advance_op = st.tuples(st.just("advance"), st.integers(0, T // 4))
sent_op = st.tuples(st.just("sent"), st.sampled_from([1, 2, 3]))
ops = st.lists(st.one_of(sm_op, nak_op, tick_op, advance_op, sent_op), min_size=1, max_size=80)


def native_model(initial_term_id: int, strategy: int, timeout_ns: int, rtx: RetransmitHandler, now_ns: int,
                 position: int, group_min_size: int = 0) -> Any:
    c = ffi.new("lbd_snd_command_t *")
    c.term_length = T
    c.initial_term_id = initial_term_id
    c.window_length = T // 2
    c.trip_gain = trip_gain(c.window_length)
    c.flow_control = strategy
    c.receiver_timeout_ns = timeout_ns
    c.retransmit_max_actions = rtx.max_actions
    c.retransmit_group = 1 if rtx.group_semantics else 0
    c.group_tag = GROUP_TAG
    c.group_min_size = group_min_size
    c.retransmit_delay_ns = rtx.delay_ns
    c.retransmit_linger_ns = rtx.linger_ns
    c.retained_window = rtx.retained_window
    c.setup_interval_ns = 100 * MS
    c.heartbeat_interval_ns = 100 * MS
    c.position = position
    c.now_ns = now_ns
    model = lib.lbd_snd_model_new(c)
    assert model != ffi.NULL
    return ffi.gc(model, lib.lbd_snd_model_free)


@PROFILE
@given(
    sequence=ops,
    initial_term_id=st.sampled_from([0, 7, -5, 2**31 - 2]),
    strategy=st.sampled_from(["unicast", "min", "tagged"]),
    group_min_size=st.integers(0, 3),
    group=st.booleans(),
    timeout_ms=st.sampled_from([5, 50, 5000]),
    delay_ns=st.sampled_from([0, 0, 2 * MS]),
    linger_ns=st.sampled_from([0, 10 * MS]),
    max_actions=st.integers(1, 16),
    start_terms=st.integers(0, 3),
)
def test_native_sender_machines_decide_as_the_specification(sequence: list[tuple], initial_term_id: int,
                                                            strategy: str, group_min_size: int, group: bool,
                                                            timeout_ms: int, delay_ns: int,
                                                            linger_ns: int, max_actions: int,
                                                            start_terms: int) -> None:
    now = 1_000 * MS
    snd_pos = start_terms * T + T // 2
    timeout_ns = timeout_ms * MS
    fc: FlowControl
    if strategy == "tagged":
        fc = TaggedFlowControl(GROUP_TAG, group_min_size, timeout_ns)
        native_strategy = lib.LBD_FC_TAGGED
    elif strategy == "min":
        fc, native_strategy = MinMulticastFlowControl(timeout_ns), lib.LBD_FC_MIN
    else:
        fc, native_strategy = UnicastFlowControl(timeout_ns), lib.LBD_FC_UNICAST
    rtx = RetransmitHandler(T, initial_term_id, linger_ns=linger_ns, delay_ns=delay_ns, max_actions=max_actions,
                            group_semantics=group)
    schedule = SenderSchedule(now)
    model = native_model(initial_term_id, native_strategy, timeout_ns, rtx, now, snd_pos, group_min_size)
    snd_lmt = snd_pos
    out = ffi.new("int32_t[]", 3 * lib.LBD_SND_MAX_RETRANSMIT_ACTIONS)
    stats = ffi.new("int64_t[5]")
    term_id_now = d.compute_term_id_from_position(snd_pos, BITS, initial_term_id)
    for op in sequence:
        kind = op[0]
        if kind == "sm":
            _, receiver, term_delta, offset, window, flags, feedback = op
            term_id = d.compute_term_id_from_position(snd_pos, BITS, initial_term_id)
            term_id = (term_id + term_delta + 2**31) % 2**32 - 2**31
            sm = StatusMessage(1, 2, term_id, offset, window, receiver, flags, feedback)
            schedule.on_status_message(now, setup_requested=sm.is_setup_requested)
            if not sm.is_setup_requested:
                snd_lmt = fc.on_status_message(sm, snd_lmt, BITS, initial_term_id, now)
            tag = int.from_bytes(feedback, "little", signed=True) if len(feedback) == 8 else 0
            native = lib.lbd_snd_model_on_sm_tagged(model, term_id, offset, window, receiver, flags, now,
                                                    len(feedback), tag)
            assert native == snd_lmt, op
        elif kind == "nak":
            _, term_delta, offset, length = op
            term_id = (term_id_now + term_delta + 2**31) % 2**32 - 2**31
            spec = rtx.on_nak(Nak(1, 2, term_id, offset, length), now, snd_pos)
            n = lib.lbd_snd_model_on_nak(model, term_id, offset, length, now, out)
            assert [tuple(r) for r in spec] == [(out[0], out[1], out[2])][:n], op
        elif kind == "tick":
            now += op[1]
            snd_lmt = fc.on_idle(now, snd_lmt, snd_pos)
            assert lib.lbd_snd_model_on_idle(model, now) == snd_lmt
            spec = rtx.on_timer(now, snd_pos)
            n = lib.lbd_snd_model_on_timer(model, now, out)
            assert [tuple(r) for r in spec] == [(out[3 * i], out[3 * i + 1], out[3 * i + 2]) for i in range(n)]
        elif kind == "advance":
            snd_pos += op[1]
            lib.lbd_snd_model_set_position(model, snd_pos)
        else:  # a SETUP, data or heartbeat went now
            which = op[1]
            if which == 1:
                schedule.on_setup_sent(now)
            elif which == 2:
                schedule.on_data_sent(now)
            else:
                schedule.on_heartbeat_sent(now)
            lib.lbd_snd_model_on_sent(model, which, now)
        assert lib.lbd_snd_model_setup_due(model, now) == schedule.setup_due(now)
        assert lib.lbd_snd_model_heartbeat_due(model, now) == schedule.heartbeat_due(now)
        assert lib.lbd_snd_model_receiver_count(model) == fc.receiver_count
        assert bool(lib.lbd_snd_model_connected(model)) == fc.is_connected
        assert bool(lib.lbd_snd_model_receivers_at_eos(model)) == fc.receivers_at_end_of_stream
        lib.lbd_snd_model_stats(model, stats)
        assert (stats[0], stats[1], stats[2], stats[3]) == (
            rtx.counters.invalid_packets, rtx.naks_out_of_window, rtx.naks_suppressed,
            rtx.counters.retransmit_pool_overflow)
