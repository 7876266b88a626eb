"""The MDC destination tracker: the native agent's (``lbd_snd_tracker_*``) against its Python specification
(``logbuf.driver.udp.destination_tracker``), fed the same random status messages (sources on a few hosts and
ports, receiver ids), manual adds and removes and clock ticks: the destinations a frame goes to, in order,
must be the same; plus the rules themselves on a few hand-made cases."""

from __future__ import annotations

import socket
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logbuf.driver.udp.destination_tracker import DestinationTracker
from logbuf.native import ffi, lib

S = 1_000_000_000
PROFILE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def v4(host: int, port: int) -> bytes:
    return struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + bytes([127, 0, 0, host]) + bytes(8)


def v6(host: int, port: int) -> bytes:
    return (struct.pack("=H", socket.AF_INET6) + struct.pack("!H", port) + bytes(4) + bytes(15) + bytes([host])
            + bytes(4))


address = st.builds(lambda six, host, port: (v6 if six else v4)(host, port), st.booleans(), st.integers(1, 3),
                    st.integers(40000, 40002))
ops = st.lists(st.one_of(
    st.tuples(st.just("sm"), st.integers(1, 3), address),
    st.tuples(st.just("add"), address, st.integers(1, 100)),
    st.tuples(st.just("remove"), address),
    st.tuples(st.just("tick"), st.integers(0, 3 * S)),
), min_size=1, max_size=60)


def native_targets(tracker: object, now: int) -> list[bytes]:
    out = ffi.new("uint8_t[]", 32 * lib.LBD_SND_MAX_DESTINATIONS)
    n = lib.lbd_snd_tracker_targets(tracker, now, out)
    spec_lengths = []
    for i in range(n):
        raw = bytes(ffi.buffer(out + 32 * i, 32))
        spec_lengths.append(raw[:28] if struct.unpack_from("=H", raw)[0] == socket.AF_INET6 else raw[:16])
    return spec_lengths


@PROFILE
@given(sequence=ops, manual=st.booleans())
def test_native_tracker_decides_as_the_specification(sequence: list[tuple], manual: bool) -> None:
    timeout = 5 * S
    spec = DestinationTracker(manual, timeout)
    native = ffi.gc(lib.lbd_snd_tracker_new(lib.LBD_MDC_MANUAL if manual else lib.LBD_MDC_DYNAMIC, timeout),
                    lib.lbd_snd_tracker_free)
    now = S
    for op in sequence:
        if op[0] == "sm":
            spec.on_status_message(op[1], op[2], now)
            lib.lbd_snd_tracker_on_sm(native, op[1], op[2], len(op[2]), now)
        elif op[0] == "add":
            assert bool(lib.lbd_snd_tracker_add(native, op[1], len(op[1]), op[2], now)) == spec.add(op[1], op[2], now)
        elif op[0] == "remove":
            spec.remove(op[1])
            lib.lbd_snd_tracker_remove(native, op[1], len(op[1]))
        else:
            now += op[1]
        assert native_targets(native, now) == spec.targets(now), op


def test_dynamic_sources_become_destinations_and_silent_ones_go() -> None:
    t = DestinationTracker(manual=False)
    t.on_status_message(1, v4(1, 40000), 0)
    t.on_status_message(2, v4(2, 40000), 0)
    t.on_status_message(1, v4(1, 40000), 4 * S)  # the same receiver again: no new destination
    assert t.targets(5 * S) == [v4(1, 40000), v4(2, 40000)]
    assert t.targets(5 * S + 1) == [v4(1, 40000)]  # the second was silent for longer than 5 s
    assert t.targets(9 * S) == [v4(1, 40000)] and t.targets(9 * S + 1) == []


def test_manual_destinations_are_the_added_ones_and_never_time_out() -> None:
    t = DestinationTracker(manual=True)
    t.on_status_message(1, v4(1, 40000), 0)  # not a destination: nothing added
    assert t.targets(0) == []
    assert t.add(v4(1, 40000), 7, 0) and t.add(v4(2, 40001), 8, 0)
    assert t.targets(100 * S) == [v4(1, 40000), v4(2, 40001)]
    t.remove(v4(1, 40000))
    assert t.targets(100 * S) == [v4(2, 40001)]
    t.remove(v4(3, 40000))  # not there: nothing happens
    assert t.targets(100 * S) == [v4(2, 40001)]
    assert not DestinationTracker(manual=False).add(v4(1, 40000), 1, 0)
