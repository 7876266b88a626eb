"""Free loopback UDP ports for demos, tests and benchmarks."""

from __future__ import annotations

import socket


def free_udp_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct UDP ports the kernel has just handed out on ``host`` (free right now, not reserved)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()
