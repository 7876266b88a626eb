"""``logbuf logdump FILE``: a log buffer's metadata, its three tails and the frames of each term.

See ``logbuf.logbuffer.descriptor`` for the file layout and ``logbuf.logbuffer.frame`` for the header.
For each partition the dump walks frames from offset 0 up to the partition's tail offset (capped at the
term length), the way a reader would but without skipping anything:

* a positive length is a committed frame (DATA, PAD, …);
* a negative length is a frame being written: claimed (``try_claim``) or mid-``offer`` and not yet
  committed — or stalled by a dead publisher until the driver unblocks it.  It is shown as ``in-flight``
  with its ``-length`` and the walk steps over it (committed frames of other writers may follow);
* a zero length stops the walk: space reserved but not yet written to, or already cleaned;
* a length that cannot be a frame (shorter than a header, running past the tail) stops the walk as
  corrupt, so a damaged file is reported, never followed out of its term.

Reading never writes; the file may be live (a publisher appending while it is dumped).
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from logbuf.errors import InvalidLogBufferError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import AtomicBuffer
from logbuf.tools import _fmt
from logbuf.tools.exit_codes import MissingFileError, UnusableFileError

DEFAULT_MAX_FRAMES = 32  # per partition
DEFAULT_PREVIEW_BYTES = 16

FRAME_TYPE_NAMES: dict[int, str] = {
    f.HDR_TYPE_PAD: "PAD",
    f.HDR_TYPE_DATA: "DATA",
    f.HDR_TYPE_NAK: "NAK",
    f.HDR_TYPE_SM: "SM",
    f.HDR_TYPE_ERR: "ERR",
    f.HDR_TYPE_SETUP: "SETUP",
    f.HDR_TYPE_RTTM: "RTTM",
    f.HDR_TYPE_RES: "RES",
    f.HDR_TYPE_RSP_SETUP: "RSP_SETUP",
    f.HDR_TYPE_EXT: "EXT",
}

_FLAG_LETTERS = ((f.BEGIN_FLAG, "B"), (f.END_FLAG, "E"), (f.EOS_FLAG, "S"))


def frame_type_name(type_id: int) -> str:
    return FRAME_TYPE_NAMES.get(type_id, f"0x{type_id:04x}")


def flags_text(flags: int) -> str:
    """``BE`` (unfragmented), ``B``, ``E``, ``S`` (end of stream); other bits as ``+0x..``; ``-`` for none."""
    text = "".join(letter for bit, letter in _FLAG_LETTERS if flags & bit)
    rest = flags & ~(f.BEGIN_FLAG | f.END_FLAG | f.EOS_FLAG) & 0xFF
    if rest:
        text += f"+0x{rest:02x}"
    return text or "-"


@dataclass(frozen=True)
class FrameHeaderFields:
    """The 32-byte data frame header, decoded."""

    frame_length: int
    version: int
    flags: int
    type: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int

    @classmethod
    def unpack(cls, data: bytes) -> FrameHeaderFields:
        return cls(*f.HEADER_STRUCT.unpack_from(data, 0))

    @property
    def type_name(self) -> str:
        return frame_type_name(self.type)

    @property
    def flags_text(self) -> str:
        return flags_text(self.flags)

    def to_dict(self) -> dict[str, object]:
        return {
            "frame_length": self.frame_length,
            "version": self.version,
            "flags": self.flags,
            "flags_text": self.flags_text,
            "type": self.type,
            "type_name": self.type_name,
            "term_offset": self.term_offset,
            "session_id": self.session_id,
            "stream_id": self.stream_id,
            "term_id": self.term_id,
            "reserved_value": self.reserved_value,
        }

    def describe(self) -> str:
        return (
            f"session {self.session_id}, stream {self.stream_id}, term id {self.term_id}, "
            f"flags {self.flags_text} (0x{self.flags:02x}), type {self.type_name}, version {self.version}, "
            f"length {self.frame_length}"
        )


class FrameState(str, enum.Enum):
    COMMITTED = "committed"
    IN_FLIGHT = "in-flight"  # negative length: claimed or being written, not committed (or stalled)


@dataclass(frozen=True)
class FrameRecord:
    term_offset: int
    position: int  # stream position of the frame's first byte
    state: FrameState
    header: FrameHeaderFields  # header.frame_length as read: negative while in flight
    payload_length: int
    preview: bytes  # the first payload bytes

    @property
    def aligned_length(self) -> int:
        return f.align(abs(self.header.frame_length))

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "term_offset": self.term_offset,
            "position": self.position,
            "state": self.state.value,
        }
        out.update(self.header.to_dict())
        out["payload_length"] = self.payload_length
        out["payload_preview_hex"] = self.preview.hex()
        return out


class StopReason(str, enum.Enum):
    TAIL = "tail"  # walked up to the tail (or the end of the term)
    ZERO_LENGTH = "zero-length"  # a zero length before the tail: not yet written, or cleaned
    FRAME_LIMIT = "frame-limit"  # --frames reached
    CORRUPT = "corrupt"  # a length that cannot be a frame
    UNUSED = "unused"  # the partition has not been used yet (term count < 0)


@dataclass(frozen=True)
class TailInfo:
    partition: int
    raw: int
    term_id: int
    raw_term_offset: int  # may exceed the term length (writers that overshot when the term filled)
    term_offset: int  # capped at the term length
    term_count: int  # terms since the initial one; < 0 for a partition not used yet
    position: int | None  # None for a partition not used yet
    active: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "partition": self.partition,
            "raw": self.raw,
            "term_id": self.term_id,
            "raw_term_offset": self.raw_term_offset,
            "term_offset": self.term_offset,
            "term_count": self.term_count,
            "position": self.position,
            "active": self.active,
        }


@dataclass(frozen=True)
class TermDump:
    partition: int
    term_id: int
    tail_offset: int
    frames: tuple[FrameRecord, ...]
    stop: StopReason
    stop_offset: int
    stop_length: int  # the length read where the walk stopped (CORRUPT), else 0

    def describe_stop(self, term_length: int) -> str:
        if self.stop is StopReason.UNUSED:
            return "not used yet"
        if self.stop is StopReason.TAIL:
            return "reached the end of the term" if self.stop_offset >= term_length else "reached the tail"
        if self.stop is StopReason.ZERO_LENGTH:
            return (
                f"zero length at offset {self.stop_offset:,} before the tail at {self.tail_offset:,}: "
                f"reserved but not written yet, or cleaned"
            )
        if self.stop is StopReason.FRAME_LIMIT:
            return f"stopped after {len(self.frames)} frames at offset {self.stop_offset:,} (--frames)"
        return f"CORRUPT frame length {self.stop_length} at offset {self.stop_offset:,}"

    def to_dict(self, term_length: int) -> dict[str, object]:
        return {
            "partition": self.partition,
            "term_id": self.term_id,
            "tail_offset": self.tail_offset,
            "stop": self.stop.value,
            "stop_offset": self.stop_offset,
            "stop_detail": self.describe_stop(term_length),
            "frames": [fr.to_dict() for fr in self.frames],
        }


@dataclass(frozen=True)
class LogMetadata:
    file_length: int
    term_length: int
    page_size: int
    mtu: int
    position_bits: int
    initial_term_id: int
    correlation_id: int
    is_connected: bool
    active_transport_count: int
    active_term_count: int
    end_of_stream_position: int | None  # None while INT64_MAX (no end of stream)
    publication_window_length: int
    receiver_window_length: int
    linger_timeout_ns: int
    max_message_length: int
    max_payload_length: int
    default_frame_header: FrameHeaderFields

    @property
    def active_partition(self) -> int:
        return d.index_by_term_count(self.active_term_count)

    def to_dict(self) -> dict[str, object]:
        return {
            "file_length": self.file_length,
            "term_length": self.term_length,
            "page_size": self.page_size,
            "mtu": self.mtu,
            "position_bits": self.position_bits,
            "initial_term_id": self.initial_term_id,
            "correlation_id": self.correlation_id,
            "is_connected": self.is_connected,
            "active_transport_count": self.active_transport_count,
            "active_term_count": self.active_term_count,
            "active_partition": self.active_partition,
            "end_of_stream_position": self.end_of_stream_position,
            "publication_window_length": self.publication_window_length,
            "receiver_window_length": self.receiver_window_length,
            "linger_timeout_ns": self.linger_timeout_ns,
            "max_message_length": self.max_message_length,
            "max_payload_length": self.max_payload_length,
            "default_frame_header": self.default_frame_header.to_dict(),
        }


@dataclass(frozen=True)
class LogDump:
    path: str
    metadata: LogMetadata
    tails: tuple[TailInfo, ...]
    producer_position: int
    terms: tuple[TermDump, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "metadata": self.metadata.to_dict(),
            "tails": [t.to_dict() for t in self.tails],
            "producer_position": self.producer_position,
            "terms": [t.to_dict(self.metadata.term_length) for t in self.terms],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)


# -- reading -------------------------------------------------------------------------------------------


def open_log(path: str | os.PathLike[str]) -> LogBuffers:
    """Maps a log buffer file, or raises MissingFileError / UnusableFileError with the reason."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"no log buffer file {path}")
    if not path.is_file():
        raise UnusableFileError(f"{path} is not a regular file")
    try:
        return LogBuffers.open(path)
    except InvalidLogBufferError as exc:
        raise UnusableFileError(f"not a log buffer: {exc}") from None


def _read_metadata(log: LogBuffers) -> LogMetadata:
    meta = log.meta
    eos = meta.get_i64_acquire(d.LOG_END_OF_STREAM_POSITION_OFFSET)
    return LogMetadata(
        file_length=log.file_length,
        term_length=log.term_length,
        page_size=log.page_size,
        mtu=log.mtu,
        position_bits=log.position_bits,
        initial_term_id=log.initial_term_id,
        correlation_id=log.correlation_id,
        is_connected=log.is_connected,
        active_transport_count=meta.get_i32_acquire(d.LOG_ACTIVE_TRANSPORT_COUNT_OFFSET),
        active_term_count=log.active_term_count,
        end_of_stream_position=None if eos == d.INT64_MAX else eos,
        publication_window_length=meta.get_i32(d.LOG_PUBLICATION_WINDOW_LENGTH_OFFSET),
        receiver_window_length=meta.get_i32(d.LOG_RECEIVER_WINDOW_LENGTH_OFFSET),
        linger_timeout_ns=meta.get_i64(d.LOG_LINGER_TIMEOUT_NS_OFFSET),
        max_message_length=log.max_message_length,
        max_payload_length=log.max_payload_length,
        default_frame_header=FrameHeaderFields.unpack(
            meta.get_bytes(d.LOG_DEFAULT_FRAME_HEADER_OFFSET, f.HEADER_LENGTH)
        ),
    )


def _read_tails(log: LogBuffers, active_term_count: int) -> tuple[TailInfo, ...]:
    active = d.index_by_term_count(active_term_count)
    tails = []
    for partition in range(d.PARTITION_COUNT):
        raw = log.raw_tail(partition)
        term_id = d.tail_term_id(raw)
        term_offset = d.tail_term_offset(raw, log.term_length)
        term_count = d.compute_term_count(term_id, log.initial_term_id)
        position = None
        if term_count >= 0:
            position = d.compute_position(term_id, term_offset, log.position_bits, log.initial_term_id)
        tails.append(
            TailInfo(
                partition,
                raw,
                term_id,
                raw & 0xFFFFFFFF,
                term_offset,
                term_count,
                position,
                partition == active,
            )
        )
    return tuple(tails)


def _walk_term(log: LogBuffers, tail: TailInfo, max_frames: int | None, preview_bytes: int) -> TermDump:
    terms: AtomicBuffer = log.terms
    base = tail.partition * log.term_length
    frames: list[FrameRecord] = []

    def done(stop: StopReason, offset: int, length: int = 0) -> TermDump:
        return TermDump(tail.partition, tail.term_id, tail.term_offset, tuple(frames), stop, offset, length)

    if tail.term_count < 0:
        return done(StopReason.UNUSED, 0)
    offset = 0
    while offset < tail.term_offset:
        if max_frames is not None and len(frames) >= max_frames:
            return done(StopReason.FRAME_LIMIT, offset)
        length = terms.get_i32_acquire(base + offset)  # acquire: a committed frame's body is visible
        if length == 0:
            return done(StopReason.ZERO_LENGTH, offset)
        size = abs(length)
        # A frame, even one still being written, lies below the tail (writers reserve before writing).
        if size < f.HEADER_LENGTH or offset + f.align(size) > tail.term_offset:
            return done(StopReason.CORRUPT, offset, length)
        header = FrameHeaderFields.unpack(terms.get_bytes(base + offset, f.HEADER_LENGTH))
        if header.frame_length != length:  # committed between our two reads: report what the walk acted on
            header = replace(header, frame_length=length)
        payload_length = size - f.HEADER_LENGTH
        preview = b""
        if header.type != f.HDR_TYPE_PAD and preview_bytes > 0:
            preview = terms.get_bytes(base + offset + f.HEADER_LENGTH, min(preview_bytes, payload_length))
        position = d.compute_position(tail.term_id, offset, log.position_bits, log.initial_term_id)
        state = FrameState.COMMITTED if length > 0 else FrameState.IN_FLIGHT
        frames.append(FrameRecord(offset, position, state, header, payload_length, preview))
        offset += f.align(size)
    return done(StopReason.TAIL, offset)


def dump_log(
    log: LogBuffers,
    *,
    max_frames: int | None = DEFAULT_MAX_FRAMES,
    preview_bytes: int = DEFAULT_PREVIEW_BYTES,
) -> LogDump:
    """Reads an open log: metadata, tails, and up to ``max_frames`` frames per partition (None: all)."""
    metadata = _read_metadata(log)
    tails = _read_tails(log, metadata.active_term_count)
    terms = tuple(_walk_term(log, tail, max_frames, preview_bytes) for tail in tails)
    active = tails[metadata.active_partition]  # pub-pos as the driver samples it, from the same tail read
    producer_position = active.position if active.position is not None else 0
    return LogDump(str(log.path), metadata, tails, producer_position, terms)


def read_log_dump(
    path: str | os.PathLike[str],
    *,
    max_frames: int | None = DEFAULT_MAX_FRAMES,
    preview_bytes: int = DEFAULT_PREVIEW_BYTES,
) -> LogDump:
    """``dump_log`` of the file at ``path``; MissingFileError / UnusableFileError when it cannot be read."""
    log = open_log(path)
    try:
        return dump_log(log, max_frames=max_frames, preview_bytes=preview_bytes)
    finally:
        log.close()


# -- text ----------------------------------------------------------------------------------------------

_FRAME_COLUMNS = (
    f"  {'offset':>10}  {'length':>7}  {'type':<5} {'flags':<5} {'session':>11} {'stream':>11} "
    f"{'term id':>11} {'reserved':>20} {'position':>14}  payload"
)


def format_frame(frame: FrameRecord) -> str:
    h = frame.header
    preview = _fmt.hex_preview(frame.preview, more=frame.payload_length > len(frame.preview))
    if frame.state is FrameState.IN_FLIGHT:
        payload = f"IN FLIGHT (claimed, not committed) [{frame.payload_length:,}] {preview}".rstrip()
    elif h.type == f.HDR_TYPE_PAD:
        payload = f"(padding, {frame.payload_length:,} bytes)"
    else:
        payload = f"[{frame.payload_length:,}] {preview}".rstrip()
    return (
        f"  {frame.term_offset:>10,}  {h.frame_length:>7}  {h.type_name:<5} {h.flags_text:<5} "
        f"{h.session_id:>11} "
        f"{h.stream_id:>11} {h.term_id:>11} {h.reserved_value:>20} {frame.position:>14,}  {payload}"
    )


def format_log_dump(dump: LogDump) -> str:
    m = dump.metadata
    eos = "none" if m.end_of_stream_position is None else f"{m.end_of_stream_position:,}"
    lines = [
        f"log buffer {dump.path}: {m.file_length:,} bytes",
        f"  term length         {m.term_length:,} (position bits {m.position_bits})",
        f"  page size           {m.page_size:,}",
        f"  mtu                 {m.mtu:,} (max payload {m.max_payload_length:,}, "
        f"max message {m.max_message_length:,})",
        f"  initial term id     {m.initial_term_id}",
        f"  correlation id      {m.correlation_id}",
        f"  connected           {'yes' if m.is_connected else 'no'}",
        f"  active transports   {m.active_transport_count}",
        f"  active term count   {m.active_term_count} (partition {m.active_partition})",
        f"  end of stream       {eos}",
        f"  producer position   {dump.producer_position:,}",
        f"  publication window  {m.publication_window_length:,}",
        f"  receiver window     {m.receiver_window_length:,}",
        f"  linger timeout      {m.linger_timeout_ns:,} ns",
        f"  default header      {m.default_frame_header.describe()}",
        "tails",
    ]
    for t in dump.tails:
        mark = "*" if t.active else " "
        if t.position is None:
            where = "not used yet"
        else:
            where = f"position {t.position:,}"
            if t.raw_term_offset > t.term_offset:
                where += f" (raw offset {t.raw_term_offset:,}: writers overshot the end of the term)"
        lines.append(
            f"  {mark} partition {t.partition}: term id {t.term_id}, offset {t.term_offset:,}, {where}"
        )
    for term in dump.terms:
        in_flight = sum(1 for fr in term.frames if fr.state is FrameState.IN_FLIGHT)
        pads = sum(
            1 for fr in term.frames if fr.state is FrameState.COMMITTED and fr.header.type == f.HDR_TYPE_PAD
        )
        counts = f"{len(term.frames)} frames ({pads} pad, {in_flight} in flight)"
        lines.append(
            f"partition {term.partition} (term id {term.term_id}, tail offset {term.tail_offset:,}): "
            f"{counts}; {term.describe_stop(m.term_length)}"
        )
        if term.frames:
            lines.append(_FRAME_COLUMNS)
            lines.extend(format_frame(fr) for fr in term.frames)
    return "\n".join(lines) + "\n"
