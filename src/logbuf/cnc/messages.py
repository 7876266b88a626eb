"""Bodies of the client -> driver commands and driver -> client responses (Aeron's control protocol).

Commands travel in the to-driver ring buffer, responses in the to-clients broadcast buffer, each record's
type id being the command/response id.  Fields are little-endian and packed on 4-byte boundaries; a
string is an i32 length followed by that many ASCII bytes, and a second string starts at the next 4-byte
boundary after the first.  Offsets from the start of the body:

Commands (every one starts with the correlated header)::

    CorrelatedMessage (CLIENT_KEEPALIVE, CLIENT_CLOSE)    PublicationMessage (ADD_[EXCLUSIVE_]PUBLICATION)
     0 clientId        i64                                  0 clientId i64 | 8 correlationId i64
     8 correlationId   i64                                 16 streamId i32 | 20 channel length i32 | 24 channel

    SubscriptionMessage (ADD_SUBSCRIPTION)                RemoveMessage (REMOVE_PUBLICATION/_SUBSCRIPTION/_COUNTER)
     0 clientId i64 | 8 correlationId i64                   0 clientId i64 | 8 correlationId i64
    16 registrationCorrelationId i64                       16 registrationId i64
    24 streamId i32 | 28 channel length i32 | 32 channel

    CounterMessage (ADD_COUNTER)                          TerminateDriverMessage (TERMINATE_DRIVER)
     0 clientId i64 | 8 correlationId i64                   0 clientId i64 | 8 correlationId i64
    16 typeId i32 | 20 key length i32 | 24 key bytes       16 token length i32 | 20 token bytes
    L = 24 + align(key length, 4): label length i32, label

Responses::

    PublicationReady (ON_[EXCLUSIVE_]PUBLICATION_READY)   AvailableImage (ON_AVAILABLE_IMAGE)
     0 correlationId i64 | 8 registrationId i64            0 correlationId i64 | 8 sessionId i32 | 12 streamId i32
    16 sessionId i32 | 20 streamId i32                     16 subscriptionRegistrationId i64
    24 positionLimitCounterId i32                          24 subscriberPositionId i32
    28 channelStatusIndicatorId i32                        28 logFileName length i32 | 32 logFileName
    32 logFileName length i32 | 36 logFileName              S = 32 + align(length, 4): sourceIdentity (string)

    SubscriptionReady (ON_SUBSCRIPTION_READY)             UnavailableImage (ON_UNAVAILABLE_IMAGE)
     0 correlationId i64 | 8 channelStatusIndicatorId i32   0 correlationId i64 | 8 subscriptionRegistrationId i64
                                                           16 streamId i32 | 20 channel length i32 | 24 channel
    OperationSuccess (ON_OPERATION_SUCCESS)               ErrorResponse (ON_ERROR)
     0 correlationId i64                                    0 offendingCorrelationId i64 | 8 errorCode i32
                                                           12 message length i32 | 16 message
    ClientTimeout (ON_CLIENT_TIMEOUT)                     CounterUpdate (ON_COUNTER_READY, ON_UNAVAILABLE_COUNTER)
     0 clientId i64                                         0 correlationId i64 | 8 counterId i32

Decoders accept trailing bytes (newer senders may append fields, as Aeron's only check a minimum length)
but raise MalformedCommandError for anything that does not fit; encoders replace non-ASCII characters by
'?' (Aeron's putStringAscii) and decoders reject non-ASCII bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields, replace
from enum import IntEnum
from typing import Any, ClassVar

from logbuf.cnc.errors import MalformedCommandError, UnknownCommandTypeError


class ControlCommand(IntEnum):
    """To-driver record type ids."""

    ADD_PUBLICATION = 0x01
    REMOVE_PUBLICATION = 0x02
    ADD_EXCLUSIVE_PUBLICATION = 0x03
    ADD_SUBSCRIPTION = 0x04
    REMOVE_SUBSCRIPTION = 0x05
    CLIENT_KEEPALIVE = 0x06
    ADD_DESTINATION = 0x07
    REMOVE_DESTINATION = 0x08
    ADD_COUNTER = 0x09
    REMOVE_COUNTER = 0x0A
    CLIENT_CLOSE = 0x0B
    ADD_RCV_DESTINATION = 0x0C
    REMOVE_RCV_DESTINATION = 0x0D
    TERMINATE_DRIVER = 0x0E
    ADD_STATIC_COUNTER = 0x0F
    REJECT_IMAGE = 0x10
    REMOVE_DESTINATION_BY_ID = 0x11


class ControlResponse(IntEnum):
    """To-clients record type ids."""

    ON_ERROR = 0x0F01
    ON_AVAILABLE_IMAGE = 0x0F02
    ON_PUBLICATION_READY = 0x0F03
    ON_OPERATION_SUCCESS = 0x0F04
    ON_UNAVAILABLE_IMAGE = 0x0F05
    ON_EXCLUSIVE_PUBLICATION_READY = 0x0F06
    ON_SUBSCRIPTION_READY = 0x0F07
    ON_COUNTER_READY = 0x0F08
    ON_UNAVAILABLE_COUNTER = 0x0F09
    ON_CLIENT_TIMEOUT = 0x0F0A
    ON_STATIC_COUNTER = 0x0F0B


class ErrorCode(IntEnum):
    """Error codes of ON_ERROR."""

    INVALID_CHANNEL = 1
    UNKNOWN_SUBSCRIPTION = 2
    UNKNOWN_PUBLICATION = 3
    CHANNEL_ENDPOINT_ERROR = 4
    UNKNOWN_COUNTER = 5
    UNKNOWN_COMMAND_TYPE_ID = 6
    MALFORMED_COMMAND = 7
    NOT_SUPPORTED = 8
    UNKNOWN_HOST = 9
    GENERIC_ERROR = 11
    STORAGE_SPACE = 12
    IMAGE_REJECTED = 13  # an ERR frame's code: the receiver rejected the image


MAX_COUNTER_KEY_LENGTH = 112
_I32 = struct.Struct("<i")
Buffer = bytes | bytearray | memoryview


def _align4(value: int) -> int:
    return (value + 3) & ~3


def _ascii(text: str) -> bytes:
    return text.encode("ascii", errors="replace")


def _string(text: str) -> bytes:
    data = _ascii(text)
    return _I32.pack(len(data)) + data


class _Reader:
    """Bounds-checked reads from a body; every failure is a MalformedCommandError."""

    __slots__ = ("data", "what")

    def __init__(self, data: Buffer, what: str) -> None:
        self.data = data
        self.what = what

    def fixed(self, fmt: struct.Struct, offset: int) -> tuple[Any, ...]:
        if offset + fmt.size > len(self.data):
            raise MalformedCommandError(
                f"{self.what}: {len(self.data)} bytes, need at least {offset + fmt.size}"
            )
        return fmt.unpack_from(self.data, offset)

    def raw(self, offset: int, field: str, max_length: int | None = None) -> tuple[bytes, int]:
        """(bytes, offset just after them) of a length-prefixed field at ``offset``."""
        (length,) = self.fixed(_I32, offset)
        start = offset + 4
        if length < 0 or start + length > len(self.data):
            raise MalformedCommandError(
                f"{self.what}: {field} length {length} does not fit in {len(self.data) - start} remaining bytes"
            )
        if max_length is not None and length > max_length:
            raise MalformedCommandError(f"{self.what}: {field} length {length} exceeds {max_length}")
        return bytes(self.data[start : start + length]), start + length

    def string(self, offset: int, field: str, utf8: bool = False) -> tuple[str, int]:
        data, end = self.raw(offset, field)
        if utf8:  # free text: whatever bytes the client sent, as Aeron's driver passes them on
            return data.decode("utf-8", errors="replace"), end
        try:
            return data.decode("ascii"), end
        except UnicodeDecodeError:
            raise MalformedCommandError(f"{self.what}: {field} is not ASCII") from None


@dataclass(frozen=True)
class _Text:
    """A length-prefixed string field (``name`` as Aeron's messages call it): ASCII (channels), or UTF-8 where
    ``utf8`` (free text such as a rejection's reason, which Aeron's clients send as the caller's bytes)."""

    name: str
    utf8: bool = False

    def pack(self, value: str) -> bytes:
        if self.utf8:
            data = value.encode("utf-8", errors="replace")
            return _I32.pack(len(data)) + data
        return _string(value)

    def unpack(self, reader: _Reader, offset: int) -> tuple[str, int]:
        return reader.string(offset, self.name, self.utf8)


@dataclass(frozen=True)
class _Bytes:
    """A length-prefixed byte field, at most ``max_length`` bytes where that is given (``noun`` in errors)."""

    name: str
    max_length: int | None = None
    noun: str = ""

    def pack(self, value: bytes) -> bytes:
        if self.max_length is not None and len(value) > self.max_length:
            raise ValueError(f"{self.noun or self.name} of {len(value)} bytes exceeds {self.max_length}")
        return _I32.pack(len(value)) + bytes(value)

    def unpack(self, reader: _Reader, offset: int) -> tuple[bytes, int]:
        return reader.raw(offset, self.name, self.max_length)


class _Message:
    """Base of the message dataclasses: ``encode() -> bytes`` and ``decode(body) -> message``.

    One codec for every layout: the fields, in declaration order, are first the ``_FIXED`` struct's, then one
    per ``_TAIL`` entry, each variable-length field starting at the next 4-byte boundary after the last.
    """

    _FIXED: ClassVar[struct.Struct]
    _TAIL: ClassVar[tuple[_Text | _Bytes, ...]] = ()

    def encode(self) -> bytes:
        values = [getattr(self, f.name) for f in fields(self)]  # type: ignore[arg-type]
        fixed = len(values) - len(self._TAIL)
        body = self._FIXED.pack(*values[:fixed])
        for tail, value in zip(self._TAIL, values[fixed:], strict=True):
            body += b"\0" * (_align4(len(body)) - len(body)) + tail.pack(value)
        return body

    @classmethod
    def decode(cls, data: Buffer) -> Any:
        reader = _Reader(data, cls.__name__)
        values: list[Any] = list(reader.fixed(cls._FIXED, 0))
        end = cls._FIXED.size
        for tail in cls._TAIL:
            value, end = tail.unpack(reader, _align4(end))
            values.append(value)
        return cls(*values)


# -- commands ----------------------------------------------------------------------------------------

_CORRELATED = struct.Struct("<qq")
_ID_ID_I32 = struct.Struct("<qqi")
_ID_ID_ID = struct.Struct("<qqq")
_CHANNEL = (_Text("channel"),)
_COUNTER_TAIL = (_Bytes("key", MAX_COUNTER_KEY_LENGTH, "counter key"), _Text("label"))


@dataclass(frozen=True)
class CorrelatedMessage(_Message):
    """CLIENT_KEEPALIVE, CLIENT_CLOSE, and the header of every command."""

    _FIXED = _CORRELATED

    client_id: int
    correlation_id: int


@dataclass(frozen=True)
class PublicationMessage(_Message):
    """ADD_PUBLICATION, ADD_EXCLUSIVE_PUBLICATION."""

    _FIXED = _ID_ID_I32
    _TAIL = _CHANNEL

    client_id: int
    correlation_id: int
    stream_id: int
    channel: str


@dataclass(frozen=True)
class SubscriptionMessage(_Message):
    """ADD_SUBSCRIPTION."""

    _FIXED = struct.Struct("<qqqi")
    _TAIL = _CHANNEL

    client_id: int
    correlation_id: int
    registration_correlation_id: int
    stream_id: int
    channel: str


@dataclass(frozen=True)
class RemoveMessage(_Message):
    """REMOVE_PUBLICATION, REMOVE_SUBSCRIPTION, REMOVE_COUNTER."""

    _FIXED = _ID_ID_ID

    client_id: int
    correlation_id: int
    registration_id: int


@dataclass(frozen=True)
class CounterMessage(_Message):
    """ADD_COUNTER: a client-owned counter (key at most 112 bytes)."""

    _FIXED = _ID_ID_I32
    _TAIL = _COUNTER_TAIL

    client_id: int
    correlation_id: int
    type_id: int
    key: bytes
    label: str


@dataclass(frozen=True)
class TerminateDriverMessage(_Message):
    """TERMINATE_DRIVER, with an opaque token the driver checks."""

    _FIXED = _CORRELATED
    _TAIL = (_Bytes("token"),)

    client_id: int
    correlation_id: int
    token: bytes = b""


@dataclass(frozen=True)
class DestinationMessage(_Message):
    """ADD_DESTINATION, REMOVE_DESTINATION (a publication's), ADD_RCV_DESTINATION, REMOVE_RCV_DESTINATION (a
    subscription's): the resource's registration id and the destination channel."""

    _FIXED = _ID_ID_ID
    _TAIL = _CHANNEL

    client_id: int
    correlation_id: int
    registration_id: int
    channel: str


@dataclass(frozen=True)
class DestinationByIdMessage(_Message):
    """REMOVE_DESTINATION_BY_ID: a publication's registration id and the destination's."""

    _FIXED = struct.Struct("<qqqq")

    client_id: int
    correlation_id: int
    registration_id: int
    destination_id: int


@dataclass(frozen=True)
class StaticCounterMessage(_Message):
    """ADD_STATIC_COUNTER: a counter found by (type id, registration id) or made once, owned by no client."""

    _FIXED = struct.Struct("<qqqi")
    _TAIL = _COUNTER_TAIL

    client_id: int
    correlation_id: int
    registration_id: int
    type_id: int
    key: bytes
    label: str


# Aeron's command struct ends in a one-byte reason array, packed to 4: shorter records are malformed
REJECT_IMAGE_MIN_LENGTH = 40


@dataclass(frozen=True)
class RejectImageMessage(_Message):
    """REJECT_IMAGE: an image's correlation id, the position and the reason it is rejected."""

    _FIXED = struct.Struct("<qqqq")
    _TAIL = (_Text("reason", utf8=True),)

    client_id: int
    correlation_id: int
    image_correlation_id: int
    position: int
    reason: str

    def encode(self) -> bytes:
        body = super().encode()
        return body + b"\0" * max(0, REJECT_IMAGE_MIN_LENGTH - len(body))

    @classmethod
    def decode(cls, data: Buffer) -> RejectImageMessage:
        if len(data) < REJECT_IMAGE_MIN_LENGTH:
            raise MalformedCommandError(f"{cls.__name__}: {len(data)} bytes, need at least {REJECT_IMAGE_MIN_LENGTH}")
        message: RejectImageMessage = super().decode(data)
        return message


# -- responses ---------------------------------------------------------------------------------------

_ID_I32 = struct.Struct("<qi")
_I64 = struct.Struct("<q")


@dataclass(frozen=True)
class PublicationReady(_Message):
    """ON_PUBLICATION_READY, ON_EXCLUSIVE_PUBLICATION_READY."""

    _FIXED = struct.Struct("<qqiiii")
    _TAIL = (_Text("logFileName"),)

    correlation_id: int
    registration_id: int
    session_id: int
    stream_id: int
    position_limit_counter_id: int
    channel_status_indicator_id: int
    log_file_name: str


@dataclass(frozen=True)
class SubscriptionReady(_Message):
    """ON_SUBSCRIPTION_READY."""

    _FIXED = _ID_I32

    correlation_id: int
    channel_status_indicator_id: int


@dataclass(frozen=True)
class AvailableImage(_Message):
    """ON_AVAILABLE_IMAGE."""

    _FIXED = struct.Struct("<qiiqi")
    _TAIL = (_Text("logFileName"), _Text("sourceIdentity"))

    correlation_id: int
    session_id: int
    stream_id: int
    subscription_registration_id: int
    subscriber_position_id: int
    log_file_name: str
    source_identity: str


@dataclass(frozen=True)
class UnavailableImage(_Message):
    """ON_UNAVAILABLE_IMAGE."""

    _FIXED = struct.Struct("<qqi")
    _TAIL = _CHANNEL

    correlation_id: int
    subscription_registration_id: int
    stream_id: int
    channel: str


@dataclass(frozen=True)
class OperationSuccess(_Message):
    """ON_OPERATION_SUCCESS."""

    _FIXED = _I64

    correlation_id: int


_ERROR_CODES = frozenset(int(code) for code in ErrorCode)


@dataclass(frozen=True)
class ErrorResponse(_Message):
    """ON_ERROR (``error_code`` is an ErrorCode when known, else the raw int)."""

    _FIXED = _ID_I32
    _TAIL = (_Text("message"),)

    offending_correlation_id: int
    error_code: int
    message: str

    @classmethod
    def decode(cls, data: Buffer) -> ErrorResponse:
        response: ErrorResponse = super().decode(data)
        if response.error_code in _ERROR_CODES:  # a code from a newer driver keeps its number
            response = replace(response, error_code=ErrorCode(response.error_code))
        return response


@dataclass(frozen=True)
class ClientTimeout(_Message):
    """ON_CLIENT_TIMEOUT."""

    _FIXED = _I64

    client_id: int


@dataclass(frozen=True)
class CounterUpdate(_Message):
    """ON_COUNTER_READY, ON_UNAVAILABLE_COUNTER."""

    _FIXED = _ID_I32

    correlation_id: int
    counter_id: int


# -- dispatch ----------------------------------------------------------------------------------------

COMMAND_TYPES: dict[ControlCommand, type[_Message]] = {
    ControlCommand.ADD_PUBLICATION: PublicationMessage,
    ControlCommand.REMOVE_PUBLICATION: RemoveMessage,
    ControlCommand.ADD_EXCLUSIVE_PUBLICATION: PublicationMessage,
    ControlCommand.ADD_SUBSCRIPTION: SubscriptionMessage,
    ControlCommand.REMOVE_SUBSCRIPTION: RemoveMessage,
    ControlCommand.CLIENT_KEEPALIVE: CorrelatedMessage,
    ControlCommand.ADD_COUNTER: CounterMessage,
    ControlCommand.REMOVE_COUNTER: RemoveMessage,
    ControlCommand.CLIENT_CLOSE: CorrelatedMessage,
    ControlCommand.TERMINATE_DRIVER: TerminateDriverMessage,
    ControlCommand.ADD_DESTINATION: DestinationMessage,
    ControlCommand.REMOVE_DESTINATION: DestinationMessage,
    ControlCommand.ADD_RCV_DESTINATION: DestinationMessage,
    ControlCommand.REMOVE_RCV_DESTINATION: DestinationMessage,
    ControlCommand.ADD_STATIC_COUNTER: StaticCounterMessage,
    ControlCommand.REJECT_IMAGE: RejectImageMessage,
    ControlCommand.REMOVE_DESTINATION_BY_ID: DestinationByIdMessage,
}

RESPONSE_TYPES: dict[ControlResponse, type[_Message]] = {
    ControlResponse.ON_ERROR: ErrorResponse,
    ControlResponse.ON_AVAILABLE_IMAGE: AvailableImage,
    ControlResponse.ON_PUBLICATION_READY: PublicationReady,
    ControlResponse.ON_OPERATION_SUCCESS: OperationSuccess,
    ControlResponse.ON_UNAVAILABLE_IMAGE: UnavailableImage,
    ControlResponse.ON_EXCLUSIVE_PUBLICATION_READY: PublicationReady,
    ControlResponse.ON_SUBSCRIPTION_READY: SubscriptionReady,
    ControlResponse.ON_COUNTER_READY: CounterUpdate,
    ControlResponse.ON_UNAVAILABLE_COUNTER: CounterUpdate,
    ControlResponse.ON_CLIENT_TIMEOUT: ClientTimeout,
    ControlResponse.ON_STATIC_COUNTER: CounterUpdate,
}

_COMMAND_BY_ID: dict[int, type[_Message]] = {int(k): v for k, v in COMMAND_TYPES.items()}
_RESPONSE_BY_ID: dict[int, type[_Message]] = {int(k): v for k, v in RESPONSE_TYPES.items()}


def decode_command(msg_type_id: int, body: Buffer) -> Any:
    """The command message of a to-driver record; UnknownCommandTypeError / MalformedCommandError if not."""
    cls = _COMMAND_BY_ID.get(msg_type_id)
    if cls is None:
        raise UnknownCommandTypeError(f"unknown command type id {msg_type_id:#x}")
    return cls.decode(body)


def decode_response(msg_type_id: int, body: Buffer) -> Any:
    """The response message of a to-clients record; UnknownCommandTypeError / MalformedCommandError if not."""
    cls = _RESPONSE_BY_ID.get(msg_type_id)
    if cls is None:
        raise UnknownCommandTypeError(f"unknown response type id {msg_type_id:#x}")
    return cls.decode(body)
