from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from logbuf.feed import moldudp64 as m
from logbuf.feed.dayfile import DayFileReader
from logbuf.feed.retransmit import MessageRing, RateLimiter, RetransmitCore, RetransmitServer

SESSION = "SYNTH0001"


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


@pytest.mark.parametrize("request_bytes, counter", [
    (m.encode_request("OTHER", 1, 1), "bad_session"),
    (m.encode_request(SESSION, 1, 1) + b"\x00", "bad_size"),
    (m.encode_request(SESSION, 1, 1)[:-1], "bad_size"),
    (m.encode_header(SESSION, 50, 0), "bad_count"),
    (m.encode_header(SESSION, 50, 0xFFFF), "bad_count"),
    (m.encode_header(SESSION, 0, 1), "not_retained"),
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


def test_ring_lap_check() -> None:
    ring = MessageRing(3)
    ring.publish(1, np.arange(10, dtype=np.int64) * 100)
    assert [ring.offset(s) for s in (1, 2, 3, 10, 11)] == [None, None, 200, 900, None]
    with pytest.raises(ValueError, match="expects sequence 11"):
        ring.publish(5, np.zeros(1, np.int64))


def _request(address, payload: bytes, timeout: float = 1.0) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.settimeout(timeout)
        client.sendto(payload, address)
        try:
            return client.recv(65536)
        except TimeoutError:
            return None


def test_loopback_round_trip_with_two_workers(small_day: Path) -> None:
    with DayFileReader(small_day) as reader:
        ring = MessageRing(16)
        for block in reader.blocks():
            ring.publish(ring.next_sequence, block.frames)
        expected = [b.message(i) for b in reader.blocks() for i in range(b.count)]
        server = RetransmitServer(lambda: RetransmitCore(SESSION, ring, reader.buffer), workers=2).start()
        try:
            answer = _request(server.address, m.encode_request(SESSION, 1000, 20))
            assert answer is not None
            packet = m.decode(answer)
            assert packet.sequence == 1000 and list(packet.messages) == expected[999:1019]
            assert _request(server.address, m.encode_request("WRONG", 1000, 20), timeout=0.3) is None
        finally:
            server.stop()
        assert all(not t.is_alive() for t in server._threads)
        assert server.stats().answers == 1 and server.stats().bad_session == 1


def test_cli_retransmit_stops_on_sigterm(small_day: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "retransmit", str(small_day), "--listen", f"127.0.0.1:{port}",
         "--workers", "2"], stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        answer = None
        deadline = time.monotonic() + 15
        while answer is None and time.monotonic() < deadline and proc.poll() is None:
            answer = _request(("127.0.0.1", port), m.encode_request(SESSION, 5, 3), timeout=0.2)
        assert answer is not None and m.decode(answer).sequence == 5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "answers=" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
