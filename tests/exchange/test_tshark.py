"""Wireshark's moldudp64 dissector is an independent decoder of what we put on the wire."""

from __future__ import annotations

import subprocess
from pathlib import Path

from logbuf.exchange.dayfile import DayFileReader
from logbuf.exchange.replay.config import FeedConfig, ReplayConfig
from logbuf.exchange.replay.core import ReplayCore
from logbuf.exchange.replay.schedule import EventKind
from logbuf.marketdata import moldudp64 as m
from support.pcap import write_pcap

PORT = 26400
FIELDS = ("moldudp64.session", "moldudp64.sequence", "moldudp64.count", "moldudp64.msgseq", "moldudp64.msglen")


def _tshark(tshark: str, pcap: Path) -> tuple[list[list[str]], str]:
    decode = ["-r", str(pcap), "-d", f"udp.port=={PORT},moldudp64"]
    cmd = [tshark, *decode, "-T", "fields", "-E", "separator=|"] + [x for f in FIELDS for x in ("-e", f)]
    rows = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    expert = subprocess.run([tshark, *decode, "-q", "-z", "expert"], capture_output=True, text=True, timeout=60,
                            check=True).stdout
    return [r.split("|") for r in rows], expert


def _problems(expert: str) -> list[str]:
    return [line for line in expert.splitlines() if line.strip().startswith(("Errors", "Warns"))
            or "Malformed" in line]


def test_tshark_decodes_replay_packets(tshark: str, tiny_day: Path, tmp_path: Path) -> None:
    with DayFileReader(tiny_day) as reader:
        core = ReplayCore(reader, ReplayConfig(speed=1.0, start="pre-open", heartbeat_ns=10**9,
                                               end_of_session_count=2, feeds=(FeedConfig("A"),)))
        events = [e for e in core.events() if e.kind not in (EventKind.SKIPPED, EventKind.SOURCE)][:1500]
        events += [e for e in core.events() if e.kind == EventKind.END_OF_SESSION]
    datagrams = [e.data for e in events] + [m.encode_request("SYNTH0001", 5, 10)]
    assert any(e.kind == EventKind.HEARTBEAT for e in events)
    pcap = tmp_path / "feed.pcap"
    write_pcap(str(pcap), datagrams, dst=("233.54.12.1", PORT))
    rows, expert = _tshark(tshark, pcap)
    assert len(rows) == len(datagrams)
    assert not _problems(expert), expert
    for row, raw in zip(rows, datagrams, strict=True):
        session, sequence, count, msgseq, msglen = row
        header = m.decode_header(raw)
        assert session.strip() == header[0].decode().strip()
        assert int(sequence) == header[1] and int(count) == header[2]
        if header[2] in (m.HEARTBEAT_COUNT, m.END_OF_SESSION_COUNT) or len(raw) == m.REQUEST_LENGTH:
            assert msgseq == ""
        else:
            packet = m.decode(raw)
            assert [int(x) for x in msgseq.split(",")] == list(range(packet.sequence, packet.next_sequence))
            assert [int(x) for x in msglen.split(",")] == [len(x) for x in packet.messages]


def test_tshark_flags_a_malformed_packet(tshark: str, tmp_path: Path) -> None:
    """The expert check above can fail: a block overrunning the datagram is reported."""
    bad = m.encode_header("SYNTH0001", 1, 2) + b"\x00\x05abc"
    pcap = tmp_path / "bad.pcap"
    write_pcap(str(pcap), [bad], dst=("233.54.12.1", PORT))
    _, expert = _tshark(tshark, pcap)
    assert _problems(expert)
