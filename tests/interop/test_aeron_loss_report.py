"""loss-report.dat in Aeron's layout: our reader prints what LossStat printed for aeronmd's file, our writer
writes aeronmd's bytes, ``logbuf loss`` reads a driver directory, and the replayed lossy capture reports
what Aeron's receiver reported."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from aeron_vectors import read_vector, vector
from test_aeron_pcap_replay import Replay, lost_datagrams, sender_datagrams

from logbuf import LogBuffers
from logbuf.cli import main
from logbuf.cnc.loss_report import (
    DEFAULT_LOSS_REPORT_LENGTH,
    LossReport,
    LossReportFile,
    format_loss_stat,
)
from logbuf.directory import LOSS_REPORT_FILE
from logbuf.driver.network_conductor import ImageLossObserver
from logbuf.native import AtomicBuffer


def test_reader_prints_what_loss_stat_printed() -> None:
    entries = LossReportFile.from_bytes(read_vector("cnc/loss-report.dat.gz"))
    assert format_loss_stat(entries) == vector("cnc/lossstat-after-copy.txt").read_text()
    listing = json.loads(vector("cnc/loss-report-listing.json").read_text())
    assert [e.observation_count for e in entries] == [item["observation_count"] for item in listing]
    assert [e.first_observation_ms for e in entries] == [item["first_observation_timestamp_ms"] for item in listing]


def test_writer_writes_aeron_s_bytes() -> None:
    original = read_vector("cnc/loss-report.dat.gz")
    (entry,) = LossReportFile.from_bytes(original)
    ours = bytearray(DEFAULT_LOSS_REPORT_LENGTH)
    report = LossReport(AtomicBuffer(ours))
    per_observation = entry.total_bytes_lost // entry.observation_count  # 7 lost datagrams of 1280
    offset = report.create_entry(per_observation, entry.first_observation_ms, entry.session_id, entry.stream_id,
                                 entry.channel, entry.source)
    for i in range(1, entry.observation_count):
        last = i == entry.observation_count - 1
        report.record_observation(offset, per_observation, entry.last_observation_ms if last else
                                  entry.first_observation_ms)
    assert bytes(ours) == original


def test_logbuf_loss_reads_a_driver_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / LOSS_REPORT_FILE).write_bytes(read_vector("cnc/loss-report.dat.gz"))
    assert main(["loss", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == vector("cnc/lossstat-after-copy.txt").read_text()
    assert main(["loss", "--dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [e["total_bytes_lost"] for e in data["entries"]] == [8960]
    assert main(["loss", "--dir", str(tmp_path / "none")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("logbuf loss: error: no driver directory")


def test_replayed_lossy_capture_reports_what_aeron_reported(make_log: Callable[..., LogBuffers]) -> None:
    """Aeron's receiver reported 11 observations, 13,440 bytes: one per NAK, the NAKed lengths."""
    _, to_receiver, _ = sender_datagrams("unicast-loss.pcap")
    aeron_text = vector("pcap/unicast-loss.lossstat.txt").read_text().splitlines()
    lost = lost_datagrams(to_receiver)
    buffer = bytearray(DEFAULT_LOSS_REPORT_LENGTH)
    report = LossReport(AtomicBuffer(buffer))
    rig = Replay(1002, make_log)
    clock = {"now_ns": 0}
    for i, packet in enumerate(to_receiver):
        clock["now_ns"] = packet.time_ns
        if i in lost:
            continue
        rig.feed(packet)
        if rig.image is not None and rig.image.on_loss is None:
            source = f"{packet.source[0]}:{packet.source[1]}"
            rig.image.on_loss = ImageLossObserver(report, lambda: clock["now_ns"] // 1_000_000,
                                                  rig.image.session_id, rig.image.stream_id,
                                                  f"aeron:udp?endpoint=127.0.0.1:{packet.destination[1]}", source)
    (entry,) = LossReportFile.from_bytes(bytes(buffer))
    ours = format_loss_stat([entry]).splitlines()
    assert ours[0] == aeron_text[0] and ours[-1] == aeron_text[-1]
    mine, theirs = ours[1].split(","), aeron_text[1].split(",")
    assert mine[:2] == theirs[:2] == ["11", "13440"]
    assert mine[4:] == theirs[4:]  # session, stream, channel, source
    # the observation times are the capture's NAK times; Aeron's come from its own millisecond clock
    assert abs(entry.first_observation_ms - _ms(theirs[2])) <= 2
    assert abs(entry.last_observation_ms - _ms(theirs[3])) <= 2


def _ms(text: str) -> int:
    from datetime import datetime

    return int(datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f%z").timestamp() * 1000 + 0.5)
