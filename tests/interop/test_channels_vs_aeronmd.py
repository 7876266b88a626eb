"""Differential tests: the same channel settings and commands through logbuf's driver and Aeron's aeronmd,
observed with logbuf's Python client (sessions, initial positions, windows, who receives what, images going
and coming back, error codes) and Aeron's C samples; the observations must be equal.

Each scenario returns what it observed on one driver; the test runs it on both and compares.  Skipped with
the reason when aeronmd is not there (see ``aeron_driver``).
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aeron_driver import require_aeron_bin, running

import logbuf
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.messages import (
    ControlCommand,
    ControlResponse,
    CorrelatedMessage,
    DestinationByIdMessage,
    DestinationMessage,
    ErrorCode,
    PublicationMessage,
    RejectImageMessage,
    StaticCounterMessage,
    SubscriptionMessage,
    decode_response,
)
from logbuf.logbuffer import descriptor as d
from support import WaitTimeout, stop_process, wait_until

pytestmark = pytest.mark.timeout(120)
STREAM = 10
Observation = dict[str, Any]


def free_udp_port() -> int:
    """A port nothing on 127.0.0.1 is bound to right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _poll(sub: logbuf.Subscription, into: list[bytes]) -> int:
    return sub.poll(lambda buffer, header: into.append(bytes(buffer)), 100)


def _offer(pub: logbuf.Publication, count: int, prefix: bytes = b"m") -> list[bytes]:
    sent = [prefix + b"%d" % i for i in range(count)]
    for message in sent:
        wait_until(lambda message=message: pub.offer(message) > 0, what="offer")
    return sent

def _gone_within_two_lingers(goings: list[logbuf.Image]) -> bool:
    """Whether an image went within two lingers (2 s) of its publication's close: nothing to await but time."""
    closed = time.monotonic()
    wait_until(lambda: bool(goings) or time.monotonic() > closed + 2.0, what="two lingers")
    return bool(goings)



def _code(add: Callable[[], object]) -> int | str:
    """The error code a registration is refused with, or "ok"."""
    try:
        add()
    except logbuf.RegistrationError as exc:
        return exc.code
    return "ok"


def _refused(add: Callable[[], object]) -> str:
    """"refused" or "ok": a bad channel value is refused by both, with INVALID_CHANNEL here and aeronmd's
    GENERIC_ERROR (errno EINVAL) there (see docs/interop.md)."""
    return "ok" if _code(add) == "ok" else "refused"


# -- scenarios (each: directory of a running driver -> observation) ------------------------------------------


def session_specific_subscriptions(directory: Path, base: str) -> Observation:
    with logbuf.connect(directory) as client:
        other = client.add_subscription(base + "session-id=779", STREAM)
        mine = client.add_subscription(base + "session-id=778", STREAM)
        pub = client.add_publication(base + "session-id=778", STREAM)
        wait_until(lambda: pub.is_connected and mine.images, what="the session 778 image")
        sent = _offer(pub, 10)
        got: list[bytes] = []
        wait_until(lambda: _poll(mine, got) >= 0 and len(got) == len(sent), what="session 778's messages")
        got_other: list[bytes] = []
        _poll(other, got_other)
        return {"session": pub.session_id, "mine": got == sent, "image sessions": [i.session_id for i in mine.images],
                "other images": len(other.images), "other got": got_other}


def session_ipc(directory: Path) -> Observation:
    return session_specific_subscriptions(directory, "aeron:ipc?")


def session_udp(directory: Path) -> Observation:
    return session_specific_subscriptions(directory, f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|")


def session_clashes(directory: Path) -> Observation:
    with logbuf.connect(directory) as client:
        shared = client.add_publication("aeron:ipc?session-id=778", STREAM)
        return {
            "shared": shared.session_id,
            "shared again": client.add_publication("aeron:ipc?session-id=778", STREAM).session_id,
            "shared, another session": _code(lambda: client.add_publication("aeron:ipc?session-id=779", STREAM)),
            "exclusive, same session": _code(
                lambda: client.add_exclusive_publication("aeron:ipc?session-id=778", STREAM)),
            "shared, another term length": _code(
                lambda: client.add_publication("aeron:ipc?term-length=128k", STREAM)),
            "shared, another mtu": _code(lambda: client.add_publication("aeron:ipc?mtu=4096", STREAM)),
            "exclusive, another stream": client.add_exclusive_publication(
                "aeron:ipc?session-id=778", STREAM + 1).session_id,
        }


def exclusive_initial_position(directory: Path) -> Observation:
    with logbuf.connect(directory) as client:
        pub = client.add_exclusive_publication("aeron:ipc?init-term-id=5|term-id=7|term-offset=1024", STREAM)
        images: list[logbuf.Image] = []
        sub = client.add_subscription("aeron:ipc", STREAM, on_available_image=images.append)
        wait_until(lambda: pub.is_connected and images, what="image")
        _offer(pub, 1)
        got: list[bytes] = []
        wait_until(lambda: _poll(sub, got) or got, what="message")
        return {"initial term id": pub.initial_term_id, "start": images[0].join_position, "got": got,
                "position": pub.position, "half-set": _refused(
                    lambda: client.add_exclusive_publication("aeron:ipc?init-term-id=5|term-id=7", STREAM))}


def publication_window(directory: Path) -> Observation:
    with logbuf.connect(directory) as client:
        limits = {}
        for stream, window in enumerate(("16k", "32k"), start=STREAM):
            sub = client.add_subscription("aeron:ipc", stream)
            pub = client.add_publication(f"aeron:ipc?pub-wnd={window}", stream)
            wait_until(lambda pub=pub, sub=sub: pub.is_connected and sub.images, what="connected")
            wait_until(lambda pub=pub: pub.position_limit_value > 0, what="a publication limit")
            time.sleep(0.2)  # let more conductor cycles pass: the limit must be stable, not just set once
            limits[window] = pub.position_limit_value
        for window in ("1k", "48k"):  # below the MTU, above half the term
            limits[window] = _refused(
                lambda window=window: client.add_publication(f"aeron:ipc?pub-wnd={window}", STREAM + 9))
        return limits


def term_length_and_mtu(directory: Path) -> Observation:
    with logbuf.connect(directory) as client:
        pub = client.add_publication("aeron:ipc?term-length=128k|mtu=4096", STREAM)
        return {"term length": pub.term_length, "max payload": pub.max_payload_length,
                "term-length=3k": _refused(lambda: client.add_publication("aeron:ipc?term-length=3k", STREAM + 2)),
                "mtu=100": _refused(lambda: client.add_publication("aeron:ipc?mtu=100", STREAM + 3)),
                "session-id=abc": _refused(lambda: client.add_publication("aeron:ipc?session-id=abc", STREAM + 4)),
                "tether=maybe": _refused(lambda: client.add_subscription("aeron:ipc?tether=maybe", STREAM + 5)),
                "unknown host": _code(lambda: client.add_publication("aeron:udp?endpoint=nohost.invalid:40555",
                                                                     STREAM + 6))}


def untethered_subscriber(directory: Path) -> Observation:
    with logbuf.connect(directory) as client:
        pub = client.add_publication(
            "aeron:ipc?untethered-window-limit-timeout=200ms|untethered-resting-timeout=300ms", STREAM)
        tethered = client.add_subscription("aeron:ipc", STREAM)
        events: list[tuple[str, int]] = []
        client.add_subscription("aeron:ipc?tether=false", STREAM,
                                on_available_image=lambda i: events.append(("available", i.join_position)),
                                on_unavailable_image=lambda i: events.append(("unavailable", 0)))
        wait_until(lambda: pub.is_connected and tethered.images and events, what="both images")
        got: list[bytes] = []

        def step() -> bool:
            pub.offer(bytes(500))
            _poll(tethered, got)
            return len(events) >= 3

        wait_until(step, timeout=30, what="the untethered subscriber going and coming back")
        window = 32 * 1024
        return {"events": [kind for kind, _ in events[:3]],
                "rejoined more than a window on": events[2][1] > events[0][1] + window}


def untethered_rejoin_position(directory: Path) -> Observation:
    """An untethered subscriber that rested rejoins where a new subscriber would: beside the slower of two
    tethered ones (one kept reading after it went, one stopped)."""
    with logbuf.connect(directory) as client:
        pub = client.add_publication(
            "aeron:ipc?term-length=64k|untethered-window-limit-timeout=200ms|untethered-resting-timeout=300ms", STREAM)
        fast, slow = (client.add_subscription("aeron:ipc", STREAM) for _ in range(2))
        events: list[tuple[str, int]] = []
        client.add_subscription("aeron:ipc?tether=false", STREAM,
                                on_available_image=lambda i: events.append(("available", i.join_position)),
                                on_unavailable_image=lambda i: events.append(("unavailable", 0)))
        wait_until(lambda: pub.is_connected and fast.images and slow.images and events, what="the images")
        got: list[bytes] = []

        def step() -> bool:
            pub.offer(bytes(500))
            _poll(fast, got)
            _poll(slow, got)
            return len(events) >= 2

        wait_until(step, timeout=30, what="the untethered subscriber going")
        moved = 0

        def move_fast() -> bool:  # once the untethered one rests, only the slow one holds the publisher
            nonlocal moved
            moved += pub.offer(bytes(500)) > 0
            _poll(fast, got)
            return moved >= 10

        wait_until(move_fast, timeout=10, what="the fast subscriber moving on")
        fast_position, slow_position = fast.images[0].position, slow.images[0].position
        wait_until(lambda: len(events) >= 3, timeout=10, what="the untethered subscriber rejoining")
        rejoin = events[2][1]
        return {"fast ahead": fast_position > slow_position, "rejoined beside the slow": rejoin == slow_position,
                "rejoined beside the fast": rejoin == fast_position}


def interface_forms(directory: Path) -> Observation:
    """Data over UDP channels whose interface is a subnet, an IPv4 address with a port, and with cc, alias,
    reliable, rejoin and tether at the values both drivers honour."""
    observed: dict[str, Any] = {}
    with logbuf.connect(directory) as client:
        for stream, extra in enumerate(("interface=127.0.0.0/8", "interface=127.0.0.1:0|cc=static|alias=x",
                                        "reliable=true|rejoin=true|tether=true|eos=true"), start=STREAM):
            channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|{extra}"
            sub = client.add_subscription(channel, stream)
            pub = client.add_publication(channel, stream)
            wait_until(lambda pub=pub, sub=sub: pub.is_connected and sub.images, what="connection")
            sent = _offer(pub, 3)
            got: list[bytes] = []
            wait_until(lambda sub=sub, got=got: _poll(sub, got) >= 0 and len(got) == 3, what="messages")
            observed[extra] = got == sent
    return observed


def _metadata(pub: logbuf.Publication) -> Observation:
    """The fields of a publication's log metadata that channel settings decide, as the driver wrote them."""
    meta = pub.log.meta
    fields = {
        "term length": meta.get_i32(d.LOG_TERM_LENGTH_OFFSET),
        "mtu": meta.get_i32(d.LOG_MTU_LENGTH_OFFSET),
        "window": meta.get_i32(d.LOG_PUBLICATION_WINDOW_LENGTH_OFFSET),
        "so-sndbuf": meta.get_i32(d.LOG_SOCKET_SNDBUF_LENGTH_OFFSET),
        "so-rcvbuf": meta.get_i32(d.LOG_SOCKET_RCVBUF_LENGTH_OFFSET),
        "linger": meta.get_i64(d.LOG_LINGER_TIMEOUT_NS_OFFSET),
        "untethered window limit": meta.get_i64(d.LOG_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS_OFFSET),
        "untethered resting": meta.get_i64(d.LOG_UNTETHERED_RESTING_TIMEOUT_NS_OFFSET),
    }
    for name, offset in (("sparse", d.LOG_SPARSE_OFFSET), ("signal eos", d.LOG_SIGNAL_EOS_OFFSET),
                         ("ssc", d.LOG_SPIES_SIMULATE_CONNECTION_OFFSET), ("tether", d.LOG_TETHER_OFFSET), ("rejoin", d.LOG_REJOIN_OFFSET),
                         ("reliable", d.LOG_RELIABLE_OFFSET)):
        fields[name] = bytes(meta.get_bytes(offset, 1))[0]
    return fields


def publication_metadata(directory: Path) -> Observation:
    port = free_udp_port()
    channels = {
        "ipc, every setting": "aeron:ipc?linger=250ms|sparse=false|eos=false|untethered-window-limit-timeout=700ms|"
                              "untethered-resting-timeout=900ms|pub-wnd=16k|term-length=128k|mtu=4096",
        "ipc, sparse": "aeron:ipc?sparse=true|linger=0",
        # logbuf's logs are sparse unless asked otherwise (aeronmd's are not): the defaults say so explicitly
        "udp, default sockets": f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|sparse=true",
        "udp, sockets": f"aeron:udp?endpoint=127.0.0.1:{port}|so-sndbuf=128k|so-rcvbuf=256k|pub-wnd=8k|linger=3s|"
                        "sparse=false",
        "udp, ssc": f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|ssc=true|sparse=true",
    }
    with logbuf.connect(directory) as client:
        return {name: _metadata(client.add_exclusive_publication(channel, STREAM))
                for name, channel in channels.items()}


def image_metadata(directory: Path) -> Observation:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with logbuf.connect(directory) as client:
        images: list[logbuf.Image] = []
        client.add_subscription(channel + "|rcv-wnd=32k|so-rcvbuf=256k|sparse=true", STREAM,
                                on_available_image=images.append)
        pub = client.add_publication(channel, STREAM)
        wait_until(lambda: pub.is_connected and images, what="the image")
        meta = images[0].log.meta
        fields = {"receiver window": meta.get_i32(d.LOG_RECEIVER_WINDOW_LENGTH_OFFSET),
                  "so-rcvbuf": meta.get_i32(d.LOG_SOCKET_RCVBUF_LENGTH_OFFSET),
                  "so-sndbuf": meta.get_i32(d.LOG_SOCKET_SNDBUF_LENGTH_OFFSET)}
        for name, offset in (("sparse", d.LOG_SPARSE_OFFSET), ("tether", d.LOG_TETHER_OFFSET),
                             ("rejoin", d.LOG_REJOIN_OFFSET), ("reliable", d.LOG_RELIABLE_OFFSET),
                             ("group", d.LOG_GROUP_OFFSET)):
            fields[name] = bytes(meta.get_bytes(offset, 1))[0]
        return fields


def receiver_keys_metadata(directory: Path) -> Observation:
    """reliable=false, rejoin=false, group=true and nak-delay on a UDP subscription: accepted, the stream is
    delivered, and the image's log metadata says so (group: the image has group semantics)."""
    observed: dict[str, Any] = {}
    with logbuf.connect(directory) as client:
        for stream, extra in enumerate(("reliable=false|rejoin=false|group=true|nak-delay=1ms",
                                        "group=false|nak-delay=500us", "group=infer|reliable=true"), start=STREAM):
            channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
            images: list[logbuf.Image] = []
            sub = client.add_subscription(f"{channel}|{extra}", stream, on_available_image=images.append)
            pub = client.add_publication(channel, stream)
            wait_until(lambda pub=pub, images=images: pub.is_connected and images, what="the image")
            sent = _offer(pub, 3)
            got: list[bytes] = []
            wait_until(lambda sub=sub, got=got: _poll(sub, got) >= 0 and len(got) == 3, what="messages")
            meta = images[0].log.meta
            observed[extra] = {"delivered": got == sent, **{
                name: bytes(meta.get_bytes(offset, 1))[0]
                for name, offset in (("rejoin", d.LOG_REJOIN_OFFSET), ("reliable", d.LOG_RELIABLE_OFFSET),
                                     ("group", d.LOG_GROUP_OFFSET))}}
        base = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
        client.add_subscription(base + "|reliable=false", STREAM + 5)
        observed["clashing reliable"] = _code(lambda: client.add_subscription(base, STREAM + 5))
        observed["clashing rejoin"] = _code(lambda: client.add_subscription(base + "|reliable=false|rejoin=false",
                                                                            STREAM + 5))
    return observed


def multi_destination_subscription(directory: Path) -> Observation:
    """A control-mode=manual subscription with two receive destinations, a publisher to each: who receives
    what, before and after one destination is removed; the answers to bad destination commands."""
    a, b = free_udp_port(), free_udp_port()
    with logbuf.connect(directory) as client:
        sub = client.add_subscription("aeron:udp?control-mode=manual", STREAM)
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{a}")
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{b}")
        pubs = {"a": client.add_publication(f"aeron:udp?endpoint=127.0.0.1:{a}", STREAM),
                "b": client.add_publication(f"aeron:udp?endpoint=127.0.0.1:{b}", STREAM)}
        wait_until(lambda: all(p.is_connected for p in pubs.values()) and len(sub.images) == 2, what="two images")
        by_session: dict[int, list[bytes]] = {p.session_id: [] for p in pubs.values()}

        def poll() -> int:
            return sub.poll(lambda buffer, header: by_session[header.session_id].append(bytes(buffer)), 100)

        sent = {name: _offer(pub, 5, name.encode()) for name, pub in pubs.items()}
        wait_until(lambda: poll() >= 0 and all(len(v) == 5 for v in by_session.values()), what="both streams")
        before = {name: by_session[pub.session_id] == sent[name] for name, pub in pubs.items()}
        sub.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{a}")
        time.sleep(0.3)  # the removal reaches the receiver
        for name, pub in pubs.items():
            for i in range(5):
                pub.offer(name.encode() + b"after%d" % i)
        wait_until(lambda: poll() >= 0 and len(by_session[pubs["b"].session_id]) == 10, what="b's later messages")
        time.sleep(0.5)
        poll()
        plain = client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}", STREAM)
        return {"before removal": before,
                "after removal": {name: len(by_session[pub.session_id]) - 5 for name, pub in pubs.items()},
                "image sessions": len(sub.images) >= 1,
                "destination with mtu": _code(lambda: sub.add_destination(
                    f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|mtu=1408")),
                "destination with rcv-wnd": _code(lambda: sub.add_destination(
                    f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|rcv-wnd=64k")),
                "remove one never added": _code(lambda: sub.remove_destination(
                    f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}")),
                "destination of a plain subscription": _code(lambda: plain.add_destination(
                    f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"))}


def reject_image(directory: Path) -> Observation:
    """Image.reject of a UDP image: the answer, no data taken after it, ERR frames sent and received (one
    driver holds both ends), and a reason over 1023 bytes."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with logbuf.connect(directory) as client:
        sub = client.add_subscription(channel, STREAM)
        pub = client.add_publication(channel, STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="the image")
        got: list[bytes] = []
        sent = _offer(pub, 3)
        wait_until(lambda: _poll(sub, got) >= 0 and len(got) == 3, what="messages")
        image = sub.images[0]
        too_long = _code(lambda: image.reject("x" * 1024))
        answer = _code(lambda: image.reject("go away"))
        with CncFile.open(directory / "cnc.dat") as cnc:
            def system(counter_id: int) -> int:
                return next(i.value for i in cnc.counters_reader() if i.counter_id == counter_id)

            wait_until(lambda: system(38) > 0 and system(39) > 0, timeout=10,
                       what="error frames received and sent")
        for i in range(3):
            pub.offer(b"late%d" % i)
        time.sleep(0.5)
        late: list[bytes] = []
        _poll(sub, late)
        return {"delivered before": got == sent, "reason of 1024 bytes": too_long, "reject": answer,
                "after rejection": late}


def c_samples_receiver_keys(directory: Path) -> Observation:
    """Aeron's basic_subscriber on a channel with reliable=false, rejoin=false, group=false and nak-delay;
    basic_publisher's messages arrive."""
    binaries = require_aeron_bin()
    base = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    log = directory.parent / "basic_subscriber_keys.txt"
    with open(log, "w") as out:
        subscriber = subprocess.Popen(
            [str(binaries / "bin" / "basic_subscriber"), "-p", str(directory), "-c",
             f"{base}|reliable=false|rejoin=false|group=false|nak-delay=1ms", "-s", str(STREAM)], stdout=out,
            stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)  # the subscriber registers before the publisher's messages
        subprocess.run([str(binaries / "bin" / "basic_publisher"), "-p", str(directory), "-c", base, "-s",
                        str(STREAM), "-m", "5", "-l", "1"], capture_output=True, timeout=60)
        time.sleep(0.5)
    finally:
        stop_process(subscriber, signal.SIGINT)
    return {"received": any("Message to stream" in line for line in log.read_text().splitlines())}


def _command_answers(directory: Path, commands: list[tuple[int, bytes, int]]) -> list[Any]:
    """Raw commands ``(type, body, correlation id)``: each one's answer (response name and, for errors, the
    code) or "none" when no answer came within a second."""
    answers: list[Any] = []
    with CncFile.open(directory / "cnc.dat") as cnc:
        receiver = cnc.copy_broadcast_receiver()
        seen: list[tuple[int, Any]] = []

        def collect() -> None:
            while receiver.receive(lambda t, b: seen.append((t, decode_response(t, b)))):
                pass

        for msg_type, body, correlation_id in commands:
            assert cnc.to_driver.write(msg_type, body)

            def answer(correlation_id: int = correlation_id) -> Any:
                collect()
                for response, message in seen:
                    if response == ControlResponse.ON_ERROR and message.offending_correlation_id == correlation_id:
                        return ("ON_ERROR", message.error_code)
                    if getattr(message, "correlation_id", None) == correlation_id:
                        return (ControlResponse(response).name, getattr(message, "counter_id", None))
                return None

            try:
                answers.append(wait_until(answer, timeout=1.0, what="an answer"))
            except Exception:
                answers.append("none")
    return answers


def aeron_commands(directory: Path) -> Observation:
    with CncFile.open(directory / "cnc.dat") as cnc:
        ids = [cnc.to_driver.next_correlation_id() for _ in range(16)]
    client_id = ids[0]
    port = free_udp_port()
    udp = f"aeron:udp?endpoint=127.0.0.1:{port}"
    dest = "aeron:udp?endpoint=127.0.0.1:4000"
    setup = [
        (ControlCommand.CLIENT_KEEPALIVE, CorrelatedMessage(client_id, 0).encode(), -99),
        (ControlCommand.ADD_PUBLICATION, PublicationMessage(client_id, ids[1], STREAM, "aeron:ipc").encode(), ids[1]),
        (ControlCommand.ADD_PUBLICATION, PublicationMessage(client_id, ids[2], STREAM, udp).encode(), ids[2]),
        (ControlCommand.ADD_SUBSCRIPTION, SubscriptionMessage(client_id, ids[3], -1, STREAM, udp).encode(), ids[3]),
    ]
    _command_answers(directory, setup)
    answers = _command_answers(directory, [
        (ControlCommand.ADD_DESTINATION, DestinationMessage(client_id, ids[4], ids[1], dest).encode(), ids[4]),
        (ControlCommand.ADD_DESTINATION, DestinationMessage(client_id, ids[5], ids[2], dest).encode(), ids[5]),
        (ControlCommand.REMOVE_DESTINATION, DestinationMessage(client_id, ids[6], 999_999, dest).encode(), ids[6]),
        (ControlCommand.ADD_RCV_DESTINATION, DestinationMessage(client_id, ids[7], ids[3], dest).encode(), ids[7]),
        (ControlCommand.ADD_RCV_DESTINATION, DestinationMessage(client_id, ids[8], 999_999, dest).encode(), ids[8]),
        (ControlCommand.REMOVE_RCV_DESTINATION, DestinationMessage(client_id, ids[9], 999_999, dest).encode(),
         ids[9]),
        (ControlCommand.REJECT_IMAGE, RejectImageMessage(client_id, ids[10], 999_999, 0, "bad!").encode(), ids[10]),
        (ControlCommand.REMOVE_DESTINATION_BY_ID, DestinationByIdMessage(client_id, ids[11], ids[2], 5).encode(),
         ids[11]),
        (ControlCommand.ADD_STATIC_COUNTER,
         StaticCounterMessage(client_id, ids[12], 42, 1001, b"k", "static").encode(), ids[12]),
        (ControlCommand.ADD_STATIC_COUNTER,
         StaticCounterMessage(client_id, ids[13], 42, 1001, b"k", "again").encode(), ids[13]),
        (ControlCommand.ADD_STATIC_COUNTER,
         StaticCounterMessage(client_id, ids[14], 43, 1001, b"k", "other").encode(), ids[14]),
    ])
    statics = [answer[1] for answer in answers[-3:]]
    with CncFile.open(directory / "cnc.dat") as cnc:
        info = next(i for i in cnc.counters_reader() if i.counter_id == statics[0])
    static = {"type": info.type_id, "registration id": info.registration_id, "label": info.label,
              "key": info.key[:1], "owner": "client" if info.owner_id == client_id else info.owner_id}
    return {"static counter": static,"answers": [a if a == "none" or a[0] != "ON_STATIC_COUNTER" else "ON_STATIC_COUNTER"
                        for a in answers],
            "same static counter": statics[0] == statics[1], "another static counter": statics[2] != statics[0]}


def c_samples_session(directory: Path) -> Observation:
    """Aeron's basic_publisher on session 778 (UDP); basic_subscribers on 778 and 779: who prints messages."""
    binaries = require_aeron_bin()
    base = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    logs = {session: directory.parent / f"basic_subscriber_{session}.txt" for session in (778, 779)}
    subscribers = {}
    for session, log in logs.items():
        with open(log, "w") as out:
            subscribers[session] = subprocess.Popen(
                [str(binaries / "bin" / "basic_subscriber"), "-p", str(directory), "-c", f"{base}|session-id={session}",
                 "-s", str(STREAM)], stdout=out, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)  # the subscribers register before the publisher's messages
        subprocess.run([str(binaries / "bin" / "basic_publisher"), "-p", str(directory), "-c",
                        f"{base}|session-id=778", "-s", str(STREAM), "-m", "5", "-l", "1"], capture_output=True,
                       timeout=60)
        time.sleep(0.5)
    finally:
        for proc in subscribers.values():
            stop_process(proc, signal.SIGINT)
    # the first of the publisher's messages may go before it is connected: who received any is what counts
    return {session: any("from session 778" in line for line in log.read_text().splitlines())
            for session, log in logs.items()}


def spy_reads_a_network_publication(directory: Path) -> Observation:
    """A spy beside a receiver: its image (session, source), what it reads, and that a spy that does not poll
    holds the publisher back to the window from its position; a spy of another session sees nothing."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k"
    with logbuf.connect(directory) as client:
        receiver = client.add_subscription(channel, STREAM)
        images: list[logbuf.Image] = []
        spy = client.add_subscription("aeron-spy:" + channel, STREAM, on_available_image=images.append)
        other = client.add_subscription("aeron-spy:" + channel + "|session-id=4", STREAM)
        pub = client.add_exclusive_publication(channel + "|pub-wnd=16k|session-id=5", STREAM)
        wait_until(lambda: pub.is_connected and receiver.images and images, what="the receiver's and spy's images")
        got: list[bytes] = []
        accepted = 0

        def fill() -> bool:
            nonlocal accepted
            result = pub.offer(bytes(992))  # 1 KiB frames
            accepted += result > 0
            _poll(receiver, got)
            return result == logbuf.BACK_PRESSURED and len(got) == accepted

        wait_until(fill, timeout=30, what="back pressure from the spy")
        spied: list[bytes] = []
        wait_until(lambda: _poll(spy, spied) >= 0 and len(spied) == accepted, what="the spy reading")
        counter_id = images[0].subscriber_position.counter_id
        with CncFile.open(directory / "cnc.dat") as cnc:
            info = next(i for i in cnc.counters_reader() if i.counter_id == counter_id)
        # Aeron's sub-pos label: "sub-pos: <registration id> <session> <stream> <channel> @<position>"; only the
        # first number is the registration id (a session id may have the same digits)
        label = re.sub(rf"^(sub-pos: ){spy.registration_id}\b", r"\1<registration id>",
                       info.label.replace(channel, "<channel>"))
        return {"session": images[0].session_id, "source": images[0].source_identity,
                "sub-pos": (info.type_id, label, info.reference_id == pub.registration_id,
                            info.registration_id == spy.registration_id),
                "accepted before the spy read": accepted, "spy read all": spied == got,
                "other session's spy images": len(other.images)}


def spies_simulate_connection(directory: Path) -> Observation:
    """A publication read only by a spy: connected with ssc=true, not without."""
    observed: dict[str, Any] = {}
    with logbuf.connect(directory) as client:
        for stream, ssc in enumerate(("false", "true"), start=STREAM):
            channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
            spy = client.add_subscription("aeron-spy:" + channel, stream)
            pub = client.add_exclusive_publication(channel + f"|ssc={ssc}", stream)
            wait_until(lambda spy=spy: spy.images, what="the spy's image")
            if ssc == "true":
                wait_until(lambda pub=pub: pub.is_connected, what="connected by the spy")
                sent = _offer(pub, 5)
                got: list[bytes] = []
                wait_until(lambda spy=spy, got=got: _poll(spy, got) >= 0 and len(got) == 5, what="the spy's messages")
                observed["ssc=true spy got"] = got == sent
            observed[f"ssc={ssc} connected"] = pub.is_connected
            observed[f"ssc={ssc} offer"] = pub.offer(b"x") > 0
    return observed


def untethered_spy(directory: Path) -> Observation:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k"
    with logbuf.connect(directory) as client:
        receiver = client.add_subscription(channel, STREAM)
        events: list[tuple[str, int]] = []
        client.add_subscription("aeron-spy:" + channel + "|tether=false", STREAM,
                                on_available_image=lambda i: events.append(("available", i.join_position)),
                                on_unavailable_image=lambda i: events.append(("unavailable", 0)))
        pub = client.add_publication(
            channel + "|untethered-window-limit-timeout=200ms|untethered-resting-timeout=300ms", STREAM)
        wait_until(lambda: pub.is_connected and receiver.images and events, what="both images")
        got: list[bytes] = []

        def step() -> bool:
            pub.offer(bytes(500))
            _poll(receiver, got)
            return len(events) >= 3

        wait_until(step, timeout=30, what="the untethered spy going and coming back")
        window = 32 * 1024
        return {"events": [kind for kind, _ in events[:3]],
                "rejoined more than a window on": events[2][1] > events[0][1] + window}



def spies_outlast_their_publication(directory: Path) -> Observation:
    """A publication closed while its spy has not read it: still there after twice the linger (1 s here), gone
    once the spy read to the end; 70 spies on one publication all get an image."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k"
    with logbuf.connect(directory) as client:
        goings: list[logbuf.Image] = []
        spy = client.add_subscription("aeron-spy:" + channel, STREAM, on_unavailable_image=goings.append)
        more = [client.add_subscription("aeron-spy:" + channel, STREAM) for _ in range(69)]
        receiver = client.add_subscription(channel, STREAM)
        pub = client.add_publication(channel, STREAM)
        wait_until(lambda: pub.is_connected and spy.images, what="the spy's image")
        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: all(s.images for s in more), timeout=10, what="70 spy images")
        with_image = sum(1 for s in [spy, *more] if s.images)
        sent = _offer(pub, 5)
        received: list[bytes] = []
        wait_until(lambda: _poll(receiver, received) >= 0 and len(received) == 5, what="the receiver's copy")
        for other in more:
            other.close()
        pub.close()
        unread_gone = _gone_within_two_lingers(goings)  # the spy unread
        spied: list[bytes] = []
        wait_until(lambda: _poll(spy, spied) >= 0 and bool(goings), timeout=30, what="the spy's image going")
        return {"spies with an image": with_image, "gone while unread": unread_gone, "spy read all": spied == sent}


def ipc_join_positions(directory: Path) -> Observation:
    """Where a subscriber added to a running aeron:ipc publication starts: behind a subscriber that read
    nothing, behind two that read part and all, beside subscribers that read everything, and with none left."""
    with logbuf.connect(directory) as client:
        pub = client.add_publication("aeron:ipc?term-length=64k", STREAM)
        first = client.add_subscription("aeron:ipc", STREAM)
        wait_until(lambda: pub.is_connected and first.images, what="the first image")
        _offer(pub, 10)
        joins: Observation = {"produced": pub.position}

        def join(what: str) -> logbuf.Subscription:
            images: list[logbuf.Image] = []
            sub = client.add_subscription("aeron:ipc", STREAM, on_available_image=images.append)
            wait_until(lambda: bool(images), what=f"the image {what}")
            joins[what] = images[0].join_position
            return sub

        def read(sub: logbuf.Subscription, count: int) -> None:
            got: list[bytes] = []
            wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), count - len(got)) >= 0
                       and len(got) >= count, what="messages")

        second = join("behind one that read nothing")
        read(second, 10 - joins["behind one that read nothing"] // 64)
        read(first, 5)
        time.sleep(0.2)  # nothing to await but the driver's duty cycle taking the new positions
        third = join("behind one that read half, one all")
        read(first, 5)
        read(third, 10 - joins["behind one that read half, one all"] // 64)
        time.sleep(0.2)
        join("beside ones that read all").close()
        for sub in (first, second, third):
            sub.close()
        time.sleep(0.2)
        join("with none left")

        # none left, the one that read half gone before the one that read nothing: where the furthest got to
        other = client.add_publication("aeron:ipc?term-length=64k", STREAM + 1)
        reader, idle = (client.add_subscription("aeron:ipc", STREAM + 1) for _ in range(2))
        wait_until(lambda: other.is_connected and reader.images and idle.images, what="the other images")
        _offer(other, 10)
        read(reader, 5)
        for sub in (reader, idle):
            time.sleep(0.2)  # the driver's duty cycle takes the positions
            sub.close()
        time.sleep(0.2)
        images: list[logbuf.Image] = []
        client.add_subscription("aeron:ipc", STREAM + 1, on_available_image=images.append)
        wait_until(lambda: bool(images), what="the image with none left")
        joins["none left, the furthest had read half"] = images[0].join_position
        return joins


def ipc_subscriber_outlasts_its_publication(directory: Path) -> Observation:
    """A closed aeron:ipc publication whose subscriber has not polled: still there after twice the linger (1 s
    here), gone once the subscriber read to the end of stream; a claim a publisher left open when it closed,
    where a second subscriber waits, is padded while the publication drains, so it reads what came after."""
    with logbuf.connect(directory) as client:
        goings: list[logbuf.Image] = []
        sub = client.add_subscription("aeron:ipc", STREAM, on_unavailable_image=goings.append)
        pub = client.add_publication("aeron:ipc", STREAM)
        wait_until(lambda: pub.is_connected and sub.images, what="the image")
        sent = _offer(pub, 5)
        pub.close()
        unread_gone = _gone_within_two_lingers(goings)  # the subscriber unread
        got: list[bytes] = []
        wait_until(lambda: _poll(sub, got) >= 0 and bool(goings), timeout=30, what="the image going")

        claimed_goings: list[logbuf.Image] = []
        behind = client.add_subscription("aeron:ipc", STREAM + 1, on_unavailable_image=claimed_goings.append)
        claimer = client.add_publication("aeron:ipc", STREAM + 1)
        wait_until(lambda: claimer.is_connected and behind.images, what="the second image")
        before = _offer(claimer, 1, b"before")
        stuck = claimer.try_claim(100)  # never committed: its publisher closes with it open
        after = _offer(claimer, 1, b"after")
        past_claim: list[bytes] = []
        wait_until(lambda: _poll(behind, past_claim) >= 0 and past_claim == before, what="read up to the claim")
        # aeronmd pads only where its conductor last saw the subscribers (it stops looking once draining):
        # nothing to await but its duty cycle taking the new position
        time.sleep(0.3)
        claimer.close()
        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: _poll(behind, past_claim) >= 0 and bool(claimed_goings), timeout=10,
                       what="the claim padded and the image going")
        del stuck
        return {"gone while unread": unread_gone, "read all": got == sent,
                "read past the open claim": past_claim == before + after, "then gone": bool(claimed_goings)}


def c_samples_spy(directory: Path) -> Observation:
    """Aeron's basic_subscriber on an aeron-spy: channel (Aeron's C client) reads what basic_publisher sends
    on a publication with ssc=true (no receiver): who prints messages."""
    binaries = require_aeron_bin()
    base = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    log = directory.parent / "basic_subscriber_spy.txt"
    with open(log, "w") as out:
        spy = subprocess.Popen([str(binaries / "bin" / "basic_subscriber"), "-p", str(directory), "-c",
                                f"aeron-spy:{base}", "-s", str(STREAM)], stdout=out, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)  # the spy registers before the publisher's messages
        subprocess.run([str(binaries / "bin" / "basic_publisher"), "-p", str(directory), "-c",
                        f"{base}|ssc=true|session-id=778", "-s", str(STREAM), "-m", "5", "-l", "1"],
                       capture_output=True, timeout=60)
        time.sleep(0.5)
    finally:
        stop_process(spy, signal.SIGINT)
    lines = log.read_text().splitlines()
    return {"spy got messages": any("from session 778" in line for line in lines),
            "image source": sorted({line.split(" from ")[-1] for line in lines if line.startswith("Available image")})}


def busy_port(directory: Path) -> Observation:
    """A port another socket holds, as a subscription's endpoint, a publication's control address and its
    local interface: the code each is refused with and the OS error its message begins with."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken, logbuf.connect(directory) as client:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        observed: Observation = {}
        for what, channel in (
            ("subscription", f"aeron:udp?endpoint=127.0.0.1:{port}"),
            ("publication control", f"aeron:udp?control=127.0.0.1:{port}|control-mode=dynamic"),
            ("publication interface", f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|interface=127.0.0.1:{port}"),
        ):
            add = client.add_subscription if what == "subscription" else client.add_publication
            try:
                add(channel, STREAM)
                observed[what] = "ok"
            except logbuf.RegistrationError as exc:
                os_error = re.search(r"\(\d+\) [^\n]*", str(exc))
                observed[what] = (exc.code, os_error.group(0) if os_error else str(exc))
        return observed


def _received_all(subs: list[logbuf.Subscription], sent: list[bytes]) -> list[bool]:
    """Polls every subscription until each has ``sent`` (or 10 s went by): whether each got exactly that."""
    got: list[list[bytes]] = [[] for _ in subs]

    def poll() -> bool:
        for sub, into in zip(subs, got, strict=True):
            _poll(sub, into)
        return all(len(into) >= len(sent) for into in got)

    with contextlib.suppress(WaitTimeout):  # what each got is the observation
        wait_until(poll, timeout=10, what="every subscriber's messages")
    return [into == sent for into in got]


def mdc_manual(directory: Path) -> Observation:
    """A manual MDC publication (default flow control) to two unicast subscriptions the client adds as
    destinations, then removes one; the destination commands' answers."""
    ports = [free_udp_port(), free_udp_port()]
    destinations = [f"aeron:udp?endpoint=127.0.0.1:{port}" for port in ports]
    with logbuf.connect(directory) as client:
        subs = [client.add_subscription(destination, STREAM) for destination in destinations]
        pub = client.add_publication("aeron:udp?control-mode=manual|term-length=64k", STREAM)
        connected_before = pub.is_connected
        for destination in destinations:
            pub.add_destination(destination)
        wait_until(lambda: pub.is_connected and all(sub.images for sub in subs), what="both images")
        first = _received_all(subs, _offer(pub, 10))
        pub.remove_destination(destinations[1])
        time.sleep(0.2)  # the removal reaches the sender before the next messages
        later = _offer(pub, 10, prefix=b"later")
        got_first: list[bytes] = []
        wait_until(lambda: _poll(subs[0], got_first) >= 0 and len(got_first) == len(later), what="later messages")
        got_removed: list[bytes] = []
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            _poll(subs[1], got_removed)
        unicast = client.add_publication(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}", STREAM)
        return {
            "connected before a destination": connected_before, "both got everything": first,
            "the kept one got the later ones": got_first == later, "the removed one got": got_removed,
            "remove it again": _code(lambda: pub.remove_destination(destinations[1])),
            "destination with mtu": _code(lambda: pub.add_destination(destinations[0] + "|mtu=4096")),
            "destination with port 0": _code(lambda: pub.add_destination("aeron:udp?endpoint=127.0.0.1:0")),
            "destination on a unicast publication": _code(lambda: unicast.add_destination(destinations[0])),
        }


def mdc_dynamic(directory: Path) -> Observation:
    """A dynamic MDC publication; two subscriptions whose status messages go to its control address."""
    control = f"127.0.0.1:{free_udp_port()}"
    with logbuf.connect(directory) as client:
        pub = client.add_publication(f"aeron:udp?control={control}|control-mode=dynamic|term-length=64k", STREAM)
        subs = [client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|control={control}", STREAM)
                for _ in range(2)]
        wait_until(lambda: pub.is_connected and all(sub.images for sub in subs), timeout=10, what="both images")
        manual = "aeron:udp?control-mode=manual|term-length=64k"
        return {"both got everything": _received_all(subs, _offer(pub, 10)),
                "the same control: one publication": client.add_publication(
                    f"aeron:udp?control={control}|control-mode=dynamic|term-length=64k", STREAM).session_id
                == pub.session_id,
                "manual without control: a publication each": client.add_publication(manual, STREAM + 2).session_id
                != client.add_publication(manual, STREAM + 2).session_id,
                "dynamic without control": _refused(
                    lambda: client.add_publication("aeron:udp?control-mode=dynamic", STREAM + 1))}


def tagged_flow_control(directory: Path) -> Observation:
    """fc=tagged,g:7/2: one tagged and one untagged receiver do not connect the publication; a second tagged
    one does; max-resend values."""
    control = f"127.0.0.1:{free_udp_port()}"
    with logbuf.connect(directory) as client:
        pub = client.add_publication(
            f"aeron:udp?control={control}|control-mode=dynamic|fc=tagged,g:7/2|max-resend=4|term-length=64k", STREAM)

        def subscribe(tag: str) -> logbuf.Subscription:
            return client.add_subscription(
                f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|control={control}{tag}", STREAM)

        first, untagged = subscribe("|gtag=7"), subscribe("")
        wait_until(lambda: first.images and untagged.images, timeout=10, what="two images")
        time.sleep(0.5)  # status messages from both have come
        one_of_two = pub.is_connected
        second = subscribe("|gtag=7")
        wait_until(lambda: pub.is_connected, timeout=10, what="the group complete")
        wait_until(lambda: second.images, what="the second tagged image")
        return {"connected with one tagged of two": one_of_two,
                "tagged got everything": _received_all([first, second], _offer(pub, 10)),
                "max-resend=0": _refused(lambda: client.add_publication(
                    f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|max-resend=0", STREAM)),
                "max-resend=257": _refused(lambda: client.add_publication(
                    f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|max-resend=257", STREAM)),
                "max-resend=256": _code(lambda: client.add_publication(
                    f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|max-resend=256", STREAM))}


def c_samples_mdc_tagged(directory: Path) -> Observation:
    """Aeron's basic_publisher on a dynamic MDC channel with fc=tagged,g:7; basic_subscribers with gtag=7 on
    two ports: who prints messages (Aeron's samples cannot add manual destinations)."""
    binaries = require_aeron_bin()
    control = f"127.0.0.1:{free_udp_port()}"
    logs = {port: directory.parent / f"basic_subscriber_mdc_{port}.txt" for port in (free_udp_port(), free_udp_port())}
    subscribers = []
    for port, log in logs.items():
        with open(log, "w") as out:
            subscribers.append(subprocess.Popen(
                [str(binaries / "bin" / "basic_subscriber"), "-p", str(directory), "-c",
                 f"aeron:udp?endpoint=127.0.0.1:{port}|control={control}|gtag=7", "-s", str(STREAM)],
                stdout=out, stderr=subprocess.STDOUT))
    try:
        time.sleep(1.0)  # the subscribers register before the publisher's messages
        subprocess.run([str(binaries / "bin" / "basic_publisher"), "-p", str(directory), "-c",
                        f"aeron:udp?control={control}|control-mode=dynamic|fc=tagged,g:7", "-s", str(STREAM),
                        "-m", "5", "-l", "1"], capture_output=True, timeout=60)
        time.sleep(0.5)
    finally:
        for proc in subscribers:
            stop_process(proc, signal.SIGINT)
    return [any("from session" in line for line in log.read_text().splitlines()) for log in logs.values()]


SCENARIOS: dict[str, Callable[[Path], Observation]] = {
    "session-id, IPC": session_ipc,
    "session-id, UDP": session_udp,
    "session-id clashes": session_clashes,
    "exclusive init-term-id|term-id|term-offset": exclusive_initial_position,
    "pub-wnd": publication_window,
    "term-length and mtu": term_length_and_mtu,
    "tether=false with untethered timeouts": untethered_subscriber,
    "tether=false: where a rested subscriber rejoins": untethered_rejoin_position,
    "Aeron's commands": aeron_commands,
    "publication log metadata": publication_metadata,
    "interface forms, cc, alias and defaults said aloud": interface_forms,
    "image log metadata": image_metadata,
    "C samples, session-id": c_samples_session,
    "reliable, rejoin, group, nak-delay": receiver_keys_metadata,
    "multi-destination subscription": multi_destination_subscription,
    "reject image": reject_image,
    "C samples, receiver keys": c_samples_receiver_keys,
    "aeron-spy: beside a receiver": spy_reads_a_network_publication,
    "aeron-spy: ssc": spies_simulate_connection,
    "aeron-spy: tether=false": untethered_spy,
    "aeron-spy: outlasting the publication, 70 spies": spies_outlast_their_publication,
    "C samples, aeron-spy:": c_samples_spy,
    "aeron:ipc subscriber outlasting its publication": ipc_subscriber_outlasts_its_publication,
    "aeron:ipc join positions": ipc_join_positions,
    "MDC, manual destinations": mdc_manual,
    "MDC, dynamic destinations": mdc_dynamic,
    "fc=tagged with g:/gtag, max-resend": tagged_flow_control,
    "C samples, dynamic MDC with fc=tagged": c_samples_mdc_tagged,
    "a busy port": busy_port,
}


# what each scenario must show on aeronmd (so that equal observations are not equal for a vacuous reason)
GROUND_TRUTH: dict[str, Callable[[Observation], bool]] = {
    "session-id, IPC": lambda o: o["session"] == 778 and o["mine"] and o["other got"] == [],
    "session-id, UDP": lambda o: o["session"] == 778 and o["mine"] and o["other got"] == [],
    "session-id clashes": lambda o: o["shared"] == 778 and o["exclusive, another stream"] == 778,
    "exclusive init-term-id|term-id|term-offset": lambda o: o["start"] == 2 * 64 * 1024 + 1024,
    "pub-wnd": lambda o: o["16k"] == 16 * 1024,
    "term-length and mtu": lambda o: o["term length"] == 128 * 1024,
    "tether=false with untethered timeouts": lambda o: o["events"] == ["available", "unavailable", "available"],
    "tether=false: where a rested subscriber rejoins": lambda o: o == {
        "fast ahead": True, "rejoined beside the slow": True, "rejoined beside the fast": False},
    "Aeron's commands": lambda o: o["same static counter"] and o["another static counter"],
    "publication log metadata": lambda o: o["ipc, every setting"]["linger"] == 250_000_000,
    "interface forms, cc, alias and defaults said aloud": lambda o: all(o.values()),
    "image log metadata": lambda o: o["receiver window"] == 32 * 1024,
    "C samples, session-id": lambda o: o == {778: True, 779: False},
    "reliable, rejoin, group, nak-delay": lambda o: o["reliable=false|rejoin=false|group=true|nak-delay=1ms"] == {
        "delivered": True, "rejoin": 0, "reliable": 0, "group": 1} and o["clashing reliable"] != "ok",
    "multi-destination subscription": lambda o: o["before removal"] == {"a": True, "b": True}
    and o["after removal"] == {"a": 0, "b": 5},
    "reject image": lambda o: o["reject"] == "ok" and o["after rejection"] == [],
    "C samples, receiver keys": lambda o: o["received"],
    "aeron-spy: beside a receiver": lambda o: o["session"] == 5 and o["spy read all"]
    and o["other session's spy images"] == 0,
    "aeron-spy: ssc": lambda o: o["ssc=true connected"] and not o["ssc=false connected"],
    "aeron-spy: tether=false": lambda o: o["events"] == ["available", "unavailable", "available"],
    "aeron-spy: outlasting the publication, 70 spies": lambda o: o["spy read all"] and not o["gone while unread"]
    and o["spies with an image"] == 70,
    "C samples, aeron-spy:": lambda o: o["spy got messages"],
    "aeron:ipc join positions": lambda o: o["produced"] == 640 and o["behind one that read nothing"] == 0
    and o["behind one that read half, one all"] == 320 and o["beside ones that read all"] == 640
    and o["none left, the furthest had read half"] == 320,
    "aeron:ipc subscriber outlasting its publication": lambda o: o["read all"] and not o["gone while unread"]
    and o["read past the open claim"] and o["then gone"],
    "MDC, manual destinations": lambda o: o["both got everything"] == [True, True] and o["the removed one got"] == [],
    "MDC, dynamic destinations": lambda o: o["both got everything"] == [True, True]
    and o["the same control: one publication"] and o["manual without control: a publication each"],
    "fc=tagged with g:/gtag, max-resend": lambda o: not o["connected with one tagged of two"]
    and o["tagged got everything"] == [True, True],
    "C samples, dynamic MDC with fc=tagged": lambda o: o == [True, True],
    "a busy port": lambda o: set(o.values()) == {(ErrorCode.GENERIC_ERROR, "(98) Address already in use")},
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_logbuf_observes_what_aeronmd_does(tmp_path: Path, name: str) -> None:
    require_aeron_bin()
    scenario = SCENARIOS[name]
    observed: dict[str, Observation] = {}
    for kind in ("aeronmd", "logbuf"):
        with running(kind, tmp_path / kind) as directory:
            observed[kind] = scenario(directory)
    assert GROUND_TRUTH[name](observed["aeronmd"]), observed
    assert observed["logbuf"] == observed["aeronmd"], observed
