"""The driver's command handling, channels, draining and wake-ups, with an embedded driver (fast)."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import logbuf
from logbuf.channel import ChannelUri, InvalidChannelError
from logbuf.cli import main as cli_main
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.errors import CncFileError
from logbuf.cnc.messages import (
    ControlCommand,
    ControlResponse,
    ErrorCode,
    PublicationMessage,
    decode_response,
)
from logbuf.directory import CNC_FILE
from support import running_driver, wait_until

pytestmark = pytest.mark.timeout(60)
STREAM = 7


@pytest.fixture
def driver(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield from running_driver(
        tmp_path / "drv",
        ipc_term_length=64 * 1024,
        timer_interval_ns=50_000_000,
        publication_linger_timeout_ns=2_000_000_000,
    )



class Responses:
    """Follows the to-clients broadcast like a client would, collecting decoded responses."""

    def __init__(self, cnc: CncFile) -> None:
        self.receiver = cnc.copy_broadcast_receiver()
        self.seen: list[tuple[int, object]] = []

    def collect(self) -> list[tuple[int, object]]:
        while self.receiver.receive(lambda t, b: self.seen.append((t, decode_response(t, b)))):
            pass
        return self.seen

    def error_for(self, correlation_id: int, timeout: float = 5.0):  # type: ignore[no-untyped-def]
        def found():  # type: ignore[no-untyped-def]
            return next((msg for msg_type, msg in self.collect() if msg_type == ControlResponse.ON_ERROR
                         and msg.offending_correlation_id == correlation_id), None)  # type: ignore[attr-defined]

        return wait_until(found, timeout, what=f"ON_ERROR for {correlation_id}")


def test_concurrent_publications_share_a_log_exclusive_ones_get_their_own(client) -> None:  # type: ignore[no-untyped-def]
    a = client.add_publication("aeron:ipc", STREAM)
    b = client.add_publication("logbuf:ipc", STREAM)
    x = client.add_exclusive_publication("aeron:ipc", STREAM)
    assert a.session_id == b.session_id and a.log.path == b.log.path
    assert x.session_id != a.session_id and x.log.path != a.log.path


def test_term_length_and_mtu_come_from_the_channel(client) -> None:  # type: ignore[no-untyped-def]
    pub = client.add_publication("aeron:ipc?term-length=128k|mtu=4096", STREAM)
    assert pub.term_length == 128 * 1024 and pub.max_payload_length == 4096 - 32
    with pytest.raises(logbuf.RegistrationError, match="existing publication has different 'term-length'") as info:
        client.add_publication("aeron:ipc?term-length=256k", STREAM)
    assert info.value.code == ErrorCode.GENERIC_ERROR  # aeronmd's code for a publication that does not match


@pytest.mark.parametrize("channel", ["aeron:tcp", "ipc", "aeron:ipc?term-length=3k", "aeron:ipc?mtu=100",
                                     "aeron:ipc?term-length", "aeron:udp?endpoint=nohost"])
def test_bad_channels_are_refused_with_invalid_channel(client, channel: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(logbuf.RegistrationError) as info:
        client.add_publication(channel, STREAM)
    assert info.value.code == ErrorCode.INVALID_CHANNEL


def test_channel_uri_parsing() -> None:
    uri = ChannelUri.parse("aeron:udp?endpoint=127.0.0.1:40456|term-length=1m|mtu=8k")
    assert uri.is_udp and uri.endpoint() == ("127.0.0.1", 40456)
    assert uri.term_length(0) == 1 << 20 and uri.mtu(0) == 8192
    assert ChannelUri.parse("logbuf:ipc").canonical() == "aeron:ipc"
    assert ChannelUri.parse("aeron:udp?endpoint=[::1]:9").endpoint() == ("::1", 9)
    for bad in ("", "aeron:", "aeron:ipc?a=1|a=2", "aeron:ipc?endpoint=x:1", "aeron:udp", "aeron:ipc x"):
        with pytest.raises(InvalidChannelError):
            ChannelUri.parse(bad)


def test_a_late_subscriber_joins_beside_the_slowest_one_or_at_the_current_position(client) -> None:  # type: ignore[no-untyped-def]
    """As Aeron's IPC publication: a subscriber added to a running publication starts where the slowest
    subscriber is (it reads what they all still may); beside subscribers that read everything, that is the
    current position."""
    early = client.add_subscription("aeron:ipc", STREAM)
    pub = client.add_publication("aeron:ipc", STREAM)
    wait_until(lambda: pub.is_connected, what="connected")
    old = [b"old-%d" % i for i in range(5)]
    for message in old:
        assert pub.offer(message) > 0

    def join() -> tuple[logbuf.Subscription, int]:
        images: list[logbuf.Image] = []
        sub = client.add_subscription("aeron:ipc", STREAM, on_available_image=images.append)
        wait_until(lambda: images, what="the image")
        return sub, images[0].join_position

    def read(sub: logbuf.Subscription, count: int) -> list[bytes]:
        got: list[bytes] = []
        wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) >= 0 and len(got) >= count,
                   what="messages")
        return got

    late, late_join = join()
    assert late_join == 0 < pub.position  # beside the early one, which read nothing
    assert pub.offer(b"new") > 0
    assert read(late, 6) == [*old, b"new"]
    assert read(early, 6) == [*old, b"new"]
    latest, latest_join = join()
    assert latest_join == pub.position  # both read everything
    assert pub.offer(b"newer") > 0
    assert read(latest, 1) == [b"newer"]


def test_closed_publication_drains_then_the_image_goes_and_the_file_is_deleted(client) -> None:  # type: ignore[no-untyped-def]
    gone: list[logbuf.Image] = []
    sub = client.add_subscription("aeron:ipc", STREAM, on_unavailable_image=gone.append)
    pub = client.add_publication("aeron:ipc", STREAM)
    wait_until(lambda: sub.images and pub.is_connected, what="image, and the publication connected")
    image = sub.images[0]
    path = Path(pub.log.path)
    for i in range(20):
        assert pub.offer(b"m%d" % i) > 0
    end = pub.position
    pub.close()
    # the driver took the close: it marked the end of stream in the log (and started draining)
    wait_until(lambda: image.log.end_of_stream_position == end, what="the end of stream marked")
    time.sleep(0.15)  # let time pass: three drain checks (timer 50 ms) while the subscriber has not read the end
    assert not gone and path.exists()  # lingering (2 s): the subscriber has not read the end yet
    got: list[bytes] = []
    sub.poll(lambda b, h: got.append(bytes(b)), 100)
    assert len(got) == 20 and image.is_end_of_stream()
    wait_until(lambda: gone, what="unavailable image")
    assert gone == [image] and not sub.images
    assert image.is_closed and image.is_end_of_stream()  # closed at its end: it still says so (as Aeron's)
    wait_until(lambda: not path.exists(), what="log file deleted")


def test_wait_wakes_on_offer_and_times_out_without_data(client) -> None:  # type: ignore[no-untyped-def]
    sub = client.add_subscription("aeron:ipc", STREAM)
    pub = client.add_publication("aeron:ipc", STREAM)
    wait_until(lambda: sub.images and pub.is_connected, what="image, and the publication connected")
    start = time.monotonic()
    assert sub.wait(0.2) is False
    assert 0.15 <= time.monotonic() - start < 2
    woke: list[float] = []

    def waiter() -> None:
        assert sub.wait(10)
        woke.append(time.monotonic())

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: pub.log.meta.get_i32(1024) == 1, what="waiter declared")  # LOG_WAITING_SUBSCRIBERS
    sent = time.monotonic()
    assert pub.offer(b"wake") > 0
    thread.join(5)
    assert woke and woke[0] - sent < 1.0
    assert pub.log.meta.get_i32(1024) == 0


def test_wait_async(client) -> None:  # type: ignore[no-untyped-def]
    sub = client.add_subscription("aeron:ipc", STREAM)
    pub = client.add_publication("aeron:ipc", STREAM)
    wait_until(lambda: sub.images and pub.is_connected, what="image, and the publication connected")

    async def scenario() -> tuple[bool, bool]:
        timed_out = await sub.wait_async(0.1)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, lambda: pub.offer(b"hello"))
        woke = await sub.wait_async(5)
        return timed_out, woke

    assert asyncio.run(scenario()) == (False, True)


def _write_raw(cnc: CncFile, msg_type_id: int, body: bytes) -> None:
    assert cnc.to_driver.write(msg_type_id, body)


def test_malformed_and_unknown_commands_get_on_error(driver) -> None:  # type: ignore[no-untyped-def]
    with CncFile.open(driver.directory / CNC_FILE) as cnc:
        responses = Responses(cnc)
        client_id = cnc.to_driver.next_correlation_id()
        # an ADD_PUBLICATION cut short after its ids: MALFORMED_COMMAND with the offending correlation id
        truncated = PublicationMessage(client_id, 4242, STREAM, "aeron:ipc").encode()[:20]
        _write_raw(cnc, ControlCommand.ADD_PUBLICATION, truncated)
        assert responses.error_for(4242).error_code == ErrorCode.MALFORMED_COMMAND
        _write_raw(cnc, 0x77, struct.pack("<qq", client_id, 4343))
        assert responses.error_for(4343).error_code == ErrorCode.UNKNOWN_COMMAND_TYPE_ID
        _write_raw(cnc, ControlCommand.REMOVE_PUBLICATION, struct.pack("<qqq", client_id, 4444, 999))
        assert responses.error_for(4444).error_code == ErrorCode.UNKNOWN_PUBLICATION
        _write_raw(cnc, ControlCommand.TERMINATE_DRIVER, struct.pack("<qqi", client_id, 4545, 0))
        assert responses.error_for(4545).error_code == ErrorCode.NOT_SUPPORTED
    assert driver.is_running


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.tuples(st.integers(-5, 0x20), st.binary(max_size=200)), min_size=1, max_size=8))
def test_fuzzed_command_records_never_hurt_the_driver(driver, records) -> None:  # type: ignore[no-untyped-def]
    with CncFile.open(driver.directory / CNC_FILE) as cnc:
        for msg_type_id, body in records:
            if msg_type_id >= 1:
                _write_raw(cnc, msg_type_id, body)
        wait_until(lambda: cnc.to_driver.size() == 0, timeout=5, what="driver to consume the commands")
    assert driver.is_running


def test_fuzzing_leaves_a_working_driver(driver) -> None:  # type: ignore[no-untyped-def]
    with CncFile.open(driver.directory / CNC_FILE) as cnc:
        for body in (b"", b"\xff" * 7, b"\x00" * 16 + b"\xff\xff\xff\x7f", struct.pack("<qqii", 1, 2, 3, -5)):
            for msg_type_id in range(1, 16):
                _write_raw(cnc, msg_type_id, body)
        wait_until(lambda: cnc.to_driver.size() == 0, timeout=5, what="consumed")
        errors = cnc.counters_reader().counter_value(15)
    assert errors >= 40
    with logbuf.connect(driver.directory) as client:
        pub = client.add_publication("aeron:ipc", STREAM)
        sub = client.add_subscription("aeron:ipc", STREAM)
        wait_until(lambda: pub.is_connected, what="connected")
        assert pub.offer(b"still fine") > 0
        got: list[bytes] = []
        wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 1) or got, what="data")
        assert got == [b"still fine"]


def test_truncated_or_foreign_cnc_file_gives_a_clear_error(tmp_path: Path) -> None:
    directory = tmp_path / "bogus"
    directory.mkdir()
    (directory / CNC_FILE).write_bytes(b"\x00" * 20)
    with pytest.raises(CncFileError, match="truncated"):
        logbuf.connect(directory, connect_timeout=0.2)
    (directory / CNC_FILE).write_bytes(b"GIF89a" + b"\x01" * 8000)
    with pytest.raises(CncFileError, match="version"):
        logbuf.connect(directory, connect_timeout=0.2)


def test_no_driver_gives_driver_timeout(tmp_path: Path) -> None:
    with pytest.raises(logbuf.DriverTimeout, match="no media driver"):
        logbuf.connect(tmp_path / "nothing", connect_timeout=0.1)


def test_logbuf_stat_on_a_live_driver(client, driver, capsys) -> None:  # type: ignore[no-untyped-def]
    pub = client.add_publication("aeron:ipc", STREAM)
    sub = client.add_subscription("aeron:ipc", STREAM)
    wait_until(lambda: pub.is_connected, what="connected")
    assert pub.offer(b"x" * 100) > 0
    wait_until(lambda: client.counters.counter_value(client.counters.find(12)) == 160, what="pub-pos sampled")
    assert cli_main(["stat", "--dir", str(driver.directory)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert str(driver.cnc.layout.pid) in text[0]
    assert any(line.split(":", 1)[0].strip() == "19" and "Unblocked Publications" in line for line in text)
    pub_pos = [line for line in text if "pub-pos (sampled):" in line]
    assert len(pub_pos) == 1 and pub_pos[0].split(" - ")[0].split(":")[1].strip() == "160"
    # Aeron's sub-pos label: the subscription's registration id and channel
    assert any(f"sub-pos: {sub.registration_id} {pub.session_id} {STREAM} aeron:ipc @0" in line for line in text)
    assert cli_main(["stat", "--dir", str(driver.directory), "--json", "--type", "pub-lmt"]) == 0
    snapshot = json.loads(capsys.readouterr().out)
    [lmt] = snapshot["counters"]
    assert lmt["type_id"] == 1 and lmt["value"] == 32 * 1024
    assert snapshot["driver_pid"] == driver.cnc.layout.pid and snapshot["driver_state"] == "active"


def test_client_counters_are_visible_and_freed_with_the_client(driver) -> None:  # type: ignore[no-untyped-def]
    with logbuf.connect(driver.directory) as owner, logbuf.connect(driver.directory) as observer:
        counter = owner.add_counter(1100, "feed A packets", b"A")
        counter.set(42)
        info = [i for i in observer.counters if i.counter_id == counter.counter_id][0]
        assert (info.type_id, info.label, info.value, info.key[:1]) == (1100, "feed A packets", 42, b"A")
        counter.close()
        wait_until(lambda: all(i.counter_id != counter.counter_id for i in observer.counters), what="freed")
        again = owner.add_counter(1100, "feed B packets")
    # the owner closed: its counters go with it
    with logbuf.connect(driver.directory) as observer:
        wait_until(lambda: all(i.label != "feed B packets" for i in observer.counters), what="released")
    assert again.counter_id >= 0


def test_a_held_consumer_resumes_where_it_released_after_a_crash(driver) -> None:  # type: ignore[no-untyped-def]
    with logbuf.connect(driver.directory) as producer:
        pub = producer.add_publication("aeron:ipc", STREAM)
        first = logbuf.connect(driver.directory)
        sub = first.add_subscription("aeron:ipc", STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connected")
        image = sub.images[0]
        image.hold_position()
        for i in range(30):
            assert pub.offer(b"m%02d" % i) > 0
        got: list[bytes] = []
        positions: list[int] = []
        image.poll(lambda b, h: (got.append(bytes(b)), positions.append(h.position)), 30)
        assert len(got) == 30
        image.release_to(positions[9])  # only the first 10 are "durable"
        assert image.released_position == positions[9] < image.position
        session = image.session_id
        first._fail(logbuf.DriverTimeout("simulated crash"))  # stops heart-beating, keeps its sub-pos
        second = logbuf.connect(driver.directory)
        try:
            resumed = second.add_subscription(f"aeron:ipc?resume-position={session}:{positions[9]}", STREAM)
            wait_until(lambda: resumed.images, what="resumed image")
            assert resumed.images[0].join_position == positions[9]
            again: list[bytes] = []
            resumed.poll(lambda b, h: again.append(bytes(b)), 100)
            assert again == got[10:]
        finally:
            second.close()
            first.close()
