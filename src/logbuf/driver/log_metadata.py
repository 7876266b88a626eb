"""The log metadata fields Aeron's driver fills beyond the layout (socket buffers, timeouts, flags), so a
publication's or image's log reads as aeronmd's does for the same settings.

Publications: entity tag and response correlation id -1 (none), the linger and untethered timeouts, signal
end-of-stream on.  Images: one active transport, rejoin, reliable and tether on, the receiver's initial
window.  Both: the OS default socket buffer sizes (Aeron records them for diagnostics; 0 where unknown).
"""

from __future__ import annotations

from pathlib import Path

from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.log_buffers import LogBuffers

NULL_VALUE = -1
# Aeron's defaults for the untethered subscriber timeouts (written into a log's metadata)
DEFAULT_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS = 5_000_000_000
DEFAULT_UNTETHERED_RESTING_TIMEOUT_NS = 10_000_000_000
_WMEM_DEFAULT = Path("/proc/sys/net/core/wmem_default")
_RMEM_DEFAULT = Path("/proc/sys/net/core/rmem_default")


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def os_default_socket_buffers() -> tuple[int, int]:
    """(SO_SNDBUF, SO_RCVBUF) a new socket gets from this OS (0 when it cannot be read)."""
    return _read_int(_WMEM_DEFAULT), _read_int(_RMEM_DEFAULT)


def _socket_buffers(log: LogBuffers) -> None:
    sndbuf, rcvbuf = os_default_socket_buffers()
    log.meta.put_i32(d.LOG_OS_DEFAULT_SOCKET_SNDBUF_LENGTH_OFFSET, sndbuf)
    log.meta.put_i32(d.LOG_OS_DEFAULT_SOCKET_RCVBUF_LENGTH_OFFSET, rcvbuf)


def fill_publication_metadata(
    log: LogBuffers,
    linger_timeout_ns: int,
    untethered_window_limit_timeout_ns: int = DEFAULT_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS,
    untethered_resting_timeout_ns: int = DEFAULT_UNTETHERED_RESTING_TIMEOUT_NS,
    *,
    signal_eos: bool = True,
    sparse: bool = False,
    socket_sndbuf: int = 0,
    socket_rcvbuf: int = 0,
    spies_simulate_connection: bool = False,
) -> None:
    """A new publication log's metadata as aeronmd writes it (before any client maps the log)."""
    meta = log.meta
    _socket_buffers(log)
    meta.put_i64(d.LOG_ENTITY_TAG_OFFSET, NULL_VALUE)
    meta.put_i64(d.LOG_RESPONSE_CORRELATION_ID_OFFSET, NULL_VALUE)
    meta.put_i64(d.LOG_LINGER_TIMEOUT_NS_OFFSET, linger_timeout_ns)
    meta.put_i64(d.LOG_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS_OFFSET, untethered_window_limit_timeout_ns)
    meta.put_i64(d.LOG_UNTETHERED_RESTING_TIMEOUT_NS_OFFSET, untethered_resting_timeout_ns)
    meta.put_bytes(d.LOG_SIGNAL_EOS_OFFSET, b"\x01" if signal_eos else b"\x00")
    meta.put_bytes(d.LOG_SPARSE_OFFSET, b"\x01" if sparse else b"\x00")
    meta.put_bytes(d.LOG_SPIES_SIMULATE_CONNECTION_OFFSET, b"\x01" if spies_simulate_connection else b"\x00")
    # the channel's so-sndbuf / so-rcvbuf (0: it named none), as aeronmd records them
    meta.put_i32(d.LOG_SOCKET_SNDBUF_LENGTH_OFFSET, socket_sndbuf)
    meta.put_i32(d.LOG_SOCKET_RCVBUF_LENGTH_OFFSET, socket_rcvbuf)


def fill_image_metadata(log: LogBuffers, initial_receiver_window: int, *, sparse: bool = False,
                        socket_sndbuf: int = 0, socket_rcvbuf: int = 0, rejoin: bool = True,
                        reliable: bool = True, group: bool = False) -> None:
    """A new image log's metadata as aeronmd writes it (socket buffers: the subscription channel's, 0 when it
    named none)."""
    meta = log.meta
    _socket_buffers(log)
    meta.put_i32(d.LOG_RECEIVER_WINDOW_LENGTH_OFFSET, initial_receiver_window)
    meta.put_i32(d.LOG_SOCKET_SNDBUF_LENGTH_OFFSET, socket_sndbuf)
    meta.put_i32(d.LOG_SOCKET_RCVBUF_LENGTH_OFFSET, socket_rcvbuf)
    meta.put_bytes(d.LOG_SPARSE_OFFSET, b"\x01" if sparse else b"\x00")
    meta.put_i32(d.LOG_ACTIVE_TRANSPORT_COUNT_OFFSET, 1)
    for offset, flag in ((d.LOG_REJOIN_OFFSET, rejoin), (d.LOG_RELIABLE_OFFSET, reliable), (d.LOG_TETHER_OFFSET, True),
                         (d.LOG_GROUP_OFFSET, group)):
        meta.put_bytes(offset, b"\x01" if flag else b"\x00")
