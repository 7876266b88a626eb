"""Layout of the command-and-control file ``cnc.dat`` (Aeron's ``CncFileDescriptor``).

The file starts with a 48-byte header; the sections follow from offset 128 (two cache lines), in this
order, back to back::

    0 +--------------------------------------------------+
      | CnC version  (major << 16 | minor << 8 | patch)  |  i32   stored LAST, with release
    4 | to-driver buffer length  (capacity + 768)        |  i32
    8 | to-clients buffer length (capacity + 128)        |  i32
   12 | counters metadata length (4 x values length)     |  i32
   16 | counters values length   (n x 128)               |  i32
   20 | error log length                                 |  i32
   24 | client liveness timeout ns                       |  i64
   32 | driver start timestamp ms                        |  i64
   40 | driver pid                                       |  i64
   48 +--------------------------------------------------+
      | (zero up to the end of the metadata block)       |
  128 +--------------------------------------------------+
      | to-driver: many-to-one ring buffer + trailer     |  ring_buffer.py
      +--------------------------------------------------+
      | to-clients: broadcast buffer + trailer           |  broadcast.py
      +--------------------------------------------------+
      | counters metadata (512-byte records)             |  counters.py
      +--------------------------------------------------+
      | counters values (128-byte records)               |  counters.py
      +--------------------------------------------------+
      | distinct error log                               |  error_log.py
      +--------------------------------------------------+  128 + sum of the lengths (file may be longer)

A version of 0 means "the driver is still initialising the file": the driver writes every other byte first
and the version last with a release store, so a client that reads a non-zero version with acquire sees a
complete header.  Versions are compatible when their major parts match (Aeron's is 0.2.0 = 512).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from logbuf.cnc.errors import CncFileError, CncNotReadyError, CncVersionError

# -- semantic version --------------------------------------------------------------------------------


def compose_version(major: int, minor: int, patch: int) -> int:
    """``(major << 16) | (minor << 8) | patch`` (Aeron's ``SemanticVersion.compose``)."""
    if not (0 <= major <= 255 and 0 <= minor <= 255 and 0 <= patch <= 255) or major + minor + patch == 0:
        raise ValueError(f"invalid semantic version {major}.{minor}.{patch}")
    return (major << 16) | (minor << 8) | patch


def version_major(version: int) -> int:
    return (version >> 16) & 0xFF


def version_minor(version: int) -> int:
    return (version >> 8) & 0xFF


def version_patch(version: int) -> int:
    return version & 0xFF


def version_string(version: int) -> str:
    return f"{version_major(version)}.{version_minor(version)}.{version_patch(version)}"


CNC_VERSION = compose_version(0, 2, 0)  # 512, Aeron's
CNC_FILE_NAME = "cnc.dat"

# -- header ------------------------------------------------------------------------------------------

CNC_VERSION_OFFSET = 0
TO_DRIVER_BUFFER_LENGTH_OFFSET = 4
TO_CLIENTS_BUFFER_LENGTH_OFFSET = 8
COUNTERS_METADATA_LENGTH_OFFSET = 12
COUNTERS_VALUES_LENGTH_OFFSET = 16
ERROR_LOG_LENGTH_OFFSET = 20
CLIENT_LIVENESS_TIMEOUT_OFFSET = 24
START_TIMESTAMP_OFFSET = 32
PID_OFFSET = 40
HEADER_LENGTH = 48
END_OF_METADATA_OFFSET = 128  # sections start two cache lines in, so the header never shares a line with them

# Trailers of the two command buffers (their capacities exclude them).
TO_DRIVER_TRAILER_LENGTH = 768
TO_CLIENTS_TRAILER_LENGTH = 128
COUNTER_VALUE_LENGTH = 128
COUNTER_METADATA_LENGTH = 512
METADATA_TO_VALUES_RATIO = COUNTER_METADATA_LENGTH // COUNTER_VALUE_LENGTH  # 4

MIN_BUFFER_CAPACITY = 64  # smallest power-of-two ring/broadcast capacity accepted (max message = capacity/8)
MAX_BUFFER_CAPACITY = 1 << 30

_HEADER = struct.Struct("<iiiiiiqqq")  # the 48 bytes above, in order
assert _HEADER.size == HEADER_LENGTH


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def align(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of ``alignment`` (a power of two)."""
    return (value + alignment - 1) & ~(alignment - 1)


def check_capacity(capacity: int, what: str) -> None:
    """Raises CncFileError unless ``capacity`` is a power of two in [MIN_BUFFER_CAPACITY, 2^30]."""
    if not is_power_of_two(capacity) or not MIN_BUFFER_CAPACITY <= capacity <= MAX_BUFFER_CAPACITY:
        raise CncFileError(
            f"{what} capacity must be a power of two in [{MIN_BUFFER_CAPACITY}, {MAX_BUFFER_CAPACITY}], "
            f"got {capacity}"
        )


@dataclass(frozen=True)
class CncLayout:
    """The header of a cnc.dat and where each section lies (offsets from the start of the file)."""

    version: int
    to_driver_buffer_length: int
    to_clients_buffer_length: int
    counters_metadata_length: int
    counters_values_length: int
    error_log_length: int
    client_liveness_timeout_ns: int
    start_timestamp_ms: int
    pid: int

    # -- construction ----------------------------------------------------------------------------------

    @classmethod
    def for_capacities(
        cls,
        to_driver_capacity: int,
        to_clients_capacity: int,
        counters_values_length: int,
        error_log_length: int,
        client_liveness_timeout_ns: int,
        pid: int,
        start_ms: int,
        version: int = CNC_VERSION,
    ) -> CncLayout:
        """The layout a driver creates: capacities exclude the trailers, which are added here."""
        layout = cls(
            version=version,
            to_driver_buffer_length=to_driver_capacity + TO_DRIVER_TRAILER_LENGTH,
            to_clients_buffer_length=to_clients_capacity + TO_CLIENTS_TRAILER_LENGTH,
            counters_metadata_length=counters_values_length * METADATA_TO_VALUES_RATIO,
            counters_values_length=counters_values_length,
            error_log_length=error_log_length,
            client_liveness_timeout_ns=client_liveness_timeout_ns,
            start_timestamp_ms=start_ms,
            pid=pid,
        )
        layout.validate()
        return layout

    @classmethod
    def decode(cls, header: bytes | memoryview, file_length: int | None = None) -> CncLayout:
        """Parses and validates a header (the first 48+ bytes of a file).

        Raises CncNotReadyError for version 0, CncVersionError for another major version and CncFileError
        for anything else that does not fit (``file_length``, when given, must hold every section).
        """
        if len(header) < HEADER_LENGTH:
            raise CncFileError(
                f"CnC file truncated: {len(header)} bytes, the header alone is {HEADER_LENGTH}"
            )
        layout = cls(*_HEADER.unpack_from(header, 0))
        layout.validate(file_length)
        return layout

    def encode(self, version: int | None = None) -> bytes:
        """The 48 header bytes (``version`` overrides the stored one, e.g. 0 while initialising)."""
        return _HEADER.pack(
            self.version if version is None else version,
            self.to_driver_buffer_length,
            self.to_clients_buffer_length,
            self.counters_metadata_length,
            self.counters_values_length,
            self.error_log_length,
            self.client_liveness_timeout_ns,
            self.start_timestamp_ms,
            self.pid,
        )

    # -- validation ------------------------------------------------------------------------------------

    def validate(self, file_length: int | None = None) -> None:
        if self.version == 0:
            raise CncNotReadyError(
                "CnC file is not initialised yet (version 0): the driver is still creating it"
            )
        if version_major(self.version) != version_major(CNC_VERSION):
            raise CncVersionError(
                f"CnC version not compatible: file is {version_string(self.version)} ({self.version}), "
                f"logbuf speaks {version_string(CNC_VERSION)} (major versions must match)"
            )
        check_capacity(self.to_driver_buffer_length - TO_DRIVER_TRAILER_LENGTH, "to-driver ring buffer")
        check_capacity(
            self.to_clients_buffer_length - TO_CLIENTS_TRAILER_LENGTH, "to-clients broadcast buffer"
        )
        values = self.counters_values_length
        if values <= 0 or values % COUNTER_VALUE_LENGTH:
            raise CncFileError(f"counters values length must be a positive multiple of 128, got {values}")
        if self.counters_metadata_length != values * METADATA_TO_VALUES_RATIO:
            raise CncFileError(
                f"counters metadata length {self.counters_metadata_length} must be 4 x the values length {values}"
            )
        if self.error_log_length <= 0:
            raise CncFileError(f"error log length must be positive, got {self.error_log_length}")
        if self.client_liveness_timeout_ns <= 0:
            raise CncFileError(
                f"client liveness timeout must be positive, got {self.client_liveness_timeout_ns}"
            )
        if file_length is not None and file_length < self.total_length:
            raise CncFileError(
                f"CnC file truncated: {file_length} bytes, its header says the sections end at {self.total_length}"
            )

    # -- section offsets -------------------------------------------------------------------------------

    @property
    def to_driver_offset(self) -> int:
        return END_OF_METADATA_OFFSET

    @property
    def to_clients_offset(self) -> int:
        return self.to_driver_offset + self.to_driver_buffer_length

    @property
    def counters_metadata_offset(self) -> int:
        return self.to_clients_offset + self.to_clients_buffer_length

    @property
    def counters_values_offset(self) -> int:
        return self.counters_metadata_offset + self.counters_metadata_length

    @property
    def error_log_offset(self) -> int:
        return self.counters_values_offset + self.counters_values_length

    @property
    def total_length(self) -> int:
        """Where the last section ends: the least file length that holds them all."""
        return self.error_log_offset + self.error_log_length

    @property
    def to_driver_capacity(self) -> int:
        return self.to_driver_buffer_length - TO_DRIVER_TRAILER_LENGTH

    @property
    def to_clients_capacity(self) -> int:
        return self.to_clients_buffer_length - TO_CLIENTS_TRAILER_LENGTH

    @property
    def max_counter_id(self) -> int:
        return self.counters_values_length // COUNTER_VALUE_LENGTH - 1

