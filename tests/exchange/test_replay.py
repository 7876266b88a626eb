from __future__ import annotations

import json
import select
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from logbuf.channel import parse_endpoint
from logbuf.exchange.dayfile import DayFileReader
from logbuf.exchange.replay.config import FaultConfig, FeedConfig, ReplayConfig
from logbuf.exchange.replay.core import ReplayCore
from logbuf.exchange.replay.schedule import EventKind
from logbuf.exchange.replay.sender import ReplayServer
from logbuf.exchange.synth import OPEN_NS
from logbuf.marketdata import moldudp64 as m

QUICK_END = {"end_of_session_count": 2, "end_of_session_interval_ns": 0}


def _events(path: Path, **kw) -> tuple[list, ReplayCore, list]:
    reader = DayFileReader(path)
    core = ReplayCore(reader, ReplayConfig(**{**QUICK_END, **kw}))
    events = list(core.events())
    with DayFileReader(path) as again:
        raw = [again_block.message(i) for again_block in again.blocks() for i in range(again_block.count)]
    return events, core, raw


def _data(events: list, feed: int = 0) -> list:
    return [e for e in events if e.feed == feed and e.kind in (EventKind.DATA, EventKind.CATCH_UP)]


def test_packets_respect_budget_and_carry_every_message_in_order(small_day: Path) -> None:
    events, core, raw = _events(small_day, speed=None, budget=600)
    seq = 1
    for e in _data(events):
        packet = m.decode(e.data)
        assert len(e.data) <= 600 or packet.sequence == seq and len(packet.messages) == 1
        assert packet.sequence == seq == e.sequence and len(packet.messages) == e.count
        assert list(packet.messages) == raw[seq - 1 : seq - 1 + e.count]
        seq += e.count
    assert seq == len(raw) + 1 == core.next_sequence
    eos = [e for e in events if e.kind == EventKind.END_OF_SESSION]
    assert len(eos) == 2 and all(m.decode(e.data) == m.EndOfSession(b"SYNTH0001 ", seq) for e in eos)


def test_flush_on_time_gap(small_day: Path) -> None:
    events, _, raw = _events(small_day, speed=None, flush_gap_ns=10_000)
    from logbuf.marketdata import itch

    for e in _data(events):
        ts = [itch.timestamp_of(msg) for msg in m.decode(e.data).messages]
        assert all(b - a <= 10_000 for a, b in zip(ts, ts[1:], strict=False))
    # and packets do fill up when messages are close: some carry many messages
    assert max(e.count for e in _data(events)) > 10


@pytest.mark.parametrize("speed", [1.0, 10.0])
def test_send_times_follow_scaled_timestamps(small_day: Path, speed: float) -> None:
    from logbuf.marketdata import itch

    events, _, raw = _events(small_day, speed=speed, start="open")
    data = _data(events)
    origin = itch.timestamp_of(raw[data[0].sequence - 1])
    assert origin >= OPEN_NS
    for e in data:
        expected = int((itch.timestamp_of(raw[e.sequence - 1]) - origin) / speed)
        assert e.time_ns == expected
    times = [e.time_ns for e in events]
    assert times == sorted(times)


def test_start_phase_keeps_sequence_numbers(small_day: Path) -> None:
    from logbuf.marketdata import itch

    events, core, raw = _events(small_day, speed=None, start="open")
    first_open = next(i for i, r in enumerate(raw) if itch.timestamp_of(r) >= OPEN_NS)
    skipped = [e for e in events if e.kind == EventKind.SKIPPED]
    assert sum(e.count for e in skipped) == first_open == core.skipped
    data = _data(events)
    assert data[0].sequence == first_open + 1 == core.first_sequence
    assert m.decode(data[0].data).messages[0] == raw[first_open]  # S/Q, start of market hours


def test_heartbeats_fill_idle_seconds(small_day: Path) -> None:
    events, _, _ = _events(small_day, speed=1.0, start="close", heartbeat_ns=10**9)
    hbs = [e for e in events if e.kind == EventKind.HEARTBEAT]
    assert hbs
    sends = [e for e in events if e.feed == 0 and e.kind != EventKind.SKIPPED]
    for prev, cur in zip(sends, sends[1:], strict=False):
        assert cur.time_ns - prev.time_ns <= 10**9  # never more than a second of silence
    for hb in hbs:
        packet = m.decode(hb.data)
        assert isinstance(packet, m.Heartbeat) and packet.next_sequence == hb.sequence


def _fault_run(path: Path, seed: int, faults: FaultConfig) -> tuple[list, ReplayCore]:
    events, core, _ = _events(path, speed=1.0, seed=seed, feeds=(FeedConfig("A", faults=faults),))
    return events, core


def test_faults_are_deterministic_per_seed(small_day: Path) -> None:
    faults = FaultConfig(loss=0.05, duplicate=0.05, reorder=0.05, freeze=0.01)
    a, core_a = _fault_run(small_day, 7, faults)
    b, _ = _fault_run(small_day, 7, faults)
    c, _ = _fault_run(small_day, 8, faults)
    key = [(e.time_ns, e.kind, e.data) for e in a]
    assert key == [(e.time_ns, e.kind, e.data) for e in b]
    assert key != [(e.time_ns, e.kind, e.data) for e in c]
    stats = core_a.feeds[0].stats
    assert stats.lost_packets and stats.duplicated_packets and stats.reordered_packets and stats.freezes
    # what the summary says is what the events show
    data = _data(a)
    assert len(data) == stats.packets
    sent = sum(e.count for e in data)
    assert sent == stats.messages
    unique = {s for e in data for s in range(e.sequence, e.sequence + e.count)}
    assert len(unique) == core_a.next_sequence - 1 - stats.lost_messages
    seqs = [e.sequence for e in data]
    assert sum(x > y for x, y in zip(seqs, seqs[1:], strict=False)) >= stats.reordered_packets  # out of order on the wire


def test_freeze_is_silence_then_large_catch_up_packets(small_day: Path) -> None:
    """At max speed a freeze holds ``freeze_max_packets`` packets, stays silent 100-200 ms, then bursts."""
    faults = FaultConfig(freeze=0.001, freeze_ms=(100.0, 200.0), freeze_max_packets=60)
    events, core, _ = _events(small_day, speed=None, seed=3, feeds=(FeedConfig("A", faults=faults),))
    stats = core.feeds[0].stats
    assert stats.freezes >= 1
    sends = [e for e in events if e.kind in (EventKind.DATA, EventKind.CATCH_UP)]
    first = next(i for i, e in enumerate(sends) if e.kind == EventKind.CATCH_UP)
    silence = sends[first].time_ns - sends[first - 1].time_ns
    assert 100_000_000 <= silence <= 200_000_000
    burst = [e for e in sends[first:] if e.kind == EventKind.CATCH_UP and e.time_ns == sends[first].time_ns]
    assert sends[first].sequence == sends[first - 1].sequence + sends[first - 1].count  # nothing lost
    for x, y in zip(burst, burst[1:], strict=False):
        assert y.sequence == x.sequence + x.count  # contiguous, in order, back to back
    normal = [e.count for e in sends if e.kind == EventKind.DATA]
    assert max(len(e.data) for e in burst) > 1400  # larger than any normal packet
    assert sum(e.count for e in burst) / len(burst) > 2 * sum(normal) / len(normal)
    assert stats.catch_up_packets >= len(burst)


def test_drop_range_loses_exactly_that_range(small_day: Path) -> None:
    drop = (1000, 1099)
    events, core, _ = _events(small_day, speed=None, feeds=(
        FeedConfig("A", faults=FaultConfig(drop_ranges=(drop,))), FeedConfig("B", faults=FaultConfig(drop_ranges=(drop,))),
    ))
    for feed in (0, 1):
        got = sorted(s for e in _data(events, feed) for s in range(e.sequence, e.sequence + e.count))
        assert got == [s for s in range(1, core.next_sequence) if not drop[0] <= s <= drop[1]]
        assert core.feeds[feed].stats.dropped_messages == 100


def test_b_feed_is_delayed(small_day: Path) -> None:
    events, _, _ = _events(small_day, speed=1.0, feeds=(FeedConfig("A"), FeedConfig("B", delay_ns=5_000_000, jitter_ns=1_000_000)))
    a = {e.sequence: e.time_ns for e in _data(events, 0)}
    b = {e.sequence: e.time_ns for e in _data(events, 1)}
    assert a.keys() == b.keys()
    lags = [b[s] - a[s] for s in a]
    assert min(lags) >= 5_000_000 and max(lags) <= 6_000_000 + max(np.diff(sorted(a.values())).max(), 0)


def _fake_clock_run(path: Path, config: ReplayConfig, batch_ns: int,
                    prebuild: bool = False) -> tuple[list[tuple[int, int]], object]:
    """(due, sent) per packet, for a server on a fake clock that only sleeping advances."""
    now = [0]
    sent: list[tuple[int, int]] = []

    def sleep(seconds: float) -> None:
        now[0] += round(seconds * 1e9)

    server = ReplayServer(ReplayCore(DayFileReader(path), config), [("127.0.0.1", 9)] * len(config.feeds),
                          clock=lambda: now[0], sleep=sleep, batch_ns=batch_ns)
    server.close()
    if prebuild:
        server.prebuild()

    def send_range(feed: int, queued, lo: int, hi: int) -> None:
        sent.extend((queued.times[i], now[0]) for i in range(lo, hi))

    server._send_range = send_range  # type: ignore[method-assign]
    return sent, server.run()


def test_fake_clock_drives_the_server_loop(tiny_day: Path) -> None:
    """Without batching the loop sends each packet exactly when the clock reaches its time, in the events' order."""
    config = ReplayConfig(speed=1e5, **QUICK_END)
    sent, summary = _fake_clock_run(tiny_day, config, batch_ns=0)
    expected = [e.time_ns for e in ReplayCore(DayFileReader(tiny_day), config).events()
                if e.kind not in (EventKind.SKIPPED, EventKind.SOURCE)]  # ring publications, not datagrams
    assert [due for due, _ in sent] == expected
    assert len(sent) == summary.packets
    assert all(at == due for due, at in sent)


@pytest.mark.parametrize("prebuild", [False, True], ids=["streamed", "prebuilt"])
def test_batched_wake_ups_are_never_early_and_at_most_a_batch_late(small_day: Path, prebuild: bool) -> None:
    """With batch_ns, what falls due within it waits for the next wake-up: never early, at most batch_ns late
    (the same whether packets are built while sending or all before the clock starts)."""
    config = ReplayConfig(packet_rate=40_000, feeds=(FeedConfig("A"), FeedConfig("B", delay_ns=30_000)), **QUICK_END)
    sent, summary = _fake_clock_run(small_day, config, batch_ns=200_000, prebuild=prebuild)
    assert len(sent) == summary.packets and summary.late_packets == 0
    assert all(0 <= at - due <= 200_000 for due, at in sent)
    wake_ups = len({at for _, at in sent})
    assert wake_ups < len(sent) / 4  # 25 us apart per feed, 200 us per wake-up: ~16 packets each


BULK_CONFIGS = {
    "loss + scheduled freeze on A, B delayed": dict(packet_rate=20_000, feeds=(
        FeedConfig("A", faults=FaultConfig(loss=0.05, freeze_every_ms=5, freeze_ms=(1.0, 3.0),
                                           freeze_max_packets=100_000)),
        FeedConfig("B", delay_ns=250_000, faults=FaultConfig(loss=0.05)))),
    "freezes longer than the period, held packets capped": dict(packet_rate=50_000, feeds=(
        FeedConfig("A", faults=FaultConfig(loss=0.01, freeze_every_ms=4, freeze_ms=(0.5, 6.0),
                                           freeze_max_packets=50)),)),
    "no faults, start at the open": dict(packet_rate=20_000, start="open",
                                         feeds=(FeedConfig("A"), FeedConfig("B", delay_ns=1_000))),
}


def _sends_by_events(path: Path, config: ReplayConfig) -> tuple:
    core = ReplayCore(DayFileReader(path), config)
    feeds: list[list] = [[] for _ in config.feeds]
    ring = []
    for e in core.events():
        if e.kind in (EventKind.SKIPPED, EventKind.SOURCE):
            ring.append((e.sequence, e.frames.tolist()))
        else:
            feeds[e.feed].append((e.time_ns, e.data, e.count))
    return feeds, ring, core


def _sends_by_batches(path: Path, config: ReplayConfig) -> tuple:
    core = ReplayCore(DayFileReader(path), config)
    feeds: list[list] = [[] for _ in config.feeds]
    ring = []
    for batch in core.batches():
        ring += [(sequence, frames.tolist()) for sequence, frames in batch.publish]
        for i, part in enumerate(batch.feeds):
            assert np.all(np.diff(part.times) >= 0)
            for t, o, n, c in zip(part.times.tolist(), part.offsets.tolist(), part.lengths.tolist(),
                                  part.counts.tolist(), strict=True):
                feeds[i].append((t, batch.wire[o : o + n].tobytes(), c))
    return feeds, ring, core


@pytest.mark.parametrize("name", list(BULK_CONFIGS))
def test_bulk_batches_send_what_events_send(small_day: Path, name: str) -> None:
    """The bulk path (whole runs of packets decided with numpy) equals the per-packet specification: per feed the
    same packets at the same times, the same ring publications, the same statistics (freezes, losses)."""
    config = ReplayConfig(**{**QUICK_END, **BULK_CONFIGS[name]})
    spec, spec_ring, spec_core = _sends_by_events(small_day, config)
    bulk, bulk_ring, bulk_core = _sends_by_batches(small_day, config)
    assert all(feed.bulk for feed in bulk_core.feeds)
    assert bulk == spec and bulk_ring == spec_ring
    assert [f.stats for f in bulk_core.feeds] == [f.stats for f in spec_core.feeds]
    assert (bulk_core.first_sequence, bulk_core.next_sequence, bulk_core.skipped) == (
        spec_core.first_sequence, spec_core.next_sequence, spec_core.skipped)
    if "freeze" in name:
        assert bulk_core.feeds[0].stats.freezes >= 3 and bulk_core.feeds[0].stats.catch_up_packets > 0
    if "open" in name:
        assert bulk_core.skipped > 0


def test_other_configurations_batch_the_events(small_day: Path) -> None:
    """Jitter, duplication, reordering, random freezes and drop ranges: batches group events() unchanged."""
    config = ReplayConfig(speed=1.0, seed=4, **QUICK_END, feeds=(
        FeedConfig("A", faults=FaultConfig(loss=0.02, duplicate=0.02, reorder=0.02, freeze=0.002,
                                           drop_ranges=((500, 520),))),
        FeedConfig("B", delay_ns=1_000_000, jitter_ns=500_000)))
    spec, spec_ring, _ = _sends_by_events(small_day, config)
    batched, ring, core = _sends_by_batches(small_day, config)
    assert not core.feeds[0].bulk
    assert batched == spec and ring == spec_ring


def test_scheduled_freezes_fall_on_the_period(small_day: Path) -> None:
    """freeze_every_ms: silence from the first packet due at each multiple of the period, then a catch-up burst."""
    faults = FaultConfig(freeze_every_ms=10, freeze_ms=(2.0, 2.0), freeze_max_packets=10_000)
    feeds, _, core = _sends_by_events(small_day, ReplayConfig(packet_rate=20_000, feeds=(FeedConfig("A", faults=faults),),
                                                              **QUICK_END))
    data = [(t, c) for t, _, c in feeds[0][: -QUICK_END["end_of_session_count"]]]
    gaps = [(a[0], b[0]) for a, b in zip(data, data[1:], strict=False) if b[0] - a[0] > 1_000_000]
    stats = core.feeds[0].stats
    assert stats.freezes == len(gaps) == int(data[-1][0] // 10_000_000)
    for k, (before, after) in enumerate(gaps, start=1):
        assert before < k * 10_000_000 <= before + 50_000  # the last packet before the k-th multiple went
        assert after == k * 10_000_000 + 2_000_000  # the burst at the end of the 2 ms freeze
    assert sum(c for _, c in data) == core.next_sequence - 1  # nothing lost: held, then sent
    with pytest.raises(ValueError, match="freeze_every_ms"):
        FaultConfig(freeze_every_ms=-1)


def test_packet_columns_match_the_plans(small_day: Path) -> None:
    """Packetiser.columns cuts exactly where plans() does: budget, time gaps, forced cuts, message cap."""
    from logbuf.exchange.replay.plans import Packetiser

    packetiser = Packetiser(500, 20_000, cuts=[1_000, 1_017, 29_000])
    with DayFileReader(small_day) as reader:
        sequence = 1
        for block in reader.blocks(8_192):
            timestamps = block.headers().timestamp
            begin = 3 if sequence == 1 else 0
            plans = list(packetiser.plans(block, timestamps, sequence, begin))
            columns = packetiser.columns(block, sequence, begin, timestamps)
            assert [(p.sequence, p.count, p.start, p.end) for p in plans] == list(zip(
                columns.sequence.tolist(), columns.count.tolist(), columns.start.tolist(), columns.end.tolist(),
                strict=True))
            sequence += block.count


class _Sink:
    """A UDP socket drained by a thread into a list, bounded by a deadline."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", socket.SO_RCVBUF), 32 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        self.packets: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.05)
            if ready:
                self.packets.append(self.sock.recv(65536))

    def wait_for_end(self, eos: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(len(p) == m.HEADER_LENGTH and p[18:20] == b"\xff\xff" for p in list(self.packets)) >= eos:
                break
            time.sleep(0.01)
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def _replay_to_sinks(path: Path, feeds: tuple[FeedConfig, ...]):
    sinks, summary, server = _run_to_sinks(path, ReplayConfig(speed=None, feeds=feeds, **QUICK_END))
    return sinks, summary, server.core


def _run_to_sinks(path: Path, config: ReplayConfig, *, native: bool = True, segment: bool = True):
    """One replay of ``path`` to a receiving socket per feed; every sink has seen the end when it returns."""
    sinks = [_Sink() for _ in config.feeds]
    server = ReplayServer(ReplayCore(DayFileReader(path), config), [s.address for s in sinks], segment=segment)
    if not native:
        server._native = None
    try:
        summary = server.run()
    finally:
        server.close()
    for sink in sinks:
        sink.wait_for_end(2)
    return sinks, summary, server


def test_loopback_two_feeds_every_message_once_in_order(tiny_day: Path) -> None:
    sinks, summary, core = _replay_to_sinks(tiny_day, (FeedConfig("A"), FeedConfig("B", delay_ns=2_000_000)))
    for sink in sinks:
        seqs = [s for p in sink.packets if isinstance(pk := m.decode(p), m.DownstreamPacket)
                for s in range(pk.sequence, pk.next_sequence)]
        assert seqs == list(range(1, core.next_sequence))
    assert summary.messages == 2 * (core.next_sequence - 1)


def test_loopback_with_faults_matches_the_summary(tiny_day: Path) -> None:
    faults = FaultConfig(loss=0.05, duplicate=0.05, reorder=0.05)
    sinks, summary, core = _replay_to_sinks(tiny_day, (FeedConfig("A", faults=faults), FeedConfig("B")))
    stats = summary.feeds["A"]
    data = [pk for p in sinks[0].packets if isinstance(pk := m.decode(p), m.DownstreamPacket)]
    assert len(data) == stats.packets
    assert sum(len(pk.messages) for pk in data) == stats.messages
    unique = {s for pk in data for s in range(pk.sequence, pk.next_sequence)}
    assert len(unique) == core.next_sequence - 1 - stats.lost_messages
    assert stats.lost_packets and stats.duplicated_packets and stats.reordered_packets
    b = [s for p in sinks[1].packets if isinstance(pk := m.decode(p), m.DownstreamPacket)
         for s in range(pk.sequence, pk.next_sequence)]
    assert b == list(range(1, core.next_sequence))


@pytest.fixture(scope="module")
def uniform_day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20,000 Add Orders of 36 bytes: with a 1,540-byte budget every packet carries 40 and has the same size."""
    count = 20_000
    frames = np.zeros((count, 38), dtype=np.uint8)
    frames[:, 1] = 36
    frames[:, 2] = ord("A")
    frames[:, 3:11] = np.arange(1, count + 1, dtype=">u8").view(np.uint8).reshape(count, 8)
    path = tmp_path_factory.mktemp("uniform") / "uniform.itch"
    path.write_bytes(frames.tobytes())
    return path


def _paced_to_sinks(path: Path, native: bool, segment: bool):
    faults = FaultConfig(loss=0.02, freeze_every_ms=3, freeze_ms=(1.0, 1.0), freeze_max_packets=10_000)
    config = ReplayConfig(packet_rate=50_000, budget=1_540, feeds=(FeedConfig("A", faults=faults),
                                                                   FeedConfig("B", delay_ns=100_000)), **QUICK_END)
    sinks, summary, server = _run_to_sinks(path, config, native=native, segment=segment)
    expected, _, _ = _sends_by_events(path, config)
    return sinks, summary, server, expected


@pytest.mark.parametrize("native, segment", [(True, True), (True, False), (False, False)],
                         ids=["segmented", "sendmmsg", "send"])
def test_loopback_paced_profile_sends_the_schedule(uniform_day: Path, native: bool, segment: bool) -> None:
    """A load profile on loopback (losses, freezes and catch-up bursts on A, B delayed): each feed's socket
    receives exactly the specification's packets in order, whichever way they go to the kernel -- segmented
    runs of equal-sized packets (UDP GSO), sendmmsg, or one send() each."""
    if native:
        pytest.importorskip("logbuf._native", reason="the native modules are not built here")
    sinks, summary, server, expected = _paced_to_sinks(uniform_day, native, segment)
    for sink, spec in zip(sinks, expected, strict=True):
        assert sink.packets == [data for _, data, _ in spec]
    stats = summary.feeds["A"]
    assert stats.freezes >= 2 and stats.lost_packets and stats.catch_up_packets
    assert summary.packets == sum(len(sink.packets) for sink in sinks)
    if segment:
        assert server._segmenting == [True, True], "this kernel does not take UDP_SEGMENT"
        assert server.send_calls < summary.packets / 8
    elif native:
        assert server.send_calls < summary.packets / 2
    else:
        assert server.send_calls == summary.packets


def test_cli_replay_writes_summary(tiny_day: Path, tmp_path: Path) -> None:
    from logbuf.cli import main

    sink = _Sink()
    out = tmp_path / "summary.json"
    rc = main(["replay", str(tiny_day), "--feed-a", f"127.0.0.1:{sink.address[1]}", "--feed-b", "off",
               "--speed", "max", "--eos-count", "2", "--eos-interval-s", "0", "--faults-a", "loss=0.01",
               "--drop-a", "10-19", "--summary-json", str(out), "--quiet"])
    sink.wait_for_end(2)
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["feeds"]["A"]["dropped_messages"] == 10
    data = [pk for p in sink.packets if isinstance(pk := m.decode(p), m.DownstreamPacket)]
    assert sum(len(pk.messages) for pk in data) == report["feeds"]["A"]["messages"]


@pytest.mark.parametrize("argv, fragment", [
    (["replay", "/nonexistent.itch"], "no such file"),
    (["replay", "{day}", "--feed-a", "off", "--feed-b", "off"], "both feeds are off"),
    (["synth", "{tmp}/x.itch", "-n", "10"], "too few"),
])
def test_cli_user_errors_exit_2_without_traceback(argv, fragment, small_day: Path, tmp_path: Path, capsys) -> None:
    from logbuf.cli import main

    argv = [a.format(day=small_day, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


@pytest.mark.parametrize(("text", "address"), [("127.0.0.1:30001", ("127.0.0.1", 30001)), ("[::1]:30001", ("::1", 30001)),
                                               ("[ff02::1]:0", ("ff02::1", 0))])
def test_the_replay_and_the_feed_handler_read_host_port_alike(text: str, address: tuple[str, int]) -> None:
    """One parser for both command lines: the replay takes IPv6 too; the handler, whose sockets are IPv4, reads
    the same text and refuses an IPv6 address by name rather than misreading it."""
    from logbuf.cli import build_parser

    replay = build_parser(["replay"]).parse_args(["replay", "day.itch", "--feed-a", text, "--retransmit", text])
    assert replay.feed_a == replay.retransmit == address
    parser = build_parser(["feed"])
    if ":" in address[0]:
        with pytest.raises(SystemExit):
            parser.parse_args(["feed", "--feed-a", text])
        return
    handler = parser.parse_args(["feed", "--feed-a", text, "--retransmit", text])
    assert handler.feed_a == handler.retransmit == address


@pytest.mark.parametrize("bad", ["nohost", "host:", ":80", "h:99999", "h:x", "[::1]", "[::1:80", "[::1]80", "::1:80",
                                 "[::1]]:80", "[[::1]:80", "h]:80"])
def test_bad_host_port(bad: str) -> None:
    with pytest.raises(ValueError, match="must be host:port|port out of range"):
        parse_endpoint(bad)
    from logbuf.cli import main

    for argv in (["replay", "x", "--feed-a", bad], ["feed", "--feed-a", bad]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2


def test_packet_rate_paces_full_packets(small_day: Path) -> None:
    """A load profile: packet k is due at k / rate, every packet but a block's last is filled to the budget."""
    rate = 20_000.0
    events, core, raw = _events(small_day, speed=1.0, packet_rate=rate, budget=1_400)
    data = _data(events)
    assert [e.time_ns for e in data] == [int(k * 1e9 / rate) for k in range(len(data))]
    sizes = [len(e.data) for e in data]
    assert sum(s > 1_400 - 60 for s in sizes) >= len(sizes) - 2  # full, bar the end of a block / of the day
    assert all(s <= 1_400 for s in sizes)
    assert sum(e.count for e in data) == len(raw)
    with pytest.raises(ValueError, match="packet rate"):
        ReplayConfig(packet_rate=0)


def test_loss_only_short_path_matches_the_general_path(small_day: Path) -> None:
    """The short path for loss alone draws and schedules exactly as the general path does."""
    loss = FaultConfig(loss=0.05)
    fast, core, _ = _events(small_day, speed=1.0, seed=9, feeds=(FeedConfig("A", delay_ns=7, faults=loss),))
    assert core.feeds[0]._loss_only
    general = ReplayCore(DayFileReader(small_day), ReplayConfig(
        speed=1.0, seed=9, feeds=(FeedConfig("A", delay_ns=7, faults=loss),), **QUICK_END))
    general.feeds[0]._loss_only = False
    slow = list(general.events())
    assert [(e.time_ns, e.kind, e.data) for e in fast] == [(e.time_ns, e.kind, e.data) for e in slow]
    assert core.feeds[0].stats == general.feeds[0].stats and core.feeds[0].stats.lost_packets > 0


def test_the_command_lines_fault_spec_reaches_every_fault_including_scheduled_freezes() -> None:
    import argparse

    from logbuf.exchange.commands import _faults

    spec = _faults("loss=0.005,freeze-every=10000,freeze-ms=150")
    assert spec == {"loss": 0.005, "freeze_every_ms": 10_000.0, "freeze_ms": (150.0, 150.0)}
    assert FaultConfig(**spec).freeze_every_ms == 10_000.0
    with pytest.raises(argparse.ArgumentTypeError, match="freeze-every"):
        _faults("thaw=1")
