"""The retransmission server's C hot path against its Python specification, and the server under a burst."""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.exchange.retransmit.core import RetransmitCore
from logbuf.exchange.retransmit.ring import MessageRing
from logbuf.exchange.retransmit.server import make_server, sockaddr_address, sockaddr_bytes
from logbuf.marketdata import moldudp64 as m
from logbuf.native import ffi
from support import wait_until

SESSION = "SYNTH0001"
HEADER = struct.Struct(">10sQH")  # the wire format, written out independently of moldudp64


@st.composite
def rings(draw: st.DrawFn) -> tuple[bytes, int, np.ndarray, list[tuple[int, int, int]]]:
    """A day file of random-length frames, a ring size, the frame offsets published, and corruptions."""
    lengths = draw(st.lists(st.integers(0, 300), min_size=1, max_size=80))
    buf = b"".join(n.to_bytes(2, "big") + bytes([i % 251]) * n for i, n in enumerate(lengths))
    frames = np.cumsum([0] + [2 + n for n in lengths[:-1]]).astype(np.int64)
    bits = draw(st.integers(1, 7))
    # (index, which: 0 offset / 1 slot's sequence, value): a ring another process may have scribbled on
    corruptions = draw(st.lists(st.tuples(st.integers(0, len(lengths) - 1), st.integers(0, 1),
                                          st.integers(-2**40, len(buf) + 400)), max_size=3))
    return buf, bits, frames, corruptions


@settings(max_examples=400, deadline=None)
@given(rings(), st.integers(0, 100), st.integers(1, 0xFFFE), st.integers(m.HEADER_LENGTH + 3, 2_000),
       st.booleans())
def test_c_answer_matches_the_specification(day: tuple, first: int, count: int, budget: int,
                                            truncated: bool) -> None:
    buf, bits, frames, corruptions = day
    if truncated:  # the file ends inside a frame the ring names
        buf = buf[: max(1, len(buf) - 7)]
    ring = MessageRing(bits)
    ring.publish(1, frames)
    for index, which, value in corruptions:
        slot = (index + 1) & ring.mask
        (ring.offset_array if which == 0 else ring.seq_array)[slot] = value
    spec = RetransmitCore(SESSION, ring, buf, budget=budget)
    native = RetransmitCore(SESSION, ring, buf, budget=budget)
    if first >= ring.next_sequence:  # check() never lets the future through
        return
    assert native.answer(first, count) == spec.answer_spec(first, count)
    assert vars(native.stats) == vars(spec.stats)


def test_c_answer_is_one_slice_of_the_file() -> None:
    buf = b"".join((5).to_bytes(2, "big") + bytes([i]) * 5 for i in range(10))
    ring = MessageRing(4)
    ring.publish(1, np.arange(10, dtype=np.int64) * 7)
    core = RetransmitCore(SESSION, ring, buf, budget=m.HEADER_LENGTH + 3 * 7)
    assert core.extent(4, 100) == (3, 21, 42)  # three frames fit the budget: sequences 4..6
    assert core.extent(10, 5) == (1, 63, 70)  # never past the last sent
    assert core.extent(0, 1)[0] < 0 and core.stats.answers == 0


def test_a_burst_is_answered_completely_in_order() -> None:
    """100 requests sent at once (each for one message, well under every limit): 100 correct answers in
    the order asked."""
    msgs = [i.to_bytes(4, "big") * 8 for i in range(1, 1_001)]
    buf = b"".join(len(x).to_bytes(2, "big") + x for x in msgs)
    ring = MessageRing(12)
    ring.publish(1, np.arange(1_000, dtype=np.int64) * 34)
    firsts = [(i * 7919) % 1_000 + 1 for i in range(100)]
    with make_server(SESSION, ring, buf, rate=1e6, burst=1e4, queue=1_000) as server, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.bind(("127.0.0.1", 0))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        for first in firsts:
            client.sendto(HEADER.pack(b"SYNTH0001 ", first, 1), server.address)
        client.settimeout(10.0)
        answers = [m.decode(client.recv(65_536)) for _ in firsts]
    assert [(a.sequence, a.messages) for a in answers] == [(f, (msgs[f - 1],)) for f in firsts]
    assert server.stats.answers == 100 and server.stats.requests == 100


def test_a_burst_over_the_rate_is_limited_through_the_server() -> None:
    """The server's token bucket holds with the C path: a burst of 50 at a burst allowance of 10 and a
    negligible rate gets 10 answers; the other 40 are counted as rate-limited."""
    buf = b"".join((4).to_bytes(2, "big") + i.to_bytes(4, "big") for i in range(100))
    ring = MessageRing(8)
    ring.publish(1, np.arange(100, dtype=np.int64) * 6)
    with make_server(SESSION, ring, buf, rate=0.001, burst=10, queue=1_000) as server, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.bind(("127.0.0.1", 0))
        for i in range(50):
            client.sendto(HEADER.pack(b"SYNTH0001 ", i + 1, 0xFFFE), server.address)
        wait_until(lambda: server.stats.requests == 50, timeout=10.0)
        client.settimeout(10.0)
        answers = [m.decode(client.recv(65_536)) for _ in range(10)]
        client.settimeout(0.2)
        extra = 0
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                client.recv(65_536)
                extra += 1
            except TimeoutError:
                break
    assert [a.sequence for a in answers] == list(range(1, 11)) and extra == 0
    # a count of 0xFFFE is answered with what fits the budget: here every message from the first on
    assert all(len(a.messages) == 100 - a.sequence + 1 for a in answers)
    assert server.stats.rate_limited == 40 and server.stats.answers == 10


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_sockaddr_bytes_round_trip_through_the_kernel() -> None:
    """The addresses the batch sends to are the kernel's own: a datagram sent to them arrives, and the raw
    addresses recvmmsg gives convert back to what recvfrom gives (what an isolated client's socket connects to)."""
    families = [(socket.AF_INET, "127.0.0.1")] + ([(socket.AF_INET6, "::1")] if _has_ipv6_loopback() else [])
    for family, host in families:
        with socket.socket(family, socket.SOCK_DGRAM) as a, socket.socket(family, socket.SOCK_DGRAM) as b:
            a.bind((host, 0))
            b.bind((host, 0))
            raw = sockaddr_bytes(b.getsockname())
            assert len(raw) == (16 if family == socket.AF_INET else 28)
            assert struct.unpack_from(">H", raw, 2)[0] == b.getsockname()[1]
            assert sockaddr_address(raw) == b.getsockname()  # and back, as recvfrom gives it
            buf = b"".join((3).to_bytes(2, "big") + b"abc" for _ in range(4))
            ring = MessageRing(4)
            ring.publish(1, np.arange(4, dtype=np.int64) * 5)
            with make_server(SESSION, ring, buf, sock=a) as server:
                b.sendto(HEADER.pack(b"SYNTH0001 ", 2, 2), server.address)
                b.settimeout(10.0)
                assert m.decode(b.recv(65_536)) == m.DownstreamPacket(b"SYNTH0001 ", 2, (b"abc", b"abc"))


def test_answers_that_cannot_be_sent_are_counted() -> None:
    """Answers the kernel refuses (here an IPv6 address on an IPv4 socket) are counted as send_failed, the
    batch going on past each; an unanswerable request is counted by its reason."""
    buf = b"".join((3).to_bytes(2, "big") + b"abc" for _ in range(4))
    ring = MessageRing(4)
    ring.publish(1, np.arange(4, dtype=np.int64) * 5)
    core = RetransmitCore(SESSION, ring, buf)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        raw = sockaddr_bytes(("::1", 9, 0, 0))
        firsts, counts = ffi.new("int64_t[]", [1, 3, 9]), ffi.new("int64_t[]", [1, 1, 1])
        addresses = ffi.new("uint8_t[]", 3 * 32)
        for i in range(3):
            ffi.memmove(addresses + 32 * i, raw, len(raw))
        lengths, results, went = ffi.new("int32_t[]", [len(raw)] * 3), ffi.new("int32_t[]", 3), ffi.new("uint8_t[]", 3)
        assert core.answer_batch(sock.fileno(), firsts, counts, addresses, 32, lengths, 3, results, went) == 0
    assert list(results) == [1, 1, -1] and list(went) == [0, 0, 0]  # 9 was never sent: not retained
    assert core.stats.answers == 2 and core.stats.send_failed == 2 and core.stats.not_retained == 1


def test_the_server_socket_gets_its_receive_buffer() -> None:
    """``rcvbuf`` sizes the shared socket (the kernel reports twice what it granted; past rmem_max only with
    CAP_NET_ADMIN, so at least the part under rmem_max is asserted)."""
    with open("/proc/sys/net/core/rmem_max") as f:
        rmem_max = int(f.read())
    ring = MessageRing(4)
    for size in (64 << 10, 3 << 20):
        with make_server(SESSION, ring, b"\0\0", rcvbuf=size) as server:
            granted = server.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert 2 * min(size, rmem_max) <= granted <= 2 * size


def test_cli_refuses_a_receive_buffer_out_of_range(tmp_path) -> None:
    import subprocess
    import sys

    from support import child_env

    day = tmp_path / "day.itch"
    day.write_bytes((3).to_bytes(2, "big") + b"abc")
    proc = subprocess.run([sys.executable, "-m", "logbuf.cli", "retransmit", str(day), "--rcvbuf", "100"],
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert proc.returncode == 2 and "--rcvbuf" in proc.stderr and "4096" in proc.stderr


@settings(max_examples=150, deadline=None)
@given(rings(), st.lists(st.tuples(st.integers(0, 100), st.integers(1, 0xFFFE)), min_size=1, max_size=16),
       st.integers(m.HEADER_LENGTH + 3, 2_000))
def test_c_batch_sends_what_the_specification_answers(day: tuple, requests: list[tuple[int, int]],
                                                     budget: int) -> None:
    """rtx_answer_batch, through a real socket: the datagrams that arrive are the specification's answers to
    the same requests, in order, and every outcome is counted alike."""
    buf, bits, frames, corruptions = day
    ring = MessageRing(bits)
    ring.publish(1, frames)
    for index, which, value in corruptions:
        (ring.offset_array if which == 0 else ring.seq_array)[(index + 1) & ring.mask] = value
    requests = [(first, count) for first, count in requests if first < ring.next_sequence]  # as check() lets by
    spec = RetransmitCore(SESSION, ring, buf, budget=budget)
    native = RetransmitCore(SESSION, ring, buf, budget=budget)
    expected = [a for a in (spec.answer_spec(first, count) for first, count in requests) if a is not None]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        rx.bind(("127.0.0.1", 0))
        raw = sockaddr_bytes(rx.getsockname())
        n = len(requests)
        addresses = ffi.new("uint8_t[]", 32 * max(1, n))
        for i in range(n):
            ffi.memmove(addresses + 32 * i, raw, len(raw))
        went = native.answer_batch(tx.fileno(), ffi.new("int64_t[]", [f for f, _ in requests] or [0]),
                                   ffi.new("int64_t[]", [c for _, c in requests] or [0]), addresses, 32,
                                   ffi.new("int32_t[]", [len(raw)] * max(1, n)), n, ffi.new("int32_t[]", max(1, n)),
                                   ffi.new("uint8_t[]", max(1, n)))
        rx.settimeout(10.0)
        got = [rx.recv(65_536) for _ in range(went)]
    assert went == len(expected) and got == expected
    assert vars(native.stats) == vars(spec.stats)
