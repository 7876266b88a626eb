"""A writer process of the aborted-claim tests: ``python claim_writer.py DIR CHANNEL STREAM WRITER COUNT KILL_AT``.

It adds a concurrent publication (the writers of a stream share one log and one session), waits until it is
connected, then claims ``COUNT`` small frames: each carries (writer id, sequence); the ones
:func:`is_aborted` names are aborted instead of committed.  At sequence ``KILL_AT`` (-1: never) it claims a
frame, prints ``claimed <KILL_AT>`` and waits, uncommitted, for the test to SIGKILL it.  Otherwise it prints
``done <COUNT>`` and waits to be stopped (its session stays while it lives).  Milestones go to stdout, flushed.
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package

import logbuf  # noqa: E402
from support import wait_until  # noqa: E402

HEAD = struct.Struct("<II")
LENGTH = 24  # payload bytes: one 64-byte frame each


def is_aborted(writer: int, seq: int) -> bool:
    """About 5 % of the claims, spread over every writer and the whole run."""
    return (seq * 2654435761 + writer * 40503) % 100 < 5


def message(writer: int, seq: int) -> bytes:
    return HEAD.pack(writer, seq) + bytes((writer * 31 + seq + j) & 0xFF for j in range(LENGTH - HEAD.size))


def claim(pub: logbuf.Publication, deadline: float) -> logbuf.BufferClaim:
    while True:
        result = pub.try_claim(LENGTH)
        if result:
            return result
        if result.result == logbuf.CLOSED or time.monotonic() > deadline:
            raise SystemExit(f"claim stuck: {result.result}")
        time.sleep(0.0002)  # back pressure: the window is full (or a dead writer's claim holds the sender)


def main() -> None:
    directory, channel, stream, writer, count, kill_at = sys.argv[1:]
    stream_id, writer_id, total, kill = int(stream), int(writer), int(count), int(kill_at)
    with logbuf.connect(directory) as client:
        pub = client.add_publication(channel, stream_id)
        wait_until(lambda: pub.is_connected, timeout=30, what="a subscriber")
        print("ready", flush=True)
        deadline = time.monotonic() + 120
        for seq in range(total):
            frame = claim(pub, deadline)
            if seq == kill:
                print("claimed", seq, flush=True)
                time.sleep(300)  # until the test SIGKILLs it, the claim uncommitted
            if is_aborted(writer_id, seq):
                frame.abort()
                continue
            buffer = frame.buffer
            assert buffer is not None
            buffer[:LENGTH] = message(writer_id, seq)
            frame.commit()
        print("done", total, flush=True)
        time.sleep(300)  # until the test stops it


if __name__ == "__main__":
    main()
