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
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

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

    def string(self, offset: int, field: str) -> tuple[str, int]:
        data, end = self.raw(offset, field)
        try:
            return data.decode("ascii"), end
        except UnicodeDecodeError:
            raise MalformedCommandError(f"{self.what}: {field} is not ASCII") from None


class _Message:
    """Base of the message dataclasses: ``encode() -> bytes`` and ``decode(body) -> message``."""

    def encode(self) -> bytes:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    @classmethod
    def decode(cls, data: Buffer) -> Any:  # pragma: no cover
        raise NotImplementedError


# -- commands ----------------------------------------------------------------------------------------

_CORRELATED = struct.Struct("<qq")


@dataclass(frozen=True)
class CorrelatedMessage(_Message):
    """CLIENT_KEEPALIVE, CLIENT_CLOSE, and the header of every command."""

    client_id: int
    correlation_id: int

    def encode(self) -> bytes:
        return _CORRELATED.pack(self.client_id, self.correlation_id)

    @classmethod
    def decode(cls, data: Buffer) -> CorrelatedMessage:
        return cls(*_Reader(data, cls.__name__).fixed(_CORRELATED, 0))


_PUBLICATION = struct.Struct("<qqi")


@dataclass(frozen=True)
class PublicationMessage(_Message):
    """ADD_PUBLICATION, ADD_EXCLUSIVE_PUBLICATION."""

    client_id: int
    correlation_id: int
    stream_id: int
    channel: str

    def encode(self) -> bytes:
        return _PUBLICATION.pack(self.client_id, self.correlation_id, self.stream_id) + _string(self.channel)

    @classmethod
    def decode(cls, data: Buffer) -> PublicationMessage:
        reader = _Reader(data, cls.__name__)
        client_id, correlation_id, stream_id = reader.fixed(_PUBLICATION, 0)
        channel, _ = reader.string(_PUBLICATION.size, "channel")
        return cls(client_id, correlation_id, stream_id, channel)


_SUBSCRIPTION = struct.Struct("<qqqi")


@dataclass(frozen=True)
class SubscriptionMessage(_Message):
    """ADD_SUBSCRIPTION."""

    client_id: int
    correlation_id: int
    registration_correlation_id: int
    stream_id: int
    channel: str

    def encode(self) -> bytes:
        return _SUBSCRIPTION.pack(
            self.client_id, self.correlation_id, self.registration_correlation_id, self.stream_id
        ) + _string(self.channel)

    @classmethod
    def decode(cls, data: Buffer) -> SubscriptionMessage:
        reader = _Reader(data, cls.__name__)
        client_id, correlation_id, registration_correlation_id, stream_id = reader.fixed(_SUBSCRIPTION, 0)
        channel, _ = reader.string(_SUBSCRIPTION.size, "channel")
        return cls(client_id, correlation_id, registration_correlation_id, stream_id, channel)


_REMOVE = struct.Struct("<qqq")


@dataclass(frozen=True)
class RemoveMessage(_Message):
    """REMOVE_PUBLICATION, REMOVE_SUBSCRIPTION, REMOVE_COUNTER."""

    client_id: int
    correlation_id: int
    registration_id: int

    def encode(self) -> bytes:
        return _REMOVE.pack(self.client_id, self.correlation_id, self.registration_id)

    @classmethod
    def decode(cls, data: Buffer) -> RemoveMessage:
        return cls(*_Reader(data, cls.__name__).fixed(_REMOVE, 0))


@dataclass(frozen=True)
class CounterMessage(_Message):
    """ADD_COUNTER: a client-owned counter (key at most 112 bytes)."""

    client_id: int
    correlation_id: int
    type_id: int
    key: bytes
    label: str

    def encode(self) -> bytes:
        if len(self.key) > MAX_COUNTER_KEY_LENGTH:
            raise ValueError(f"counter key of {len(self.key)} bytes exceeds {MAX_COUNTER_KEY_LENGTH}")
        key = bytes(self.key)
        padding = b"\0" * (_align4(len(key)) - len(key))
        return _PUBLICATION.pack(self.client_id, self.correlation_id, self.type_id) + (
            _I32.pack(len(key)) + key + padding + _string(self.label)
        )

    @classmethod
    def decode(cls, data: Buffer) -> CounterMessage:
        reader = _Reader(data, cls.__name__)
        client_id, correlation_id, type_id = reader.fixed(_PUBLICATION, 0)
        key, end = reader.raw(_PUBLICATION.size, "key", MAX_COUNTER_KEY_LENGTH)
        label, _ = reader.string(_align4(end), "label")
        return cls(client_id, correlation_id, type_id, key, label)


@dataclass(frozen=True)
class TerminateDriverMessage(_Message):
    """TERMINATE_DRIVER, with an opaque token the driver checks."""

    client_id: int
    correlation_id: int
    token: bytes = b""

    def encode(self) -> bytes:
        return _CORRELATED.pack(self.client_id, self.correlation_id) + _I32.pack(len(self.token)) + self.token

    @classmethod
    def decode(cls, data: Buffer) -> TerminateDriverMessage:
        reader = _Reader(data, cls.__name__)
        client_id, correlation_id = reader.fixed(_CORRELATED, 0)
        token, _ = reader.raw(_CORRELATED.size, "token")
        return cls(client_id, correlation_id, token)


_DESTINATION = struct.Struct("<qqq")


@dataclass(frozen=True)
class DestinationMessage(_Message):
    """ADD_DESTINATION, REMOVE_DESTINATION (a publication's), ADD_RCV_DESTINATION, REMOVE_RCV_DESTINATION (a
    subscription's): the resource's registration id and the destination channel."""

    client_id: int
    correlation_id: int
    registration_id: int
    channel: str

    def encode(self) -> bytes:
        return _DESTINATION.pack(self.client_id, self.correlation_id, self.registration_id) + _string(self.channel)

    @classmethod
    def decode(cls, data: Buffer) -> DestinationMessage:
        reader = _Reader(data, cls.__name__)
        client_id, correlation_id, registration_id = reader.fixed(_DESTINATION, 0)
        channel, _ = reader.string(_DESTINATION.size, "channel")
        return cls(client_id, correlation_id, registration_id, channel)


_DESTINATION_BY_ID = struct.Struct("<qqqq")


@dataclass(frozen=True)
class DestinationByIdMessage(_Message):
    """REMOVE_DESTINATION_BY_ID: a publication's registration id and the destination's."""

    client_id: int
    correlation_id: int
    registration_id: int
    destination_id: int

    def encode(self) -> bytes:
        return _DESTINATION_BY_ID.pack(self.client_id, self.correlation_id, self.registration_id,
                                       self.destination_id)

    @classmethod
    def decode(cls, data: Buffer) -> DestinationByIdMessage:
        return cls(*_Reader(data, cls.__name__).fixed(_DESTINATION_BY_ID, 0))


_STATIC_COUNTER = struct.Struct("<qqqi")


@dataclass(frozen=True)
class StaticCounterMessage(_Message):
    """ADD_STATIC_COUNTER: a counter found by (type id, registration id) or made once, owned by no client."""

    client_id: int
    correlation_id: int
    registration_id: int
    type_id: int
    key: bytes
    label: str

    def encode(self) -> bytes:
        if len(self.key) > MAX_COUNTER_KEY_LENGTH:
            raise ValueError(f"counter key of {len(self.key)} bytes exceeds {MAX_COUNTER_KEY_LENGTH}")
        key = bytes(self.key)
        padding = b"\0" * (_align4(len(key)) - len(key))
        return _STATIC_COUNTER.pack(self.client_id, self.correlation_id, self.registration_id, self.type_id) + (
            _I32.pack(len(key)) + key + padding + _string(self.label)
        )

    @classmethod
    def decode(cls, data: Buffer) -> StaticCounterMessage:
        reader = _Reader(data, cls.__name__)
        client_id, correlation_id, registration_id, type_id = reader.fixed(_STATIC_COUNTER, 0)
        key, end = reader.raw(_STATIC_COUNTER.size, "key", MAX_COUNTER_KEY_LENGTH)
        label, _ = reader.string(_align4(end), "label")
        return cls(client_id, correlation_id, registration_id, type_id, key, label)


_REJECT_IMAGE = struct.Struct("<qqqq")
# Aeron's command struct ends in a one-byte reason array, packed to 4: shorter records are malformed
REJECT_IMAGE_MIN_LENGTH = 40


@dataclass(frozen=True)
class RejectImageMessage(_Message):
    """REJECT_IMAGE: an image's correlation id, the position and the reason it is rejected."""

    client_id: int
    correlation_id: int
    image_correlation_id: int
    position: int
    reason: str

    def encode(self) -> bytes:
        body = _REJECT_IMAGE.pack(self.client_id, self.correlation_id, self.image_correlation_id,
                                  self.position) + _string(self.reason)
        return body + b"\0" * max(0, REJECT_IMAGE_MIN_LENGTH - len(body))

    @classmethod
    def decode(cls, data: Buffer) -> RejectImageMessage:
        if len(data) < REJECT_IMAGE_MIN_LENGTH:
            raise MalformedCommandError(f"{cls.__name__}: {len(data)} bytes, need at least {REJECT_IMAGE_MIN_LENGTH}")
        reader = _Reader(data, cls.__name__)
        client_id, correlation_id, image_correlation_id, position = reader.fixed(_REJECT_IMAGE, 0)
        reason, _ = reader.string(_REJECT_IMAGE.size, "reason")
        return cls(client_id, correlation_id, image_correlation_id, position, reason)


# -- responses ---------------------------------------------------------------------------------------

_PUBLICATION_READY = struct.Struct("<qqiiii")


@dataclass(frozen=True)
class PublicationReady(_Message):
    """ON_PUBLICATION_READY, ON_EXCLUSIVE_PUBLICATION_READY."""

    correlation_id: int
    registration_id: int
    session_id: int
    stream_id: int
    position_limit_counter_id: int
    channel_status_indicator_id: int
    log_file_name: str

    def encode(self) -> bytes:
        return _PUBLICATION_READY.pack(
            self.correlation_id,
            self.registration_id,
            self.session_id,
            self.stream_id,
            self.position_limit_counter_id,
            self.channel_status_indicator_id,
        ) + _string(self.log_file_name)

    @classmethod
    def decode(cls, data: Buffer) -> PublicationReady:
        reader = _Reader(data, cls.__name__)
        (correlation_id, registration_id, session_id, stream_id, position_limit_counter_id,
         channel_status_indicator_id) = reader.fixed(_PUBLICATION_READY, 0)
        log_file_name, _ = reader.string(_PUBLICATION_READY.size, "logFileName")
        return cls(correlation_id, registration_id, session_id, stream_id, position_limit_counter_id,
                   channel_status_indicator_id, log_file_name)


_SUBSCRIPTION_READY = struct.Struct("<qi")


@dataclass(frozen=True)
class SubscriptionReady(_Message):
    """ON_SUBSCRIPTION_READY."""

    correlation_id: int
    channel_status_indicator_id: int

    def encode(self) -> bytes:
        return _SUBSCRIPTION_READY.pack(self.correlation_id, self.channel_status_indicator_id)

    @classmethod
    def decode(cls, data: Buffer) -> SubscriptionReady:
        return cls(*_Reader(data, cls.__name__).fixed(_SUBSCRIPTION_READY, 0))


_AVAILABLE_IMAGE = struct.Struct("<qiiqi")


@dataclass(frozen=True)
class AvailableImage(_Message):
    """ON_AVAILABLE_IMAGE."""

    correlation_id: int
    session_id: int
    stream_id: int
    subscription_registration_id: int
    subscriber_position_id: int
    log_file_name: str
    source_identity: str

    def encode(self) -> bytes:
        head = _AVAILABLE_IMAGE.pack(
            self.correlation_id,
            self.session_id,
            self.stream_id,
            self.subscription_registration_id,
            self.subscriber_position_id,
        ) + _string(self.log_file_name)
        return head + b"\0" * (_align4(len(head)) - len(head)) + _string(self.source_identity)

    @classmethod
    def decode(cls, data: Buffer) -> AvailableImage:
        reader = _Reader(data, cls.__name__)
        correlation_id, session_id, stream_id, subscription_registration_id, subscriber_position_id = (
            reader.fixed(_AVAILABLE_IMAGE, 0))
        log_file_name, end = reader.string(_AVAILABLE_IMAGE.size, "logFileName")
        source_identity, _ = reader.string(_align4(end), "sourceIdentity")
        return cls(correlation_id, session_id, stream_id, subscription_registration_id, subscriber_position_id,
                   log_file_name, source_identity)


_UNAVAILABLE_IMAGE = struct.Struct("<qqi")


@dataclass(frozen=True)
class UnavailableImage(_Message):
    """ON_UNAVAILABLE_IMAGE."""

    correlation_id: int
    subscription_registration_id: int
    stream_id: int
    channel: str

    def encode(self) -> bytes:
        return _UNAVAILABLE_IMAGE.pack(
            self.correlation_id, self.subscription_registration_id, self.stream_id
        ) + _string(self.channel)

    @classmethod
    def decode(cls, data: Buffer) -> UnavailableImage:
        reader = _Reader(data, cls.__name__)
        correlation_id, subscription_registration_id, stream_id = reader.fixed(_UNAVAILABLE_IMAGE, 0)
        channel, _ = reader.string(_UNAVAILABLE_IMAGE.size, "channel")
        return cls(correlation_id, subscription_registration_id, stream_id, channel)


_I64 = struct.Struct("<q")


@dataclass(frozen=True)
class OperationSuccess(_Message):
    """ON_OPERATION_SUCCESS."""

    correlation_id: int

    def encode(self) -> bytes:
        return _I64.pack(self.correlation_id)

    @classmethod
    def decode(cls, data: Buffer) -> OperationSuccess:
        return cls(*_Reader(data, cls.__name__).fixed(_I64, 0))


_ERROR = struct.Struct("<qi")
_ERROR_CODES = frozenset(int(code) for code in ErrorCode)


@dataclass(frozen=True)
class ErrorResponse(_Message):
    """ON_ERROR (``error_code`` is an ErrorCode when known, else the raw int)."""

    offending_correlation_id: int
    error_code: int
    message: str

    def encode(self) -> bytes:
        return _ERROR.pack(self.offending_correlation_id, self.error_code) + _string(self.message)

    @classmethod
    def decode(cls, data: Buffer) -> ErrorResponse:
        reader = _Reader(data, cls.__name__)
        correlation_id, code = reader.fixed(_ERROR, 0)
        message, _ = reader.string(_ERROR.size, "message")
        if code in _ERROR_CODES:  # a code from a newer driver keeps its number
            code = ErrorCode(code)
        return cls(correlation_id, code, message)


@dataclass(frozen=True)
class ClientTimeout(_Message):
    """ON_CLIENT_TIMEOUT."""

    client_id: int

    def encode(self) -> bytes:
        return _I64.pack(self.client_id)

    @classmethod
    def decode(cls, data: Buffer) -> ClientTimeout:
        return cls(*_Reader(data, cls.__name__).fixed(_I64, 0))


@dataclass(frozen=True)
class CounterUpdate(_Message):
    """ON_COUNTER_READY, ON_UNAVAILABLE_COUNTER."""

    correlation_id: int
    counter_id: int

    def encode(self) -> bytes:
        return _SUBSCRIPTION_READY.pack(self.correlation_id, self.counter_id)

    @classmethod
    def decode(cls, data: Buffer) -> CounterUpdate:
        return cls(*_Reader(data, cls.__name__).fixed(_SUBSCRIPTION_READY, 0))


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
