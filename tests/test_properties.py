"""Property: whatever mix of offers, claims, aborts and batches, across many term rotations, the subscriber
sees exactly the committed messages, in order, reassembled, with PAD frames skipped."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from log_pipe import Pipe
from logbuf import ADMIN_ACTION, BACK_PRESSURED, FragmentAssembler, Position
from logbuf.driver.ipc_publication import IpcPublicationDuty

MAX_MESSAGE = 8 * 1024  # T/8 for a 64 KiB term

op = st.one_of(
    st.tuples(st.just("offer"), st.integers(min_value=0, max_value=MAX_MESSAGE)),
    st.tuples(st.just("offer"), st.integers(min_value=0, max_value=200)),
    st.tuples(st.just("claim"), st.integers(min_value=0, max_value=1376)),
    st.tuples(st.just("abort"), st.integers(min_value=0, max_value=1376)),
    st.tuples(st.just("batch"), st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=40)),
    st.tuples(st.just("poll"), st.integers(min_value=1, max_value=50)),
)


def payload(n: int, tag: int) -> bytes:
    return bytes((tag + i) % 251 for i in range(n))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=20, max_size=300), exclusive=st.booleans())
def test_subscriber_sees_exactly_the_committed_messages(make_log, ops, exclusive) -> None:
    p = Pipe(make_log(term_length=64 * 1024), exclusive=exclusive)
    pub_pos = Position.standalone()
    duty = IpcPublicationDuty(p.log, pub_pos, p.limit, lambda: [p.sub_pos])
    duty.update()
    expected: list[bytes] = []
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda b, h: got.append(bytes(b)))
    def append(fn) -> None:
        # retry through rotations and back-pressure, letting the reader and conductor make room
        for _ in range(1000):
            result = fn()
            if result not in (ADMIN_ACTION, BACK_PRESSURED):
                assert result > 0
                return
            p.image.poll(assembler, 100)
            duty.update()
        raise AssertionError("no progress")

    for tag, (kind, arg) in enumerate(ops, start=1):
        if kind == "offer":
            m = payload(arg, tag)
            append(lambda m=m: p.pub.offer(m))
            expected.append(m)
        elif kind in ("claim", "abort"):
            m = payload(arg, tag)

            def claim(m=m, kind=kind):
                c = p.pub.try_claim(len(m))
                if not c:
                    return c.result
                c.buffer[:] = m
                c.commit() if kind == "claim" else c.abort()
                return c.position

            append(claim)
            if kind == "claim":
                expected.append(m)
        elif kind == "batch":
            ms = [payload(n, tag + i) for i, n in enumerate(arg)]
            rest = ms
            for _ in range(1000):
                if not rest:
                    break
                r = p.pub.offer_batch(rest)
                rest = rest[r.appended :]
                if r.appended == 0:
                    p.image.poll(assembler, 100)
                    duty.update()
            assert not rest
            expected.extend(ms)
        else:
            p.image.poll(assembler, arg)
        duty.update()

    for _ in range(10_000):
        if not p.image.poll(assembler, 100):
            break
        duty.update()
    assert got == expected
    assert p.sub_pos.get() == p.log.producer_position()
