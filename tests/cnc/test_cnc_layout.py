"""cnc.dat header/section layout against the reference tables (aeron-formats.md §5/§6), and CncFile
create/open validation."""

from __future__ import annotations

import os
import stat
import struct

import pytest

from logbuf.cnc import layout as L
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.errors import CncFileError, CncNotReadyError, CncVersionError
from logbuf.errors import LogbufError

pytestmark = pytest.mark.timeout(30)

KIB = 1024


def test_header_offsets_match_reference_table():
    assert (L.CNC_VERSION_OFFSET, L.TO_DRIVER_BUFFER_LENGTH_OFFSET, L.TO_CLIENTS_BUFFER_LENGTH_OFFSET) == (
        0,
        4,
        8,
    )
    assert (
        L.COUNTERS_METADATA_LENGTH_OFFSET,
        L.COUNTERS_VALUES_LENGTH_OFFSET,
        L.ERROR_LOG_LENGTH_OFFSET,
    ) == (
        12,
        16,
        20,
    )
    assert (L.CLIENT_LIVENESS_TIMEOUT_OFFSET, L.START_TIMESTAMP_OFFSET, L.PID_OFFSET) == (24, 32, 40)
    assert L.HEADER_LENGTH == 48 and L.END_OF_METADATA_OFFSET == 128
    assert L.CNC_VERSION == 512 and L.version_string(L.CNC_VERSION) == "0.2.0"
    assert (L.TO_DRIVER_TRAILER_LENGTH, L.TO_CLIENTS_TRAILER_LENGTH) == (768, 128)
    assert (L.COUNTER_VALUE_LENGTH, L.COUNTER_METADATA_LENGTH) == (128, 512)


def test_sections_follow_each_other_from_128_in_reference_order():
    layout = L.CncLayout.for_capacities(64 * KIB, 32 * KIB, 8 * KIB, 4 * KIB, 10_000_000_000, 1234, 99)
    assert layout.to_driver_buffer_length == 64 * KIB + 768
    assert layout.to_clients_buffer_length == 32 * KIB + 128
    assert layout.counters_metadata_length == 4 * 8 * KIB
    assert layout.to_driver_offset == 128
    assert layout.to_clients_offset == 128 + 64 * KIB + 768
    assert layout.counters_metadata_offset == layout.to_clients_offset + 32 * KIB + 128
    assert layout.counters_values_offset == layout.counters_metadata_offset + 32 * KIB
    assert layout.error_log_offset == layout.counters_values_offset + 8 * KIB
    assert layout.total_length == layout.error_log_offset + 4 * KIB
    assert layout.max_counter_id == 8 * KIB // 128 - 1


def test_header_encoding_decoded_by_independent_struct():
    layout = L.CncLayout.for_capacities(1024, 1024, 1024, 1024, 5_000_000_000, 4321, 1_700_000_000_000)
    raw = layout.encode()
    fields = struct.unpack_from("<iiiiiiqqq", raw)
    assert fields == (512, 1024 + 768, 1024 + 128, 4096, 1024, 1024, 5_000_000_000, 1_700_000_000_000, 4321)
    assert L.CncLayout.decode(raw) == layout


def _create(path, **overrides):
    args = dict(
        to_driver_capacity=4 * KIB,
        to_clients_capacity=4 * KIB,
        counters_values_length=4 * KIB,
        error_log_length=4 * KIB,
        client_liveness_timeout_ns=10_000_000_000,
        pid=os.getpid(),
        start_ms=1_700_000_000_123,
    )
    args.update(overrides)
    return CncFile.create(path, **args)


def test_create_then_open_round_trip(tmp_path):
    path = tmp_path / "cnc.dat"
    with _create(path) as cnc:
        cnc.to_driver.write(7, b"hello")
        counter_id = cnc.counters_manager().allocate(0, "Bytes sent")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    raw = path.read_bytes()
    assert len(raw) % 4096 == 0
    version, to_driver_len = struct.unpack_from("<ii", raw, 0)
    assert version == 512 and to_driver_len == 4 * KIB + 768
    with CncFile.open(path) as cnc:
        assert cnc.layout.pid == os.getpid()
        assert cnc.layout.start_timestamp_ms == 1_700_000_000_123
        assert cnc.layout.client_liveness_timeout_ns == 10_000_000_000
        assert cnc.to_driver.consumer_heartbeat_time == 1_700_000_000_123  # a fresh driver looks alive
        got = []
        cnc.to_driver.read(lambda t, body: got.append((t, bytes(body))))
        assert got == [(7, b"hello")]
        assert [c.label for c in cnc.counters_reader()] == ["Bytes sent"]
        assert cnc.counters_reader().counter_state(counter_id) == 1


def test_create_replaces_a_stale_file_and_honours_mode(tmp_path):
    path = tmp_path / "cnc.dat"
    path.write_bytes(b"stale" * 1000)
    with _create(path, mode=0o640):
        pass
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    with CncFile.open(path) as cnc:
        assert cnc.layout.version == 512


def test_invalid_capacities_are_rejected_at_create(tmp_path):
    with pytest.raises(CncFileError, match="power of two"):
        _create(tmp_path / "a", to_driver_capacity=3000)
    with pytest.raises(CncFileError, match="power of two"):
        _create(tmp_path / "b", to_clients_capacity=4097)
    with pytest.raises(CncFileError, match="multiple of 128"):
        _create(tmp_path / "c", counters_values_length=100)
    with pytest.raises(CncFileError, match="error log"):
        _create(tmp_path / "d", error_log_length=0)


def test_open_missing_file(tmp_path):
    with pytest.raises(CncFileError, match="no CnC file"):
        CncFile.open(tmp_path / "nope.dat")


def test_open_truncated_file(tmp_path):
    path = tmp_path / "cnc.dat"
    with _create(path):
        pass
    raw = path.read_bytes()
    path.write_bytes(raw[:20])
    with pytest.raises(CncFileError, match="truncated"):
        CncFile.open(path)
    path.write_bytes(raw[:1000])  # header fine, sections cut off
    with pytest.raises(CncFileError, match="truncated"):
        CncFile.open(path)


def test_open_while_initialising_says_not_ready(tmp_path):
    path = tmp_path / "cnc.dat"
    with _create(path):
        pass
    with open(path, "r+b") as f:
        f.write(struct.pack("<i", 0))
    with pytest.raises(CncNotReadyError, match="not initialised"):
        CncFile.open(path)


def test_open_wrong_major_version(tmp_path):
    path = tmp_path / "cnc.dat"
    with _create(path):
        pass
    with open(path, "r+b") as f:
        f.write(struct.pack("<i", L.compose_version(1, 0, 0)))
    with pytest.raises(CncVersionError, match="not compatible"):
        CncFile.open(path)
    with open(path, "r+b") as f:  # same major, other minor/patch: compatible
        f.write(struct.pack("<i", L.compose_version(0, 3, 7)))
    with CncFile.open(path) as cnc:
        assert cnc.layout.version == L.compose_version(0, 3, 7)


@pytest.mark.parametrize(
    "offset, value, message",
    [
        (4, 4096 + 768 + 8, "power of two"),  # to-driver length not capacity + trailer
        (8, 100, "power of two"),
        (12, 1234, "4 x the values length"),
        (16, 4 * KIB + 64, "multiple of 128"),
        (20, -1, "error log"),
    ],
)
def test_open_lengths_that_do_not_add_up(tmp_path, offset, value, message):
    path = tmp_path / "cnc.dat"
    with _create(path):
        pass
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<i", value))
    with pytest.raises(CncFileError, match=message):
        CncFile.open(path)


def test_open_foreign_file(tmp_path):
    path = tmp_path / "cnc.dat"
    path.write_bytes(b"%PDF-1.7 definitely not a cnc file\n" * 300)
    with pytest.raises(CncFileError) as info:
        CncFile.open(path)
    assert isinstance(info.value, LogbufError)
    path.write_bytes(os.urandom(8192))
    with pytest.raises(CncFileError):
        CncFile.open(path)


def test_sections_are_where_the_layout_says(tmp_path):
    """Bytes written through each section object land at the header-computed file offsets."""
    path = tmp_path / "cnc.dat"
    with _create(path) as cnc:
        layout = cnc.layout
        cnc.to_driver.write(3, b"cmd")
        cnc.broadcast_transmitter().transmit(0x0F04, struct.pack("<q", 7))
        cnc.counters_manager().allocate(11, "client-heartbeat: 1", struct.pack("<q", 1), registration_id=5)
        cnc.distinct_error_log().record("oops")
    raw = path.read_bytes()
    assert struct.unpack_from("<ii3s", raw, layout.to_driver_offset) == (11, 3, b"cmd")
    assert struct.unpack_from("<iiq", raw, layout.to_clients_offset) == (16, 0x0F04, 7)
    assert struct.unpack_from("<ii", raw, layout.counters_metadata_offset) == (1, 11)
    assert struct.unpack_from("<qq", raw, layout.counters_values_offset) == (0, 5)
    assert struct.unpack_from("<ii", raw, layout.error_log_offset) == (28, 1)
    assert raw[layout.error_log_offset + 24 : layout.error_log_offset + 28] == b"oops"
