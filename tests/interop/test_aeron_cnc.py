"""Our readers on aeronmd's files: cnc.dat (counters, error log) as AeronStat and ErrorStat printed them, and
its log buffers as the listings describe them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from aeron_vectors import read_vector, vector

from logbuf.cli import main
from logbuf.cnc import counters as c
from logbuf.cnc.cnc_file import CncFile
from logbuf.tools.log_dump import read_log_dump

AERON_STAT_LINE = re.compile(r"^ *(?P<id>\d+) ?: +(?P<value>[\d,-]+) - (?P<label>.*)$")


@pytest.fixture
def aeron_dir(tmp_path: Path) -> Path:
    """A directory holding aeronmd's cnc.dat (its driver is long gone: the heartbeat is stale)."""
    (tmp_path / "cnc.dat").write_bytes(read_vector("cnc/cnc.dat.gz"))
    return tmp_path


def stat_lines(text: str) -> list[tuple[int, int, str]]:
    """(id, value, label) of every counter line of AeronStat's or ``logbuf stat``'s text."""
    out = []
    for line in text.splitlines():
        m = AERON_STAT_LINE.match(line)
        if m:
            out.append((int(m["id"]), int(m["value"].replace(",", "")), m["label"]))
    return out


def test_counters_decode_as_the_listing_says(aeron_dir: Path) -> None:
    listing = json.loads(vector("cnc/cnc-listing.json").read_text())
    with CncFile.open(aeron_dir / "cnc.dat") as cnc:
        reader = cnc.counters_reader()
        for expected in listing["counters"]:
            counter_id = expected["id"]
            assert reader.counter_state(counter_id) == expected["state"]
            assert reader.counter_type_id(counter_id) == expected["type_id"]
            assert reader.counter_label(counter_id) == expected["label"]
            assert reader.counter_key(counter_id).hex() == expected["key_hex"]
            assert reader.counter_value(counter_id) == expected["value"]
            assert (reader.counter_registration_id(counter_id), reader.counter_owner_id(counter_id),
                    reader.counter_reference_id(counter_id)) == (
                expected["registration_id"], expected["owner_id"], expected["reference_id"])
            assert reader.free_for_reuse_deadline(counter_id) == expected["free_for_reuse_deadline_ms"]
        observations = list(cnc.error_log_reader().read())
    assert [(o.count, o.first_timestamp_ms, o.last_timestamp_ms, o.text) for o in observations] == [
        (e["observation_count"], e["first_observation_timestamp_ms"], e["last_observation_timestamp_ms"],
         e["encoded_error"]) for e in listing["distinct_errors"]]


def test_logbuf_stat_prints_what_aeron_stat_printed(aeron_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Same ids, values and labels, in the same order (the header line is ours).  The copied file holds the
    counters of the AeronStat run just before the copy (the independent listing agrees): one idle heartbeat
    went out between that run and the one after it."""
    assert main(["stat", "--dir", str(aeron_dir), "--force"]) == 5  # printed, but the driver is not alive
    ours = stat_lines(capsys.readouterr().out)
    aeron = stat_lines(vector("cnc/aeronstat-before-copy.txt").read_text())
    assert len(aeron) == 68 and ours == aeron


def test_logbuf_errors_prints_what_error_stat_printed(aeron_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["errors", "--dir", str(aeron_dir)]) == 0
    assert capsys.readouterr().out == vector("cnc/errorstat-after-copy.txt").read_text()


def test_our_system_counters_are_aeron_s_but_for_version_and_threading_mode(aeron_dir: Path) -> None:
    """Every system counter label equals aeronmd's once its version text, threading mode and cycle threshold
    (settings, not format) are put in; the software-version value is 1.48.0 encoded as Aeron encodes it."""
    with CncFile.open(aeron_dir / "cnc.dat") as cnc:
        reader = cnc.counters_reader()
        aeron = {i: reader.counter_label(i) for i in range(40)}
        aeron_version_value = reader.counter_value(c.SystemCounter.AERON_VERSION)
    expected = c.system_counter_labels("version=1.48.0-SNAPSHOT commit=+guilty", "DEDICATED", 1_000_000_000)
    assert expected == aeron
    assert c.SOFTWARE_VERSION_VALUE == aeron_version_value == 77_824
    assert [counter.name for counter in c.SystemCounter][:2] == ["BYTES_SENT", "BYTES_RECEIVED"]


FRAME_LINE = re.compile(r"^\s+@(?P<offset>\d+)\s+(?P<type>DATA|PAD)\s+frame_length=(?P<length>\d+)\s+"
                        r"flags=0x(?P<flags>[0-9a-f]{2}) term_id=(?P<term_id>-?\d+)")


def listed(name: str) -> tuple[dict[str, str], dict[int, list[tuple[int, str, int, int, int]]]]:
    """The metadata lines and, per partition, the frames of a log buffer's listing."""
    meta: dict[str, str] = {}
    frames: dict[int, list[tuple[int, str, int, int, int]]] = {}
    partition = -1
    for line in vector(f"logbuffers/{name}.frames.txt").read_text().splitlines():
        if line.startswith("meta "):
            key, _, value = line[len("meta "):].partition(" = ")
            meta[key] = value
        elif line.startswith("partition "):
            partition = int(line.split()[1].rstrip(":"))
            frames[partition] = []
        elif (m := FRAME_LINE.match(line)) is not None:
            frames[partition].append((int(m["offset"]), m["type"], int(m["length"]), int(m["flags"], 16),
                                      int(m["term_id"])))
    return meta, frames


@pytest.mark.parametrize("name", ["ipc-during-linger", "ipc-after-close", "udp-pub-during-linger",
                                  "udp-pub-after-close", "udp-image-during-linger", "udp-image-after-eos"])
def test_log_buffers_decode_as_the_listings_say(name: str) -> None:
    meta, frames = listed(name)
    dump = read_log_dump(vector(f"logbuffers/{name}.logbuffer"), max_frames=None).to_dict()
    m = dump["metadata"]
    for field in ("term_length", "page_size", "initial_term_id", "correlation_id", "active_transport_count",
                  "active_term_count", "publication_window_length", "receiver_window_length",
                  "linger_timeout_ns"):
        assert m[field] == int(meta[field]), field
    assert m["mtu"] == int(meta["mtu_length"])
    assert m["is_connected"] == bool(int(meta["is_connected"]))
    eos = int(meta["end_of_stream_position"])
    assert m["end_of_stream_position"] == (None if eos == 2**63 - 1 else eos)
    assert [t["term_id"] for t in dump["tails"]] == [t["term_id"] for t in eval(meta["term_tail_counters"])]
    for term in dump["terms"]:
        ours = [(f["term_offset"], f["type_name"], f["frame_length"], f["flags"], f["term_id"])
                for f in term["frames"]]
        theirs = frames[term["partition"]]
        assert ours == theirs[: len(ours)]  # logdump walks from offset 0 to the tail: a prefix of the listing
        if theirs and theirs[0][0] == 0 and term["tail_offset"] > 0:
            assert ours  # a term written from its start is decoded
