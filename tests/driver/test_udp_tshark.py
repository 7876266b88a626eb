"""Wireshark's ``aeron`` dissector decodes a capture of the driver's real UDP traffic.

One embedded driver publishes to and subscribes from a loopback endpoint while its receive path drops 10%
of datagrams (so NAKs and retransmits happen), 1000-byte messages fill past two 64 KiB terms (so PAD frames
travel), it then idles (heartbeats) and closes the publication (the end-of-stream heartbeat).  The traffic
is captured two ways:

- ``capture``: ``dumpcap -i lo -f "udp port P"`` while it runs (skipped where capturing is not permitted);
- ``relay``: the publication sends to a relay on another port that forwards both ways and writes what it
  forwards into a pcap itself (works without any privilege).

tshark must find DATA, PAD, SETUP, SM, NAK and heartbeat frames, agree with our own decoding of every
packet's payload, and report no malformed packet, error or warning.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from udp_rig import HEARTBEATS_SENT, NAKS_SENT, Received, free_udp_port, message, publish, system

import logbuf
from logbuf.protocol import ControlPacket, DataPacket, Nak, PacketKind, SetupFrame, StatusMessage, classify
from support import LineReader, WaitTimeout, require_tool, stop_process, wait_until
from support.pcap import LINKTYPE_ETHERNET, PCAP_MAGIC, PCAP_VERSION, SNAPLEN, udp_frame

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]
STREAM = 1001
KINDS = ("data", "pad", "heartbeat", "setup", "sm", "nak")
FIELDS = ["udp.payload", "aeron.data.flags.s", *(f"aeron.{kind}.type" for kind in KINDS)]


class Relay:
    """Forwards datagrams between a sender (whoever writes to ``port``) and ``target``, recording them as
    (payload, source, destination) in the order they passed."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.upstream = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # talks to the receiver
        self.upstream.bind(("127.0.0.1", 0))
        self.upstream.settimeout(0.05)
        self.packets: list[tuple[bytes, tuple[str, int], tuple[str, int]]] = []
        self.sender: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._forward, daemon=True),
                         threading.Thread(target=self._backward, daemon=True)]
        for t in self._threads:
            t.start()

    def _forward(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                data, self.sender = self.sock.recvfrom(65536)
                self.packets.append((data, self.sender, self.target))
                self.upstream.sendto(data, self.target)

    def _backward(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                data, source = self.upstream.recvfrom(65536)
                if self.sender is not None:
                    self.packets.append((data, self.target, self.sender))
                    self.sock.sendto(data, self.sender)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(2)
        self.sock.close()
        self.upstream.close()

    def write_pcap(self, path: Path) -> None:
        """A classic pcap (Ethernet/IPv4/UDP), one record per forwarded datagram, 10 us apart."""
        with open(path, "wb") as f:
            f.write(struct.pack("<IHHiIII", PCAP_MAGIC, *PCAP_VERSION, 0, 0, SNAPLEN, LINKTYPE_ETHERNET))
            for i, (data, src, dst) in enumerate(self.packets):
                frame = udp_frame(data, src, dst, ident=i)
                f.write(struct.pack("<IIII", 0, i * 10, len(frame), len(frame)))
                f.write(frame)


class Capture:
    """``dumpcap`` on ``lo`` for one UDP port; skips the test when capturing is not permitted."""

    def __init__(self, port: int, path: Path) -> None:
        dumpcap = require_tool("dumpcap")
        self.proc = subprocess.Popen([dumpcap, "-i", "lo", "-f", f"udp port {port}", "-w", str(path), "-q"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        try:
            LineReader(self.proc.stderr, "dumpcap").read_until("Capturing on", timeout=15)
        except WaitTimeout as exc:
            self.stop()
            pytest.skip(f"capturing on lo is not permitted here: {exc}")
        # dumpcap says "Capturing on" before it opens the capture (no later sign of it comes with -q)
        time.sleep(0.1)

    def stop(self) -> None:
        time.sleep(0.5)  # let dumpcap take the last packets from the kernel's ring before SIGINT ends its loop
        # SIGINT: dumpcap flushes and closes the file
        stop_process(self.proc, signal.SIGINT)


def run_traffic(directory: Path, pub_endpoint: int, sub_endpoint: int) -> None:
    sub_channel = f"aeron:udp?endpoint=127.0.0.1:{sub_endpoint}|term-length=64k"
    pub_channel = f"aeron:udp?endpoint=127.0.0.1:{pub_endpoint}|term-length=64k"
    with logbuf.MediaDriver.launch(directory, receive_impairment="drop=0.1,seed=3") as drv, \
            logbuf.connect(drv.directory) as client:
        gone: list[logbuf.Image] = []
        sub = client.add_subscription(sub_channel, STREAM, on_unavailable_image=gone.append)
        pub = client.add_publication(pub_channel, STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connection")
        received = Received()
        sent = [message(i, 1000) for i in range(150)]  # 1056-byte frames: terms end in padding
        publish(pub, sent, between=lambda: received.poll(sub))
        wait_until(lambda: len(received.sequences) == len(sent), poll=lambda: received.poll(sub), what="delivery")
        assert received.sequences == list(range(len(sent)))
        wait_until(lambda: system(client, NAKS_SENT) > 0, what="a NAK")
        idle_from = system(client, HEARTBEATS_SENT)
        wait_until(lambda: system(client, HEARTBEATS_SENT) >= idle_from + 2, what="heartbeats while idle")
        pub.close()  # end of stream: the EOS heartbeat, the image goes
        wait_until(lambda: gone, poll=lambda: received.poll(sub), what="end of stream")


def our_kinds(payload: bytes) -> dict[str, int]:
    packet = classify(payload)
    if isinstance(packet, DataPacket):
        kind = {PacketKind.DATA: "data", PacketKind.PAD: "pad", PacketKind.HEARTBEAT: "heartbeat"}[packet.kind]
        if packet.kind is PacketKind.HEARTBEAT and packet.header.is_end_of_stream:
            kind = "data"  # the dissector shows a length-0 frame with the EOS flag as "Data Frame ... Len 0"
        return {kind: packet.frame_count}
    assert isinstance(packet, ControlPacket)
    kinds: dict[str, int] = {}
    for frame in packet.frames:
        kind = {SetupFrame: "setup", StatusMessage: "sm", Nak: "nak"}.get(type(frame), "other")
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def dissect(tshark: str, pcap: Path, port: int) -> tuple[list[tuple[bytes, dict[str, int], bool]], list[str]]:
    decode = ["-r", str(pcap), "-d", f"udp.port=={port},aeron"]
    rows = subprocess.run(
        [tshark, *decode, "-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=,",
         *[x for f in FIELDS for x in ("-e", f)]], capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()
    packets = []
    for row in rows:
        payload, eos, *types = row.split("|")
        shown = {kind: len(cell.split(",")) for kind, cell in zip(KINDS, types, strict=True) if cell}
        packets.append((bytes.fromhex(payload.replace(":", "")), shown, "1" in eos.split(",") or "True" in eos))
    verbose = subprocess.run([tshark, *decode, "-V"], capture_output=True, text=True, timeout=60, check=True).stdout
    expert = subprocess.run([tshark, *decode, "-q", "-z", "expert"], capture_output=True, text=True, timeout=60,
                            check=True).stdout
    problems = [line for line in verbose.splitlines() if "Malformed" in line or "(Error/" in line
                or "(Warning/" in line]
    problems += [line for line in expert.splitlines() if line.strip().startswith(("Errors", "Warns"))]
    return packets, problems


@pytest.mark.parametrize("mode", ["capture", "relay"])
def test_tshark_decodes_the_drivers_traffic(tshark: str, tmp_path: Path, mode: str) -> None:
    port = free_udp_port()
    pcap = tmp_path / "aeron.pcap"
    if mode == "capture":
        capture = Capture(port, pcap)
        try:
            run_traffic(tmp_path / "drv", port, port)
        finally:
            capture.stop()
    else:
        relay = Relay(("127.0.0.1", port))
        try:
            run_traffic(tmp_path / "drv", relay.port, port)
        finally:
            relay.close()
        relay.write_pcap(pcap)

    packets, problems = dissect(tshark, pcap, port)
    assert not problems, problems[:10]
    seen: dict[str, int] = {}
    eos = 0
    for payload, shown, shown_eos in packets:
        ours = {k: v for k, v in our_kinds(payload).items() if k in KINDS}
        assert shown == ours, (payload[:48].hex(), shown, ours)
        for kind, n in shown.items():
            seen[kind] = seen.get(kind, 0) + n
        packet = classify(payload)
        if isinstance(packet, DataPacket) and packet.kind is PacketKind.HEARTBEAT and packet.header.is_end_of_stream:
            assert shown_eos, f"tshark does not show the EOS flag of {payload.hex()}"
            eos += 1
    assert set(seen) == set(KINDS), seen
    assert eos, "no end-of-stream heartbeat in the capture"
