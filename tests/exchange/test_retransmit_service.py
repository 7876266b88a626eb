"""The fair service in C (``native/rtx_fair.c``: check, token bucket, fair queue, answers) against its Python
specification (FairService with RateLimiter and RetransmitCore.check), on random and hostile requests."""

from __future__ import annotations

import socket
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.exchange.retransmit.core import RetransmitCore
from logbuf.exchange.retransmit.fair import FairService
from logbuf.exchange.retransmit.rate import RateLimiter
from logbuf.exchange.retransmit.ring import MessageRing, RetransmitError
from logbuf.exchange.retransmit.server import sockaddr_bytes
from logbuf.exchange.retransmit.service import NativeFairService
from logbuf.native import ffi, lib

SESSION = b"SYNTH0001 "
HEADER = struct.Struct(">10sQH")  # the wire format, written out independently of moldudp64
MESSAGES = 60
SLOT = 21  # as the server reads: a longer datagram is cut and reads as 21 bytes (or truncated: -1)


def _day(bits: int = 5) -> tuple[bytes, MessageRing]:
    """MESSAGES frames of 1..40 bytes in a ring of 2**bits slots (older ones overwritten: not retained)."""
    lengths = [1 + (i * 7) % 40 for i in range(MESSAGES)]
    buf = b"".join(n.to_bytes(2, "big") + bytes([i % 251]) * n for i, n in enumerate(lengths))
    ring = MessageRing(bits)
    ring.publish(1, np.cumsum([0] + [2 + n for n in lengths[:-1]]).astype(np.int64))
    return buf, ring


def _pair(rate: float, burst: float, limiter_clients: int, queue: int, max_clients: int,
          budget: int = 200, limited: bool = True) -> tuple[FairService, NativeFairService]:
    """The specification and the C service over one ring (``limited=False``: no rate limit at all)."""
    buf, ring = _day()
    spec = FairService(RetransmitCore(SESSION, ring, buf, budget=budget),
                       RateLimiter(rate, burst, limiter_clients) if limited else None, queue, max_clients)
    native = NativeFairService(RetransmitCore(SESSION, ring, buf, budget=budget),
                               RateLimiter(rate, burst, limiter_clients) if limited else None, queue, max_clients)
    return spec, native


#: a request as a hostile client may send it: any first sequence and count, a wrong session, a wrong size
requests = st.one_of(
    st.builds(lambda first, count: HEADER.pack(SESSION, first, count),
              st.one_of(st.integers(0, MESSAGES + 3), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1])),
              st.one_of(st.sampled_from([0, 1, 2, 40, 0xFFFE, 0xFFFF]), st.integers(0, 0xFFFF))),
    st.builds(lambda first: HEADER.pack(b"OTHER0001 ", first, 1), st.integers(1, MESSAGES)),
    st.binary(min_size=0, max_size=40).filter(lambda b: len(b) != 20),
)
#: clients: raw keys of 1..32 bytes, some sharing a prefix with others
clients = st.sampled_from([b"\x02\x00\x01\x01", b"\x02\x00\x01\x01\x00", b"\x02\x00\x01\x02", b"b" * 28,
                           b"c" * 32, b"\x0a"])


def _batch(spec: FairService, native: NativeFairService, batch: list[tuple[bytes, bytes]], now_ns: int) -> None:
    """One receive batch through rtx_service_receive and the same requests one by one through the
    specification: the same admissions and over-rate flags."""
    n = len(batch)
    slots = ffi.new("uint8_t[]", max(1, n) * SLOT)
    lengths = ffi.new("int32_t[]", max(1, n))
    addresses = ffi.new("uint8_t[]", max(1, n) * 32)
    address_lengths = ffi.new("int32_t[]", max(1, n))
    flags = ffi.new("uint8_t[]", max(1, n))
    for i, (request, client) in enumerate(batch):
        ffi.memmove(slots + i * SLOT, request[:SLOT], min(len(request), SLOT))
        lengths[i] = len(request) if len(request) <= SLOT else -1  # cut by the kernel (LBN_TRUNCATED)
        ffi.memmove(addresses + i * 32, client, len(client))
        address_lengths[i] = len(client)
    over = native.receive_batch(slots, SLOT, lengths, addresses, 32, address_lengths, n, now_ns, flags)
    expected = []
    for request, client in batch:
        admitted = spec.receive(request, client, now_ns)
        expected.append((admitted, spec.over_rate))
    got = [(bool(flags[i] & lib.RTX_ADMITTED), bool(flags[i] & lib.RTX_OVER_RATE)) for i in range(n)]
    assert got == expected
    assert over == sum(o for _, o in expected)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(1e-3, 10.0), st.floats(1e-3, 1e7)), st.one_of(st.floats(1.0, 3.0), st.floats(1.0, 20.0)),
       st.integers(1, 4), st.integers(1, 5), st.integers(1, 4), st.booleans(),
       st.lists(st.one_of(
           st.tuples(st.just("receive"), st.lists(st.tuples(requests, clients), max_size=12),
                     st.one_of(st.integers(0, 2_000_000_000), st.integers(-1_000, 0))),
           st.tuples(st.just("pop"), st.integers(1, 8), st.just(0))), max_size=25))
def test_c_service_matches_the_specification(rate: float, burst: float, limiter_clients: int, queue: int,
                                             max_clients: int, limited: bool, steps: list) -> None:
    """Random batches of hostile requests from a few clients, with the clock moving (now and then backwards),
    interleaved with turns: the C service admits, flags, serves in the same order and counts exactly as the
    specification (token buckets to the last bit of floating point, buckets forgotten least recently seen
    first, per-client queues bounded, at most max_clients clients queued; or no rate limit at all)."""
    spec, native = _pair(rate, burst, limiter_clients, queue, max_clients, limited=limited)
    now = 10**12
    for kind, arg, step in steps:
        if kind == "receive":
            now += step
            _batch(spec, native, arg, now)
        else:
            for _ in range(arg):
                assert native.next_request() == spec.next_request()
        assert native.pending == spec.pending
    while (turn := spec.next_request()) is not None:
        assert native.next_request() == turn
    assert native.next_request() is None and native.pending == 0
    assert vars(native.stats) == vars(spec.stats)


@pytest.mark.parametrize("request_bytes, counter", [
    (HEADER.pack(b"OTHER0001 ", 1, 1), "bad_session"),
    (HEADER.pack(SESSION, 1, 1) + b"\x00", "bad_size"),
    (HEADER.pack(SESSION, 1, 1) + bytes(100), "bad_size"),  # cut at the slot: LBN_TRUNCATED
    (HEADER.pack(SESSION, 1, 1)[:-1], "bad_size"),
    (b"", "bad_size"),
    (HEADER.pack(SESSION, 50, 0), "bad_count"),
    (HEADER.pack(SESSION, 50, 0xFFFF), "bad_count"),
    (HEADER.pack(SESSION, MESSAGES + 1, 1), "future"),
    (HEADER.pack(SESSION, 2**63, 1), "future"),
    (HEADER.pack(SESSION, 2**64 - 1, 0xFFFE), "future"),
])
def test_hostile_requests_are_counted_and_never_queued(request_bytes: bytes, counter: str) -> None:
    _, native = _pair(1e6, 100, 16, 8, 16)
    assert native.receive(request_bytes, b"\x02\x00\x01\x01", 0) is False and not native.over_rate
    stats = native.stats
    assert getattr(stats, counter) == 1 and stats.requests == 1 and native.pending == 0
    assert sum(vars(stats).values()) == 2  # requests and that one reason, nothing else


def test_a_request_queued_then_overwritten_is_counted_as_not_retained() -> None:
    """The sequence was in the ring when asked, gone when answered: no answer, counted."""
    _, native = _pair(1e6, 100, 16, 8, 16)
    assert native.receive(HEADER.pack(SESSION, 1, 5), b"c", 0)  # sequence 1 is not in a ring of 32 slots
    assert native.receive(HEADER.pack(SESSION, 40, 5), b"c", 0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        assert native.answer(sock.fileno(), 10) == 0  # the second: to an address the kernel refuses (b"c")
    stats = native.stats
    assert stats.not_retained == 1 and stats.answers == 1 and stats.send_failed == 1


def test_rate_limit_and_queue_bound_in_c() -> None:
    """Burst 3 at 10/s: 3 admitted, the rest over rate until the clock gives a token back; a queue of 2
    refuses a third request as over rate too (the server isolates such a client)."""
    _, native = _pair(10.0, 3, 16, 100, 16)
    request = HEADER.pack(SESSION, 40, 1)
    assert [native.receive(request, b"a", 0) for _ in range(5)] == [True, True, True, False, False]
    assert native.over_rate and native.stats.rate_limited == 2
    assert not native.receive(request, b"a", 50_000_000) and native.receive(request, b"a", 100_000_000)
    _, native = _pair(1e6, 100, 16, 2, 16)
    assert [native.receive(request, b"a", 0) for _ in range(3)] == [True, True, False]
    assert native.over_rate and native.stats.queue_full == 1


def test_the_least_recently_seen_bucket_is_forgotten() -> None:
    """Two buckets remembered, one token each, no refill to speak of: a client seen again moves to the back,
    so a third client makes the service forget the other one, which then starts with a full bucket."""
    spec, native = _pair(1e-3, 1, 2, 8, 16)
    request = HEADER.pack(SESSION, 40, 1)
    # c evicts b (a was seen after it); a keeps its empty bucket; b comes back with a full one
    script = [(b"a", True), (b"b", True), (b"a", False), (b"c", True), (b"a", False), (b"b", True)]
    for client, admitted in script:
        assert native.receive(request, client, 0) is admitted
        assert spec.receive(request, client, 0) is admitted
    assert vars(native.stats) == vars(spec.stats) and native.stats.rate_limited == 2


def test_settings_out_of_range_are_refused() -> None:
    buf, ring = _day()
    core = RetransmitCore(SESSION, ring, buf)
    for queue, max_clients in ((0, 1), (1, 0)):
        with pytest.raises(RetransmitError):
            NativeFairService(core, RateLimiter(), queue, max_clients)
    with pytest.raises(ValueError, match="at most 32"):
        NativeFairService(core, RateLimiter()).receive(HEADER.pack(SESSION, 40, 1), bytes(33), 0)


def test_many_spoofed_sources_stay_within_the_pool() -> None:
    """10,000 distinct sources against 64 remembered buckets and 32 queued clients: buckets are forgotten,
    the 33rd queued client is refused (queue_full), and serving frees every entry."""
    spec, native = _pair(1e6, 100, 64, 4, 32)
    for i in range(10_000):
        client = i.to_bytes(4, "big")
        request = HEADER.pack(SESSION, 40 + i % 20, 1)
        assert native.receive(request, client, i) == spec.receive(request, client, i)
    assert native.pending == spec.pending == 32
    served = []
    while (turn := native.next_request()) is not None:
        served.append(turn)
    assert served == [t for t in iter(spec.next_request, None)]
    assert vars(native.stats) == vars(spec.stats) and native.stats.queue_full == 10_000 - 32


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, MESSAGES + 2), st.integers(1, 0xFFFE)),
                min_size=1, max_size=40), st.integers(1, 6), st.integers(40, 300))
def test_c_answers_are_the_specifications_through_sockets(asks: list[tuple[int, int, int]], queue: int,
                                                         budget: int) -> None:
    """Three real client sockets: what rtx_service_answer sends each of them is, in order, what the
    specification's next_answer gives that client, and every outcome is counted alike."""
    spec, native = _pair(1e6, 1e4, 16, queue, 16, budget=budget)
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        keys = [sockaddr_bytes(s.getsockname()) for s in socks]
        for who, first, count in asks:
            request = HEADER.pack(SESSION, first, count)
            assert native.receive(request, keys[who], 0) == spec.receive(request, keys[who], 0)
        expected: list[list[bytes]] = [[], [], []]
        while (turn := spec.next_answer()) is not None:
            if turn[1] is not None:
                expected[keys.index(turn[0])].append(turn[1])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            went = native.answer(tx.fileno(), 10_000)
        assert went == sum(map(len, expected)) and native.pending == 0
        for s, answers in zip(socks, expected, strict=True):
            s.settimeout(10.0)
            assert [s.recv(65_536) for _ in answers] == answers
    finally:
        for s in socks:
            s.close()
    assert vars(native.stats) == vars(spec.stats)


def test_drain_reads_a_socket_and_names_each_client_over_its_rate_once() -> None:
    """rtx_service_drain through a real socket: every datagram read and taken as the specification takes it
    (an oversized one is cut and counted as bad_size), and a client over its rate is named once per drain."""
    spec, native = _pair(1e-3, 2, 16, 8, 16)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
        server.bind(("127.0.0.1", 0))
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
        key_a = sockaddr_bytes(a.getsockname())
        sent = [(a, HEADER.pack(SESSION, 40 + i, 1)) for i in range(5)]  # burst 2: three over the rate
        sent += [(b, HEADER.pack(SESSION, 50, 2)), (b, HEADER.pack(SESSION, 50, 2) + bytes(100))]
        for s, request in sent:
            s.sendto(request, server.getsockname())
        for s, request in sent:
            spec.receive(request, sockaddr_bytes(s.getsockname()), 7)
        read, over = 0, []
        for _ in range(100):  # loopback delivers at once; a few tries cover a scheduler's hiccup
            got, names = native.drain(server.fileno(), 64, 7)
            read, over = read + got, over + names
            if read == len(sent):
                break
    assert read == len(sent) and over == [key_a]
    assert [native.next_request() for _ in range(3)] == [spec.next_request() for _ in range(3)]
    assert vars(native.stats) == vars(spec.stats) and native.stats.bad_size == 1 and native.stats.rate_limited == 3
