"""Multicast (``endpoint=239.x.y.z:port|interface=127.0.0.1``) between three driver processes, inside a network
namespace the test creates (its own ``lo``, up, multicast on, a route for 224.0.0.0/4) and removes: no
datagram leaves it.  Skipped with the reason where namespaces cannot be created (not root, no ``ip``).

One publishing driver with min-multicast flow control (``fc=min``), two receiving drivers (one of them on a
lossy receive path, so multicast NAKs with their randomised delay and retransmits to the group happen):
both get everything; a stalled receiver holds the sender back.  The clients run in the test process, outside
the namespace - they talk to their drivers through shared memory only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from driver_rig import FAST_TIMERS, wait_for_driver
from udp_rig import (
    NAKS_SENT,
    RETRANSMITS_SENT,
    Received,
    counter,
    message,
    publish,
    system,
    threading_mode_of,
)

import logbuf
from logbuf.cnc import counters as c
from logbuf.driver.agents import THREADING_MODES
from support import child_env, in_namespace, stop_process, wait_until

pytestmark = pytest.mark.timeout(90)
STREAM = 1001
T = 64 * 1024
WINDOW = T // 2  # the receivers' window: min(128 KiB, T/2)
FRAME_500 = 544  # a 500-byte message's frame: 32-byte header, aligned to 32


def start_driver_in(netns: str, directory: Path, *extra: str) -> subprocess.Popen[str]:
    # `ip netns exec` enters the namespace and execs the command: the PID we stop is the driver's
    proc = subprocess.Popen(
        in_namespace(netns, sys.executable, "-m", "logbuf.cli", "driver", "--dir", str(directory), *FAST_TIMERS,
                     *extra),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    )
    wait_for_driver(directory, proc)
    return proc


@pytest.mark.parametrize("threading_mode", THREADING_MODES, indirect=True)
def test_min_multicast_two_receivers_get_everything_and_the_slowest_holds_the_sender(
        multicast_netns: str, tmp_path: Path, threading_mode: str) -> None:
    channel = "aeron:udp?endpoint=239.255.10.1:40500|interface=127.0.0.1|term-length=64k|fc=min"
    procs: list[subprocess.Popen[str]] = []
    clients: list[logbuf.Client] = []
    try:
        procs.append(start_driver_in(multicast_netns, tmp_path / "pub"))
        procs.append(start_driver_in(multicast_netns, tmp_path / "fast"))
        procs.append(start_driver_in(multicast_netns, tmp_path / "lossy", "--impair-receive", "drop=0.05,seed=4"))
        pub_client, fast_client, lossy_client = (logbuf.connect(tmp_path / n) for n in ("pub", "fast", "lossy"))
        clients += [pub_client, fast_client, lossy_client]
        assert {threading_mode_of(client) for client in clients} == {threading_mode}
        fast = fast_client.add_subscription(channel, STREAM)
        lossy = lossy_client.add_subscription(channel, STREAM)
        pub = pub_client.add_publication(channel, STREAM)
        wait_until(lambda: pub.is_connected and fast.images and lossy.images, what="both receivers")
        got_fast, got_lossy = Received(), Received()

        def both() -> int:
            return got_fast.poll(fast) + got_lossy.poll(lossy)

        sent = [message(i, (64, 700, 2000)[i % 3]) for i in range(600)]
        publish(pub, sent, between=both, timeout=30)
        wait_until(lambda: len(got_fast.sequences) == len(got_lossy.sequences) == len(sent), timeout=30, poll=both,
                 what="everything at both receivers")
        assert got_fast.sequences == got_lossy.sequences == list(range(len(sent)))
        assert got_fast.corrupt == got_lossy.corrupt == 0
        assert system(lossy_client, NAKS_SENT) > 0
        wait_until(lambda: system(pub_client, RETRANSMITS_SENT) > 0, what="retransmits to the group")
        assert system(fast_client, NAKS_SENT) == 0  # it heard the retransmits others asked for

        # fc=min: the lossy receiver's subscriber stops; the sender may not run past its window
        stalled_at = lossy.images[0].position
        more = [message(len(sent) + i, 500) for i in range(400)]  # far more than one window
        snd_pos = counter(pub_client, c.SENDER_POSITION_TYPE_ID, pub.registration_id).counter_id
        bpe = counter(pub_client, c.SENDER_BPE_TYPE_ID, pub.registration_id).counter_id
        bpe_at_stall = pub_client.counters.counter_value(bpe)
        offered = 0

        def held_back() -> bool:
            """Offers until refused; held back = refused, the sender at the window's edge (less than a frame
            short of it) and held there by flow control since the stall (snd-bpe counted)."""
            nonlocal offered
            got_fast.poll(fast)
            while offered < len(more) and pub.offer(more[offered]) > 0:
                offered += 1
            counters = pub_client.counters
            return (offered < len(more) and counters.counter_value(snd_pos) > stalled_at + WINDOW - FRAME_500
                    and counters.counter_value(bpe) > bpe_at_stall)

        wait_until(held_back, timeout=20, what="the sender held back by the stalled receiver")
        assert pub_client.counters.counter_value(snd_pos) <= stalled_at + WINDOW
        # it resumes: everything reaches both
        publish(pub, more[offered:], between=both, timeout=30)
        total = len(sent) + len(more)
        wait_until(lambda: len(got_fast.sequences) == len(got_lossy.sequences) == total, timeout=30, poll=both,
                 what="everything after the stall")
        assert got_fast.sequences == got_lossy.sequences == list(range(total))
    finally:
        for client in clients:
            client.close()
        for proc in procs:
            stop_process(proc)
