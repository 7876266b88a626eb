"""A retransmission server in a process of its own (no interpreter lock shared with a replay's send loop),
reading a ring in an anonymous shared mapping (memfd) the parent writes. The parent binds the socket and passes
it; the child stops when the parent closes its control pipe, or dies (end of file on the pipe).
``python -m logbuf.exchange.retransmit.process`` is the child."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import mmap
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import fields

from logbuf.exchange.retransmit.core import RetransmitCore, RetransmitStats
from logbuf.exchange.retransmit.fair import DEFAULT_QUEUE
from logbuf.exchange.retransmit.rate import DEFAULT_BURST, DEFAULT_RATE, RateLimiter
from logbuf.exchange.retransmit.ring import (
    DEFAULT_RING_BITS,
    MAX_RING_BITS,
    MIN_RING_BITS,
    MessageRing,
    RetransmitError,
    ring_bytes,
)
from logbuf.exchange.retransmit.server import DEFAULT_RCVBUF, bind_server_socket, make_server
from logbuf.marketdata import moldudp64
from logbuf.marketdata.moldudp64 import DEFAULT_PAYLOAD_BUDGET

log = logging.getLogger(__name__)

_READY = b"ready"  # the child's first line: it serves from now on


class RetransmitProcess:
    """A retransmission server in a child process, answering from a ring this process writes.

    The socket is bound here (a busy port fails before anything starts) and passed to the child with the ring
    (an anonymous memfd: nothing in the file system to leave behind) and the read end of a control pipe.
    :meth:`stop` closes the pipe and waits for the child's statistics; a child that does not exit in time is
    terminated, then killed, by its PID. If this process dies, the child sees end of file on the pipe and exits.
    """

    def __init__(self, day_file: str | os.PathLike[str], host: str, port: int, *, session: str | bytes,
                 budget: int = DEFAULT_PAYLOAD_BUDGET, ring_bits: int = DEFAULT_RING_BITS,
                 rate: float = DEFAULT_RATE, burst: float = DEFAULT_BURST, queue: int = DEFAULT_QUEUE,
                 rcvbuf: int = DEFAULT_RCVBUF) -> None:
        RetransmitCore(session, MessageRing(MIN_RING_BITS), b"", budget)  # validate before anything is created
        RateLimiter(rate, burst)
        if not MIN_RING_BITS <= ring_bits <= MAX_RING_BITS:
            raise RetransmitError(f"ring bits must be within {MIN_RING_BITS}..{MAX_RING_BITS}, not {ring_bits}")
        if queue < 1:
            raise RetransmitError("the per-client queue must be >= 1")
        self.day_file = os.fspath(day_file)
        self._args = [f"--session={moldudp64.encode_session(session).decode('ascii')}", f"--budget={budget}",
                      f"--ring-bits={ring_bits}", f"--rate={rate}", f"--burst={burst}", f"--queue={queue}"]
        self.ring_bits = ring_bits
        self.process: subprocess.Popen[bytes] | None = None
        self.stats: RetransmitStats | None = None
        self._control_w: int | None = None
        self.sock = bind_server_socket(host, port, rcvbuf)
        try:
            self.address = self.sock.getsockname()[:2]
            self._ring_fd = os.memfd_create("logbuf-retransmit-ring")
            os.ftruncate(self._ring_fd, ring_bytes(ring_bits))
            self._map: mmap.mmap | None = mmap.mmap(self._ring_fd, ring_bytes(ring_bits))
            self.ring = MessageRing(ring_bits, self._map)
            self.ring.reset()
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self, ready_timeout: float = 60.0) -> RetransmitProcess:
        """Start the child and wait until it serves (at most ``ready_timeout`` seconds)."""
        control_r, self._control_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "logbuf.exchange.retransmit.process", self.day_file, f"--socket-fd={self.sock.fileno()}",
                 f"--ring-fd={self._ring_fd}", f"--control-fd={control_r}", *self._args],
                pass_fds=(self.sock.fileno(), self._ring_fd, control_r), stdout=subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C reaches the replay, which stops the child
            )
        except OSError as exc:
            os.close(self._control_w)
            self._control_w = None
            raise RetransmitError(f"cannot start the retransmission process: {exc}") from exc
        finally:
            os.close(control_r)
        # the child holds its own copies now
        self.sock.close()
        os.close(self._ring_fd)
        self._ring_fd = -1
        self._wait_ready(ready_timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Until the child says it serves (requests meanwhile wait in the socket the parent bound)."""
        process = self.process
        assert process is not None and process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        line = process.stdout.readline() if ready else b""
        if line.strip() != _READY:
            self.stop(timeout=1.0)
            why = "did not start in time" if not ready else f"ended with status {process.poll()}"
            raise RetransmitError(f"the retransmission process {process.pid} {why}")

    def stop(self, timeout: float = 5.0) -> RetransmitStats | None:
        """Stop the child (pipe closed, then SIGTERM, then SIGKILL by PID); its statistics, None if it had none."""
        if self._control_w is not None:
            os.close(self._control_w)
            self._control_w = None
        process = self.process
        if process is not None and self.stats is None:
            out = b""
            try:
                out, _ = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, sig)
                    try:
                        out, _ = process.communicate(timeout=timeout)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            self.stats = _parse_stats(out)
            if process.returncode:
                log.warning("retransmission process %d ended with status %s", process.pid, process.returncode)
        self.close()
        return self.stats

    def close(self) -> None:
        if self._control_w is not None:  # never started or not stopped: the child (if any) sees end of file
            os.close(self._control_w)
            self._control_w = None
        mapping: mmap.mmap | None = getattr(self, "_map", None)  # absent when __init__ failed before it
        if mapping is not None:
            # the ring's arrays are views of the mapping: let them go first (the ring is unusable after close)
            self.ring = None  # type: ignore[assignment]  # typed for its open life, when it is never None
            with contextlib.suppress(BufferError):
                mapping.close()
            self._map = None
        if getattr(self, "_ring_fd", -1) >= 0:
            os.close(self._ring_fd)
            self._ring_fd = -1
        self.sock.close()

    def __enter__(self) -> RetransmitProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _parse_stats(out: bytes) -> RetransmitStats | None:
    try:
        values = json.loads(out.decode("ascii").strip().splitlines()[-1])
        return RetransmitStats(**{f.name: int(values.get(f.name, 0)) for f in fields(RetransmitStats)})
    except (ValueError, IndexError, TypeError, AttributeError):
        return None


def _child_main(argv: list[str] | None = None) -> int:
    """The child of :class:`RetransmitProcess`: serve until the control pipe ends, print the statistics."""
    from logbuf.exchange.dayfile import DayFileReader

    parser = argparse.ArgumentParser(prog="logbuf-retransmit-child")
    parser.add_argument("file")
    for name in ("--socket-fd", "--ring-fd", "--control-fd", "--budget", "--ring-bits", "--queue"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--burst", type=float, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    sock = socket.socket(fileno=args.socket_fd)
    ring_map = mmap.mmap(args.ring_fd, ring_bytes(args.ring_bits))
    os.close(args.ring_fd)
    ring = MessageRing(args.ring_bits, ring_map)
    with DayFileReader(args.file) as reader:
        server = make_server(args.session, ring, reader.buffer, budget=args.budget, rate=args.rate,
                             burst=args.burst, queue=args.queue, sock=sock)
        sys.stdout.buffer.write(_READY + b"\n")
        sys.stdout.flush()
        try:
            server.run(stopping.is_set, wake_fd=args.control_fd)
        finally:
            server.close()
        stats = server.stats  # after close: the sockets' kernel drops are in
        del server
    with contextlib.suppress(OSError):
        sys.stdout.write(json.dumps({f.name: getattr(stats, f.name) for f in fields(stats)}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(_child_main())
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
