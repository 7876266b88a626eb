"""Keeps the benchmark harnesses and the demo from rotting: tiny runs that check their output, not speed.

Every peer rig of ``python -m bench peers`` runs here with a few hundred messages (throughput, and ping-pong in
each wait mode it offers); a peer whose library is not installed is skipped with the reason the harness gives.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `bench` lives at the repository root, next to src/

from bench import runner, suite  # noqa: E402
from bench.peers import PEERS  # noqa: E402
from bench.peers.base import RING, Peer, expected_checksum, message_block, messages, stamp_at  # noqa: E402
from bench.peers.posix_mq_peer import PosixMessageQueue, kernel_limit  # noqa: E402
from bench.peers.stdlib_peers import MpPipe  # noqa: E402

SMOKE = {"count": 300, "warmup": 50}


def _skip_if_unavailable(key: str, size: int = 32, producers: int = 1) -> None:
    reason = PEERS[key].skip_reason(size, producers)
    if reason:
        pytest.skip(f"{PEERS[key].label}: {reason}")


# -- the message format ---------------------------------------------------------------------------------


def test_messages_carry_their_stamp_in_the_last_eight_bytes() -> None:
    block = message_block(40, producer=3)
    assert len(block) == 40 * RING
    ring = messages(40, producer=3)
    assert ring[5] == block[200:240].tobytes()
    assert stamp_at(ring[5], 32)[0] == (3 << 32) | 5
    assert ring[5][:4] == bytes([5, 6, 7, 8])  # filler byte j of message k is (k + j) & 0xFF
    with pytest.raises(ValueError, match="size must be >= 8"):
        message_block(7, 0)


@pytest.mark.parametrize(("producers", "start", "stop"), [(1, 0, 10), (2, 1000, 3100), (4, 5, 2 * RING + 7)])
def test_expected_checksum_matches_a_brute_force_sum(producers: int, start: int, stop: int) -> None:
    brute = sum((p << 32) | (i % RING) for p in range(producers) for i in range(start, stop))
    assert expected_checksum(producers, start, stop) == brute


# -- skip reasons ---------------------------------------------------------------------------------------


def test_a_peer_without_its_library_is_skipped_with_the_reason() -> None:
    class Missing(Peer):
        key = "missing"
        label = "missing"
        modules = ("no_such_module_for_bench",)

    assert "no_such_module_for_bench is not installed" in Missing().skip_reason(32)


def test_posix_queue_skips_messages_above_the_kernel_limit() -> None:
    limit = kernel_limit("msgsize_max", 8192)
    reason = PosixMessageQueue().skip_reason(limit + 8)
    if reason and "not installed" in reason:
        pytest.skip(reason)
    assert reason is not None and "msgsize_max" in reason
    assert PosixMessageQueue().skip_reason(min(limit, 4096)) is None


def test_pipe_has_no_multi_producer_row() -> None:
    assert "single-producer" in MpPipe().skip_reason(32, producers=2)


# -- every rig, tiny --------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", list(PEERS))
def test_peer_throughput_rig(key: str) -> None:
    _skip_if_unavailable(key)
    run = runner.throughput(key, 32, **SMOKE)  # raises RunFailed unless count and checksum are right
    assert run.messages == SMOKE["count"] and run.producers == 1
    assert run.msgs_per_s > 0 and run.mb_per_s == pytest.approx(run.msgs_per_s * 32 / 1e6)
    assert run.cpu_s_per_million > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", ["logbuf", "logbuf-batch", "logbuf-driver", "zmq"])
def test_multi_producer_rig(key: str) -> None:
    _skip_if_unavailable(key, producers=2)
    run = runner.throughput(key, 32, producers=2, multi=True, **SMOKE)
    assert run.messages == 2 * SMOKE["count"] and run.producers == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("key", "wait"), [(k, w) for k, p in PEERS.items() for w in p.rtt_waits])
def test_peer_ping_pong_rig(key: str, wait: str) -> None:
    _skip_if_unavailable(key)
    run = runner.ping_pong(key, 32, wait=wait, count=200, warmup=20)  # raises RunFailed on a wrong echo
    assert run.samples == 200 and run.wait == wait
    assert 0 < run.p50_us <= run.p99_us <= run.p999_us <= run.max_us


class _DuplicatingSender:
    """Sends message i-1 again instead of message i once: the count is right, the data is not."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._sent = 0

    def send(self, n: int) -> None:
        for _ in range(n):
            self._sent += 1
            if self._sent == 100:
                self._inner._next -= 1  # CallSender's next index: resend the previous message
            self._inner.send(1)

    def send_one(self, index: int) -> None:
        self._inner.send_one(index)

    def close(self) -> None:
        self._inner.close()


class DuplicatingPipe(MpPipe):
    """A broken transport (looked up by the spawned processes as ``test_bench_smoke:DuplicatingPipe``)."""

    key = "test_bench_smoke:DuplicatingPipe"

    def sender(self, spec: Any, producer: int, size: int) -> Any:
        return _DuplicatingSender(super().sender(spec, producer, size))


@pytest.mark.timeout(60)
def test_a_run_that_delivers_wrong_data_fails_instead_of_giving_a_number() -> None:
    with pytest.raises(runner.RunFailed, match="checksum"):
        runner.throughput(DuplicatingPipe.key, 32, count=300, warmup=0)


# -- the harnesses end to end -------------------------------------------------------------------------


def test_targets_are_judged_against_the_issue_goals() -> None:
    summary = {
        "throughput": [{"peer": "logbuf", "size": 32, "msgs_per_s": 6e6, "vs_zmq": 3.0, "vs_naive": 2.5},
                       {"peer": "logbuf-batch", "size": 32, "msgs_per_s": 29e6}],
        "rtt": [{"peer": "logbuf", "size": 32, "wait": "backoff", "p50_us": 1.4, "p50_vs_naive": 0.6}],
        "multi": [],
    }
    verdicts = {t["target"]: t["met"] for t in suite.targets(summary)}
    assert verdicts == {
        "logbuf per-message at 32 B ≥ 5 M msg/s": True,
        "logbuf per-message at 32 B ≥ 4× pyzmq ipc": False,
        "logbuf per-message at 32 B ≥ 2× the naive SPSC ring": True,
        "logbuf batch at 32 B ≥ 30 M msg/s": False,
        "logbuf per-message ping-pong RTT p50 at 32 B ≤ 1.5 µs": True,
        "logbuf per-message ping-pong RTT p50 at 32 B ≤ 0.5× the naive ring's": False,
    }


@pytest.mark.timeout(120)
def test_peers_harness_writes_json_markdown_and_charts(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "peers", "--runs", "1", "--messages", "300", "--warmup", "50",
         "--rtt-samples", "200", "--sizes", "32", "--peers", "logbuf", "mp-pipe", "--producers", "1", "2",
         "--rtt-sizes", "32", "--rtt-waits", "backoff", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "peers.json").read_text())
    assert {(r["peer"], r["size"]) for r in result["throughput"]} == {("logbuf", 32), ("mp-pipe", 32)}
    assert {(r["peer"], r["producers"]) for r in result["multi"]} == {("logbuf", 1), ("logbuf", 2), ("mp-pipe", 1)}
    assert [s["name"] for s in result["skipped"]] == ["multi mp-pipe 2->1 32 B"]
    assert {(r["peer"], r["wait"]) for r in result["rtt"]} == {("logbuf", "backoff"), ("mp-pipe", "backoff")}
    assert all(r["msgs_per_s"] > 0 and r["runs"] == 1 and not r["failed"] for r in result["throughput"])
    assert result["command"].startswith("python -m bench peers --runs 1")
    assert result["machine"]["cores"] >= 1 and "load_1m_at_end" in result["machine"]
    assert any(t["target"].startswith("logbuf per-message at 32 B ≥ 5 M") for t in result["targets"])
    text = (tmp_path / "peers.md").read_text()
    assert "| logbuf per-message | 32 B |" in text and "## Targets" in text and "## Skipped" in text
    for name in ("peers_throughput.png", "peers_cpu.png", "peers_multi.png", "peers_rtt.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_transport_harness_smoke(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "transport", "--runs", "1", "--messages", "5000", "--sizes", "32",
         "--rtt-samples", "200", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "transport.json").read_text())
    assert {(r["api"], r["size"]) for r in result["throughput"]} == {("per-message", 32), ("batch", 32)}
    assert all(r["msgs_per_s"] > 0 for r in result["throughput"])
    assert result["rtt"]["p50_us"] > 0
    assert "| logbuf per-message | 32 B |" in (tmp_path / "transport.md").read_text()


@pytest.mark.timeout(120)
def test_transport_demo_prints_throughput_and_rtt() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "logbuf.cli", "demo", "--transport", "--transport-messages", "5000", "--sizes",
         "32", "--rtt-samples", "200"],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    assert "per-message" in proc.stdout and "batch" in proc.stdout and "p50" in proc.stdout


def test_transport_demo_rejects_bad_arguments() -> None:
    proc = subprocess.run([sys.executable, "-m", "logbuf.cli", "demo", "--transport", "--transport-messages", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "positive" in proc.stderr and "Traceback" not in proc.stderr
