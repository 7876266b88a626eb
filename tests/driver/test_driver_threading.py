"""The media driver's threading modes: which native agents run, the counters' labels, IPC through each mode,
an IPC publisher that keeps getting pub-lmt while the Python conductor thread is held, and a UDP stream
between two drivers that keeps flowing, losing nothing, while either driver's Python conductor is held."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from udp_rig import Received, free_udp_port, message

import logbuf
from logbuf.cli import main as cli_main
from logbuf.cnc import counters as c
from logbuf.driver.context import DriverContext
from support import wait_until

pytestmark = pytest.mark.timeout(90)
STREAM = 11
TERM = 64 * 1024


def _launch(tmp_path: Path, **options: object) -> logbuf.MediaDriver:
    return logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=TERM, timer_interval_ns=50_000_000,
                                     **options)


@pytest.mark.parametrize(
    ("mode", "agents", "label"),
    [
        ("shared", [("lb-shared", ["sender", "receiver", "conductor"])], "SHARED"),
        ("shared-network", [("lb-network", ["sender", "receiver"]), ("lb-conductor", ["conductor"])],
         "SHARED_NETWORK"),
        ("dedicated", [("lb-sender", ["sender"]), ("lb-receiver", ["receiver"]), ("lb-conductor", ["conductor"])],
         "DEDICATED"),
    ],
)
def test_each_mode_runs_its_agents_and_names_itself_in_the_counters(
        tmp_path: Path, mode: str, agents: list[tuple[str, list[str]]], label: str) -> None:
    driver = _launch(tmp_path, threading_mode=mode, conductor_idle="backoff:max-park=2ms")
    try:
        wait_until(lambda: driver.agents and all(a.is_running for a in driver.agents), what="agents running")
        assert [(agent.name, agent.roles) for agent in driver.agents] == agents
        counters = driver.conductor.counters  # type: ignore[union-attr]
        system = driver.conductor.system  # type: ignore[union-attr]
        for counter in (c.SystemCounter.CONDUCTOR_MAX_CYCLE_TIME, c.SystemCounter.SENDER_MAX_CYCLE_TIME,
                        c.SystemCounter.RECEIVER_MAX_CYCLE_TIME):
            assert counters.counter_label(system[counter]).endswith(f": {label}")
        assert counters.counter_label(system[c.SystemCounter.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED]).endswith(
            f"ns {label}")
        with logbuf.connect(driver.directory) as client:
            pub = client.add_publication("aeron:ipc", STREAM)
            sub = client.add_subscription("aeron:ipc", STREAM)
            wait_until(lambda: sub.images and pub.is_connected, what="image, and the publication connected")
            sent = [b"m%d" % i for i in range(2000)]  # several windows: pub-lmt must move
            got: list[bytes] = []
            for message in sent:
                wait_until(lambda m=message: pub.offer(m) > 0, what="offer", poll=lambda: sub.poll(
                    lambda b, h: got.append(bytes(b)), 100))
            wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 100) * 0 or len(got) == len(sent),
                       what="everything received")
            assert got == sent
    finally:
        driver.close()
    assert not any(agent.is_running for agent in driver.agents)


def test_default_mode_follows_the_cores_and_bad_settings_are_refused_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOGBUF_THREADING_MODE", raising=False)
    assert DriverContext().threading_mode == ("dedicated" if (os.cpu_count() or 1) >= 4 else "shared")
    with pytest.raises(ValueError, match="threading mode 'invoker'"):
        DriverContext.build(threading_mode="invoker")
    with pytest.raises(ValueError, match="receiver_idle: .*unknown kind 'fast'"):
        DriverContext.build(receiver_idle="fast")
    with pytest.raises(ValueError, match="conductor_idle: .*unknown parameter 'parks=3'"):
        DriverContext.build(conductor_idle="backoff:parks=3")


def test_cli_refuses_a_bad_idle_strategy_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["driver", "--dir", str(tmp_path / "d"), "--sender-idle", "backoff:max-park=soon"])
    assert "max-park='soon'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["driver", "--dir", str(tmp_path / "d"), "--threading-mode", "invoker"])
    assert "invalid choice: 'invoker'" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("mode", ["shared", "dedicated"])
def test_ipc_publisher_keeps_its_limit_moving_while_the_python_conductor_is_held(tmp_path: Path, mode: str) -> None:
    driver = _launch(tmp_path, threading_mode=mode)
    try:
        with logbuf.connect(driver.directory) as client:
            pub = client.add_publication("aeron:ipc", STREAM)
            sub = client.add_subscription("aeron:ipc", STREAM)
            wait_until(lambda: sub.images and pub.is_connected, what="image, and the publication connected")
            window = TERM // 2
            received = [0]

            def consume() -> int:
                return sub.poll(lambda b, h: received.__setitem__(0, received[0] + 1), 1000)

            message = b"x" * 480  # 512-byte frames
            with driver.conductor_lock:  # the Python conductor cannot run a cycle
                held_from = time.monotonic()
                limit_before = pub.position_limit.get()
                sent = 0
                while time.monotonic() - held_from < 2.0:
                    if pub.offer(message) > 0:
                        sent += 1
                    else:
                        consume()
                consume()
                held_for = time.monotonic() - held_from
                limit_after = pub.position_limit.get()
            # a frozen pub-lmt would have stopped the publisher after one window
            assert sent * 512 > 4 * window, (sent, limit_before, limit_after)
            assert limit_after > limit_before + 3 * window
            assert held_for >= 2.0
            wait_until(lambda: consume() * 0 or received[0] == sent, what="everything received")
    finally:
        driver.close()


@pytest.mark.parametrize(
    ("mode", "agents"),
    [
        ("shared", [("lb-shared", ["sender", "receiver", "conductor"])]),
        ("shared-network", [("lb-network", ["sender", "receiver"]), ("lb-conductor", ["conductor"])]),
        ("dedicated", [("lb-sender", ["sender"]), ("lb-receiver", ["receiver"]), ("lb-conductor", ["conductor"])]),
    ],
)
def test_native_sender_and_receiver_duties_plug_into_the_mode_s_agents(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, agents: list[tuple[str, list[str]]]) -> None:
    """What a native sender/receiver gets: its duty on the mode's agent, its cycle counters written there, and
    in the Python loop only its control_work, never its do_work."""
    from logbuf.driver.conductor import DriverConductor
    from logbuf.driver.native_ipc import PUBLICATION_REMOVED, NativeIpcDuty
    from logbuf.driver.receiver import Receiver
    from logbuf.driver.sender import Sender

    # stand-ins with the duty signature: two more IPC duty states that acknowledge a command as work
    stand_ins = {"sender": NativeIpcDuty(timer_interval_ns=10**9), "receiver": NativeIpcDuty(timer_interval_ns=10**9)}
    monkeypatch.setattr(DriverConductor, "network_native_duties",
                        lambda self: {role: duty.duty for role, duty in stand_ins.items()})
    calls = {"do_work": 0, "control_work": 0}

    def do_work(self: object, now_ns: int) -> int:
        calls["do_work"] += 1
        return 0

    def control_work(self: object, now_ns: int) -> int:
        calls["control_work"] += 1
        return 0

    for cls in (Sender, Receiver):
        monkeypatch.setattr(cls, "do_work", do_work)
        monkeypatch.setattr(cls, "control_work", control_work, raising=False)
    driver = _launch(tmp_path, threading_mode=mode)
    try:
        wait_until(lambda: driver.agents and all(a.is_running for a in driver.agents), what="agents running")
        assert [(agent.name, agent.roles) for agent in driver.agents] == agents
        for duty in stand_ins.values():
            duty.remove_publication(1)  # work for the stand-in duty
        counters = driver.conductor.counters  # type: ignore[union-attr]
        system = driver.conductor.system  # type: ignore[union-attr]
        wait_until(lambda: all(counters.counter_value(system[counter]) > 0 for counter in (
            c.SystemCounter.SENDER_MAX_CYCLE_TIME, c.SystemCounter.RECEIVER_MAX_CYCLE_TIME)),
            what="the sender's and receiver's cycle counters, written by their agents")
        for duty in stand_ins.values():
            assert [event[0] for event in duty.poll_events()] == [PUBLICATION_REMOVED]
        wait_until(lambda: calls["control_work"] > 10, what="control_work in the Python loop")
        assert calls["do_work"] == 0
    finally:
        driver.close()
        for duty in stand_ins.values():
            duty.close()


def test_publications_and_subscriptions_come_and_go_while_the_native_duty_runs(tmp_path: Path) -> None:
    """Removals reach the native duty as commands; the sub-pos and pub-pos/pub-lmt counters and the log files
    go only once it acknowledged them - and then they do go."""
    driver = _launch(tmp_path, threading_mode="dedicated", publication_linger_timeout_ns=100_000_000)
    publications_dir = Path(driver.directory) / "publications"
    stream_types = {c.PUBLISHER_POSITION_TYPE_ID, c.PUBLISHER_LIMIT_TYPE_ID, c.SUBSCRIBER_POSITION_TYPE_ID}
    try:
        counters = driver.conductor.counters  # type: ignore[union-attr]
        with logbuf.connect(driver.directory) as client:
            for round_index in range(8):
                pub = client.add_exclusive_publication("aeron:ipc", STREAM + round_index)
                sub = client.add_subscription("aeron:ipc", STREAM + round_index)
                wait_until(lambda p=pub, s=sub: s.images and p.is_connected, what="connected")
                got: list[bytes] = []
                wait_until(lambda p=pub: p.offer(b"hello") > 0, what="offer")
                wait_until(lambda s=sub, g=got: s.poll(lambda b, h: g.append(bytes(b)), 10) or g, what="received")
                assert got == [b"hello"]
                sub.close()
                pub.close()

            def leftovers() -> tuple[list[str], list[int]]:
                return (os.listdir(publications_dir),
                        [info.counter_id for info in counters if info.type_id in stream_types])

            wait_until(lambda: leftovers() == ([], []), timeout=20, what="logs deleted and counters freed")
    finally:
        driver.close()


@pytest.mark.parametrize("mode", ["shared", "dedicated"])
@pytest.mark.parametrize("held", ["receiving", "sending"])
def test_a_udp_stream_keeps_flowing_while_a_python_conductor_is_held(tmp_path: Path, mode: str, held: str) -> None:
    """Two drivers in this process, a UDP stream from one to the other; the receiving (or the sending) driver's
    Python conductor is held for 2 s: data, SMs, pub-lmt and snd-lmt must keep moving on the native agents
    (many receiver windows arrive during the hold), and afterwards every message is there once, in order."""
    window = TERM // 2  # the receiver's window: min(128 KiB, T/2)
    frame = 544  # a 500-byte message's frame: 32-byte header, aligned to 32
    ch = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k"
    sending = logbuf.MediaDriver.launch(tmp_path / "snd", threading_mode=mode, timer_interval_ns=50_000_000)
    try:
        receiving = logbuf.MediaDriver.launch(tmp_path / "rcv", threading_mode=mode, timer_interval_ns=50_000_000)
        try:
            with logbuf.connect(sending.directory) as pub_client, logbuf.connect(receiving.directory) as sub_client:
                sub = sub_client.add_subscription(ch, STREAM)
                pub = pub_client.add_publication(ch, STREAM)
                wait_until(lambda: pub.is_connected and sub.images, what="connection across the drivers")
                received = Received()
                sent = 0

                def offer_or_poll() -> None:
                    nonlocal sent
                    if pub.offer(message(sent, 500)) > 0:
                        sent += 1
                    else:
                        received.poll(sub)

                while sent < 100:  # under way before the hold
                    offer_or_poll()
                lock = (receiving if held == "receiving" else sending).conductor_lock
                with lock:  # that driver's Python conductor cannot run a cycle
                    held_from = time.monotonic()
                    before = len(received.sequences)
                    while time.monotonic() - held_from < 2.0:
                        offer_or_poll()
                    received.poll(sub)
                    during = len(received.sequences) - before
                    held_for = time.monotonic() - held_from
                assert held_for >= 2.0
                # a stalled SM, snd-lmt or pub-lmt would have stopped the stream after one window
                assert during * frame > 4 * window, (during, sent)
                wait_until(lambda: received.poll(sub) * 0 or len(received.sequences) >= sent, timeout=30,
                           what="everything sent to arrive")
                assert received.sequences == list(range(sent)) and received.corrupt == 0
        finally:
            receiving.close()
    finally:
        sending.close()


def test_the_environment_sets_the_default_mode_and_an_option_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LOGBUF_THREADING_MODE", "shared-network")
    assert DriverContext().threading_mode == "shared-network"
    assert DriverContext.build(threading_mode="dedicated").threading_mode == "dedicated"
    monkeypatch.setenv("LOGBUF_THREADING_MODE", "invoker")
    with pytest.raises(ValueError, match="LOGBUF_THREADING_MODE='invoker': expected one of shared, "):
        DriverContext()
    assert DriverContext.build(threading_mode="shared").threading_mode == "shared"
    assert cli_main(["driver", "--dir", str(tmp_path / "d")]) == 2  # a usage error, named
    assert "LOGBUF_THREADING_MODE='invoker'" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
