"""Reading a child process's output line by line with a timeout, without losing a line.

A ``select`` on the pipe followed by ``file.readline()`` loses lines: when two lines arrive in one chunk,
``readline`` returns the first and keeps the second in the file object's buffer, where the next ``select``
on the (now empty) pipe cannot see it.  Here the pipe is read with ``os.read`` and split by
:class:`LineSplitter`, which hands out every complete line of a chunk and keeps a partial one until its end
arrives.
"""

from __future__ import annotations

import os
import selectors
import time
import weakref
from collections import deque
from typing import IO

from support.waiting import WaitTimeout

_CHUNK = 65536


class LineSplitter:
    """Splits a byte stream, fed in arbitrary chunks, into lines (without their ``\\n``)."""

    def __init__(self) -> None:
        self._partial = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """Every line ``chunk`` completes, in order; the unfinished rest waits for the next chunk."""
        self._partial += chunk
        *lines, rest = bytes(self._partial).split(b"\n")
        self._partial = bytearray(rest)
        return lines

    @property
    def pending(self) -> bytes:
        """The start of a line whose end has not arrived yet."""
        return bytes(self._partial)


class LineReader:
    """The lines of one pipe (a file object or a file descriptor), each waited for with a timeout.

    Every read of the pipe must go through this reader: it reads the descriptor itself, so anything a file
    object already buffered (after a ``readline`` of its own) would be missed.
    """

    def __init__(self, stream: IO[str] | IO[bytes] | int, name: str = "", encoding: str = "utf-8") -> None:
        self.fd = stream if isinstance(stream, int) else stream.fileno()
        self.name = name or f"fd {self.fd}"
        self.encoding = encoding
        self._splitter = LineSplitter()
        self._lines: deque[bytes] = deque()
        self._ended = False
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.fd, selectors.EVENT_READ)

    @property
    def at_end(self) -> bool:
        """True once the writer closed the pipe and every line was read."""
        return self._ended and not self._lines

    def _fill(self, timeout: float) -> bool:
        """Reads one chunk if one arrives within ``timeout``; False if none did."""
        if not self._selector.select(max(timeout, 0.0)):
            return False
        chunk = os.read(self.fd, _CHUNK)
        if not chunk:  # the writer closed its end: a last line without its newline still counts
            self._ended = True
            if self._splitter.pending:
                self._lines.append(self._splitter.pending)
                self._splitter = LineSplitter()
            return True
        self._lines.extend(self._splitter.feed(chunk))
        return True

    def read_line(self, timeout: float = 20.0) -> str | None:
        """The next line (without its newline); None once the pipe has ended.

        Raises :class:`WaitTimeout` when no whole line arrived within ``timeout`` seconds (naming what of a
        line did arrive)."""
        deadline = time.monotonic() + timeout
        while not self._lines:
            if self._ended:
                return None
            if not self._fill(deadline - time.monotonic()) and time.monotonic() >= deadline:
                raise WaitTimeout(f"no line from {self.name} within {timeout} s "
                                  f"(pending: {self._splitter.pending[-200:]!r})")
        return self._lines.popleft().decode(self.encoding, errors="replace")

    def read_until(self, wanted: str, timeout: float = 20.0) -> list[str]:
        """Lines up to and including the first containing ``wanted`` (all within ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while True:
            line = self.read_line(max(deadline - time.monotonic(), 0.0))
            if line is None:
                raise WaitTimeout(f"{self.name} ended without a line containing {wanted!r}; saw {seen[-5:]!r}")
            seen.append(line)
            if wanted in line:
                return seen

    def read_to_end(self, timeout: float = 20.0) -> list[str]:
        """Every line left, up to the end of the pipe (which must come within ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        rest: list[str] = []
        while (line := self.read_line(max(deadline - time.monotonic(), 0.0))) is not None:
            rest.append(line)
        return rest

    def close(self) -> None:
        self._selector.close()


_READERS: weakref.WeakKeyDictionary[object, LineReader] = weakref.WeakKeyDictionary()


def lines_of(stream: IO[str] | IO[bytes], name: str = "") -> LineReader:
    """The one :class:`LineReader` of ``stream`` (made on first use), so that every caller shares its buffer."""
    reader = _READERS.get(stream)
    if reader is None:
        reader = _READERS[stream] = LineReader(stream, name)
    return reader
