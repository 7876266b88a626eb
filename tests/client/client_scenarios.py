"""Client scenarios that once crashed the process, run in a child process by the tests (exit status checked).

``python client_scenarios.py <scenario> <directory> [args]`` prints one JSON object per result line; a
segfault shows as exit status -11 in the test, not as a dead test session.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package

import posix_ipc  # noqa: E402

import logbuf  # noqa: E402
from logbuf.directory import wake_semaphore_name  # noqa: E402
from logbuf.logbuffer import descriptor as d  # noqa: E402
from support import wait_until  # noqa: E402

STREAM = 11
WAKE_TIMEOUT_S = 10.0  # how long a woken waiter may take to come back (loaded 2-core machine)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def outcome(call: Callable[[], object]) -> str:
    """What a call did: its result's repr, or the exception's class name."""
    try:
        return repr(call())
    except Exception as exc:  # noqa: BLE001 - the test asserts on the class name
        return type(exc).__name__


class Waiter:
    """A thread blocked in ``subscription.wait(None)``; records what the call returned or raised."""

    def __init__(self, subscription: logbuf.Subscription) -> None:
        self.result: str | None = None
        self.entered = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(subscription,), daemon=True)
        self.thread.start()

    def _run(self, subscription: logbuf.Subscription) -> None:
        self.entered.set()
        self.result = outcome(lambda: subscription.wait(None))

    def join(self) -> str | None:
        self.thread.join(WAKE_TIMEOUT_S)
        return "still blocked" if self.thread.is_alive() else self.result


def waiting_declared(publication: logbuf.Publication) -> bool:
    return publication.log.meta.get_i32_acquire(d.LOG_WAITING_SUBSCRIBERS_OFFSET) > 0


def semaphore_exists(directory: str) -> bool:
    """True while the driver's wake-up semaphore of STREAM exists (the waiter slept on it, not in back-off)."""
    try:
        posix_ipc.Semaphore(wake_semaphore_name(directory, STREAM)).close()
    except posix_ipc.ExistentialError:
        return False
    return True


def use_after_close(directory: str) -> None:
    """Everything a user may still hold after ``client.close()``: no segfault, closed answers."""
    with logbuf.MediaDriver.launch(directory, ipc_term_length=64 * 1024):
        client = logbuf.connect(directory)
        pub = client.add_publication("aeron:ipc", STREAM)
        sub = client.add_subscription("aeron:ipc", STREAM)
        counter = client.add_counter(1100, "scenario counter")
        wait_until(lambda: pub.is_connected and sub.images, what="connected")
        image = sub.images[0]
        assert pub.offer(b"before close") > 0
        client.close()
        results = {
            "offer": outcome(lambda: int(pub.offer(b"after close"))),
            "position": outcome(lambda: pub.position),
            "repr": outcome(lambda: repr(pub)),
            "position_limit_value": outcome(lambda: pub.position_limit_value),
            "available_window": outcome(pub.available_window),
            "is_closed": outcome(lambda: pub.is_closed),
            "released_position": outcome(lambda: image.released_position),
            "image_poll": outcome(lambda: image.poll(lambda b, h: None, 10)),
            "sub_poll": outcome(lambda: sub.poll(lambda b, h: None, 10)),
            "sub_wait": outcome(lambda: sub.wait(0.01)),
            "counter_get": outcome(counter.get),
            "add_publication": outcome(lambda: client.add_publication("aeron:ipc", STREAM)),
            "add_exclusive_publication": outcome(lambda: client.add_exclusive_publication("aeron:ipc", STREAM)),
            "add_subscription": outcome(lambda: client.add_subscription("aeron:ipc", STREAM)),
            "add_counter": outcome(lambda: client.add_counter(1100, "late")),
            "do_work": outcome(client.do_work),
            "counters": outcome(lambda: client.counters),
            "close_again": outcome(client.close),
        }
        for name in ("add_publication", "add_subscription"):
            try:
                getattr(client, name)("aeron:ipc", STREAM)
            except logbuf.ClosedError as exc:
                results[f"{name}_message"] = str(exc)
        emit(**results)


def wait_close_race(directory: str, rounds: str) -> None:
    """A thread blocked in (or entering) ``wait(None)`` while the subscription or the whole client closes."""
    rng = random.Random(int(rounds))
    with logbuf.MediaDriver.launch(directory, ipc_term_length=64 * 1024):
        for i in range(int(rounds)):
            client = logbuf.connect(directory)
            pub = client.add_publication("aeron:ipc", STREAM)
            sub = client.add_subscription("aeron:ipc", STREAM)
            wait_until(lambda: pub.is_connected and sub.images, what="connected")  # noqa: B023
            waiter = Waiter(sub)
            waiter.entered.wait(WAKE_TIMEOUT_S)
            if i % 3 == 0:
                wait_until(lambda: waiting_declared(pub), what="the waiter asleep")  # noqa: B023
            else:
                time.sleep(rng.random() * 0.002)  # anywhere between entering wait() and sleeping in it
            how = ("client", "subscription", "subscription from a thread")[i % 3]
            if how == "client":
                client.close()
            elif how == "subscription":
                sub.close()
            else:
                closer = threading.Thread(target=sub.close)
                closer.start()
                closer.join(WAKE_TIMEOUT_S)
            result = waiter.join()
            pub.close()
            client.close()
            emit(round=i, closed=how, waiter=result, semaphore=semaphore_exists(directory))


def driver_dies_while_waiting(directory: str, asynchronous: str) -> None:
    """Connected to a driver process the test kills: a waiter must wake with DriverTimeout."""
    import asyncio

    client = logbuf.connect(directory, driver_timeout_ms=500, error_handler=lambda error: None)
    pub = client.add_publication("aeron:ipc", STREAM)
    sub = client.add_subscription("aeron:ipc", STREAM)
    wait_until(lambda: pub.is_connected and sub.images, what="connected")
    result: list[str] = []
    if asynchronous == "async":
        thread = threading.Thread(
            target=lambda: result.append(outcome(lambda: asyncio.run(sub.wait_async(None)))), daemon=True
        )
    else:
        thread = threading.Thread(target=lambda: result.append(outcome(lambda: sub.wait(None))), daemon=True)
    thread.start()
    wait_until(lambda: waiting_declared(pub), what="the waiter asleep")
    emit(state="waiting")
    thread.join(30)
    emit(
        waiter=result[0] if result else "still blocked",
        offer=outcome(lambda: int(pub.offer(b"x"))),
        add=outcome(lambda: client.add_publication("aeron:ipc", STREAM)),
    )
    client.close()
    emit(after_close=outcome(lambda: client.add_publication("aeron:ipc", STREAM)))


SCENARIOS: dict[str, Callable[..., None]] = {
    "use_after_close": use_after_close,
    "wait_close_race": wait_close_race,
    "driver_dies_while_waiting": driver_dies_while_waiting,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
