"""logbuf's native sender and receiver against the real Aeron C media driver as the peer: Aeron's own C samples
publish through a logbuf driver over UDP to an ``aeronmd`` that drops 5 % of the DATA it receives (Aeron's
loss interceptor), so Aeron's receiver NAKs and logbuf's sender agent retransmits; Aeron's subscriber must
count every message.  Then both ways with the logbuf driver in the dedicated threading mode: aeronmd to
logbuf (logbuf's receiver dropping 5 % of what it receives, so it NAKs and Aeron's sender retransmits) and
logbuf to aeronmd.  Skipped, with the reason, where the Aeron binaries are not available (``$AERON_BIN``,
else ``../shared/aeron-bin`` beside the repository)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from aeron_driver import require_aeron_bin

import logbuf
from logbuf.cnc.counters import SystemCounter
from support import stop_process, wait_until

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def aeron_bin() -> Path:
    return require_aeron_bin().resolve()


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def totals(path: Path) -> int:
    found = re.findall(r"totals (\d+) messages", path.read_text(errors="replace"))
    return int(found[-1]) if found else -1


@pytest.mark.parametrize(("count", "length"), [(50_000, 32), (3_000, 3_000)])
def test_aeron_receives_everything_from_logbuf_s_native_sender_through_loss(tmp_path: Path, count: int,
                                                                           length: int) -> None:
    bin_dir = aeron_bin() / "bin"
    if shutil.which("stdbuf") is None:
        pytest.skip("stdbuf (coreutils) is needed to read Aeron's subscriber as it runs")
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    env = dict(os.environ, AERON_DIR=str(tmp_path / "aeron"), AERON_DIR_DELETE_ON_START="1",
               AERON_DIR_DELETE_ON_SHUTDOWN="1", AERON_UDP_CHANNEL_INCOMING_INTERCEPTORS="loss",
               AERON_UDP_CHANNEL_TRANSPORT_BINDINGS_LOSS_ARGS="rate=0.05|seed=7|recv-msg-mask=0x2")
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        procs.append(proc)
        return proc

    with logbuf.MediaDriver.launch(tmp_path / "logbuf", idle_strategy="backoff:200000"):
        try:
            start([str(bin_dir / "aeronmd")], tmp_path / "aeronmd.log")
            wait_until(lambda: (tmp_path / "aeron" / "cnc.dat").is_file(), timeout=15, what="aeronmd's cnc.dat")
            sub_log = tmp_path / "subscriber.log"
            # line-buffered: its running totals reach the file as it prints them
            start(["stdbuf", "-oL", str(bin_dir / "rate_subscriber"), "-p", str(tmp_path / "aeron"), "-c", channel, "-s", "1001"],
                  sub_log)
            publisher = start([str(bin_dir / "streaming_publisher"), "-p", str(tmp_path / "logbuf"), "-c", channel,
                               "-s", "1001", "-m", str(count), "-L", str(length)], tmp_path / "publisher.log")
            wait_until(lambda: publisher.poll() is not None, timeout=60, what="Aeron's publisher to finish")
            wait_until(lambda: totals(sub_log) == count, timeout=30,
                       what=f"Aeron's subscriber to count {count} messages")
            with logbuf.connect(tmp_path / "logbuf") as client:  # the loss was real: Aeron NAKed, logbuf resent
                assert client.counters.counter_value(SystemCounter.NAK_MESSAGES_RECEIVED) > 0
                assert client.counters.counter_value(SystemCounter.RETRANSMITS_SENT) > 0
        finally:
            for proc in reversed(procs):
                stop_process(proc, grace=0.0)


@pytest.mark.parametrize("direction", ["aeronmd-to-logbuf", "logbuf-to-aeronmd"])
@pytest.mark.parametrize(("count", "length"), [(50_000, 32), (2_000, 3_000)])
def test_aeron_samples_both_ways_between_aeronmd_and_a_dedicated_logbuf_driver(
        tmp_path: Path, direction: str, count: int, length: int) -> None:
    """Aeron's streaming_publisher on one driver, its rate_subscriber on the other, over UDP on loopback; the
    logbuf driver runs its sender and receiver on dedicated agents.  Each receiving side drops 5 % of the DATA
    it receives (Aeron's loss interceptor in aeronmd, ``receive_impairment`` in logbuf's receiver): every
    message still arrives, so the NAKs of each receiver were answered by the other's sender."""
    bin_dir = aeron_bin() / "bin"
    if shutil.which("stdbuf") is None:
        pytest.skip("stdbuf (coreutils) is needed to read Aeron's subscriber as it runs")
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    aeron_dir, logbuf_dir = tmp_path / "aeron", tmp_path / "logbuf"
    pub_dir, sub_dir = (aeron_dir, logbuf_dir) if direction == "aeronmd-to-logbuf" else (logbuf_dir, aeron_dir)
    env = dict(os.environ, AERON_DIR=str(aeron_dir), AERON_DIR_DELETE_ON_START="1",
               AERON_DIR_DELETE_ON_SHUTDOWN="1", AERON_THREADING_MODE="DEDICATED",
               AERON_UDP_CHANNEL_INCOMING_INTERCEPTORS="loss",
               AERON_UDP_CHANNEL_TRANSPORT_BINDINGS_LOSS_ARGS="rate=0.05|seed=7|recv-msg-mask=0x2")
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        procs.append(proc)
        return proc

    with logbuf.MediaDriver.launch(logbuf_dir, threading_mode="dedicated", idle_strategy="backoff:200000",
                                   receive_impairment="drop=0.05,seed=3") as driver:
        wait_until(lambda: [agent.name for agent in driver.agents] == ["lb-sender", "lb-receiver", "lb-conductor"]
                   and all(agent.is_running for agent in driver.agents), what="the dedicated mode's agents")
        try:
            start([str(bin_dir / "aeronmd")], tmp_path / "aeronmd.log")
            wait_until(lambda: (aeron_dir / "cnc.dat").is_file(), timeout=15, what="aeronmd's cnc.dat")
            sub_log = tmp_path / "subscriber.log"
            # line-buffered: its running totals reach the file as it prints them
            start(["stdbuf", "-oL", str(bin_dir / "rate_subscriber"), "-p", str(sub_dir), "-c", channel,
                   "-s", "1001"], sub_log)
            publisher = start([str(bin_dir / "streaming_publisher"), "-p", str(pub_dir), "-c", channel,
                               "-s", "1001", "-m", str(count), "-L", str(length)], tmp_path / "publisher.log")
            wait_until(lambda: publisher.poll() is not None, timeout=60, what="Aeron's publisher to finish")
            wait_until(lambda: totals(sub_log) == count, timeout=30,
                       what=f"Aeron's subscriber to count {count} messages")
            with logbuf.connect(logbuf_dir) as client:  # the loss was real, and logbuf's side took part in it
                if direction == "aeronmd-to-logbuf":
                    assert client.counters.counter_value(SystemCounter.NAK_MESSAGES_SENT) > 0
                else:
                    assert client.counters.counter_value(SystemCounter.RETRANSMITS_SENT) > 0
        finally:
            for proc in reversed(procs):
                stop_process(proc, grace=0.0)
