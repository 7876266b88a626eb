"""Counter type ids, the short names the tools print and accept (``--type sub-pos``), and key decoders.

One table, ``CounterType`` per type id.  The driver's counters use Aeron's ids (``logbuf.cnc.counters``); a
layer that adds its own counters (e.g. the feed handler) names them with one call, and ``logbuf stat``
then prints, filters and decodes them like the built-in ones::

    register_counter_type(CounterType(1001, "feed-gaps", "MoldUDP64 gaps detected", decode_no_key))

Keys are 112 opaque bytes whose meaning depends on the type: a decoder turns them into JSON-able fields.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from logbuf.cnc import counters as c

KeyDecoder = Callable[[bytes], dict[str, object]]


def decode_no_key(key: bytes) -> dict[str, object]:
    """Types without a defined key: nothing to decode (JSON still carries the raw bytes if non-zero)."""
    return {}


def decode_system_key(key: bytes) -> dict[str, object]:
    """System counters: the key is the system counter id (i32 @0)."""
    return {"system_counter_id": struct.unpack_from("<i", key, 0)[0]}


def decode_stream_position_key(key: bytes) -> dict[str, object]:
    """pub-pos, pub-lmt, sub-pos, …: registration id @0, session @8, stream @12, channel length @16, @20."""
    registration_id, session_id, stream_id, channel = c.decode_stream_position_key(key)
    return {
        "registration_id": registration_id,
        "session_id": session_id,
        "stream_id": stream_id,
        "channel": channel,
    }


def decode_client_heartbeat_key(key: bytes) -> dict[str, object]:
    """client-heartbeat: the client id (i64 @0)."""
    return {"client_id": struct.unpack_from("<q", key, 0)[0]}


@dataclass(frozen=True)
class CounterType:
    """What the tools know about one counter type id."""

    type_id: int
    name: str  # short name, as in Aeron's labels: "sub-pos", "client-heartbeat", …
    description: str
    decode_key: KeyDecoder = decode_no_key
    value_is_epoch_ms: bool = False  # a timestamp, not a count: no rate, show its age instead
    aliases: tuple[str, ...] = field(default=())


_BY_ID: dict[int, CounterType] = {}
_BY_NAME: dict[str, int] = {}


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def register_counter_type(counter_type: CounterType, *, replace: bool = False) -> None:
    """Adds a type to the table; ValueError if its id or a name is already taken (unless ``replace``)."""
    names = [_normalise(n) for n in (counter_type.name, *counter_type.aliases)]
    if not replace:
        if counter_type.type_id in _BY_ID:
            raise ValueError(
                f"counter type id {counter_type.type_id} is already {_BY_ID[counter_type.type_id].name!r}"
            )
        taken = [n for n in names if n in _BY_NAME]
        if taken:
            raise ValueError(f"counter type name(s) {taken} already registered")
    old = _BY_ID.get(counter_type.type_id)
    if old is not None:
        for n in (old.name, *old.aliases):
            _BY_NAME.pop(_normalise(n), None)
    _BY_ID[counter_type.type_id] = counter_type
    for n in names:
        _BY_NAME[n] = counter_type.type_id


def counter_type(type_id: int) -> CounterType | None:
    return _BY_ID.get(type_id)


def type_name(type_id: int) -> str:
    """The short name of ``type_id``, or ``type-<id>`` for a type nobody registered."""
    known = _BY_ID.get(type_id)
    return known.name if known else f"type-{type_id}"


def known_counter_types() -> list[CounterType]:
    return sorted(_BY_ID.values(), key=lambda t: t.type_id)


def parse_counter_type(text: str) -> int:
    """A type id from a number (``4``) or a name (``sub-pos``, ``SUB_POS``); ValueError lists the names."""
    raw = text.strip()
    try:
        return int(raw, 0)
    except ValueError:
        pass
    type_id = _BY_NAME.get(_normalise(raw))
    if type_id is None:
        names = ", ".join(t.name for t in known_counter_types())
        raise ValueError(f"unknown counter type {text!r}: use a type id or one of {names}")
    return type_id


def decode_key(type_id: int, key: bytes) -> dict[str, object]:
    """The key's fields for ``type_id`` ({} when the type has no decoder or the key cannot be decoded)."""
    known = _BY_ID.get(type_id)
    if known is None:
        return {}
    try:
        return known.decode_key(key)
    except (ValueError, struct.error):  # shared memory: a short or odd key must not break a listing
        return {}


FEED_HANDLER_TYPE_ID = c.FEED_HANDLER_COUNTER_TYPE_ID
RECORDER_TYPE_ID = c.RECORDER_COUNTER_TYPE_ID


def _raw(key: bytes) -> dict[str, object]:
    """Keys of logbuf's client counters: the counter's name in ASCII."""
    return {"name": key.rstrip(b"\0").decode("ascii", "replace")} if key.strip(b"\0") else {}


def _register_builtin() -> None:
    stream = decode_stream_position_key
    for type_id, name, description, decoder, epoch, aliases in (
        (c.SYSTEM_COUNTER_TYPE_ID, "system", "driver-wide system counter", decode_system_key, False, ()),
        (
            c.PUBLISHER_LIMIT_TYPE_ID,
            "pub-lmt",
            "publisher limit (flow-control window end)",
            stream,
            False,
            (),
        ),
        (c.SENDER_POSITION_TYPE_ID, "snd-pos", "sender position", stream, False, ()),
        (c.RECEIVER_HWM_TYPE_ID, "rcv-hwm", "receiver high-water mark", stream, False, ()),
        (c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos", "subscriber position", stream, False, ()),
        (c.RECEIVER_POSITION_TYPE_ID, "rcv-pos", "receiver position", stream, False, ()),
        (c.SEND_CHANNEL_STATUS_TYPE_ID, "snd-channel", "send channel status", decode_no_key, False, ()),
        (c.RECEIVE_CHANNEL_STATUS_TYPE_ID, "rcv-channel", "receive channel status", decode_no_key, False, ()),
        (c.SENDER_LIMIT_TYPE_ID, "snd-lmt", "sender limit", stream, False, ()),
        (c.PER_IMAGE_TYPE_ID, "per-image", "per-image counter", stream, False, ()),
        (
            c.CLIENT_HEARTBEAT_TYPE_ID,
            "client-heartbeat",
            "client keepalive (epoch ms)",
            decode_client_heartbeat_key,
            True,
            (),
        ),
        (
            c.PUBLISHER_POSITION_TYPE_ID,
            "pub-pos",
            "publisher position (sampled)",
            stream,
            False,
            ("pub-pos (sampled)",),
        ),
        (c.SENDER_BPE_TYPE_ID, "snd-bpe", "sender back-pressure events", stream, False, ()),
        # logbuf's own client counters (ids >= 1000 are application types in Aeron's scheme)
        (FEED_HANDLER_TYPE_ID, "feed", "feed handler (per feed packets, gaps, recovery, A-B delay)", _raw, False, ()),
        (RECORDER_TYPE_ID, "recorder", "recorder (rows, files, lag)", _raw, False, ()),
    ):
        register_counter_type(CounterType(type_id, name, description, decoder, epoch, aliases))


_register_builtin()
