"""Counters: value/metadata records decoded independently, allocate/free/reuse after the deadline with an
injected clock, reader stopping at the first unused record, truncation of labels and keys, and the
Aeron key/label helpers and id tables."""

from __future__ import annotations

import struct

import pytest

from logbuf.cnc import counters as c
from logbuf.cnc.errors import CountersFullError, CounterStateError
from logbuf.native import AtomicBuffer
from logbuf.position import Position

pytestmark = pytest.mark.timeout(30)

N = 8  # counters


class Clock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def make(clock: Clock | None = None) -> tuple[bytearray, bytearray, c.CountersManager, Clock]:
    clock = clock or Clock()
    metadata, values = bytearray(N * 512), bytearray(N * 128)
    manager = c.CountersManager(AtomicBuffer(metadata), AtomicBuffer(values), clock)
    return metadata, values, manager, clock


def decode_metadata(metadata: bytes, counter_id: int) -> tuple[int, int, int, bytes, str]:
    """Independent decoding: (state, type id, free-for-reuse deadline, key, label)."""
    base = counter_id * 512
    state, type_id, deadline = struct.unpack_from("<iiq", metadata, base)
    key = bytes(metadata[base + 16 : base + 128])
    (label_length,) = struct.unpack_from("<i", metadata, base + 128)
    label = bytes(metadata[base + 132 : base + 132 + label_length]).decode("ascii")
    return state, type_id, deadline, key, label


def decode_value(values: bytes, counter_id: int) -> tuple[int, int, int, int]:
    return struct.unpack_from("<qqqq", values, counter_id * 128)


def test_constants_match_reference():
    assert (c.VALUE_OFFSET, c.REGISTRATION_ID_OFFSET, c.OWNER_ID_OFFSET, c.REFERENCE_ID_OFFSET) == (
        0,
        8,
        16,
        24,
    )
    assert (c.COUNTER_LENGTH, c.METADATA_LENGTH) == (128, 512)
    assert (c.STATE_OFFSET, c.TYPE_ID_OFFSET, c.FREE_FOR_REUSE_DEADLINE_OFFSET, c.KEY_OFFSET) == (0, 4, 8, 16)
    assert (c.LABEL_LENGTH_OFFSET, c.LABEL_OFFSET, c.MAX_KEY_LENGTH, c.MAX_LABEL_LENGTH) == (
        128,
        132,
        112,
        380,
    )
    assert (c.RECORD_UNUSED, c.RECORD_ALLOCATED, c.RECORD_RECLAIMED) == (0, 1, -1)
    type_ids = [
        c.SYSTEM_COUNTER_TYPE_ID,
        c.PUBLISHER_LIMIT_TYPE_ID,
        c.SENDER_POSITION_TYPE_ID,
        c.RECEIVER_HWM_TYPE_ID,
        c.SUBSCRIBER_POSITION_TYPE_ID,
        c.RECEIVER_POSITION_TYPE_ID,
        c.SEND_CHANNEL_STATUS_TYPE_ID,
        c.RECEIVE_CHANNEL_STATUS_TYPE_ID,
        c.SENDER_LIMIT_TYPE_ID,
        c.PER_IMAGE_TYPE_ID,
        c.CLIENT_HEARTBEAT_TYPE_ID,
        c.PUBLISHER_POSITION_TYPE_ID,
        c.SENDER_BPE_TYPE_ID,
    ]
    assert type_ids == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13]


def test_system_counter_table_is_complete():
    labels = c.SYSTEM_COUNTER_LABELS
    assert sorted(labels) == list(range(40))
    assert labels[0] == "Bytes sent" and labels[15] == "Errors: version=1.48.0 commit=logbuf-0.1.0"
    assert labels[20] == "Unblocked Control Commands" and labels[24] == "Client liveness timeouts"
    assert labels[34] == "Aeron software: version=1.48.0 commit=logbuf-0.1.0" and labels[39] == "Error Frames sent"
    assert labels[26] == "Conductor max cycle time doing its work in ns: SHARED"
    assert labels[27] == "Conductor work cycle exceeded threshold count: threshold=1000000ns SHARED"
    assert [int(s) for s in c.SystemCounter] == list(range(40)) and c.SystemCounter.AERON_VERSION == 34
    assert c.SOFTWARE_VERSION_VALUE == 77_824  # 1.48.0 as (major << 16) | (minor << 8) | patch


def test_allocate_writes_records_readable_by_independent_decoder():
    metadata, values, manager, _ = make()
    key = c.stream_position_key(77, 5, 1001, "aeron:ipc")
    counter_id = manager.allocate(
        c.PUBLISHER_LIMIT_TYPE_ID,
        "pub-lmt: 77 5 1001 aeron:ipc",
        key,
        registration_id=77,
        owner_id=3,
        reference_id=9,
    )
    assert counter_id == 0
    state, type_id, deadline, stored_key, label = decode_metadata(metadata, 0)
    assert (state, type_id, deadline, label) == (1, 1, 2**63 - 1, "pub-lmt: 77 5 1001 aeron:ipc")
    assert stored_key == key + bytes(112 - len(key))
    assert decode_value(values, 0) == (0, 77, 3, 9)
    manager.set_counter_value(0, 4096)
    assert decode_value(values, 0)[0] == 4096
    assert manager.counter_value(0) == 4096


def test_reader_yields_allocated_and_stops_at_first_unused():
    metadata, values, manager, _ = make()
    ids = [manager.allocate(c.SYSTEM_COUNTER_TYPE_ID, f"c{i}", registration_id=i) for i in range(4)]
    manager.free(ids[1])
    reader = c.CountersReader(AtomicBuffer(metadata), AtomicBuffer(values))  # e.g. another process
    assert [(i.counter_id, i.label, i.registration_id) for i in reader] == [
        (0, "c0", 0),
        (2, "c2", 2),
        (3, "c3", 3),
    ]
    # a record beyond the first unused one is never looked at
    struct.pack_into("<ii", metadata, 6 * 512, 1, 0)
    assert [i.counter_id for i in reader] == [0, 2, 3]


def test_free_and_reuse_only_after_the_deadline():
    metadata, _, manager, clock = make()
    first = manager.allocate(4, "a")
    second = manager.allocate(4, "b")
    manager.free(first)
    state, _, deadline, _, _ = decode_metadata(metadata, first)
    assert state == -1 and deadline == clock.now_ms + 1_000
    assert manager.allocate(4, "c") == 2  # not yet free for reuse: a new id
    clock.now_ms += 999
    assert manager.allocate(4, "d") == 3
    clock.now_ms += 1
    reused = manager.allocate(4, "e", registration_id=55)
    assert reused == first
    assert decode_metadata(metadata, first)[:3] == (1, 4, 2**63 - 1)
    assert manager.counter_label(first) == "e" and manager.counter_registration_id(first) == 55
    assert second == 1


def test_available_counts_unused_ids_and_freed_ones_past_their_deadline():
    _, _, manager, clock = make()
    assert manager.available() == N
    first = manager.allocate(4, "a")
    manager.allocate(4, "b")
    assert manager.available() == N - 2
    manager.free(first)
    assert manager.available() == N - 2  # not yet free for reuse
    clock.now_ms += 1_000
    assert manager.available() == N - 1
    for _ in range(N - 1):
        manager.allocate(4, "x")
    assert manager.available() == 0
    with pytest.raises(c.CountersFullError):
        manager.allocate(4, "full")


def test_reused_counter_starts_from_zero_without_old_key_or_label():
    metadata, values, manager, clock = make()
    counter_id = manager.allocate(1, "x" * 300, b"k" * 112, registration_id=9)
    manager.set_counter_value(counter_id, 123)
    manager.free(counter_id)
    clock.now_ms += 1_000
    assert manager.allocate(2, "y", b"z") == counter_id
    state, type_id, _, key, label = decode_metadata(metadata, counter_id)
    assert (state, type_id, label) == (1, 2, "y")
    assert key == b"z" + bytes(111)
    assert bytes(metadata[counter_id * 512 + 133 : counter_id * 512 + 512]) == bytes(379)
    assert decode_value(values, counter_id) == (0, 0, 0, 0)


def test_full_and_bad_ids():
    _, _, manager, _ = make()
    for i in range(N):
        manager.allocate(0, f"c{i}")
    with pytest.raises(CountersFullError):
        manager.allocate(0, "one too many")
    with pytest.raises(CounterStateError):
        manager.counter_value(N)
    with pytest.raises(CounterStateError):
        manager.counter_value(-1)
    manager.free(3)
    with pytest.raises(CounterStateError, match="not allocated"):
        manager.free(3)
    with pytest.raises(CountersFullError):
        manager.allocate(0, "still within the deadline")


def test_labels_and_keys_truncated():
    metadata, _, manager, _ = make()
    counter_id = manager.allocate(0, "L" * 500 + "é", b"K" * 200)
    _, _, _, key, label = decode_metadata(metadata, counter_id)
    assert label == "L" * 380 and key == b"K" * 112
    other = manager.allocate(0, "caf\u00e9")
    assert manager.counter_label(other) == "caf?"  # ASCII with '?' like Aeron


def test_hostile_label_length_is_clamped():
    metadata, values, manager, _ = make()
    counter_id = manager.allocate(0, "ok")
    struct.pack_into("<i", metadata, counter_id * 512 + 128, 100_000)
    assert len(manager.counter_label(counter_id)) == 380
    struct.pack_into("<i", metadata, counter_id * 512 + 128, -5)
    assert manager.counter_label(counter_id) == ""


def test_position_over_counter_value():
    _, values, manager, _ = make()
    counter_id = manager.allocate(c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos")
    position = manager.position(counter_id)
    assert isinstance(position, Position) and position.counter_id == counter_id
    position.set(1 << 40)
    assert decode_value(values, counter_id)[0] == 1 << 40
    assert manager.counter_value(counter_id) == 1 << 40
    assert position.propose_max(5) is False


def test_manager_takes_over_existing_buffers():
    metadata, values, manager, clock = make()
    for i in range(3):
        manager.allocate(0, f"c{i}")
    manager.free(1)
    again = c.CountersManager(AtomicBuffer(metadata), AtomicBuffer(values), clock)
    assert again.allocate(0, "new") == 3  # does not clobber live ids, nor reuse before the deadline
    clock.now_ms += 1_000
    assert again.allocate(0, "reused") == 1


def test_stream_position_key_layout_and_truncation():
    key = c.stream_position_key(0x1122334455, -7, 1001, "aeron:udp?endpoint=localhost:20121")
    assert struct.unpack_from("<qiii", key) == (0x1122334455, -7, 1001, 34)
    assert key[20:] == b"aeron:udp?endpoint=localhost:20121"
    long_channel = "aeron:udp?endpoint=" + "h" * 200
    key = c.stream_position_key(1, 2, 3, long_channel)
    assert len(key) == 112 and struct.unpack_from("<i", key, 16)[0] == 92
    assert c.decode_stream_position_key(key) == (1, 2, 3, long_channel[:92])


def test_labels_in_aeron_format():
    # Aeron's "<name>: <ids> <channel> <suffix>": an empty suffix leaves a trailing space
    assert c.stream_position_label(c.PUBLISHER_POSITION_NAME, 10, 20, 30, "aeron:ipc") == (
        "pub-pos (sampled): 10 20 30 aeron:ipc "
    )
    assert c.stream_position_label(
        c.SUBSCRIBER_POSITION_NAME, 10, 20, 30, "aeron:ipc", join_position=4096
    ) == ("sub-pos: 10 20 30 aeron:ipc @4096")
    names = [c.STREAM_COUNTER_NAMES[t] for t in (12, 1, 4, 2, 9, 13, 3, 5)]
    assert names == [
        "pub-pos (sampled)",
        "pub-lmt",
        "sub-pos",
        "snd-pos",
        "snd-lmt",
        "snd-bpe",
        "rcv-hwm",
        "rcv-pos",
    ]
    assert c.client_heartbeat_label(42) == "client-heartbeat: id=42"
    assert c.client_heartbeat_label(42) + c.client_heartbeat_label_suffix("x") == (
        "client-heartbeat: id=42 name=x version=1.48.0 commit=logbuf-0.1.0"
    )
    assert c.channel_status_label("rcv-channel", "aeron:udp?endpoint=h:1", "127.0.0.1:1") == (
        "rcv-channel: aeron:udp?endpoint=h:1 127.0.0.1:1"
    )
    assert c.local_sockaddr_label("snd-local-sockaddr", 56, "127.0.0.1:52959") == "snd-local-sockaddr: 56 127.0.0.1:52959"
    assert c.local_sockaddr_key(56, "127.0.0.1:5") == struct.pack("<ii", 56, 11) + b"127.0.0.1:5"
    assert struct.unpack("<q", c.client_heartbeat_key(42)) == (42,)


def test_allocate_system_counters_gets_aeron_ids():
    metadata, values = bytearray(64 * 512), bytearray(64 * 128)
    manager = c.CountersManager(AtomicBuffer(metadata), AtomicBuffer(values), Clock())
    ids = manager.allocate_system_counters()
    assert ids == {i: i for i in range(40)}
    assert decode_metadata(metadata, 24)[4] == "Client liveness timeouts"
    assert struct.unpack_from("<i", metadata, 24 * 512 + 16) == (24,)  # key = system counter id
    assert manager.find(c.SYSTEM_COUNTER_TYPE_ID) == 0
    assert manager.find(c.CLIENT_HEARTBEAT_TYPE_ID) == c.NULL_COUNTER_ID
