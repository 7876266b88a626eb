"""Where the Aeron test vectors are (files written by Aeron's own driver and tools), and a pcap reader.

The vectors live beside the repository (``<repo>/../shared/aeron-vectors``); ``LOGBUF_AERON_VECTORS`` names
another place (a git worktree sits elsewhere).  Tests that need them skip with the reason when absent.
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]


def vectors_dir() -> Path | None:
    named = os.environ.get("LOGBUF_AERON_VECTORS")
    for candidate in ([Path(named)] if named else []) + [REPO / ".." / "shared" / "aeron-vectors"]:
        if (candidate / "README.md").is_file():
            return candidate.resolve()
    return None


def vector(relative: str) -> Path:
    """The vector file ``relative`` (e.g. ``"pcap/unicast-clean.pcap"``); skips the test when it is absent."""
    base = vectors_dir()
    if base is None:
        pytest.skip("Aeron test vectors not found (../shared/aeron-vectors beside the repository, or "
                    "LOGBUF_AERON_VECTORS)")
    path = base / relative
    if not path.is_file():
        pytest.skip(f"Aeron test vector {relative} not found in {base}")
    return path


def read_vector(relative: str) -> bytes:
    """The bytes of a vector file, gunzipped when its name ends in ``.gz``."""
    path = vector(relative)
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


class UdpPacket(NamedTuple):
    time_ns: int  # capture time
    source: tuple[str, int]
    destination: tuple[str, int]
    payload: bytes


_PCAP_HEADER = struct.Struct("<IHHiIII")  # magic, version, zone, sigfigs, snaplen, link type
_RECORD_HEADER = struct.Struct("<IIII")  # seconds, microseconds, captured length, original length
_PCAP_MAGIC_US = 0xA1B2C3D4
_LINKTYPE_ETHERNET = 1
_ETHERNET_LENGTH = 14
_ETHERTYPE_IPV4 = 0x0800
_PROTOCOL_UDP = 17
_UDP_HEADER_LENGTH = 8


def udp_packets(relative: str) -> Iterator[UdpPacket]:
    """The UDP datagrams of a little-endian microsecond pcap of Ethernet frames (IPv4), in capture order."""
    data = read_vector(relative)
    magic, _, _, _, _, _, link_type = _PCAP_HEADER.unpack_from(data, 0)
    assert magic == _PCAP_MAGIC_US and link_type == _LINKTYPE_ETHERNET, "expected a microsecond Ethernet pcap"
    offset = _PCAP_HEADER.size
    while offset + _RECORD_HEADER.size <= len(data):
        seconds, micros, captured, _ = _RECORD_HEADER.unpack_from(data, offset)
        frame = data[offset + _RECORD_HEADER.size : offset + _RECORD_HEADER.size + captured]
        offset += _RECORD_HEADER.size + captured
        if int.from_bytes(frame[12:14], "big") != _ETHERTYPE_IPV4:
            continue
        ip = frame[_ETHERNET_LENGTH:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != _PROTOCOL_UDP:
            continue
        src = ".".join(str(b) for b in ip[12:16])
        dst = ".".join(str(b) for b in ip[16:20])
        udp = ip[ihl:]
        sport, dport, length = struct.unpack_from(">HHH", udp, 0)
        payload = bytes(udp[_UDP_HEADER_LENGTH:length])
        yield UdpPacket(seconds * 1_000_000_000 + micros * 1000, (src, sport), (dst, dport), payload)
