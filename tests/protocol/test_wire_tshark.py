"""Wireshark's ``aeron`` dissector is an independent decoder of what we put on the wire.

Traffic is what our own pieces produce - a PublicationSender over a real log (SETUP, DATA datagrams of
several frames and of fragments, the header-only PAD at the end of a term, a heartbeat), and the receiver's
frames (SMs, a NAK, RTT measurements) - written into a pcap on 127.0.0.1 (no capture privileges needed) and
read back with ``tshark -d udp.port==PORT,aeron`` (the dissector is not tied to a port by default; its UDP
heuristic is off, so "decode as" is how Wireshark users enable it).  ERR frames are left out: the dissector
in Wireshark 4.0 still knows an older ERR layout.
"""

from __future__ import annotations

import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

from logbuf import ExclusivePublication, LogBuffers, Position
from logbuf.driver.udp import PublicationSender
from logbuf.protocol import (
    SEND_SETUP_FLAG,
    ControlPacket,
    DataPacket,
    Nak,
    PacketKind,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    classify,
)
from support.pcap import udp_frame

PORT = 40123
SENDER = ("127.0.0.1", 40001)
RECEIVER = ("127.0.0.1", PORT)

# per frame kind: the tshark fields and how to get each from our decoded frame
DATA_FIELDS = {
    "frame_length": lambda h: h.frame_length,
    "flags": lambda h: h.flags,
    "term_offset": lambda h: h.term_offset,
    "session_id": lambda h: h.session_id,
    "stream_id": lambda h: h.stream_id,
    "term_id": lambda h: h.term_id,
}
KINDS: dict[str, dict[str, Callable]] = {
    "data": {**DATA_FIELDS, "reserved_value": lambda h: h.reserved_value},
    "pad": DATA_FIELDS,
    "heartbeat": {k: v for k, v in DATA_FIELDS.items() if k != "frame_length"},
    "setup": {f: (lambda name: lambda s: getattr(s, name))(f) for f in (
        "term_offset", "session_id", "stream_id", "initial_term_id", "active_term_id", "term_length", "mtu", "ttl")},
    "sm": {
        "flags": lambda m: m.flags,
        "session_id": lambda m: m.session_id,
        "stream_id": lambda m: m.stream_id,
        "consumption_term_id": lambda m: m.consumption_term_id,
        "consumption_term_offset": lambda m: m.consumption_term_offset,
        "receiver_window": lambda m: m.receiver_window,
        "receiver_id": lambda m: m.receiver_id,
    },
    "nak": {f: (lambda name: lambda n: getattr(n, name))(f) for f in (
        "session_id", "stream_id", "term_id", "term_offset", "length")},
    "rtt": {
        "flags": lambda r: r.flags,
        "session_id": lambda r: r.session_id,
        "stream_id": lambda r: r.stream_id,
        "echo_timestamp": lambda r: r.echo_timestamp_ns,
        "reception_delta": lambda r: r.reception_delta_ns,
        "receiver_id": lambda r: r.receiver_id,
    },
}
COLUMNS = [f"aeron.{kind}.{name}" for kind, fields in KINDS.items() for name in fields]


def _sender_traffic(make_log: Callable[..., LogBuffers]) -> list[bytes]:
    log = make_log("tshark.logbuffer", term_length=64 * 1024, mtu=1408, session_id=-7, stream_id=1001,
                   initial_term_id=2**31 - 1)  # the second term id wraps to -2^31
    publication = ExclusivePublication(log, Position.standalone(1 << 40))
    sender = PublicationSender(log, 0)
    datagrams: list[bytes] = []
    now = 0

    def pump() -> None:
        for item in sender.poll(now, max_datagrams=64):
            datagrams.append(bytes(item.buffer))
            assert sender.on_sent(item, len(item.buffer), now)

    pump()  # SETUP
    for size in (10, 20, 30, 3000):  # a datagram of small frames, then three fragments
        assert publication.offer(b"m" * size) > 0
    while publication.position < 64 * 1024:  # fill the term: the last offer pads it and rotates
        publication.offer(b"f" * 1000, reserved_value=publication.position)
    publication.offer(b"next term")
    while sender.snd_pos < publication.position:
        sender.on_status_message(StatusMessage.at_position(-7, 1001, sender.snd_pos, log.position_bits,
                                                           log.initial_term_id, 32768, 99), now)
        now += 1_000_000
        pump()
    now += 150_000_000
    pump()  # heartbeat
    return datagrams


def _write_pcap(path: Path, packets: list[tuple[bytes, tuple[str, int], tuple[str, int]]]) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, (payload, src, dst) in enumerate(packets):
            frame = udp_frame(payload, src, dst, ident=i)
            f.write(struct.pack("<IIII", 0, 10 * i, len(frame), len(frame)))
            f.write(frame)


def _expected(payload: bytes) -> dict[str, list[int]]:
    """The values tshark should show for ``payload``, from our own decoding (ids as tshark's unsigned)."""
    packet = classify(payload)
    expected: dict[str, list[int]] = {}
    if isinstance(packet, DataPacket):
        kind = {PacketKind.DATA: "data", PacketKind.PAD: "pad", PacketKind.HEARTBEAT: "heartbeat"}[packet.kind]
        headers = [packet.header]
        offset = 0
        if packet.kind is PacketKind.DATA:
            headers = []
            while offset < len(payload):
                header = type(packet.header).decode(payload, offset)
                headers.append(header)
                offset += (header.frame_length + 31) & ~31
        for name, get in KINDS[kind].items():
            expected[f"aeron.{kind}.{name}"] = [get(h) for h in headers]
        return expected
    assert isinstance(packet, ControlPacket)
    for frame in packet.frames:
        kind = {SetupFrame: "setup", StatusMessage: "sm", Nak: "nak", RttMeasurement: "rtt"}[type(frame)]
        for name, get in KINDS[kind].items():
            expected.setdefault(f"aeron.{kind}.{name}", []).append(get(frame))
    return expected


def _as_unsigned(field: str, value: int) -> int:
    bits = 64 if field.endswith(("receiver_id", "reserved_value", "echo_timestamp", "reception_delta")) else 32
    return value & ((1 << bits) - 1)


def _tshark_fields(tshark: str, pcap: Path) -> list[dict[str, list[int]]]:
    cmd = [tshark, "-r", str(pcap), "-d", f"udp.port=={PORT},aeron", "-T", "fields", "-E", "separator=|",
           "-E", "occurrence=a", "-E", "aggregator=,"] + [x for c in COLUMNS for x in ("-e", c)]
    rows = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    decoded = []
    for row in rows:
        cells = row.split("|")
        assert len(cells) == len(COLUMNS)
        decoded.append({c: [int(v, 0) for v in cell.split(",")] for c, cell in zip(COLUMNS, cells, strict=True)
                        if cell})
    return decoded


def _problems(tshark: str, pcap: Path) -> list[str]:
    decode = ["-r", str(pcap), "-d", f"udp.port=={PORT},aeron"]
    verbose = subprocess.run([tshark, *decode, "-V"], capture_output=True, text=True, timeout=60, check=True).stdout
    expert = subprocess.run([tshark, *decode, "-q", "-z", "expert"], capture_output=True, text=True, timeout=60,
                            check=True).stdout
    bad = [line for line in verbose.splitlines() if "Malformed" in line or "(Error/" in line or "(Warning/" in line]
    bad += [line for line in expert.splitlines() if line.strip().startswith(("Errors", "Warns"))]
    return bad


def test_tshark_decodes_our_traffic(tshark: str, make_log: Callable[..., LogBuffers], tmp_path: Path) -> None:
    data_plane = _sender_traffic(make_log)
    control = [
        StatusMessage(-7, 1001, -2**31, 4096, 32768, 2**40 + 3).encode(),
        StatusMessage(-7, 1001, 0, 0, 0, 2**40 + 3, SEND_SETUP_FLAG).encode(),
        Nak(-7, 1001, 2**31 - 1, 64, 1408).encode(),
        RttMeasurement(-7, 1001, 123_456_789_000, 0, 2**40 + 3, 0x80).encode(),
        RttMeasurement(-7, 1001, 123_456_789_000, 2_500, 2**40 + 3, 0).encode(),
    ]
    kinds = {classify(p).kind for p in data_plane}
    assert kinds == {PacketKind.CONTROL, PacketKind.DATA, PacketKind.PAD, PacketKind.HEARTBEAT}
    assert any(classify(p).frame_count > 1 for p in data_plane if classify(p).kind is PacketKind.DATA)
    packets = [(p, SENDER, RECEIVER) for p in data_plane] + [(p, RECEIVER, SENDER) for p in control]
    pcap = tmp_path / "aeron.pcap"
    _write_pcap(pcap, packets)

    decoded = _tshark_fields(tshark, pcap)
    assert len(decoded) == len(packets)
    for (payload, _, _), shown in zip(packets, decoded, strict=True):
        expected = {field: [_as_unsigned(field, v) for v in values] for field, values in _expected(payload).items()}
        assert shown == expected, (payload[:40].hex(), shown, expected)
    assert not _problems(tshark, pcap)


def test_tshark_flags_a_malformed_frame(tshark: str, tmp_path: Path) -> None:
    """The problem check above can fail: a NAK cut short is reported by the dissector."""
    pcap = tmp_path / "bad.pcap"
    _write_pcap(pcap, [(Nak(1, 2, 3, 64, 32).encode()[:20], RECEIVER, SENDER)])
    assert _problems(tshark, pcap)


def test_sender_traffic_is_what_the_sender_sent(make_log: Callable[..., LogBuffers]) -> None:
    """The capture holds every kind of datagram the sender produces, in the sender's order."""
    packets = [classify(p) for p in _sender_traffic(make_log)]
    assert isinstance(packets[0], ControlPacket) and isinstance(packets[0].frames[0], SetupFrame)
    kinds = [p.kind for p in packets]
    assert kinds[-1] is PacketKind.HEARTBEAT and kinds.count(PacketKind.PAD) == 1
    pad = next(p for p in packets if p.kind is PacketKind.PAD)
    assert pad.length == 32 and pad.header.term_offset + pad.term_span == 64 * 1024
