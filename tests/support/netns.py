"""Network namespaces a test creates for itself (to test multicast without a datagram leaving the machine)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator

_NAMES = itertools.count()
# inside the namespace: loopback up, multicast on, the multicast range routed to it
MULTICAST_SETUP: tuple[tuple[str, ...], ...] = (
    ("link", "set", "lo", "up"),
    ("link", "set", "lo", "multicast", "on"),
    ("route", "add", "224.0.0.0/4", "dev", "lo"),
)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


@contextlib.contextmanager
def network_namespace(purpose: str = "test",
                      setup: tuple[tuple[str, ...], ...] = MULTICAST_SETUP) -> Iterator[str]:
    """A new network namespace (its name), set up with ``ip -n NAME`` + each of ``setup``, deleted afterwards.

    Skips the test, with the reason, where namespaces cannot be made (no ``ip``, not root, not permitted)
    or set up.  Only the namespace made here is ever deleted.  Run a command in it with
    ``ip netns exec NAME command...`` (which execs the command: its PID is the command's)."""
    import pytest  # (lazily: child scripts import this package without pytest's start-up cost)

    if shutil.which("ip") is None:
        pytest.skip("the ip tool (iproute2) is not installed: cannot create a network namespace")
    if os.geteuid() != 0:
        pytest.skip("creating a network namespace needs root (CAP_SYS_ADMIN)")
    name = f"logbuf-{purpose}-{os.getpid()}-{next(_NAMES)}"
    created = _ip("netns", "add", name)
    if created.returncode != 0:
        pytest.skip(f"ip netns add is not permitted here: {created.stderr.strip()}")
    try:
        for args in setup:
            result = _ip("-n", name, *args)
            if result.returncode != 0:
                pytest.skip(f"cannot set up the network namespace ({' '.join(args)}): {result.stderr.strip()}")
        yield name
    finally:
        _ip("netns", "del", name)


def in_namespace(name: str, *command: str) -> list[str]:
    """``command`` run inside network namespace ``name``."""
    return ["ip", "netns", "exec", name, *command]
