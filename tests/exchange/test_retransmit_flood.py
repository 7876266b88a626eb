"""The retransmission server under a one-client request flood: the flooder is limited, the others are served.

The server runs as ``logbuf retransmit`` (a process of its own, as inside ``replay``); the flooder is another
process sending well-formed requests as fast as it can; two paced clients in this process ask 200 times a second
each and must get (nearly) every answer.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logbuf.samples.ports import free_udp_ports
from support import LineReader, child_env, stop_process, wait_until

SESSION = b"SYNTH0001 "
REQUEST = struct.Struct(">10sQH")

FLOODER = r"""
import signal, socket, struct, sys, time
port = int(sys.argv[1])
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))  # the test is done with the flood
request = struct.pack(">10sQH", b"SYNTH0001 ", 100, 40)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setblocking(False)
sent = answers = 0
announced = False
start = time.monotonic()
while not stop:
    for _ in range(64):
        try:
            sock.sendto(request, ("127.0.0.1", port))
            sent += 1
        except (BlockingIOError, ConnectionRefusedError):
            pass
    while True:
        try:
            sock.recv(2048)
            answers += 1
        except (BlockingIOError, ConnectionRefusedError):
            break
    if not announced and answers >= 100:  # the server's burst is used up: from here its rate limit holds
        print("flooding", flush=True)
        announced = True
seconds = time.monotonic() - start
time.sleep(0.3)  # answers still on their way
while True:
    try:
        sock.recv(2048)
        answers += 1
    except (BlockingIOError, ConnectionRefusedError):
        break
print(sent, answers, seconds, flush=True)
"""


def _wait_until_serving(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.settimeout(0.2)

        def answered() -> bool:
            assert proc.poll() is None, "the retransmission server ended"
            probe.sendto(REQUEST.pack(SESSION, 1, 1), ("127.0.0.1", port))
            try:
                probe.recv(2048)
            except TimeoutError:
                return False
            return True

        wait_until(answered, timeout, what="the retransmission server to answer")


def _paced_clients(port: int, clients: int, per_second: float, seconds: float) -> list[tuple[int, int]]:
    """Each client asks for a different sequence every 1/per_second s; (asked, answered) per client."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(clients)]
    try:
        for sock in socks:
            sock.setblocking(False)
        asked = [0] * clients
        answered = [set() for _ in range(clients)]
        interval = 1.0 / per_second
        start = time.monotonic()
        next_send = start
        while True:
            now = time.monotonic()
            if now >= next_send and now < start + seconds:
                for i, sock in enumerate(socks):
                    asked[i] += 1
                    sock.sendto(REQUEST.pack(SESSION, 1_000 + asked[i], 5), ("127.0.0.1", port))
                next_send += interval
            if now >= start + seconds and all(len(answered[i]) == asked[i] for i in range(clients)):
                break  # every request answered
            if now >= start + seconds + 1.0:  # at most a second for the last answers
                break
            ready, _, _ = select.select(socks, [], [], max(0.0, min(next_send - now, 0.05)))
            for sock in ready:
                i = socks.index(sock)
                while True:
                    try:
                        answer = sock.recv(2048)
                    except BlockingIOError:
                        break
                    _, first, _ = REQUEST.unpack_from(answer)
                    answered[i].add(first)
        return [(asked[i], len(answered[i])) for i in range(clients)]
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.timeout(60)
def test_a_flooding_client_does_not_starve_paced_clients(small_day: Path) -> None:
    port = free_udp_ports(1)[0]
    rate = 1000
    server = subprocess.Popen(
        [sys.executable, "-m", "logbuf.cli", "retransmit", str(small_day), "--listen", f"127.0.0.1:{port}",
         "--rate", str(rate), "--burst", "100"], stderr=subprocess.PIPE, text=True, env=child_env())
    flooder = None
    try:
        _wait_until_serving(port, server)
        flooder = subprocess.Popen([sys.executable, "-c", FLOODER, str(port)], stdout=subprocess.PIPE, text=True,
                                   env=child_env())
        assert flooder.stdout is not None
        flooder_says = LineReader(flooder.stdout, "the flooder")
        assert flooder_says.read_line(20) == "flooding"  # the flood is on before the paced clients start
        results = _paced_clients(port, clients=2, per_second=200, seconds=2.5)
        os.kill(flooder.pid, signal.SIGUSR1)
        sent, flood_answers, flood_seconds = (float(x) for x in (flooder_says.read_line(20) or "").split())
        assert flooder.wait(timeout=10) == 0
    finally:
        if flooder is not None:
            stop_process(flooder)
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGTERM)  # it prints its statistics as it stops
        try:
            server_err = server.communicate(timeout=10)[1]
        finally:
            stop_process(server)
    stats = dict(item.split("=") for item in server_err.strip().splitlines()[-1].split(": ", 1)[1].split(", "))
    for asked, answered in results:
        assert asked >= 400
        assert answered >= 0.99 * asked, (results, sent, flood_answers, stats)
    # the flooder is held to its rate (plus the burst), however much it sends
    assert sent > 5 * rate * flood_seconds, "the flood was not a flood"
    assert flood_answers <= rate * (flood_seconds + 1.0) + 100, (sent, flood_answers, stats)
    assert int(stats["rate_limited"]) + int(stats["kernel_dropped"]) + int(stats["queue_full"]) > 0
