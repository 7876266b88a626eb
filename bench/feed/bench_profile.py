"""The market-open profile through the real processes: sender (A/B + retransmission) -> ``logbuf feed`` -> subscriber.

    PYTHONPATH=src .venv/bin/python bench/feed/bench_profile.py --rate 20000 --duration 60
    PYTHONPATH=src .venv/bin/python bench/feed/bench_profile.py --rate 5000 --duration 20 --loss 0 --no-freeze

The sender (a process of this script) sends ``--rate`` MoldUDP64 packets per second on each of A and B, about
40 ITCH-sized messages (36 bytes) per packet, B ``--b-lag`` packets behind A; each feed loses ``--loss`` of its
packets independently; every ``--freeze-every`` seconds A stops for ``--freeze-ms`` and then sends what it held
as one catch-up burst. It also answers MoldUDP64 re-requests (one packet per request, like a retransmission
server). A subscriber process reads the messages stream in batches and checks every sequence and message.
Reported: delivered/expected, unrecoverable, the handler's CPU per received packet (its rusage while running ÷
packets received), wire-to-log latency (kernel arrival -> committed in the log), kernel drops.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SESSION = b"PROFILE01 "
MESSAGES_PER_PACKET = 40
MESSAGE_LENGTH = 36  # an Add Order
HEADER = struct.Struct(">10sQH")
BLOCK = MESSAGE_LENGTH + 2
LOGBUF = [sys.executable, "-m", "logbuf.cli"]


def messages_block(first: int, count: int) -> bytes:
    """``count`` message blocks from ``first``: 2-byte length, 'A', the sequence (8 bytes), filler."""
    seqs = np.arange(first, first + count, dtype=">u8")
    blocks = np.zeros((count, BLOCK), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(struct.pack(">H", MESSAGE_LENGTH), np.uint8)
    blocks[:, 2] = ord("A")
    blocks[:, 3:11] = seqs.view(np.uint8).reshape(count, 8)
    blocks[:, 11:] = (np.arange(first, first + count) % 251).astype(np.uint8)[:, None]
    return blocks.tobytes()


def packet(first: int, count: int) -> bytes:
    return HEADER.pack(SESSION, first, count) + messages_block(first, count)


def sender(args: argparse.Namespace) -> int:
    a = ("127.0.0.1", args.port_a)
    b = ("127.0.0.1", args.port_b)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rtx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rtx.bind(("127.0.0.1", args.port_r))
    rtx.setblocking(False)
    rng = random.Random(args.seed)
    total_packets = int(args.rate * args.duration)
    highest = total_packets * MESSAGES_PER_PACKET
    interval = 1.0 / args.rate
    start = time.monotonic() + 0.2
    held_a: list[bytes] = []
    b_queue: list[bytes] = []
    freeze_until = 0.0
    next_freeze = start + args.freeze_every if args.freeze_ms > 0 else float("inf")
    sent = answered = 0
    for k in range(total_packets):
        due = start + k * interval
        while True:  # serve re-requests while waiting for the next send time
            try:
                req, addr = rtx.recvfrom(64)
            except BlockingIOError:
                req = b""
            if len(req) == HEADER.size:
                _, seq, count = HEADER.unpack(req)
                if 1 <= seq <= highest and count:
                    rtx.sendto(packet(seq, min(count, MESSAGES_PER_PACKET, highest - seq + 1)), addr)
                    answered += 1
                continue
            if time.monotonic() >= due:
                break
            time.sleep(min(0.0005, max(0.0, due - time.monotonic())))
        data = packet(k * MESSAGES_PER_PACKET + 1, MESSAGES_PER_PACKET)
        now = time.monotonic()
        if now >= next_freeze:
            freeze_until, next_freeze = now + args.freeze_ms / 1e3, next_freeze + args.freeze_every
        lost_both = rng.random() < args.loss_both
        if not lost_both and rng.random() >= args.loss:
            held_a.append(data)
        if now >= freeze_until:
            for d in held_a:  # the catch-up burst after a freeze, or just this packet
                tx.sendto(d, a)
            held_a.clear()
        if not lost_both and rng.random() >= args.loss:
            b_queue.append(data)
        if len(b_queue) > args.b_lag:
            tx.sendto(b_queue.pop(0), b)
        sent += 1
    for d in held_a:
        tx.sendto(d, a)
    for d in b_queue:
        tx.sendto(d, b)
    end_of_session = HEADER.pack(SESSION, highest + 1, 0xFFFF)
    until = time.monotonic() + args.linger
    next_eos = 0.0
    while time.monotonic() < until:  # keep answering; end of session every 200 ms
        if time.monotonic() >= next_eos:
            tx.sendto(end_of_session, a)
            tx.sendto(end_of_session, b)
            next_eos = time.monotonic() + 0.2
        try:
            req, addr = rtx.recvfrom(64)
        except BlockingIOError:
            time.sleep(0.001)
            continue
        if len(req) == HEADER.size:
            _, seq, count = HEADER.unpack(req)
            if 1 <= seq <= highest and count:
                rtx.sendto(packet(seq, min(count, MESSAGES_PER_PACKET, highest - seq + 1)), addr)
                answered += 1
    print(json.dumps({"packets": sent, "answered": answered, "messages": highest}), file=sys.stderr)
    return 0


def subscriber(args: argparse.Namespace) -> int:
    import logbuf

    expected = int(args.rate * args.duration) * MESSAGES_PER_PACKET
    got = bad = 0
    next_seq = 1
    deadline = time.monotonic() + args.duration + 120
    with logbuf.connect(args.dir) as client:
        sub = client.add_subscription("aeron:ipc", 1001)
        while got < expected and time.monotonic() < deadline:
            work = 0
            for image in sub.images:
                with image.batch_poll(4096) as batch:
                    n = batch.count
                    if not n:
                        continue
                    work += n
                    seqs = batch.reserved_values.astype(np.int64)
                    bad += int(np.count_nonzero(seqs != np.arange(next_seq, next_seq + n)))
                    data, offsets = batch.gather()
                    body = data.reshape(n, MESSAGE_LENGTH) if n * MESSAGE_LENGTH == data.size else None
                    if body is None or not np.array_equal(body[:, 1:9].copy().view(">u8").ravel(), seqs):
                        bad += 1
                    next_seq = int(seqs[-1]) + 1
                    got += n
            if not work:
                sub.wait(0.01)
    print(json.dumps({"received": got, "bad": bad}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("bench", "sender", "subscriber"), default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=20_000, help="packets per second per feed")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic")
    parser.add_argument("--loss", type=float, default=0.005, help="share of packets each feed loses")
    parser.add_argument("--loss-both", type=float, default=0.0, help="share of packets lost on both feeds")
    parser.add_argument("--freeze-every", type=float, default=10.0, help="seconds between freezes of A")
    parser.add_argument("--freeze-ms", type=float, default=150.0, help="length of a freeze of A (0: none)")
    parser.add_argument("--b-lag", type=int, default=5, help="packets B runs behind A")
    parser.add_argument("--linger", type=float, default=15.0, help="seconds to keep answering after the end")
    parser.add_argument("--seed", type=int, default=1, help="seed of the losses")
    parser.add_argument("--term-mib", type=int, default=16, help="term length of the log (MiB)")
    parser.add_argument("--port-a", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port-b", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port-r", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "sender":
        return sender(args)
    if args.role == "subscriber":
        return subscriber(args)

    import logbuf
    from logbuf.samples.ports import free_udp_ports

    a, b, r = free_udp_ports(3)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        driver = logbuf.MediaDriver.launch(Path(tmp) / "drv", ipc_term_length=args.term_mib << 20)
        env = dict(os.environ, LOGBUF_DIR=str(driver.directory))
        me = [sys.executable, __file__, "--rate", str(args.rate), "--duration", str(args.duration),
              "--dir", str(driver.directory)]
        procs: list[subprocess.Popen] = []
        try:
            feed = subprocess.Popen([*LOGBUF, "feed", "--feed-a", f"127.0.0.1:{a}", "--feed-b", f"127.0.0.1:{b}",
                                     "--retransmit", f"127.0.0.1:{r}", "--until-end-of-session", "-q",
                                     "--summary-json", f"{tmp}/feed.json"], env=env)
            procs.append(feed)
            sub = subprocess.Popen([*me, "--role", "subscriber"], env=env, stdout=subprocess.PIPE, text=True)
            procs.append(sub)
            with logbuf.connect(driver.directory) as client:  # the handler's publications are up
                deadline = time.monotonic() + 30
                while not any(c.type_id == 1100 for c in client.counters):
                    if time.monotonic() > deadline:
                        raise SystemExit("the feed handler did not start")
                    time.sleep(0.05)
            time.sleep(1.0)
            send = subprocess.Popen([*me, "--role", "sender", "--port-a", str(a), "--port-b", str(b), "--port-r",
                                     str(r), "--loss", str(args.loss), "--loss-both", str(args.loss_both),
                                     "--freeze-every", str(args.freeze_every), "--freeze-ms", str(args.freeze_ms),
                                     "--b-lag", str(args.b_lag), "--linger", str(args.linger), "--seed",
                                     str(args.seed)], env=env)
            procs.append(send)
            out, _ = sub.communicate(timeout=args.duration + 180)
            received = json.loads(out.strip().splitlines()[-1])
            feed.wait(args.linger + 30)
            summary = json.loads(Path(f"{tmp}/feed.json").read_text())
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
            driver.close()
    expected = int(args.rate * args.duration) * MESSAGES_PER_PACKET
    result = {
        "rate_per_feed": args.rate, "expected": expected, "delivered": received["received"], "bad": received["bad"],
        "unrecoverable": summary["messages_unrecoverable"], "gaps_detected": summary["gaps_detected"],
        "gaps_recovered": summary["gaps_recovered"], "recovery_requests": summary["recovery_requests"],
        "cpu_ns_per_packet": summary["cpu_ns_per_packet"],
        "packets_per_round": round((summary["A.packets"] + summary["B.packets"]) / max(1, summary["rounds"]), 1),
        "wire_to_log_p50_us": round(summary.get("wire_to_log_p50_ns", 0) / 1e3, 1),
        "wire_to_log_p99_us": round(summary.get("wire_to_log_p99_ns", 0) / 1e3, 1),
        "kernel_drops": summary.get("A.kernel_drops", 0) + summary.get("B.kernel_drops", 0),
        "load": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))
    return 0 if result["delivered"] == expected and not result["bad"] and not result["unrecoverable"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
