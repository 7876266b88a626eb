"""Process entry points for the multi-process tests (importable by spawned children)."""

from __future__ import annotations

import signal
import struct
import time
import zlib

from logbuf import ADMIN_ACTION, BACK_PRESSURED, ConcurrentPublication, Image, LogBuffers
from logbuf.idle import BackoffIdleStrategy
from logbuf.position import SharedPositions

LIMIT_SLOT, SUB_POS_SLOT, PUB_POS_SLOT = 0, 1, 2
_ID = struct.Struct("<II")


def message(publisher: int, seq: int) -> bytes:
    """Self-describing, variable-length (8..68 bytes) payload: a torn frame cannot pass the check."""
    body_length = seq % 61
    return _ID.pack(publisher, seq) + bytes([(publisher * 31 + seq) & 0xFF]) * body_length


def publisher(log_path: str, positions_path: str, publisher_id: int, count: int, deadline: float) -> None:
    log = LogBuffers.open(log_path)
    positions = SharedPositions(positions_path, create=False)
    pub = ConcurrentPublication(log, positions.position(LIMIT_SLOT))
    idle = BackoffIdleStrategy()
    seq = 0
    while seq < count:
        result = pub.offer(message(publisher_id, seq))
        if result > 0:
            seq += 1
            idle.reset()
        elif result in (BACK_PRESSURED, ADMIN_ACTION):
            idle.idle(0)
            if time.monotonic() > deadline:
                raise SystemExit(f"publisher {publisher_id} timed out at {seq}")
        else:
            raise SystemExit(f"publisher {publisher_id}: unexpected result {result}")


def subscriber(log_path: str, positions_path: str, publishers: int, count: int, deadline: float, results) -> None:
    log = LogBuffers.open(log_path)
    positions = SharedPositions(positions_path, create=False)
    image = Image(log, positions.position(SUB_POS_SLOT))
    expected = [0] * publishers
    state = {"received": 0, "torn": 0, "out_of_order": 0}
    crcs = [0] * publishers

    def on_fragment(buf: memoryview, header) -> None:
        data = bytes(buf)
        pid, seq = _ID.unpack_from(data)
        if pid >= publishers or data != message(pid, seq):
            state["torn"] += 1
            return
        if seq != expected[pid]:
            state["out_of_order"] += 1
        expected[pid] = seq + 1
        state["received"] += 1
        crcs[pid] = zlib.crc32(data, crcs[pid])

    idle = BackoffIdleStrategy()
    total = publishers * count
    while state["received"] + state["torn"] < total and time.monotonic() < deadline:
        idle.idle(image.poll(on_fragment, 256))
    results.put({**state, "expected": expected, "crcs": crcs})


def claim_then_hang(log_path: str, positions_path: str, before: int, ready) -> None:
    """Offers ``before`` messages, claims a frame, writes half of it, says so, and waits to be killed."""
    log = LogBuffers.open(log_path)
    positions = SharedPositions(positions_path, create=False)
    pub = ConcurrentPublication(log, positions.position(LIMIT_SLOT))
    for seq in range(before):
        while pub.offer(message(9, seq)) < 0:
            time.sleep(0.001)
    claim = pub.try_claim(200)
    assert claim, claim.result
    claim.buffer[:100] = b"h" * 100
    ready.set()
    signal.pause()
