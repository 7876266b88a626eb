"""``read_stat``, ``format_stat``, JSON and filters over a real cnc.dat; each way the file can be wrong."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import struct
from pathlib import Path

import pytest
from fake_driver import FakeDriver, now_ms

from logbuf.cnc import counters as c
from logbuf.cnc.layout import CNC_VERSION_OFFSET, compose_version
from logbuf.tools import (
    CncStatSource,
    CounterFilter,
    DriverInactiveError,
    DriverState,
    ExitCode,
    MissingFileError,
    UnusableFileError,
    format_stat,
    read_stat,
)

pytestmark = pytest.mark.timeout(30)

LINE = re.compile(r"^(?P<id>[ \d]{3}\d*): (?P<value>[ \d,-]{20}) - (?P<label>.*)$")


def populate(driver: FakeDriver) -> dict[str, int]:
    """Counters a driver with one IPC publication, one subscriber and one client would have."""
    driver.set(driver.system[0], 123_456_789)  # Bytes sent
    driver.set(driver.system[15], 3)  # Errors
    driver.set(driver.system[19], 1)  # Unblocked Publications
    ids = {
        "pub-lmt": driver.stream_counter(c.PUBLISHER_LIMIT_TYPE_ID, "pub-lmt", 7, -1812, 1001, value=65_536),
        "pub-pos": driver.stream_counter(
            c.PUBLISHER_POSITION_TYPE_ID, c.PUBLISHER_POSITION_NAME, 7, -1812, 1001, value=4_096
        ),
    }
    freed = driver.counters.allocate(c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos: freed")
    driver.counters.free(freed)  # reclaimed: must not be listed
    ids["freed"] = freed
    ids["sub-pos"] = driver.stream_counter(
        c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos", 9, -1812, 1001, "aeron:ipc?term-length=65536", 2_048, 0
    )
    ids["heartbeat"] = driver.client_heartbeat(3, driver.now_ms)
    ids["custom"] = driver.counters.allocate(4242, "feed gaps: A")
    driver.set(ids["custom"], -5)
    return ids


def snapshot_at(driver: FakeDriver, time_ms: int, **kwargs):
    return read_stat(driver.path, clock_ms=lambda: time_ms, **kwargs)


def test_text_header_and_counter_lines(driver: FakeDriver):
    ids = populate(driver)
    heartbeat = now_ms()
    driver.heartbeat(heartbeat)
    now = heartbeat + 250
    text = format_stat(snapshot_at(driver, now))
    lines = text.splitlines()

    wall = dt.datetime.fromtimestamp(now / 1000).strftime("%Y-%m-%d %H:%M:%S")
    assert lines[0].startswith(
        f"{wall} - logbuf stat (CnC v0.2.0), pid {os.getpid()}, heartbeat age 250 ms, up "
    )
    assert lines[1] == "=" * 70
    assert lines[2] == "  0:          123,456,789 - Bytes sent"
    assert lines[2 + 19] == " 19:                    1 - Unblocked Publications"

    parsed = []
    for line in lines[2:]:
        m = LINE.match(line)
        assert m, line
        parsed.append((int(m["id"]), int(m["value"].replace(",", "")), m["label"]))
    by_id = {i: (v, label) for i, v, label in parsed}
    # every system counter, in Aeron's order and with its label
    for system_id, label in c.SYSTEM_COUNTER_LABELS.items():
        assert by_id[driver.system[system_id]][1] == label
    assert by_id[driver.system[15]][0] == 3
    assert by_id[ids["pub-lmt"]] == (65_536, "pub-lmt: 7 -1812 1001 aeron:ipc")
    assert by_id[ids["pub-pos"]] == (4_096, "pub-pos (sampled): 7 -1812 1001 aeron:ipc")
    assert by_id[ids["sub-pos"]] == (2_048, "sub-pos: 9 -1812 1001 aeron:ipc?term-length=65536 @0")
    assert by_id[ids["heartbeat"]] == (driver.now_ms, "client-heartbeat: 3")
    assert by_id[ids["custom"]] == (-5, "feed gaps: A")
    assert ids["freed"] not in by_id
    assert len(parsed) == len(c.SYSTEM_COUNTER_LABELS) + 5
    assert [i for i, _, _ in parsed] == sorted(i for i, _, _ in parsed)


def test_header_fields_and_driver_state(driver: FakeDriver):
    heartbeat = now_ms()
    driver.heartbeat(heartbeat)
    header = snapshot_at(driver, heartbeat + 9_000).header
    assert header.driver_pid == os.getpid()
    assert header.cnc_version == 512 and header.cnc_version_string == "0.2.0"
    assert header.start_timestamp_ms == driver.start_ms
    assert header.heartbeat_age_ms == 9_000
    assert header.stale_after_ms == 10_000  # the client liveness timeout in the header
    assert header.state is DriverState.ACTIVE and header.inactive_reason() is None
    header.check_active()

    stale = snapshot_at(driver, heartbeat + 10_001).header
    assert stale.state is DriverState.STALE
    assert "10.0 s ago" in stale.inactive_reason()
    with pytest.raises(DriverInactiveError) as info:
        stale.check_active()
    assert info.value.exit_code == ExitCode.DRIVER_INACTIVE
    assert "STALE > 10,000 ms" in stale.summary()

    assert snapshot_at(driver, heartbeat + 2_000, stale_after_ms=1_000).header.state is DriverState.STALE

    driver.heartbeat(0)  # a driver that shut down cleanly
    gone = snapshot_at(driver, heartbeat).header
    assert gone.state is DriverState.SHUT_DOWN and gone.heartbeat_age_ms is None
    assert "shut down" in gone.inactive_reason() and "heartbeat 0" in gone.summary()


def test_json_has_header_and_decoded_keys(driver: FakeDriver):
    ids = populate(driver)
    heartbeat = now_ms()
    driver.heartbeat(heartbeat)
    snap = snapshot_at(driver, heartbeat + 40)
    data = json.loads(snap.to_json())
    assert data["driver_pid"] == os.getpid()
    assert data["cnc_version"] == 512 and data["cnc_version_string"] == "0.2.0"
    assert data["heartbeat_ms"] == heartbeat and data["heartbeat_age_ms"] == 40
    assert data["time_ms"] == heartbeat + 40 and data["driver_state"] == "active"
    assert data["driver_start_ms"] == driver.start_ms
    assert data["client_liveness_timeout_ns"] == 10**10
    counters = {item["id"]: item for item in data["counters"]}
    assert len(counters) == len(c.SYSTEM_COUNTER_LABELS) + 5

    bytes_sent = counters[driver.system[0]]
    assert (bytes_sent["type"], bytes_sent["type_id"], bytes_sent["value"]) == ("system", 0, 123_456_789)
    assert bytes_sent["key"] == {"system_counter_id": 0}

    sub = counters[ids["sub-pos"]]
    assert (sub["type"], sub["type_id"], sub["registration_id"]) == ("sub-pos", 4, 9)
    assert sub["key"] == {
        "registration_id": 9,
        "session_id": -1812,
        "stream_id": 1001,
        "channel": "aeron:ipc?term-length=65536",
    }
    assert counters[ids["pub-pos"]]["type"] == "pub-pos"

    hb = counters[ids["heartbeat"]]
    assert hb["type"] == "client-heartbeat" and hb["key"] == {"client_id": 3}
    assert hb["age_ms"] == heartbeat + 40 - driver.now_ms

    custom = counters[ids["custom"]]
    assert custom["type"] == "type-4242" and custom["key"] == {} and custom["value"] == -5


def test_snapshot_lookups(driver: FakeDriver):
    ids = populate(driver)
    snap = read_stat(driver.path)
    assert snap.value("Unblocked Publications") == 1
    assert snap.system_counter(19) == 1 and snap.system_counter(0) == 123_456_789
    assert snap.system_counter(99) is None
    assert [s.counter_id for s in snap.find(type_id=c.SUBSCRIBER_POSITION_TYPE_ID)] == [ids["sub-pos"]]
    assert [s.counter_id for s in snap.find(re.compile(r"^pub-"))] == [ids["pub-lmt"], ids["pub-pos"]]
    with pytest.raises(KeyError):
        snap.value("no such counter")


def test_filters_by_type_name_id_and_label(driver: FakeDriver):
    ids = populate(driver)
    snap = read_stat(driver.path)

    def selected(types=None, label=None):
        return [s.counter_id for s in snap.select(CounterFilter.parse(types, label)).counters]

    assert selected(["sub-pos"]) == [ids["sub-pos"]]
    assert selected(["1", "12"]) == [ids["pub-lmt"], ids["pub-pos"]]
    assert selected(["pub-lmt,SUB_POS"]) == [ids["pub-lmt"], ids["sub-pos"]]
    assert selected(["pub-pos (sampled)"]) == [ids["pub-pos"]]
    assert selected(["client-heartbeat"]) == [ids["heartbeat"]]
    assert selected(["4242"]) == [ids["custom"]]
    assert selected(label=r"^Bytes") == [driver.system[0], driver.system[1], driver.system[35]]
    assert selected(["system"], label="Unblocked") == [driver.system[19], driver.system[20]]
    assert selected(["sub-pos"], label="Unblocked") == []
    with pytest.raises(ValueError, match="unknown counter type 'sub-position'.*sub-pos"):
        CounterFilter.parse(["sub-position"])
    with pytest.raises(ValueError, match="bad --label"):
        CounterFilter.parse(None, "(")


# -- files that are not there, or not usable ------------------------------------------------------------


def test_missing_directory_and_missing_cnc(tmp_path: Path):
    with pytest.raises(MissingFileError, match="no driver directory") as info:
        read_stat(tmp_path / "nope" / "cnc.dat")
    assert info.value.exit_code == ExitCode.NOT_FOUND
    with pytest.raises(MissingFileError, match="no cnc.dat in"):
        read_stat(tmp_path / "cnc.dat")


@pytest.mark.parametrize("size", [0, 20, 48, 4096])
def test_truncated_cnc(driver: FakeDriver, size: int):
    driver.close()
    os.truncate(driver.path, size)
    with pytest.raises(UnusableFileError, match="truncated") as info:
        read_stat(driver.path)
    assert info.value.exit_code == ExitCode.UNUSABLE


def test_garbage_and_foreign_files(tmp_path: Path):
    path = tmp_path / "cnc.dat"
    path.write_bytes(os.urandom(64 * 1024))
    with pytest.raises(UnusableFileError, match=f"cannot use {path}"):
        read_stat(path)
    # a plausible header with nonsense section lengths
    path.write_bytes(struct.pack("<iiiiiiqqq", 512, 3, 5, 7, 11, 13, 1, 1, 1) + bytes(64 * 1024))
    with pytest.raises(UnusableFileError, match="capacity must be a power of two"):
        read_stat(path)


def test_incompatible_version(driver: FakeDriver):
    driver.cnc.header_buffer.put_i32_release(CNC_VERSION_OFFSET, compose_version(1, 0, 0))
    with pytest.raises(UnusableFileError, match="CnC version not compatible: file is 1.0.0"):
        read_stat(driver.path)


def test_version_zero_waits_then_reports_initialising(driver: FakeDriver):
    driver.cnc.header_buffer.put_i32_release(CNC_VERSION_OFFSET, 0)
    with pytest.raises(UnusableFileError, match="not initialised yet.*still so after 0.05 s"):
        read_stat(driver.path, not_ready_wait_s=0.05)


def test_source_follows_a_restarted_driver(driver: FakeDriver):
    with CncStatSource(driver.path) as source:
        assert source.read().header.driver_pid == os.getpid()
        driver.close()
        os.unlink(driver.path)
        with pytest.raises(MissingFileError):
            source.read()
        restarted = FakeDriver(driver.directory, pid=4_000_000, start_ms=now_ms())
        try:
            restarted.set(restarted.system[19], 2)
            snap = source.read()
            assert snap.header.driver_pid == 4_000_000 and snap.system_counter(19) == 2
        finally:
            restarted.close()


# -- ages, units, lags ----------------------------------------------------------------------------------


def test_a_heartbeat_stored_after_the_readers_clock_has_age_0(driver: FakeDriver):
    heartbeat = now_ms()
    driver.heartbeat(heartbeat)
    header = snapshot_at(driver, heartbeat - 7).header  # the driver beat between our clock read and the read
    assert header.heartbeat_age_ms == 0
    assert "heartbeat age 0 ms" in header.summary()
    assert header.state is DriverState.ACTIVE


def test_timestamp_counters_have_an_age_never_negative(driver: FakeDriver):
    ids = populate(driver)
    snap = snapshot_at(driver, driver.now_ms + 1_500)
    (hb,) = [s for s in snap.counters if s.counter_id == ids["heartbeat"]]
    assert hb.unit == "epoch-ms" and hb.age_ms(snap.header.time_ms) == 1_500
    assert hb.age_ms(driver.now_ms - 10) == 0
    assert [s.age_ms(snap.header.time_ms) for s in snap.counters if s.counter_id != ids["heartbeat"]] == [
        None
    ] * (len(snap.counters) - 1)


def test_counter_units(driver: FakeDriver):
    ids = populate(driver)
    units = {s.counter_id: s.unit for s in read_stat(driver.path).counters}
    assert units[driver.system[0]] == units[driver.system[1]] == "B"  # Bytes sent / received
    assert units[driver.system[36]] == "B"  # Retransmitted bytes
    assert units[driver.system[26]] == "ns"  # Conductor max cycle time
    assert units[driver.system[5]] == ""  # NAKs sent: events
    assert units[ids["pub-pos"]] == units[ids["sub-pos"]] == units[ids["pub-lmt"]] == "B"
    assert units[ids["custom"]] == ""


def test_lag_pairs_each_subscriber_with_its_streams_producer(driver: FakeDriver):
    ids = populate(driver)  # pub-pos 4,096 and sub-pos 2,048 of session -1812
    udp = "aeron:udp?endpoint=127.0.0.1:40123"
    hwm = driver.stream_counter(c.RECEIVER_HWM_TYPE_ID, "rcv-hwm", 21, 77, 2002, udp, value=10_000)
    udp_sub = driver.stream_counter(c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos", 22, 77, 2002, udp, 9_000, 0)
    ahead = driver.stream_counter(c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos", 23, -1812, 1001, value=5_000)
    lonely = driver.stream_counter(c.SUBSCRIBER_POSITION_TYPE_ID, "sub-pos", 24, 99, 1001, value=5)
    lags = {lag.subscriber_counter_id: lag for lag in read_stat(driver.path).stream_lags()}

    ipc = lags[ids["sub-pos"]]
    assert (ipc.producer_type, ipc.producer_counter_id, ipc.producer_position) == ("pub-pos", ids["pub-pos"], 4_096)
    assert (ipc.session_id, ipc.stream_id, ipc.subscriber_registration_id, ipc.lag) == (-1812, 1001, 9, 2_048)
    assert ipc.channel == "aeron:ipc?term-length=65536"

    net = lags[udp_sub]  # no publication on this driver: measured from the image's high-water mark
    assert (net.producer_type, net.producer_counter_id, net.lag, net.channel) == ("rcv-hwm", hwm, 1_000, udp)

    assert lags[ahead].lag == 0  # pub-pos is sampled: a subscriber past the sample is not behind
    assert lonely not in lags  # nothing to measure from
    assert list(lags) == sorted(lags)


def test_the_plain_listing_stays_aeronstats_layout_and_json_carries_the_lags(driver: FakeDriver):
    ids = populate(driver)
    snap = read_stat(driver.path)
    lines = format_stat(snap).splitlines()
    assert all(LINE.match(line) for line in lines[2:])  # no rate/age column, no streams section
    assert len(lines) == 2 + len(snap.counters)
    data = json.loads(snap.to_json())
    assert [(s["subscriber_counter_id"], s["lag_bytes"]) for s in data["streams"]] == [(ids["sub-pos"], 2_048)]
    units = {item["id"]: item["unit"] for item in data["counters"]}
    assert units[ids["heartbeat"]] == "epoch-ms" and units[driver.system[0]] == "B"
