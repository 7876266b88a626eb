"""UDP between two real ``logbuf driver`` processes (two directories, loopback 127.0.0.1): end to end, through
a lossy network (seeded impairment), a receiver driver restarted mid-stream, a sender driver killed."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import posix_ipc
import pytest
from driver_rig import driver_process, read_line, start_driver, start_worker, wait_for_driver
from driver_workers import mixed_message
from udp_rig import (
    BYTES_RECEIVED,
    BYTES_SENT,
    NAKS_RECEIVED,
    NAKS_SENT,
    RETRANSMITS_SENT,
    Received,
    counter,
    free_udp_port,
    message,
    publish,
    system,
    threading_mode_of,
)

import logbuf
from logbuf.cnc import counters as c
from logbuf.directory import wake_semaphore_name
from logbuf.driver.agents import THREADING_MODES
from support import stop_process, wait_until

pytestmark = pytest.mark.timeout(90)
STREAM = 1001


def channel(port: int, extra: str = "") -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k{extra}"


@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)
def test_two_drivers_end_to_end(tmp_path: Path, threading_mode: str) -> None:
    port = free_udp_port()
    with driver_process(tmp_path / "a"), driver_process(tmp_path / "b"), \
            logbuf.connect(tmp_path / "a") as pub_client, logbuf.connect(tmp_path / "b") as sub_client:
        assert threading_mode_of(pub_client) == threading_mode_of(sub_client) == threading_mode
        sub = sub_client.add_subscription(channel(port), STREAM)
        pub = pub_client.add_publication(channel(port), STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connection across drivers")
        received = Received()
        sent = [message(i, (40, 300, 1400, 5000)[i % 4]) for i in range(2000)]
        publish(pub, sent, between=lambda: received.poll(sub))
        wait_until(lambda: len(received.sequences) == len(sent), poll=lambda: received.poll(sub), what="delivery")
        assert received.sequences == list(range(len(sent))) and received.corrupt == 0
        end = pub.position
        image = sub.images[0]
        rcv_pos = counter(sub_client, c.RECEIVER_POSITION_TYPE_ID, image.correlation_id).counter_id
        snd_pos = counter(pub_client, c.SENDER_POSITION_TYPE_ID, pub.registration_id).counter_id
        wait_until(lambda: sub_client.counters.counter_value(rcv_pos) == end == pub_client.counters.counter_value(
            snd_pos), what="rcv-pos and snd-pos at the end")
        # the data bytes the sender's driver sent are the ones the receiver's driver received (no loss)
        assert system(pub_client, BYTES_SENT) > 0 and system(sub_client, BYTES_RECEIVED) > 0
        assert system(sub_client, NAKS_SENT) == 0


@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)
def test_two_drivers_through_a_lossy_network(tmp_path: Path, threading_mode: str) -> None:
    port = free_udp_port()
    lossy = "drop=0.05,reorder=0.05,duplicate=0.01,delay=20us,reorder-delay=300us"
    with driver_process(tmp_path / "a", "--impair-receive", lossy + ",seed=1"), \
            driver_process(tmp_path / "b", "--impair-receive", lossy + ",seed=2"), \
            logbuf.connect(tmp_path / "a") as pub_client, logbuf.connect(tmp_path / "b") as sub_client:
        assert threading_mode_of(pub_client) == threading_mode_of(sub_client) == threading_mode
        sub = sub_client.add_subscription(channel(port), STREAM)
        pub = pub_client.add_publication(channel(port), STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="connection")
        received = Received()
        sent = [message(i, (40, 500, 2000)[i % 3]) for i in range(1500)]
        publish(pub, sent, between=lambda: received.poll(sub), timeout=40)
        wait_until(lambda: len(received.sequences) == len(sent), timeout=30, poll=lambda: received.poll(sub),
                 what="every message through the lossy network")
        assert received.sequences == list(range(len(sent))) and received.corrupt == 0
        wait_until(lambda: system(pub_client, RETRANSMITS_SENT) > 0, what="retransmits counted")
        assert system(sub_client, NAKS_SENT) > 0 and system(pub_client, NAKS_RECEIVED) > 0


def test_a_restarted_receiver_driver_rejoins_mid_stream(tmp_path: Path) -> None:
    port = free_udp_port()
    # receivers time out of the sender's flow control after 500 ms instead of 5 s: the test is faster
    ch = channel(port, "|fc=unicast,t:500ms")
    with driver_process(tmp_path / "a"), logbuf.connect(tmp_path / "a") as pub_client:
        pub = pub_client.add_publication(ch, STREAM)
        receiver = start_driver(tmp_path / "b")
        try:
            wait_for_driver(tmp_path / "b", receiver)
            with logbuf.connect(tmp_path / "b") as sub_client:
                sub = sub_client.add_subscription(ch, STREAM)
                wait_until(lambda: pub.is_connected and sub.images, what="first connection")
                first = Received()
                publish(pub, [message(i, 200) for i in range(300)], between=lambda: first.poll(sub))
                wait_until(lambda: len(first.sequences) == 300, poll=lambda: first.poll(sub), what="first 300")
                assert first.sequences == list(range(300))
                stop_process(receiver)  # the receiving driver goes away mid-stream (its client with it)
            seq = 300

            def gone_after_offering() -> bool:  # the sender keeps going into the void until the receiver times out
                nonlocal seq
                if pub.offer(message(seq, 200)) > 0:
                    seq += 1
                return not pub.is_connected

            wait_until(gone_after_offering, what="the sender to notice its receiver went")
            assert pub.offer(message(seq, 200)) == logbuf.NOT_CONNECTED
            receiver = start_driver(tmp_path / "b")  # a new driver process in the same directory
            wait_for_driver(tmp_path / "b", receiver)
            with logbuf.connect(tmp_path / "b") as sub_client:
                sub = sub_client.add_subscription(ch, STREAM)
                rejoined = Received()
                wait_until(lambda: pub.is_connected and sub.images, what="the receiver rejoining")
                first_after = seq
                publish(pub, [message(seq + i, 200) for i in range(300)], between=lambda: rejoined.poll(sub))
                last = seq + 299
                wait_until(lambda: rejoined.sequences[-1:] == [last], poll=lambda: rejoined.poll(sub),
                         what="the rejoined receiver to get everything sent after it joined")
                got = rejoined.sequences
                assert got == list(range(got[0], last + 1)) and got[0] <= first_after
                assert rejoined.corrupt == 0
        finally:
            stop_process(receiver)


def test_a_killed_sender_driver_s_image_goes_after_the_liveness_timeout(tmp_path: Path) -> None:
    port = free_udp_port()
    sender = start_driver(tmp_path / "a")
    try:
        wait_for_driver(tmp_path / "a", sender)
        with driver_process(tmp_path / "b", "--image-liveness-timeout", "0.5"), \
                logbuf.connect(tmp_path / "b") as sub_client:
            gone: list[logbuf.Image] = []
            sub = sub_client.add_subscription(channel(port), STREAM, on_unavailable_image=gone.append)
            pub_client = logbuf.connect(tmp_path / "a")
            pub = pub_client.add_publication(channel(port), STREAM)
            wait_until(lambda: pub.is_connected and sub.images, what="connection")
            image = sub.images[0]
            stop_process(sender, signal.SIGKILL)  # no EOS, no goodbye: only silence
            killed_at = time.monotonic()
            wait_until(lambda: gone, timeout=5, what="the image to time out")
            assert gone == [image] and not sub.images
            # the liveness clock started at the last heartbeat (they go every 100 ms while idle)
            assert 0.5 - 0.15 < time.monotonic() - killed_at < 3
            hwm = [i for i in sub_client.counters if i.type_id == c.RECEIVER_HWM_TYPE_ID]
            assert not hwm  # the image's counters were freed
            with contextlib.suppress(logbuf.LogbufError):
                pub_client.close()
    finally:
        stop_process(sender, signal.SIGKILL)
        # a killed driver cannot unlink its stream's wake-up semaphore; the next driver there would: we do
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_semaphore(wake_semaphore_name(tmp_path / "a", STREAM))


class PerPublisher:
    """Messages of several publishers (``driver_workers.mixed_message``) as one subscription got them."""

    def __init__(self, publishers: int) -> None:
        self.got: dict[int, list[int]] = {p: [] for p in range(publishers)}
        self.corrupt = 0
        self.assembler = logbuf.FragmentAssembler(self._on_message)

    def _on_message(self, buffer: memoryview, header: object) -> None:
        data = bytes(buffer)
        publisher_id, seq = int.from_bytes(data[:4], "little"), int.from_bytes(data[4:8], "little")
        if publisher_id not in self.got or data != mixed_message(publisher_id, seq):
            self.corrupt += 1
            return
        self.got[publisher_id].append(seq)

    def has(self, count: int) -> bool:
        return all(len(seqs) >= count for seqs in self.got.values())


@pytest.mark.slow
@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)
def test_several_publisher_processes_exactly_once_through_a_lossy_network(tmp_path: Path,
                                                                        threading_mode: str) -> None:
    """Four publisher processes (each its own session, mixed sizes, some fragmented past the MTU) into two
    subscriptions through a receiving driver that drops and reorders 5 %, both drivers in each threading
    mode: each subscription gets every message exactly once, in order per publisher, intact."""
    port = free_udp_port()
    ch = channel(port)
    publishers, count = 4, 3000
    with driver_process(tmp_path / "a"), \
            driver_process(tmp_path / "b", "--impair-receive", "drop=0.05,reorder=0.05,seed=5"), \
            logbuf.connect(tmp_path / "b") as sub_client, logbuf.connect(tmp_path / "a") as pub_client:
        assert threading_mode_of(pub_client) == threading_mode_of(sub_client) == threading_mode
        subs = [(sub_client.add_subscription(ch, STREAM), PerPublisher(publishers)) for _ in range(2)]

        def poll() -> int:
            return sum(sub.poll(received.assembler, 256) for sub, received in subs)

        workers = [start_worker("udp-publisher", str(tmp_path / "a"), ch, str(count), str(p))
                   for p in range(publishers)]
        try:
            for w in workers:
                assert read_line(w, timeout=30) == "ready"
            wait_until(lambda: all(received.has(count) for _, received in subs), timeout=50, poll=poll,
                       what="every message of every publisher on both subscriptions")
            for w in workers:
                assert read_line(w, timeout=10) == f"done {count}"
        finally:
            for w in workers:
                stop_process(w)
        for _, received in subs:
            assert received.corrupt == 0
            assert all(seqs == list(range(count)) for seqs in received.got.values()), {
                p: len(seqs) for p, seqs in received.got.items()}
        assert system(sub_client, NAKS_SENT) > 0  # the loss was real, and repaired
