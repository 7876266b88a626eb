"""A log with one publication and one image, for the core tests (imported by conftest and tests)."""

from __future__ import annotations

from logbuf import ConcurrentPublication, ExclusivePublication, Image, LogBuffers, Position


class Pipe:
    """A log with one publication and one image, flow control left wide open unless a test narrows it."""

    def __init__(self, log: LogBuffers, exclusive: bool = False) -> None:
        self.log = log
        self.limit = Position.standalone(1 << 62)
        self.sub_pos = Position.standalone(0)
        log.is_connected = True
        cls = ExclusivePublication if exclusive else ConcurrentPublication
        self.pub = cls(log, self.limit)
        self.image = Image(log, self.sub_pos)

    def drain(self, limit: int = 1 << 30) -> list[tuple[bytes, int, int]]:
        got: list[tuple[bytes, int, int]] = []
        while True:
            before = self.image.position
            n = self.image.poll(lambda b, h: got.append((bytes(b), h.reserved_value, h.flags)), 1000)
            if (n == 0 and self.image.position == before) or len(got) >= limit:
                return got
