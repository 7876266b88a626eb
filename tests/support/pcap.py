"""A classic pcap writer for UDP datagrams (Ethernet / IPv4 / UDP), to let Wireshark's dissectors check packets.

    file header (24)  magic a1b2c3d4, version 2.4, thiszone 0, sigfigs 0, snaplen, linktype 1 (Ethernet)
    per packet (16)   ts_sec, ts_usec, captured length, original length
      Ethernet (14)   dst MAC 6, src MAC 6, ethertype 0x0800
      IPv4 (20)       version/IHL 0x45, DSCP 0, total length, id, flags/fragment, TTL, proto 17, checksum,
                      src, dst
      UDP (8)         src port, dst port, length, checksum (0 = none, allowed over IPv4)
      payload
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from typing import BinaryIO

PCAP_MAGIC = 0xA1B2C3D4
PCAP_VERSION = (2, 4)
LINKTYPE_ETHERNET = 1
SNAPLEN = 65_535
ETHERTYPE_IPV4 = 0x0800
IPV4_VERSION_IHL = 0x45
IPV4_HEADER_LENGTH = 20
UDP_HEADER_LENGTH = 8
IP_PROTO_UDP = 17
DEFAULT_TTL = 64
MAX_UDP_PAYLOAD = 65_507

_FILE_HEADER = struct.Struct("<IHHiIII")
_RECORD_HEADER = struct.Struct("<IIII")
_ETHERNET = struct.Struct(">6s6sH")
_IPV4 = struct.Struct(">BBHHHBBH4s4s")
_UDP = struct.Struct(">HHHH")
_SRC_MAC = bytes.fromhex("020000000001")
_DST_MAC = bytes.fromhex("01005e000001")


def _ipv4_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f">{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def udp_frame(payload: bytes, src: tuple[str, int], dst: tuple[str, int], ident: int = 0) -> bytes:
    """One Ethernet frame carrying ``payload`` in a UDP datagram from ``src`` to ``dst``."""
    if len(payload) > MAX_UDP_PAYLOAD:
        raise ValueError(f"UDP payload of {len(payload)} bytes exceeds {MAX_UDP_PAYLOAD}")
    udp_length = UDP_HEADER_LENGTH + len(payload)
    total_length = IPV4_HEADER_LENGTH + udp_length
    src_ip, dst_ip = socket.inet_aton(src[0]), socket.inet_aton(dst[0])
    ip = _IPV4.pack(IPV4_VERSION_IHL, 0, total_length, ident & 0xFFFF, 0, DEFAULT_TTL, IP_PROTO_UDP, 0,
                    src_ip, dst_ip)
    ip = ip[:10] + _ipv4_checksum(ip).to_bytes(2, "big") + ip[12:]
    return _ETHERNET.pack(_DST_MAC, _SRC_MAC, ETHERTYPE_IPV4) + ip + _UDP.pack(src[1], dst[1], udp_length, 0) + payload


def write_pcap(target: str | BinaryIO, datagrams: Iterable[bytes], src: tuple[str, int] = ("10.0.0.1", 40000),
               dst: tuple[str, int] = ("233.54.12.1", 26400), start_us: int = 0, step_us: int = 10) -> int:
    """Write every datagram as one UDP packet; returns how many were written."""
    own = isinstance(target, str)
    f: BinaryIO = open(target, "wb") if isinstance(target, str) else target  # noqa: SIM115
    try:
        f.write(_FILE_HEADER.pack(PCAP_MAGIC, *PCAP_VERSION, 0, 0, SNAPLEN, LINKTYPE_ETHERNET))
        count = 0
        for i, payload in enumerate(datagrams):
            frame = udp_frame(payload, src, dst, ident=i)
            t = start_us + i * step_us
            f.write(_RECORD_HEADER.pack(t // 1_000_000, t % 1_000_000, len(frame), len(frame)))
            f.write(frame)
            count += 1
        return count
    finally:
        if own:
            f.close()
