"""Client processes for the driver tests: ``python tests/driver/driver_workers.py ROLE DIR ...``.

Each prints one line per milestone (``ready``, ``claimed``, ``done <count> <crc>``) on stdout, flushed, so
the test can follow it; the test stops every process by its PID.
"""

from __future__ import annotations

import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package

import logbuf  # noqa: E402
from support import wait_until  # noqa: E402

STREAM = 1001


def say(*parts: object) -> None:
    print(*parts, flush=True)


def publisher(directory: str, count: int, size: int) -> None:
    with logbuf.connect(directory) as client:
        pub = client.add_publication("aeron:ipc", STREAM)
        wait_until(lambda: pub.is_connected, what="a subscriber")
        say("ready")
        crc = 0
        for i in range(count):
            msg = i.to_bytes(8, "little") + bytes((i + j) & 0xFF for j in range(size - 8))
            while (result := pub.offer(msg)) < 0:
                if result == logbuf.CLOSED:
                    raise SystemExit("publication closed")
                time.sleep(0)
            crc = zlib.crc32(msg, crc)
        say("done", count, crc)


def subscriber(directory: str, count: int) -> None:
    with logbuf.connect(directory) as client:
        sub = client.add_subscription("aeron:ipc", STREAM)
        state = {"n": 0, "crc": 0, "next": 0, "bad": 0}

        def on_fragment(buffer: memoryview, header: logbuf.Header) -> None:
            seq = int.from_bytes(buffer[:8], "little")
            if seq != state["next"]:
                state["bad"] += 1
            state["next"] = seq + 1
            state["n"] += 1
            state["crc"] = zlib.crc32(buffer, state["crc"])

        say("ready")
        deadline = time.monotonic() + 60
        while state["n"] < count and time.monotonic() < deadline:
            if not sub.poll(on_fragment, 256):
                sub.wait(0.05)
        say("done", state["n"], state["crc"], state["bad"])


def idle_subscriber(directory: str) -> None:
    """Subscribes and never polls (a consumer that stopped): the test SIGKILLs it."""
    client = logbuf.connect(directory)
    sub = client.add_subscription("aeron:ipc", STREAM)
    wait_until(lambda: sub.images, what="an image")
    say("ready", len(sub.images))
    time.sleep(120)  # until the test kills it


def claimer(directory: str) -> None:
    """Claims a frame and never commits it (the test SIGKILLs it)."""
    client = logbuf.connect(directory)
    pub = client.add_publication("aeron:ipc", STREAM)
    wait_until(lambda: pub.is_connected, what="a subscriber")
    claim = pub.try_claim(200)
    say("claimed", claim.result)
    time.sleep(120)  # until the test kills it


def udp_publisher(directory: str, channel: str, count: int, publisher_id: int) -> None:
    """An exclusive publication (its own session) on ``channel``: ``count`` messages of mixed sizes, some
    fragmented past the MTU; each starts with (publisher id, sequence) and the rest derives from them."""
    with logbuf.connect(directory) as client:
        pub = client.add_exclusive_publication(channel, STREAM)
        wait_until(lambda: pub.is_connected, timeout=30, what="a subscriber")
        say("ready")
        deadline = time.monotonic() + 120
        for i in range(count):
            msg = mixed_message(publisher_id, i)
            while (result := pub.offer(msg)) < 0:
                if result == logbuf.CLOSED or time.monotonic() > deadline:
                    raise SystemExit(f"publishing stuck at {i}: {result}")
                time.sleep(0.0001)
        say("done", count)
        time.sleep(120)  # keeps the session alive (a drained publication's image goes) until the test stops it


def mixed_message(publisher_id: int, seq: int) -> bytes:
    size = (40, 300, 1400, 3000, 6000)[(seq * 7 + publisher_id) % 5]
    head = publisher_id.to_bytes(4, "little") + seq.to_bytes(4, "little")
    return head + bytes((publisher_id * 131 + seq * 31 + j) & 0xFF for j in range(size - 8))


def main() -> None:
    role, directory, *rest = sys.argv[1:]
    if role == "publisher":
        publisher(directory, int(rest[0]), int(rest[1]))
    elif role == "subscriber":
        subscriber(directory, int(rest[0]))
    elif role == "idle-subscriber":
        idle_subscriber(directory)
    elif role == "udp-publisher":
        udp_publisher(directory, rest[0], int(rest[1]), int(rest[2]))
    elif role == "claimer":
        claimer(directory)
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
