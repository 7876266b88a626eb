"""The retransmission server process under a closed-loop flood of MoldUDP64 re-requests: answers per second
and the server's CPU per answer.

    PYTHONPATH=src .venv/bin/python bench/exchange/bench_retransmit.py --seconds 5
    PYTHONPATH=src .venv/bin/python bench/exchange/bench_retransmit.py --seconds 5 --client batch
    PYTHONPATH=src .venv/bin/python bench/exchange/bench_retransmit.py --in-thread --profile   # cProfile

A day file of 40-message packets' worth of Add Orders (36 bytes each) is published into the ring of a
:class:`~logbuf.exchange.retransmit.process.RetransmitProcess` (its rate limit raised out of the way); one client
socket in this process keeps ``--window`` requests in flight, each for ``--count`` messages at a random
sequence, and asks again for every answer (or after a 20 ms silence, for what the server dropped). Every answer
is checked: its header echoes the request's first sequence, and its messages carry their own sequence numbers.
The default client asks and reads one datagram per call (about 35 k answers/s here: the server is not saturated,
so its CPU per answer includes waking up for small batches); ``--client batch`` reads up to 64 answers per
recvmmsg and sends the next requests with one sendmmsg, each answer compared with its slice of the day file, so
the server is what limits the rate.
Printed as one JSON line: requests sent, answers, answers/s (wall), the server's CPU seconds, the share of it in
user space (the rest is the kernel's: the sockets) and answers per CPU second (what one core of the server would
answer), and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "feed"))
from bench_profile import BLOCK, BUDGET, MESSAGES_PER_PACKET, SESSION, write_day  # noqa: E402

from logbuf.exchange.dayfile import DayFileReader  # noqa: E402

HEADER = struct.Struct(">10sQH")


def _cpu_of(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid`` (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def flood(address: tuple[str, int], messages: int, args: argparse.Namespace) -> dict:
    """Closed loop: ``--window`` requests in flight for ``--seconds``; every answer checked."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.connect(address)
    session = SESSION.encode().ljust(10)
    rng = random.Random(1)
    top = messages - args.count
    sent = answers = bad = 0

    def ask() -> None:
        nonlocal sent
        sock.send(HEADER.pack(session, rng.randint(1, top), args.count))
        sent += 1

    for _ in range(args.window):
        ask()
    sock.settimeout(0.02)
    started = time.perf_counter()
    deadline = started + args.seconds
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        try:
            answer = sock.recv(65536)
        except TimeoutError:  # requests the server dropped: refill the window
            for _ in range(args.window):
                ask()
            continue
        _, first, count = HEADER.unpack_from(answer)
        body = np.frombuffer(answer, np.uint8, offset=20)
        if count < 1 or body.size != count * BLOCK or not np.array_equal(
                body.reshape(count, BLOCK)[:, 3:11].copy().view(">u8").ravel(),
                np.arange(first, first + count, dtype=np.uint64)):
            bad += 1
        answers += 1
        ask()
    elapsed = time.perf_counter() - started
    sock.close()
    return {"sent": sent, "answers": answers, "bad_answers": bad, "seconds": round(elapsed, 2),
            "answers_per_s": round(answers / elapsed)}


def flood_batch(address: tuple[str, int], messages: int, day_bytes: bytes, args: argparse.Namespace) -> dict:
    """As :func:`flood`, with a client that reads and asks 64 datagrams per system call (recvmmsg, sendmmsg)."""
    from logbuf.native import ffi, lib

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.connect(address)
    sock.setblocking(False)
    fd = sock.fileno()
    session = SESSION.encode().ljust(10)
    rng = np.random.default_rng(1)
    pool = 1 << 16  # pre-built requests, used round-robin
    firsts = rng.integers(1, messages - args.count, size=pool)
    requests = b"".join(HEADER.pack(session, int(f), args.count) for f in firsts)
    c_requests = ffi.from_buffer("uint8_t[]", requests)
    batch = lib.LBN_MAX_BATCH
    slot = 65536 if args.count * BLOCK > 4000 else 4096
    slots = ffi.new("uint8_t[]", batch * slot)
    view = ffi.buffer(slots)
    lengths = ffi.new("int32_t[]", batch)
    addresses = ffi.new("uint8_t[]", batch * lib.LBN_ADDRESS_SLOT)
    address_lengths = ffi.new("int32_t[]", batch)
    offsets = ffi.new("int32_t[]", batch)
    request_lengths = ffi.new("int32_t[]", [HEADER.size] * batch)
    next_request = 0
    sent = answers = bad = 0

    def ask(n: int) -> None:
        nonlocal next_request, sent
        while n > 0:
            k = min(n, batch)
            for i in range(k):
                offsets[i] = ((next_request + i) % pool) * HEADER.size
            went = lib.lbn_send_from(fd, c_requests, offsets, request_lengths, k, ffi.NULL, 0)
            if went <= 0:
                return  # the socket buffer is full: the silence refill asks again
            next_request += went
            sent += went
            n -= went

    ask(args.window)
    started = time.perf_counter()
    deadline = started + args.seconds
    while time.perf_counter() < deadline:
        n = lib.lbn_recv_batch(fd, slots, slot, batch, lengths, addresses, address_lengths)
        if n <= 0:
            readable, _, _ = select.select([sock], [], [], 0.02)
            if not readable:
                ask(args.window)  # requests the server dropped: refill the window
            continue
        for i in range(n):
            answer = view[i * slot : i * slot + lengths[i]]
            _, first, count = HEADER.unpack_from(answer)
            start = (first - 1) * BLOCK
            if count < 1 or answer[HEADER.size :] != day_bytes[start : start + count * BLOCK]:
                bad += 1
        answers += n
        ask(n)
    elapsed = time.perf_counter() - started
    sock.close()
    return {"sent": sent, "answers": answers, "bad_answers": bad, "seconds": round(elapsed, 2),
            "answers_per_s": round(answers / elapsed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=4_000_000, help="messages in the ring (default 4 M)")
    parser.add_argument("--count", type=int, default=MESSAGES_PER_PACKET * 4,
                        help="messages asked per request (the answer carries one packet's worth: 40)")
    parser.add_argument("--window", type=int, default=64, help="requests in flight")
    parser.add_argument("--client", choices=("simple", "batch"), default="simple",
                        help="simple: one datagram per call; batch: 64 per recvmmsg/sendmmsg (saturates the server)")
    parser.add_argument("--in-thread", action="store_true",
                        help="run the server in a thread of this process (for --profile) instead of its process")
    parser.add_argument("--profile", action="store_true", help="with --in-thread: cProfile the server thread")
    args = parser.parse_args(argv)

    from logbuf.exchange.retransmit.process import RetransmitProcess
    from logbuf.exchange.retransmit.ring import MessageRing
    from logbuf.exchange.retransmit.server import make_server

    with tempfile.TemporaryDirectory(prefix="bench-rtx-") as work:
        day = Path(work) / "day.itch"
        write_day(day, args.messages)
        with DayFileReader(day) as reader:
            frames = reader.index()
        load = os.getloadavg()[0]
        if args.in_thread:
            ring = MessageRing(23)
            ring.publish(1, frames)
            with DayFileReader(day) as reader:
                server = make_server(SESSION, ring, reader.buffer, budget=BUDGET, rate=1e9, burst=1e6, queue=4096)
                profiler = None
                if args.profile:
                    import cProfile
                    profiler = cProfile.Profile()
                    run = server.run
                    server.run = lambda *a, **k: profiler.runcall(run, *a, **k)  # type: ignore[method-assign]
                server.start()
                cpu0 = time.thread_time()
                result = flood(server.address, args.messages, args)
                server.stop()
                server_cpu = None
                stats = vars(server.stats)
                if profiler is not None:
                    import pstats
                    pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
                del cpu0
        else:
            rtx = RetransmitProcess(day, "127.0.0.1", 0, session=SESSION, budget=BUDGET, ring_bits=23,
                                    rate=1e9, burst=1e6, queue=4096)
            rtx.ring.publish(1, frames)
            rtx.start()
            assert rtx.pid is not None
            day_bytes = day.read_bytes() if args.client == "batch" else b""
            user0, system0 = _cpu_of(rtx.pid)
            result = (flood_batch(rtx.address, args.messages, day_bytes, args) if args.client == "batch"
                      else flood(rtx.address, args.messages, args))
            user1, system1 = _cpu_of(rtx.pid)
            server_cpu = user1 - user0 + system1 - system0
            result["server_user_share"] = round((user1 - user0) / max(1e-9, server_cpu), 2)
            stats = vars(rtx.stop() or {})
        result.update(server_cpu_s=None if server_cpu is None else round(server_cpu, 2),
                      answers_per_cpu_s=None if not server_cpu else round(result["answers"] / server_cpu),
                      load_before=round(load, 2), load_after=round(os.getloadavg()[0], 2),
                      server={k: v for k, v in stats.items() if v})
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
