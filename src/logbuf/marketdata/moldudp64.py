"""MoldUDP64 packets: downstream (messages, heartbeat, end of session) and re-request, encode and decode.

Every integer is big-endian. A downstream packet (also the shape of a retransmission answer)::

      0                   1                   2
      0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 ...
     +-------------------+---------------+---+------------------------------------+
     | session (10 ASCII,| sequence (u64)| n | n message blocks:                  |
     | space padded)     | of message #0 |u16| +-------+---------------------+    |
     +-------------------+---------------+---+ |len u16| message (len bytes) |... |
     0                   10              18  20+-------+---------------------+----+

    n = 0x0000  heartbeat       no blocks, ``sequence`` = next expected sequence
    n = 0xFFFF  end of session  no blocks, ``sequence`` = next expected sequence
    otherwise   message i (0 <= i < n) has sequence ``sequence + i``

A request packet (client -> re-request server, unicast) is the same 20-byte header with ``n`` = number of
messages wanted, starting at ``sequence``; it is exactly 20 bytes long.

Decoding is strict: a packet shorter than its header, a block running past the end of the datagram, fewer
blocks than announced or bytes left over after the last block raise :class:`MoldUDP64Error`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from logbuf.errors import LogbufError

SESSION_OFFSET = 0
SESSION_LENGTH = 10
SEQUENCE_OFFSET = 10
COUNT_OFFSET = 18
HEADER_LENGTH = 20
BLOCK_LENGTH_SIZE = 2
REQUEST_LENGTH = HEADER_LENGTH

HEARTBEAT_COUNT = 0x0000
END_OF_SESSION_COUNT = 0xFFFF
MAX_MESSAGE_COUNT = 0xFFFE
MAX_MESSAGE_LENGTH = 0xFFFF
FIRST_SEQUENCE = 1
MAX_SEQUENCE = 2**64 - 1

# 1500-byte Ethernet MTU minus the IPv4 (20) and UDP (8) headers; the default budget is more conservative.
MAX_UDP_PAYLOAD_ON_ETHERNET = 1472
DEFAULT_PAYLOAD_BUDGET = 1400

HEADER = struct.Struct(">10sQH")  # session, sequence, message count: the packet header (big-endian)
_BLOCK_LENGTH = struct.Struct(">H")
_PAD = b" "


class MoldUDP64Error(LogbufError, ValueError):
    """A MoldUDP64 packet (or a value to put in one) is malformed; the message says which field and why."""


def encode_session(session: str | bytes) -> bytes:
    """The 10-byte session field: ASCII, right-padded with spaces."""
    raw = session.encode("ascii", "strict") if isinstance(session, str) else bytes(session)
    if len(raw) > SESSION_LENGTH:
        raise MoldUDP64Error(f"session {raw!r} is longer than {SESSION_LENGTH} bytes")
    if not raw.isascii():
        raise MoldUDP64Error(f"session {raw!r} is not ASCII")
    return raw.ljust(SESSION_LENGTH, _PAD)


class DownstreamPacket(NamedTuple):
    """A packet carrying ``len(messages)`` messages, the first with sequence number ``sequence``."""

    session: bytes
    sequence: int
    messages: tuple[bytes, ...]

    @property
    def next_sequence(self) -> int:
        return self.sequence + len(self.messages)


class Heartbeat(NamedTuple):
    """No messages; ``next_sequence`` is the sequence of the next message the server will send."""

    session: bytes
    next_sequence: int


class EndOfSession(NamedTuple):
    """No messages and none to follow; ``next_sequence`` must not advance the receiver's expected sequence."""

    session: bytes
    next_sequence: int


class RequestPacket(NamedTuple):
    """A re-request for ``count`` messages starting at ``sequence``."""

    session: bytes
    sequence: int
    count: int  # type: ignore[assignment]  # MoldUDP64's name for the field; shadows tuple.count on purpose


Packet = DownstreamPacket | Heartbeat | EndOfSession


def _check_sequence(sequence: int) -> None:
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise MoldUDP64Error(f"sequence {sequence} does not fit in an unsigned 64-bit field")


def encode_header(session: str | bytes, sequence: int, count: int) -> bytes:
    """The 20-byte header; ``count`` may be a message count or one of the two marker values."""
    _check_sequence(sequence)
    if not 0 <= count <= END_OF_SESSION_COUNT:
        raise MoldUDP64Error(f"message count {count} does not fit in an unsigned 16-bit field")
    return HEADER.pack(encode_session(session), sequence, count)


def encode_downstream(session: str | bytes, sequence: int, messages: Iterable[bytes]) -> bytes:
    """A downstream packet with at least one message (use :func:`encode_heartbeat` for none)."""
    parts: list[bytes] = []
    for message in messages:
        if len(message) > MAX_MESSAGE_LENGTH:
            raise MoldUDP64Error(f"message of {len(message)} bytes exceeds the 16-bit block length")
        parts.append(_BLOCK_LENGTH.pack(len(message)))
        parts.append(bytes(message))
    count = len(parts) // 2
    if count == HEARTBEAT_COUNT:
        raise MoldUDP64Error("a downstream packet needs at least one message (count 0 means heartbeat)")
    if count > MAX_MESSAGE_COUNT:
        raise MoldUDP64Error(f"{count} messages exceed the maximum of {MAX_MESSAGE_COUNT} per packet")
    return encode_header(session, sequence, count) + b"".join(parts)


def encode_heartbeat(session: str | bytes, next_sequence: int) -> bytes:
    return encode_header(session, next_sequence, HEARTBEAT_COUNT)


def encode_end_of_session(session: str | bytes, next_sequence: int) -> bytes:
    return encode_header(session, next_sequence, END_OF_SESSION_COUNT)


def encode_request(session: str | bytes, sequence: int, count: int) -> bytes:
    if not 1 <= count <= MAX_MESSAGE_COUNT:
        raise MoldUDP64Error(f"requested count {count} is outside 1..{MAX_MESSAGE_COUNT}")
    if sequence < FIRST_SEQUENCE:
        raise MoldUDP64Error(f"requested sequence {sequence} is below the first sequence {FIRST_SEQUENCE}")
    return encode_header(session, sequence, count)


def encode(packet: Packet | RequestPacket) -> bytes:
    """Encode any of the packet tuples."""
    if isinstance(packet, DownstreamPacket):
        return encode_downstream(packet.session, packet.sequence, packet.messages)
    if isinstance(packet, Heartbeat):
        return encode_heartbeat(packet.session, packet.next_sequence)
    if isinstance(packet, EndOfSession):
        return encode_end_of_session(packet.session, packet.next_sequence)
    if isinstance(packet, RequestPacket):
        return encode_request(packet.session, packet.sequence, packet.count)
    raise TypeError(f"not a MoldUDP64 packet: {type(packet).__name__}")


def decode_header(buf: bytes | bytearray | memoryview) -> tuple[bytes, int, int]:
    """(session, sequence, count) of a packet; checks only that the 20-byte header is present."""
    if len(buf) < HEADER_LENGTH:
        raise MoldUDP64Error(f"packet of {len(buf)} bytes is shorter than the {HEADER_LENGTH}-byte header")
    return HEADER.unpack_from(buf, 0)


def iter_blocks(buf: bytes | bytearray | memoryview, count: int, offset: int = HEADER_LENGTH) -> Iterator[bytes]:
    """Yield exactly ``count`` message blocks from ``buf[offset:]``, which they must fill exactly."""
    view = memoryview(buf)
    end = len(view)
    for index in range(count):
        if offset + BLOCK_LENGTH_SIZE > end:
            raise MoldUDP64Error(f"packet ends at byte {end} before the length of message {index} of {count}")
        (length,) = _BLOCK_LENGTH.unpack_from(view, offset)
        offset += BLOCK_LENGTH_SIZE
        if offset + length > end:
            raise MoldUDP64Error(
                f"message {index} of {count} claims {length} bytes at offset {offset}, "
                f"but the packet has only {end - offset} left"
            )
        yield bytes(view[offset : offset + length])
        offset += length
    if offset != end:
        raise MoldUDP64Error(f"{end - offset} bytes left over after the last of {count} messages")


def decode(buf: bytes | bytearray | memoryview) -> Packet:
    """Decode a downstream packet into a :class:`DownstreamPacket`, :class:`Heartbeat` or :class:`EndOfSession`."""
    session, sequence, count = decode_header(buf)
    if count in (HEARTBEAT_COUNT, END_OF_SESSION_COUNT):
        if len(buf) != HEADER_LENGTH:
            kind = "heartbeat" if count == HEARTBEAT_COUNT else "end-of-session"
            raise MoldUDP64Error(f"{kind} packet carries {len(buf) - HEADER_LENGTH} trailing bytes")
        cls = Heartbeat if count == HEARTBEAT_COUNT else EndOfSession
        return cls(session, sequence)
    if sequence < FIRST_SEQUENCE:
        raise MoldUDP64Error(f"downstream packet with messages starts at sequence {sequence} (first is 1)")
    return DownstreamPacket(session, sequence, tuple(iter_blocks(buf, count)))


def decode_request(buf: bytes | bytearray | memoryview) -> RequestPacket:
    """Decode a re-request; it must be exactly 20 bytes with a count of 1..0xFFFE and a sequence >= 1."""
    if len(buf) != REQUEST_LENGTH:
        raise MoldUDP64Error(f"request packet of {len(buf)} bytes (must be exactly {REQUEST_LENGTH})")
    session, sequence, count = HEADER.unpack_from(buf, 0)
    if not 1 <= count <= MAX_MESSAGE_COUNT:
        raise MoldUDP64Error(f"requested count {count} is outside 1..{MAX_MESSAGE_COUNT}")
    if sequence < FIRST_SEQUENCE:
        raise MoldUDP64Error(f"requested sequence {sequence} is below the first sequence {FIRST_SEQUENCE}")
    return RequestPacket(session, sequence, count)


class PacketBuilder:
    """Accumulates messages into one downstream packet without exceeding a payload budget (bytes of UDP
    payload, header included)."""

    __slots__ = ("_session", "_budget", "_sequence", "_parts", "_length")

    def __init__(self, session: str | bytes, sequence: int, budget: int = DEFAULT_PAYLOAD_BUDGET) -> None:
        if budget < HEADER_LENGTH + BLOCK_LENGTH_SIZE:
            raise MoldUDP64Error(f"payload budget {budget} leaves no room for a message")
        self._session = encode_session(session)
        self._budget = budget
        self._sequence = sequence
        self._parts: list[bytes] = []
        self._length = HEADER_LENGTH

    @property
    def count(self) -> int:
        return len(self._parts) // 2

    @property
    def length(self) -> int:
        return self._length

    def try_append(self, message: bytes) -> bool:
        """Add ``message`` if it fits in the budget and the count limit; False (nothing added) otherwise."""
        framed = BLOCK_LENGTH_SIZE + len(message)
        if self._length + framed > self._budget or self.count >= MAX_MESSAGE_COUNT:
            return False
        self._parts.append(_BLOCK_LENGTH.pack(len(message)))
        self._parts.append(bytes(message))
        self._length += framed
        return True

    def build(self) -> bytes:
        """The packet, then start the next one at the following sequence number."""
        if not self._parts:
            raise MoldUDP64Error("no message to build a downstream packet from")
        packet = encode_header(self._session, self._sequence, self.count) + b"".join(self._parts)
        self._sequence += self.count
        self._parts.clear()
        self._length = HEADER_LENGTH
        return packet
