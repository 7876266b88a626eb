"""Layout of a log buffer file and its position arithmetic (Aeron's ``LogBufferDescriptor``).

A log is three terms of length T followed by a 4096-byte metadata block::

  +----------------------------+  0
  |           Term 0           |
  +----------------------------+  T
  |           Term 1           |
  +----------------------------+  2T
  |           Term 2           |
  +----------------------------+  fileLength - 4096   (fileLength = align(3T + 4096, pageSize))
  |       Log metadata         |
  +----------------------------+  fileLength

The metadata block (offsets from its start, little-endian)::

    0 +-----------------------------------------------+
      | tail counter, term 0 (termId << 32 | offset)   |  8
      | tail counter, term 1                          |  8
      | tail counter, term 2                          |  8
   24 | activeTermCount (index = count % 3)           |  4
      +-----------------------------------------------+
  128 | end-of-stream position (INT64_MAX until EOS)  |  8
  136 | isConnected (0/1)                             |  4
  140 | activeTransportCount                          |  4
      +-----------------------------------------------+
  256 | correlation (registration) id                 |  8
  264 | initialTermId                                 |  4
  268 | default frame header length (32)              |  4
  272 | MTU                                           |  4
  276 | term length                                   |  4
  280 | page size                                     |  4
  284 | publication window length                     |  4
  288 | receiver window length                        |  4
  292 | socket SNDBUF, OS default/max SNDBUF,         |
      | socket RCVBUF, OS default/max RCVBUF          |  6 x 4
  316 | max resend                                    |  4
  320 | default frame header (128 bytes, 32 used)     | 128
  448 | entity tag                                    |  8
  456 | response correlation id                       |  8
  464 | linger timeout ns                             |  8
  472 | untethered window-limit timeout ns            |  8
  480 | untethered resting timeout ns                 |  8
  488 | group, is-response, rejoin, reliable, sparse, |
      | signal-EOS, spies-simulate-connection, tether |  8 x 1
      +-----------------------------------------------+
 1024 | logbuf: subscribers waiting on the wake-up    |  4    (padding in Aeron's layout: Aeron ignores it;
      | semaphore (see client/wakeup.py)              |        its own cache-line pair, away from the tails)
      +-----------------------------------------------+  4096

Positions: ``position = (termId - initialTermId as wrapping int32) << log2(T) | termOffset``.
"""

from __future__ import annotations

PARTITION_COUNT = 3

TERM_MIN_LENGTH = 64 * 1024
TERM_MAX_LENGTH = 1024 * 1024 * 1024
PAGE_MIN_SIZE = 4 * 1024
PAGE_MAX_SIZE = 1024 * 1024 * 1024
LOG_META_DATA_LENGTH = 4096

TERM_TAIL_COUNTERS_OFFSET = 0
LOG_ACTIVE_TERM_COUNT_OFFSET = 24
LOG_END_OF_STREAM_POSITION_OFFSET = 128
LOG_IS_CONNECTED_OFFSET = 136
LOG_ACTIVE_TRANSPORT_COUNT_OFFSET = 140
LOG_CORRELATION_ID_OFFSET = 256
LOG_INITIAL_TERM_ID_OFFSET = 264
LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET = 268
LOG_MTU_LENGTH_OFFSET = 272
LOG_TERM_LENGTH_OFFSET = 276
LOG_PAGE_SIZE_OFFSET = 280
LOG_PUBLICATION_WINDOW_LENGTH_OFFSET = 284
LOG_RECEIVER_WINDOW_LENGTH_OFFSET = 288
LOG_SOCKET_SNDBUF_LENGTH_OFFSET = 292
LOG_OS_DEFAULT_SOCKET_SNDBUF_LENGTH_OFFSET = 296
LOG_OS_MAX_SOCKET_SNDBUF_LENGTH_OFFSET = 300
LOG_SOCKET_RCVBUF_LENGTH_OFFSET = 304
LOG_OS_DEFAULT_SOCKET_RCVBUF_LENGTH_OFFSET = 308
LOG_OS_MAX_SOCKET_RCVBUF_LENGTH_OFFSET = 312
LOG_MAX_RESEND_OFFSET = 316
LOG_DEFAULT_FRAME_HEADER_OFFSET = 320
LOG_DEFAULT_FRAME_HEADER_MAX_LENGTH = 128
LOG_ENTITY_TAG_OFFSET = 448
LOG_RESPONSE_CORRELATION_ID_OFFSET = 456
LOG_LINGER_TIMEOUT_NS_OFFSET = 464
LOG_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS_OFFSET = 472
LOG_UNTETHERED_RESTING_TIMEOUT_NS_OFFSET = 480
LOG_GROUP_OFFSET = 488
LOG_IS_RESPONSE_OFFSET = 489
LOG_REJOIN_OFFSET = 490
LOG_RELIABLE_OFFSET = 491
LOG_SPARSE_OFFSET = 492
LOG_SIGNAL_EOS_OFFSET = 493
LOG_SPIES_SIMULATE_CONNECTION_OFFSET = 494
LOG_TETHER_OFFSET = 495
# logbuf's extension, in space Aeron leaves as padding: a count of subscribers sleeping on the stream's
# named semaphore; publishers post it only when this is non-zero.
LOG_WAITING_SUBSCRIBERS_OFFSET = 1024
#: a publisher posts the wake-up semaphore at most this often per append, whatever the waiting count says
#: (the count is in shared memory: a larger value cannot be real sleepers and gets a single post)
MAX_WAKE_POSTS = 64

INT64_MAX = (1 << 63) - 1
#: a term count is an int32 that never goes negative: a log reaches at most ``T << POSITION_TERM_COUNT_BITS``
POSITION_TERM_COUNT_BITS = 31
#: a message, and a frame's payload (an MTU), is at most ``T / MAX_MESSAGE_TERM_DIVISOR``
MAX_MESSAGE_TERM_DIVISOR = 8
#: and a message is at most this long, whatever the term length
MAX_MESSAGE_LENGTH_CAP = 16 * 1024 * 1024

DEFAULT_IPC_TERM_LENGTH = 64 * 1024 * 1024
DEFAULT_NETWORK_TERM_LENGTH = 16 * 1024 * 1024
DEFAULT_MTU = 1408
MAX_MTU = 65504  # the largest UDP payload over IPv4, aligned to frames


def is_power_of_two(value: int) -> bool:
    """True for 1, 2, 4, ..."""
    return value > 0 and value & (value - 1) == 0


def check_term_length(term_length: int) -> None:
    """Raises ValueError unless ``term_length`` is a power of two in [64 KiB, 1 GiB]."""
    if not TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH or not is_power_of_two(term_length):
        raise ValueError(
            f"term length {term_length} must be a power of two in [{TERM_MIN_LENGTH}, {TERM_MAX_LENGTH}]"
        )


def check_page_size(page_size: int) -> None:
    """Raises ValueError unless ``page_size`` is a power of two in [4 KiB, 1 GiB]."""
    if not PAGE_MIN_SIZE <= page_size <= PAGE_MAX_SIZE or not is_power_of_two(page_size):
        raise ValueError(f"page size {page_size} must be a power of two in [{PAGE_MIN_SIZE}, {PAGE_MAX_SIZE}]")


def check_mtu(mtu: int, term_length: int) -> None:
    """Raises ValueError unless ``mtu`` is a frame-aligned size that fits the term."""
    from logbuf.logbuffer.frame import FRAME_ALIGNMENT, HEADER_LENGTH

    if mtu <= HEADER_LENGTH or mtu % FRAME_ALIGNMENT or mtu > MAX_MTU or mtu > term_length // MAX_MESSAGE_TERM_DIVISOR:
        raise ValueError(f"mtu {mtu} must be a multiple of {FRAME_ALIGNMENT} in ({HEADER_LENGTH}, min({MAX_MTU}, T/8)]")


def compute_log_length(term_length: int, page_size: int) -> int:
    """``align(3T + 4096, pageSize)``."""
    raw = PARTITION_COUNT * term_length + LOG_META_DATA_LENGTH
    return (raw + page_size - 1) & ~(page_size - 1)


_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


def position_bits_to_shift(term_length: int) -> int:
    """log2 of a (power-of-two) term length."""
    return term_length.bit_length() - 1


def _wrap_i32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def compute_term_count(term_id: int, initial_term_id: int) -> int:
    """Terms since the initial one, as a wrapping int32 difference (term ids wrap around)."""
    return _wrap_i32(term_id - initial_term_id)


def compute_position(term_id: int, term_offset: int, bits: int, initial_term_id: int) -> int:
    """The stream position of ``term_offset`` in term ``term_id``."""
    return (compute_term_count(term_id, initial_term_id) << bits) + term_offset


def compute_term_id_from_position(position: int, bits: int, initial_term_id: int) -> int:
    """The term id (wrapping int32) of the term holding ``position``."""
    return _wrap_i32((position >> bits) + initial_term_id)


def compute_term_offset_from_position(position: int, bits: int) -> int:
    """The offset of ``position`` inside its term."""
    return position & ((1 << bits) - 1)


def index_by_position(position: int, bits: int) -> int:
    """The partition (0..2) of the term holding ``position``."""
    return ((position >> bits) & _U64) % PARTITION_COUNT


def index_by_term_count(term_count: int) -> int:
    """The partition (0..2) of a term count, taken as an unsigned 32-bit value as the native code does (the
    count comes from shared memory and may be negative)."""
    return (term_count & _U32) % PARTITION_COUNT


def max_possible_position(term_length: int) -> int:
    """The largest position a log can reach: ``T * 2^31`` (then MAX_POSITION_EXCEEDED, never a wrap)."""
    return term_length << POSITION_TERM_COUNT_BITS


def compute_max_message_length(term_length: int) -> int:
    """The longest message a log of this term length takes: T/8, at most 16 MiB."""
    return min(term_length // MAX_MESSAGE_TERM_DIVISOR, MAX_MESSAGE_LENGTH_CAP)


def pack_tail(term_id: int, term_offset: int) -> int:
    """``termId << 32 | termOffset`` as the signed int64 stored in a tail counter."""
    raw = ((term_id & 0xFFFFFFFF) << 32) | (term_offset & 0xFFFFFFFF)
    return raw - (1 << 64) if raw & (1 << 63) else raw


def tail_term_id(raw_tail: int) -> int:
    """The term id in a raw tail counter."""
    return _wrap_i32(raw_tail >> 32)


def tail_term_offset(raw_tail: int, term_length: int) -> int:
    """The tail's offset capped at the term length (a writer that overshot leaves more there)."""
    return min(raw_tail & 0xFFFFFFFF, term_length)


def _check_native_layout() -> None:
    # the native code has its own copy of these constants (native/include/lb_layout.h): refuse to run with
    # a build whose layout differs from the one Python reads and writes
    from logbuf.logbuffer import frame
    from logbuf.native import check_layout

    check_layout(frame, globals())


_check_native_layout()
