from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from logbuf.errors import LogbufError
from logbuf.exchange.dayfile import DayFileReader
from logbuf.exchange.retransmit.core import RetransmitCore
from logbuf.exchange.retransmit.fair import FairService
from logbuf.exchange.retransmit.rate import RateLimiter
from logbuf.exchange.retransmit.ring import MessageRing, RetransmitError
from logbuf.exchange.retransmit.server import make_server
from logbuf.marketdata import moldudp64 as m
from logbuf.samples.ports import free_udp_ports
from support import child_env, stop_process, wait_until

SESSION = "SYNTH0001"
HEADER = struct.Struct(">10sQH")  # the wire format, written out independently of moldudp64


def _framed(n: int, size: int = 30) -> tuple[bytes, np.ndarray, list[bytes]]:
    msgs = [bytes([i % 251]) * size for i in range(n)]
    buf = b"".join(len(x).to_bytes(2, "big") + x for x in msgs)
    return buf, np.arange(n, dtype=np.int64) * (size + 2), msgs


def _core(n: int = 100, bits: int = 6, published: int | None = None, **kw) -> tuple[RetransmitCore, list[bytes]]:
    buf, frames, msgs = _framed(n)
    ring = MessageRing(bits)
    upto = n if published is None else published
    ring.publish(1, frames[:upto])
    return RetransmitCore(SESSION, ring, buf, **kw), msgs


def test_answers_requested_messages() -> None:
    core, msgs = _core()
    answer = core.handle(m.encode_request(SESSION, 90, 5), ("c", 1), 0)
    assert m.decode(answer) == m.DownstreamPacket(b"SYNTH0001 ", 90, tuple(msgs[89:94]))


def test_future_sequence_gets_no_answer() -> None:
    core, _ = _core(published=50)
    assert core.handle(m.encode_request(SESSION, 51, 1), ("c", 1), 0) is None
    assert core.stats.future == 1
    # a request running into the future is answered up to the last sent message only
    answer = m.decode(core.handle(m.encode_request(SESSION, 48, 10), ("c", 1), 0))
    assert (answer.sequence, len(answer.messages)) == (48, 3)


def test_overwritten_sequence_gets_no_answer() -> None:
    core, msgs = _core(n=100, bits=6)  # ring keeps 64: sequences 37..100
    assert core.handle(m.encode_request(SESSION, 36, 1), ("c", 1), 0) is None
    assert core.stats.not_retained == 1
    assert m.decode(core.handle(m.encode_request(SESSION, 37, 1), ("c", 1), 0)).messages == (msgs[36],)


def test_count_larger_than_fits_is_capped_at_the_budget() -> None:
    core, msgs = _core(budget=m.HEADER_LENGTH + 10 * 32 + 5)
    answer = core.handle(m.encode_request(SESSION, 50, 0xFFFE), ("c", 1), 0)
    packet = m.decode(answer)
    assert len(answer) <= m.HEADER_LENGTH + 10 * 32 + 5
    assert packet.sequence == 50 and packet.messages == tuple(msgs[49:59])


def test_a_message_larger_than_the_cap_is_never_sent() -> None:
    big = b"x" * 2_000
    buf = len(big).to_bytes(2, "big") + big + (3).to_bytes(2, "big") + b"abc"
    ring = MessageRing(4)
    ring.publish(1, np.array([0, 2 + len(big)], dtype=np.int64))
    core = RetransmitCore(SESSION, ring, buf, budget=1_400)
    assert core.handle(m.encode_request(SESSION, 1, 2), ("c", 1), 0) is None
    assert core.stats.too_large == 1
    assert m.decode(core.handle(m.encode_request(SESSION, 2, 1), ("c", 1), 0)).messages == (b"abc",)


def test_a_corrupted_ring_never_reads_outside_the_day() -> None:
    """Offsets come from shared memory: an offset past the file, or a length running off it, is refused."""
    buf, frames, _ = _framed(10)
    for bad in (len(buf) + 100, len(buf) - 1, -5):
        ring = MessageRing(4)
        ring.publish(1, np.where(np.arange(10) == 4, bad, frames))
        core = RetransmitCore(SESSION, ring, buf)
        assert core.handle(m.encode_request(SESSION, 5, 3), ("c", 1), 0) is None
        assert core.stats.bad_offset == 1


@pytest.mark.parametrize("request_bytes, counter", [
    (HEADER.pack(b"OTHER     ", 1, 1), "bad_session"),
    (HEADER.pack(b"SYNTH0001 ", 1, 1) + b"\x00", "bad_size"),
    (HEADER.pack(b"SYNTH0001 ", 1, 1)[:-1], "bad_size"),
    (b"", "bad_size"),
    (HEADER.pack(b"SYNTH0001 ", 50, 0), "bad_count"),
    (HEADER.pack(b"SYNTH0001 ", 50, 0xFFFF), "bad_count"),
    (HEADER.pack(b"SYNTH0001 ", 0, 1), "not_retained"),
    (HEADER.pack(b"SYNTH0001 ", 2**63, 1), "future"),
    (HEADER.pack(b"SYNTH0001 ", 2**64 - 1, 0xFFFE), "future"),
])
def test_invalid_requests_get_no_answer(request_bytes: bytes, counter: str) -> None:
    core, _ = _core()
    assert core.handle(request_bytes, ("c", 1), 0) is None
    assert getattr(core.stats, counter) == 1 and core.stats.answers == 0


def test_rate_limit_per_client() -> None:
    core, _ = _core(limiter=RateLimiter(rate=10.0, burst=3))
    request = m.encode_request(SESSION, 90, 1)
    answers = [core.handle(request, ("a", 1), 0) is not None for _ in range(5)]
    assert answers == [True, True, True, False, False]
    assert core.handle(request, ("b", 1), 0) is not None  # another client has its own bucket
    assert core.handle(request, ("a", 1), 50_000_000) is None  # 0.05 s: half a token
    assert core.handle(request, ("a", 1), 100_000_000) is not None  # 0.1 s at 10/s: one token back
    assert core.stats.rate_limited == 3


def test_fair_service_answers_clients_in_turn_and_bounds_each_queue() -> None:
    core, _ = _core()
    service = FairService(core, RateLimiter(rate=1.0, burst=1_000), queue=4)
    for i in range(10):  # a flood: 4 admitted, 6 dropped
        service.receive(m.encode_request(SESSION, 70 + i, 1), "flood", 0)
    service.receive(m.encode_request(SESSION, 90, 1), "x", 0)
    service.receive(m.encode_request(SESSION, 95, 1), "y", 0)
    order = []
    while (turn := service.next_answer()) is not None:
        order.append((turn[0], m.decode(turn[1]).sequence))
    # the others are served before the flooder's second request, and nothing waits behind the flood
    assert order[:3] == [("flood", 70), ("x", 90), ("y", 95)]
    assert order[3:] == [("flood", 71), ("flood", 72), ("flood", 73)]
    assert core.stats.queue_full == 6 and core.stats.requests == 12 and core.stats.answers == 6


def test_fair_service_rate_limits_before_queueing() -> None:
    core, _ = _core()
    service = FairService(core, RateLimiter(rate=1.0, burst=2), queue=100)
    admitted = [service.receive(m.encode_request(SESSION, 10, 1), "c", 0) for _ in range(5)]
    assert admitted == [True, True, False, False, False] and service.over_rate
    assert core.stats.rate_limited == 3


def test_ring_lap_check() -> None:
    ring = MessageRing(3)
    ring.publish(1, np.arange(10, dtype=np.int64) * 100)
    assert [ring.offset(s) for s in (1, 2, 3, 10, 11)] == [None, None, 200, 900, None]
    with pytest.raises(ValueError, match="expects sequence 11"):
        ring.publish(5, np.zeros(1, np.int64))


def test_errors_are_logbuf_errors() -> None:
    for bad in (lambda: MessageRing(31), lambda: RateLimiter(rate=0), lambda: _core(budget=10),
                lambda: _core(budget=70_000)):
        with pytest.raises(RetransmitError) as info:
            bad()
        assert isinstance(info.value, LogbufError) and isinstance(info.value, ValueError)


def _ask(sock: socket.socket, address, payload: bytes, timeout: float = 1.0) -> bytes | None:
    sock.settimeout(timeout)
    sock.sendto(payload, address)
    try:
        return sock.recv(65536)
    except TimeoutError:
        return None


def test_hostile_datagrams_are_dropped_and_counted_never_a_crash(small_day: Path) -> None:
    """A struct-built client throws every malformed request at a live server; it keeps answering good ones,
    and no answer exceeds the cap."""
    cap = 600
    with DayFileReader(small_day) as reader:
        ring = MessageRing(16)
        for block in reader.blocks():
            ring.publish(ring.next_sequence, block.frames)
        server = make_server(SESSION, ring, reader.buffer, budget=cap, rate=1e6, burst=1e6).start()
        session = b"SYNTH0001 "
        hostile = [
            HEADER.pack(session, 2**63, 1), HEADER.pack(session, 2**64 - 1, 1), HEADER.pack(session, 2**63 - 1, 5),
            HEADER.pack(session, 100, 0), HEADER.pack(session, 100, 0xFFFF), HEADER.pack(b"WRONGSESS ", 100, 1),
            HEADER.pack(session, 0, 1), HEADER.pack(session, 100, 1)[:19], b"", b"\xff" * 3,
            HEADER.pack(session, 100, 1) + b"tail", b"\x00" * 1_500,
        ]
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
                for payload in hostile:
                    client.sendto(payload, server.address)
                answer = _ask(client, server.address, HEADER.pack(session, 1_000, 0xFFFE))
                assert answer is not None and len(answer) <= cap
                packet = m.decode(answer)
                assert packet.sequence == 1_000 and len(packet.messages) > 1
                client.settimeout(0.3)
                with pytest.raises(TimeoutError):  # none of the hostile ones was answered
                    client.recv(65536)
        finally:
            server.stop()
        stats = server.stats
        assert stats.answers == 1
        assert (stats.future, stats.bad_count, stats.bad_session, stats.not_retained, stats.bad_size) == (3, 2, 1, 1, 5)


def test_cli_retransmit_stops_on_sigterm(small_day: Path) -> None:
    port = free_udp_ports(1)[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "retransmit", str(small_day), "--listen", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE, text=True, env=child_env(),
    )
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            def answer() -> bytes | None:
                assert proc.poll() is None, "the server ended"
                return _ask(client, ("127.0.0.1", port), m.encode_request(SESSION, 5, 3), timeout=0.2)

            assert m.decode(wait_until(answer, 15, what="an answer")).sequence == 5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr is not None and "answers=" in proc.stderr.read()
    finally:
        stop_process(proc, signal.SIGKILL)
