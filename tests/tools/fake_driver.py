"""A driver directory with a real cnc.dat (``CncFile.create``) whose counters, heartbeat and error log a
test sets by hand, the way the media driver would (imported by the tools tests and their conftest)."""

from __future__ import annotations

import time
from pathlib import Path

from logbuf.cnc import counters as c
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.error_log import DistinctErrorLog

COUNTERS = 64  # values section of 64 x 128 bytes: 40 system counters + room for streams


class FakeDriver:
    """cnc.dat as a driver leaves it: system counters, stream positions, client heartbeats, heartbeat."""

    def __init__(self, directory: Path, pid: int, start_ms: int, liveness_timeout_ns: int = 10**10) -> None:
        self.directory = directory
        self.path = directory / "cnc.dat"
        self.pid = pid
        self.start_ms = start_ms
        self.cnc = CncFile.create(
            self.path,
            to_driver_capacity=1024,
            to_clients_capacity=1024,
            counters_values_length=COUNTERS * 128,
            error_log_length=8 * 1024,
            client_liveness_timeout_ns=liveness_timeout_ns,
            pid=pid,
            start_ms=start_ms,
        )
        self.now_ms = start_ms  # the clock of the counters manager and the error log
        self.counters = self.cnc.counters_manager(lambda: self.now_ms)
        self.system = self.counters.allocate_system_counters()  # Aeron system id -> counter id
        self.error_log = DistinctErrorLog(self.cnc.error_log_buffer, lambda: self.now_ms)

    def heartbeat(self, epoch_ms: int) -> None:
        self.cnc.to_driver.consumer_heartbeat_time = epoch_ms

    def set(self, counter_id: int, value: int) -> None:
        self.counters.set_counter_value(counter_id, value)

    def stream_counter(
        self,
        type_id: int,
        name: str,
        registration_id: int,
        session_id: int,
        stream_id: int,
        channel: str = "aeron:ipc",
        value: int = 0,
        join_position: int | None = None,
    ) -> int:
        counter_id = self.counters.allocate(
            type_id,
            # labels as a driver may write them: the tools print whatever a counter says
            f"{name}: {registration_id} {session_id} {stream_id} {channel}"
            + ("" if join_position is None else f" @{join_position}"),
            c.stream_position_key(registration_id, session_id, stream_id, channel),
            registration_id=registration_id,
        )
        self.set(counter_id, value)
        return counter_id

    def client_heartbeat(self, client_id: int, epoch_ms: int) -> int:
        counter_id = self.counters.allocate(
            c.CLIENT_HEARTBEAT_TYPE_ID,
            f"{c.CLIENT_HEARTBEAT_NAME}: {client_id}",
            c.client_heartbeat_key(client_id),
            registration_id=client_id,
        )
        self.set(counter_id, epoch_ms)
        return counter_id

    def close(self) -> None:
        self.cnc.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000
