"""Counters in cnc.dat: Aeron's ``CountersManager`` (the driver allocates) and ``CountersReader`` (anyone).

Two parallel arrays indexed by counter id.  Values, 128 bytes per counter (the value alone on its pair
of cache lines, so writers of neighbouring counters do not false-share)::

    0        8                 16          24             32                      128
    +--------+-----------------+-----------+--------------+-----------------------+
    | value  | registration id | owner id  | reference id | (padding)             |
    | i64    | i64             | i64       | i64          |                       |
    +--------+-----------------+-----------+--------------+-----------------------+

Metadata, 512 bytes per counter::

    0        4         8                     16              128            132            512
    +--------+---------+---------------------+---------------+--------------+--------------+
    | state  | type id | free-for-reuse      | key           | label length | label        |
    | i32    | i32     | deadline ms  i64    | 112 bytes     | i32          | 380 bytes    |
    +--------+---------+---------------------+---------------+--------------+--------------+

State: 0 unused (never allocated: readers stop at the first one), 1 allocated, -1 reclaimed (freed; the id
is reused once the deadline has passed, so readers that cached the id see a stale counter for a while, not
a different one).  Allocation writes every field, then stores state = 1 with release.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterator
from typing import NamedTuple

from logbuf.cnc.errors import CncFileError, CountersFullError, CounterStateError
from logbuf.cnc.layout import COUNTER_METADATA_LENGTH, COUNTER_VALUE_LENGTH
from logbuf.native import AtomicBuffer
from logbuf.position import Position
from logbuf.units import NANOS_PER_MILLI, epoch_ms

# -- value record ------------------------------------------------------------------------------------
VALUE_OFFSET = 0
REGISTRATION_ID_OFFSET = 8
OWNER_ID_OFFSET = 16
REFERENCE_ID_OFFSET = 24
COUNTER_LENGTH = COUNTER_VALUE_LENGTH  # 128

# -- metadata record ---------------------------------------------------------------------------------
STATE_OFFSET = 0
TYPE_ID_OFFSET = 4
FREE_FOR_REUSE_DEADLINE_OFFSET = 8
KEY_OFFSET = 16
LABEL_LENGTH_OFFSET = 128
LABEL_OFFSET = 132
METADATA_LENGTH = COUNTER_METADATA_LENGTH  # 512
MAX_KEY_LENGTH = 112
MAX_LABEL_LENGTH = 380

RECORD_UNUSED = 0
RECORD_ALLOCATED = 1
RECORD_RECLAIMED = -1

NOT_FREE_TO_REUSE = 2**63 - 1  # deadline of an allocated counter
NULL_COUNTER_ID = -1
DEFAULT_REGISTRATION_ID = 0
DEFAULT_OWNER_ID = 0
DEFAULT_REFERENCE_ID = 0
DEFAULT_FREE_TO_REUSE_TIMEOUT_MS = 1_000

# -- counter type ids (Aeron's) ----------------------------------------------------------------------
SYSTEM_COUNTER_TYPE_ID = 0
PUBLISHER_LIMIT_TYPE_ID = 1
SENDER_POSITION_TYPE_ID = 2
RECEIVER_HWM_TYPE_ID = 3
SUBSCRIBER_POSITION_TYPE_ID = 4
RECEIVER_POSITION_TYPE_ID = 5
SEND_CHANNEL_STATUS_TYPE_ID = 6
RECEIVE_CHANNEL_STATUS_TYPE_ID = 7
SENDER_LIMIT_TYPE_ID = 9
PER_IMAGE_TYPE_ID = 10
CLIENT_HEARTBEAT_TYPE_ID = 11
PUBLISHER_POSITION_TYPE_ID = 12
SENDER_BPE_TYPE_ID = 13

# Application counter type ids of logbuf's own components (Aeron leaves 1000+ to applications)
FEED_HANDLER_COUNTER_TYPE_ID = 1100  # logbuf feed: per feed packets, gaps, recovery, A-B delay
RECORDER_COUNTER_TYPE_ID = 1200  # logbuf record: rows, files, lag

# -- system counters (type 0): ids and labels, Aeron's order ------------------------------------------


class SystemCounter(enum.IntEnum):
    """Aeron's system counter ids (type 0): the driver allocates them first, so counter id = system id."""

    BYTES_SENT = 0
    BYTES_RECEIVED = 1
    RECEIVER_PROXY_FAILS = 2
    SENDER_PROXY_FAILS = 3
    CONDUCTOR_PROXY_FAILS = 4
    NAK_MESSAGES_SENT = 5
    NAK_MESSAGES_RECEIVED = 6
    STATUS_MESSAGES_SENT = 7
    STATUS_MESSAGES_RECEIVED = 8
    HEARTBEATS_SENT = 9
    HEARTBEATS_RECEIVED = 10
    RETRANSMITS_SENT = 11
    FLOW_CONTROL_UNDER_RUNS = 12
    FLOW_CONTROL_OVER_RUNS = 13
    INVALID_PACKETS = 14
    ERRORS = 15
    SHORT_SENDS = 16
    FREE_FAILS = 17
    SENDER_FLOW_CONTROL_LIMITS = 18
    UNBLOCKED_PUBLICATIONS = 19
    UNBLOCKED_COMMANDS = 20
    POSSIBLE_TTL_ASYMMETRY = 21
    CONTROLLABLE_IDLE_STRATEGY = 22
    LOSS_GAP_FILLS = 23
    CLIENT_TIMEOUTS = 24
    RESOLUTION_CHANGES = 25
    CONDUCTOR_MAX_CYCLE_TIME = 26
    CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED = 27
    SENDER_MAX_CYCLE_TIME = 28
    SENDER_CYCLE_TIME_THRESHOLD_EXCEEDED = 29
    RECEIVER_MAX_CYCLE_TIME = 30
    RECEIVER_CYCLE_TIME_THRESHOLD_EXCEEDED = 31
    NAME_RESOLVER_MAX_TIME = 32
    NAME_RESOLVER_TIME_THRESHOLD_EXCEEDED = 33
    AERON_VERSION = 34
    BYTES_CURRENTLY_MAPPED = 35
    RETRANSMITTED_BYTES = 36
    RETRANSMIT_OVERFLOW = 37
    ERROR_FRAMES_RECEIVED = 38
    ERROR_FRAMES_SENT = 39


# The Aeron release whose formats and counters logbuf's driver reproduces: the software-version counter holds
# it encoded as Aeron encodes its own, (major << 16) | (minor << 8) | patch.
AERON_VERSION = (1, 48, 0)
SOFTWARE_VERSION_VALUE = (AERON_VERSION[0] << 16) | (AERON_VERSION[1] << 8) | AERON_VERSION[2]
LOGBUF_VERSION = "0.1.0"  # the package's version (pyproject.toml)
# Aeron's labels read "version=<release> commit=<sha>"; logbuf names the Aeron release it speaks and, where
# Aeron puts its git sha, which logbuf built it.
SOFTWARE_VERSION_TEXT = "version={}.{}.{} commit=logbuf-{}".format(*AERON_VERSION, LOGBUF_VERSION)
THREADING_MODE = "SHARED"  # conductor, sender and receiver in one loop: Aeron's name for it
DEFAULT_CYCLE_THRESHOLD_NS = NANOS_PER_MILLI  # a duty cycle longer than this is counted (Aeron: 1 s; ours: 1 ms)


def system_counter_labels(
    version_text: str = SOFTWARE_VERSION_TEXT,
    threading_mode: str = THREADING_MODE,
    cycle_threshold_ns: int = DEFAULT_CYCLE_THRESHOLD_NS,
    driver_name: str = "",
) -> dict[int, str]:
    """Every system counter's label as Aeron 1.48 writes it (some carry the version, threading mode, cycle
    threshold or driver name)."""
    mode, threshold = threading_mode, f"threshold={cycle_threshold_ns}ns {threading_mode}"
    s = SystemCounter
    return {
        s.BYTES_SENT: "Bytes sent",
        s.BYTES_RECEIVED: "Bytes received",
        s.RECEIVER_PROXY_FAILS: "Failed offers to ReceiverProxy",
        s.SENDER_PROXY_FAILS: "Failed offers to SenderProxy",
        s.CONDUCTOR_PROXY_FAILS: "Failed offers to DriverConductorProxy",
        s.NAK_MESSAGES_SENT: "NAKs sent",
        s.NAK_MESSAGES_RECEIVED: "NAKs received",
        s.STATUS_MESSAGES_SENT: "Status Messages sent",
        s.STATUS_MESSAGES_RECEIVED: "Status Messages received",
        s.HEARTBEATS_SENT: "Heartbeats sent",
        s.HEARTBEATS_RECEIVED: "Heartbeats received",
        s.RETRANSMITS_SENT: "Retransmits sent",
        s.FLOW_CONTROL_UNDER_RUNS: "Flow control under runs",
        s.FLOW_CONTROL_OVER_RUNS: "Flow control over runs",
        s.INVALID_PACKETS: "Invalid packets",
        s.ERRORS: f"Errors: {version_text}",
        s.SHORT_SENDS: "Short sends",
        s.FREE_FAILS: "Failed attempts to free log buffers",
        s.SENDER_FLOW_CONTROL_LIMITS: "Sender flow control limits, i.e. back-pressure events",
        s.UNBLOCKED_PUBLICATIONS: "Unblocked Publications",
        s.UNBLOCKED_COMMANDS: "Unblocked Control Commands",
        s.POSSIBLE_TTL_ASYMMETRY: "Possible TTL Asymmetry",
        s.CONTROLLABLE_IDLE_STRATEGY: "ControllableIdleStrategy status",
        s.LOSS_GAP_FILLS: "Loss gap fills",
        s.CLIENT_TIMEOUTS: "Client liveness timeouts",
        s.RESOLUTION_CHANGES: f"Resolution changes: driverName={driver_name}",
        s.CONDUCTOR_MAX_CYCLE_TIME: f"Conductor max cycle time doing its work in ns: {mode}",
        s.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED: f"Conductor work cycle exceeded threshold count: {threshold}",
        s.SENDER_MAX_CYCLE_TIME: f"Sender max cycle time doing its work in ns: {mode}",
        s.SENDER_CYCLE_TIME_THRESHOLD_EXCEEDED: f"Sender work cycle exceeded threshold count: {threshold}",
        s.RECEIVER_MAX_CYCLE_TIME: f"Receiver max cycle time doing its work in ns: {mode}",
        s.RECEIVER_CYCLE_TIME_THRESHOLD_EXCEEDED: f"Receiver work cycle exceeded threshold count: {threshold}",
        s.NAME_RESOLVER_MAX_TIME: "NameResolver max time in ns",
        s.NAME_RESOLVER_TIME_THRESHOLD_EXCEEDED: "NameResolver exceeded threshold count",
        s.AERON_VERSION: f"Aeron software: {version_text}",
        s.BYTES_CURRENTLY_MAPPED: "Bytes currently mapped",
        s.RETRANSMITTED_BYTES: "Retransmitted bytes",
        s.RETRANSMIT_OVERFLOW: "Retransmit Pool Overflow count",
        s.ERROR_FRAMES_RECEIVED: "Error Frames received",
        s.ERROR_FRAMES_SENT: "Error Frames sent",
    }


# system counter id -> label, as logbuf's driver allocates them
SYSTEM_COUNTER_LABELS: dict[int, str] = system_counter_labels()

# -- stream-position key and label (pub-pos, pub-lmt, sub-pos, snd-pos, …) -----------------------------
#
#    0                 8            12          16               20
#    +-----------------+------------+-----------+----------------+---------------------------+
#    | registration id | session id | stream id | channel length | channel (ASCII, to 112)   |
#    | i64             | i32        | i32       | i32            | at most 92 bytes          |
#    +-----------------+------------+-----------+----------------+---------------------------+
KEY_REGISTRATION_ID_OFFSET = 0
KEY_SESSION_ID_OFFSET = 8
KEY_STREAM_ID_OFFSET = 12
KEY_CHANNEL_LENGTH_OFFSET = 16
KEY_CHANNEL_OFFSET = 20
MAX_KEY_CHANNEL_LENGTH = MAX_KEY_LENGTH - KEY_CHANNEL_OFFSET  # 92

PUBLISHER_POSITION_NAME = "pub-pos (sampled)"
PUBLISHER_LIMIT_NAME = "pub-lmt"
SUBSCRIBER_POSITION_NAME = "sub-pos"
SENDER_POSITION_NAME = "snd-pos"
SENDER_LIMIT_NAME = "snd-lmt"
SENDER_BPE_NAME = "snd-bpe"
RECEIVER_HWM_NAME = "rcv-hwm"
RECEIVER_POSITION_NAME = "rcv-pos"
CLIENT_HEARTBEAT_NAME = "client-heartbeat"

STREAM_COUNTER_NAMES: dict[int, str] = {
    PUBLISHER_POSITION_TYPE_ID: PUBLISHER_POSITION_NAME,
    PUBLISHER_LIMIT_TYPE_ID: PUBLISHER_LIMIT_NAME,
    SUBSCRIBER_POSITION_TYPE_ID: SUBSCRIBER_POSITION_NAME,
    SENDER_POSITION_TYPE_ID: SENDER_POSITION_NAME,
    SENDER_LIMIT_TYPE_ID: SENDER_LIMIT_NAME,
    SENDER_BPE_TYPE_ID: SENDER_BPE_NAME,
    RECEIVER_HWM_TYPE_ID: RECEIVER_HWM_NAME,
    RECEIVER_POSITION_TYPE_ID: RECEIVER_POSITION_NAME,
}

_KEY_HEADER = struct.Struct("<qiii")


def encode_ascii(text: str) -> bytes:
    """ASCII with '?' for anything else, as Aeron's putStringWithoutLengthAscii does."""
    return text.encode("ascii", errors="replace")


def stream_position_key(registration_id: int, session_id: int, stream_id: int, channel: str) -> bytes:
    """Aeron's stream-position key (at most 112 bytes: the channel is cut to 92)."""
    channel_bytes = encode_ascii(channel)[:MAX_KEY_CHANNEL_LENGTH]
    return _KEY_HEADER.pack(registration_id, session_id, stream_id, len(channel_bytes)) + channel_bytes


def decode_stream_position_key(key: bytes) -> tuple[int, int, int, str]:
    """(registration id, session id, stream id, channel) from a stream-position key."""
    if len(key) < KEY_CHANNEL_OFFSET:
        raise ValueError(f"a stream-position key needs at least {KEY_CHANNEL_OFFSET} bytes, got {len(key)}")
    registration_id, session_id, stream_id, length = _KEY_HEADER.unpack_from(key, 0)
    length = max(0, min(length, len(key) - KEY_CHANNEL_OFFSET, MAX_KEY_CHANNEL_LENGTH))
    channel = key[KEY_CHANNEL_OFFSET : KEY_CHANNEL_OFFSET + length].decode("ascii", errors="replace")
    return registration_id, session_id, stream_id, channel


def stream_position_label(
    name: str,
    registration_id: int,
    session_id: int,
    stream_id: int,
    channel: str,
    join_position: int | None = None,
) -> str:
    """``"<name>: <registrationId> <sessionId> <streamId> <channel> <suffix>"`` as Aeron writes it: the
    suffix is ``@<joinPosition>`` for sub-pos and empty otherwise, which leaves a trailing space.

    The counters manager truncates it to 380 bytes when stored.
    """
    suffix = "" if join_position is None else f"@{join_position}"
    return f"{name}: {registration_id} {session_id} {stream_id} {channel} {suffix}"


def client_heartbeat_key(client_id: int) -> bytes:
    return struct.pack("<q", client_id)


def client_heartbeat_label(client_id: int) -> str:
    """What the driver labels a client's heartbeat counter; the client appends `` name=<name> <version>``
    (:func:`client_heartbeat_label_suffix`, :meth:`CountersManager.append_to_label`) as Aeron's clients do."""
    return f"{CLIENT_HEARTBEAT_NAME}: id={client_id}"


def client_heartbeat_label_suffix(client_name: str = "", version_text: str = SOFTWARE_VERSION_TEXT) -> str:
    return f" name={client_name} {version_text}"


# -- channel status and local socket address counters ----------------------------------------------------
#
# channel status (snd-channel 6, rcv-channel 7): key = channel length i32 @0, channel @4 (to 108 bytes);
#   label "<name>: <channel> <local or remote address>"
# local socket address (14): key = channel status counter id i32 @0, address length i32 @4, address @8;
#   label "<name>: <channel status counter id> <address>"
SEND_CHANNEL_STATUS_NAME = "snd-channel"
RECEIVE_CHANNEL_STATUS_NAME = "rcv-channel"
SEND_LOCAL_SOCKADDR_NAME = "snd-local-sockaddr"
RECEIVE_LOCAL_SOCKADDR_NAME = "rcv-local-sockaddr"
LOCAL_SOCKADDR_TYPE_ID = 14
_I32 = struct.Struct("<i")
_I32_PAIR = struct.Struct("<ii")


def channel_status_key(channel: str) -> bytes:
    text = encode_ascii(channel)[: MAX_KEY_LENGTH - _I32.size]
    return _I32.pack(len(text)) + text


def channel_status_label(name: str, channel: str, address: str) -> str:
    return f"{name}: {channel} {address}"


def local_sockaddr_key(channel_status_id: int, address: str) -> bytes:
    text = encode_ascii(address)[: MAX_KEY_LENGTH - _I32_PAIR.size]
    return _I32_PAIR.pack(channel_status_id, len(text)) + text


def local_sockaddr_label(name: str, channel_status_id: int, address: str) -> str:
    return f"{name}: {channel_status_id} {address}"


class CounterInfo(NamedTuple):
    counter_id: int
    type_id: int
    value: int
    label: str
    key: bytes
    registration_id: int
    owner_id: int
    reference_id: int


class CountersReader:
    """Reads counters anyone allocated (clients, tools): values with acquire, metadata once allocated."""

    def __init__(self, metadata_buffer: AtomicBuffer, values_buffer: AtomicBuffer) -> None:
        if values_buffer.capacity % COUNTER_LENGTH or metadata_buffer.capacity % METADATA_LENGTH:
            raise CncFileError(
                f"counters buffers must be multiples of 128 (values, got {values_buffer.capacity}) and "
                f"512 (metadata, got {metadata_buffer.capacity}) bytes"
            )
        self.metadata_buffer = metadata_buffer
        self.values_buffer = values_buffer
        self.max_counter_id = (
            min(values_buffer.capacity // COUNTER_LENGTH, metadata_buffer.capacity // METADATA_LENGTH) - 1
        )

    # -- offsets ---------------------------------------------------------------------------------------

    @staticmethod
    def counter_offset(counter_id: int) -> int:
        return counter_id * COUNTER_LENGTH

    @staticmethod
    def metadata_offset(counter_id: int) -> int:
        return counter_id * METADATA_LENGTH

    def _check_id(self, counter_id: int) -> None:
        if not 0 <= counter_id <= self.max_counter_id:
            raise CounterStateError(f"counter id {counter_id} is outside 0..{self.max_counter_id}")

    # -- fields ----------------------------------------------------------------------------------------

    def counter_value(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self.values_buffer.get_i64_acquire(self.counter_offset(counter_id) + VALUE_OFFSET)

    def counter_registration_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self.values_buffer.get_i64_acquire(self.counter_offset(counter_id) + REGISTRATION_ID_OFFSET)

    def counter_owner_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self.values_buffer.get_i64_acquire(self.counter_offset(counter_id) + OWNER_ID_OFFSET)

    def counter_reference_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self.values_buffer.get_i64_acquire(self.counter_offset(counter_id) + REFERENCE_ID_OFFSET)

    def counter_state(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self.metadata_buffer.get_i32_acquire(self.metadata_offset(counter_id) + STATE_OFFSET)

    def counter_type_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self.metadata_buffer.get_i32(self.metadata_offset(counter_id) + TYPE_ID_OFFSET)

    def free_for_reuse_deadline(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self.metadata_buffer.get_i64_acquire(
            self.metadata_offset(counter_id) + FREE_FOR_REUSE_DEADLINE_OFFSET
        )

    def counter_label(self, counter_id: int) -> str:
        self._check_id(counter_id)
        offset = self.metadata_offset(counter_id)
        # Shared memory: clamp the stored length so a bad one cannot read past the record.
        length = max(0, min(self.metadata_buffer.get_i32(offset + LABEL_LENGTH_OFFSET), MAX_LABEL_LENGTH))
        return self.metadata_buffer.get_bytes(offset + LABEL_OFFSET, length).decode("ascii", errors="replace")

    def counter_key(self, counter_id: int) -> bytes:
        """All 112 key bytes (keys carry no length; their type id says how to read them)."""
        self._check_id(counter_id)
        return self.metadata_buffer.get_bytes(self.metadata_offset(counter_id) + KEY_OFFSET, MAX_KEY_LENGTH)

    def position(self, counter_id: int) -> Position:
        """A ``Position`` over the counter's value (the buffer must outlive it)."""
        self._check_id(counter_id)
        return Position(self.values_buffer, self.counter_offset(counter_id) + VALUE_OFFSET, counter_id)

    def append_to_label(self, counter_id: int, text: str) -> None:
        """Appends ``text`` to an allocated counter's label (cut at 380 bytes), as Aeron's clients complete
        their heartbeat counter's label (the one write a reader makes: the label is the client's to finish)."""
        if self.counter_state(counter_id) != RECORD_ALLOCATED:
            raise CounterStateError(f"counter {counter_id} is not allocated")
        offset = self.metadata_offset(counter_id)
        length = max(0, min(self.metadata_buffer.get_i32(offset + LABEL_LENGTH_OFFSET), MAX_LABEL_LENGTH))
        extra = encode_ascii(text)[: MAX_LABEL_LENGTH - length]
        self.metadata_buffer.put_bytes(offset + LABEL_OFFSET + length, extra)
        self.metadata_buffer.put_i32_release(offset + LABEL_LENGTH_OFFSET, length + len(extra))

    # -- iteration -------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[CounterInfo]:
        """Allocated counters in id order, stopping at the first never-used record."""
        for counter_id in range(self.max_counter_id + 1):
            state = self.counter_state(counter_id)
            if state == RECORD_UNUSED:
                return
            if state != RECORD_ALLOCATED:
                continue
            yield CounterInfo(
                counter_id,
                self.counter_type_id(counter_id),
                self.counter_value(counter_id),
                self.counter_label(counter_id),
                self.counter_key(counter_id),
                self.counter_registration_id(counter_id),
                self.counter_owner_id(counter_id),
                self.counter_reference_id(counter_id),
            )

    def find(self, type_id: int, registration_id: int | None = None) -> int:
        """The first allocated counter of ``type_id`` (and registration id, if given); NULL_COUNTER_ID if none."""
        for info in self:
            if info.type_id == type_id and (
                registration_id is None or info.registration_id == registration_id
            ):
                return info.counter_id
        return NULL_COUNTER_ID


class CountersManager(CountersReader):
    """Allocates and frees counters (one owner: the driver conductor; not thread-safe).

    ``clock_ms`` (epoch ms) decides when a freed id may be reused; inject one in tests.
    """

    def __init__(
        self,
        metadata_buffer: AtomicBuffer,
        values_buffer: AtomicBuffer,
        clock_ms: Callable[[], int] = epoch_ms,
        free_to_reuse_timeout_ms: int = DEFAULT_FREE_TO_REUSE_TIMEOUT_MS,
    ) -> None:
        super().__init__(metadata_buffer, values_buffer)
        self._clock_ms = clock_ms
        self.free_to_reuse_timeout_ms = free_to_reuse_timeout_ms
        self._free_list: list[int] = []
        # Take over whatever a previous manager of these buffers allocated (ids are never reused early).
        self._high_water_mark = -1
        for counter_id in range(self.max_counter_id + 1):
            state = self.counter_state(counter_id)
            if state == RECORD_UNUSED:
                break
            self._high_water_mark = counter_id
            if state == RECORD_RECLAIMED:
                self._free_list.append(counter_id)

    def allocate(
        self,
        type_id: int,
        label: str,
        key: bytes = b"",
        registration_id: int = DEFAULT_REGISTRATION_ID,
        owner_id: int = DEFAULT_OWNER_ID,
        reference_id: int = DEFAULT_REFERENCE_ID,
    ) -> int:
        """A new counter with value 0; its id.  Label is cut to 380 ASCII bytes, key to 112 bytes.

        Raises CountersFullError when no id is available.
        """
        counter_id = self._next_counter_id()
        values, metadata = self.values_buffer, self.metadata_buffer
        value_offset = self.counter_offset(counter_id)
        values.put_i64_release(value_offset + VALUE_OFFSET, 0)
        values.put_i64_release(value_offset + REGISTRATION_ID_OFFSET, registration_id)
        values.put_i64_release(value_offset + OWNER_ID_OFFSET, owner_id)
        values.put_i64_release(value_offset + REFERENCE_ID_OFFSET, reference_id)

        offset = self.metadata_offset(counter_id)
        key = bytes(key)[:MAX_KEY_LENGTH]
        label_bytes = encode_ascii(label)[:MAX_LABEL_LENGTH]
        metadata.put_i32(offset + TYPE_ID_OFFSET, type_id)
        metadata.put_i64(offset + FREE_FOR_REUSE_DEADLINE_OFFSET, NOT_FREE_TO_REUSE)
        metadata.set_memory(offset + KEY_OFFSET, MAX_KEY_LENGTH, 0)  # a reused id must not keep old key bytes
        metadata.put_bytes(offset + KEY_OFFSET, key)
        metadata.set_memory(offset + LABEL_OFFSET, MAX_LABEL_LENGTH, 0)
        metadata.put_bytes(offset + LABEL_OFFSET, label_bytes)
        metadata.put_i32(offset + LABEL_LENGTH_OFFSET, len(label_bytes))
        metadata.put_i32_release(offset + STATE_OFFSET, RECORD_ALLOCATED)  # publishes everything above
        return counter_id

    def available(self) -> int:
        """How many counters :meth:`allocate` could hand out now (unused ids and freed ones past their deadline)."""
        now_ms = self._clock_ms()
        reusable = sum(1 for counter_id in self._free_list if now_ms >= self.free_for_reuse_deadline(counter_id))
        return self.max_counter_id - self._high_water_mark + reusable

    def _next_counter_id(self) -> int:
        if self._free_list:
            now_ms = self._clock_ms()
            for i, counter_id in enumerate(self._free_list):
                if now_ms >= self.free_for_reuse_deadline(counter_id):
                    del self._free_list[i]
                    return counter_id
        counter_id = self._high_water_mark + 1
        if counter_id > self.max_counter_id:
            raise CountersFullError(
                f"unable to allocate a counter: all {self.max_counter_id + 1} ids are in use or not yet "
                f"free for reuse"
            )
        self._high_water_mark = counter_id
        return counter_id

    def free(self, counter_id: int) -> None:
        """Reclaims a counter; its id is reused no sooner than the free-to-reuse timeout from now."""
        if self.counter_state(counter_id) != RECORD_ALLOCATED:
            raise CounterStateError(f"counter {counter_id} is not allocated")
        offset = self.metadata_offset(counter_id)
        self.metadata_buffer.put_i64_release(
            offset + FREE_FOR_REUSE_DEADLINE_OFFSET, self._clock_ms() + self.free_to_reuse_timeout_ms
        )
        self.metadata_buffer.set_memory(offset + KEY_OFFSET, MAX_KEY_LENGTH, 0)
        self.metadata_buffer.put_i32_release(offset + STATE_OFFSET, RECORD_RECLAIMED)
        self._free_list.append(counter_id)

    def set_counter_value(self, counter_id: int, value: int) -> None:
        self._check_id(counter_id)
        self.values_buffer.put_i64_release(self.counter_offset(counter_id) + VALUE_OFFSET, value)

    def allocate_system_counters(self, labels: dict[int, str] | None = None) -> dict[int, int]:
        """Allocates Aeron's system counters in order (on fresh buffers their ids equal Aeron's ids); the
        software-version counter gets its value.  ``labels``: :data:`SYSTEM_COUNTER_LABELS` by default."""
        ids = {
            system_id: self.allocate(SYSTEM_COUNTER_TYPE_ID, label, key=struct.pack("<i", system_id))
            for system_id, label in (SYSTEM_COUNTER_LABELS if labels is None else labels).items()
        }
        self.set_counter_value(ids[SystemCounter.AERON_VERSION], SOFTWARE_VERSION_VALUE)
        return ids

