"""``DriverServices``: what the IPC and network conductors share - the context, the counters, answering
clients, the error log, correlation and session ids, the log files and their stream counters.

Log and counter allocation are written once here: a publication's log (Aeron's metadata filled in, removed
again when anything after its creation fails), its stream-position counters (keys and labels as Aeron writes
them, pub-lmt owned by the publishing client, all freed when one allocation fails), the "Bytes currently
mapped" counter, and session ids - sequential from a random start, as Aeron's driver hands them out, never
one a live publication has.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from logbuf.cnc import counters as c
from logbuf.cnc.counters import CountersManager
from logbuf.cnc.loss_report import LossReport
from logbuf.cnc.messages import ControlResponse
from logbuf.directory import IMAGES_DIR, LOG_SUFFIX, PUBLICATIONS_DIR
from logbuf.driver.channel_params import PublicationParams
from logbuf.driver.context import DriverContext
from logbuf.driver.log_metadata import fill_publication_metadata
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.units import epoch_ms

_INT32_RANGE = 2**32
# Aeron's default reserved range: generated session ids avoid it, so ids chosen by channels here never clash
RESERVED_SESSION_ID_LOW = -1
RESERVED_SESSION_ID_HIGH = 1000


def _start_at(log: LogBuffers, initial_term_id: int, term_id: int, term_offset: int) -> None:
    """A new log's tails as Aeron sets them for a channel's init-term-id, term-id and term-offset: the active
    term at that id and offset, the other partitions at the ids they would have had three terms before."""
    term_count = (term_id - initial_term_id) & 0xFFFFFFFF
    index = term_count % d.PARTITION_COUNT
    meta = log.meta
    meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET + 8 * index, d.pack_tail(term_id, term_offset))
    for i in range(1, d.PARTITION_COUNT):
        meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET + 8 * ((index + i) % d.PARTITION_COUNT),
                             d.pack_tail(term_id + i - d.PARTITION_COUNT, 0))
    meta.put_i32_release(d.LOG_ACTIVE_TERM_COUNT_OFFSET, term_count - (1 << 32) if term_count >= 1 << 31 else term_count)


class DriverServices:
    """One object handed to every conductor (see the module docstring)."""

    def __init__(
        self,
        ctx: DriverContext,
        counters: CountersManager,
        system: dict[int, int],
        *,
        respond: Callable[[ControlResponse, Any], None],
        record_error: Callable[[str], None],
        next_correlation_id: Callable[[], int],
        ensure_wake_semaphore: Callable[[int], None],
        loss_report: LossReport | None = None,
        epoch_ms: Callable[[], int] = epoch_ms,
    ) -> None:
        self.ctx = ctx
        self.counters = counters
        self.system = system
        self.respond = respond
        self.record_error = record_error
        self.next_correlation_id = next_correlation_id
        self.ensure_wake_semaphore = ensure_wake_semaphore
        self.loss_report = loss_report
        self.epoch_ms = epoch_ms
        self.publications_dir = Path(ctx.directory) / PUBLICATIONS_DIR
        self.images_dir = Path(ctx.directory) / IMAGES_DIR
        self._bytes_mapped = 0
        # session id -> live publications with it (a chosen id may be on several streams at once)
        self._sessions_in_use: collections.Counter[int] = collections.Counter()
        self._next_session_id = random.SystemRandom().randint(-(2**31), 2**31 - 1)

    # -- ids and system counters -----------------------------------------------------------------------

    def new_session_id(self) -> int:
        """The next session id after the last one handed out that no live publication has and that is outside
        Aeron's reserved range (kept for channels that name their session-id); reserved until
        :meth:`release_session_id`."""
        session_id = self._next_session_id
        while session_id in self._sessions_in_use or RESERVED_SESSION_ID_LOW <= session_id <= RESERVED_SESSION_ID_HIGH:
            session_id = (session_id + 1 + 2**31) % _INT32_RANGE - 2**31
        self._next_session_id = (session_id + 1 + 2**31) % _INT32_RANGE - 2**31
        self._sessions_in_use[session_id] += 1
        return session_id

    def reserve_session_id(self, session_id: int) -> None:
        """A session id a channel named (the caller checked it does not clash on its stream and transport)."""
        self._sessions_in_use[session_id] += 1

    def release_session_id(self, session_id: int) -> None:
        count = self._sessions_in_use[session_id] - 1
        if count > 0:
            self._sessions_in_use[session_id] = count
        else:
            del self._sessions_in_use[session_id]

    def increment(self, system_id: int, delta: int = 1) -> None:
        counter_id = self.system[system_id]
        self.counters.set_counter_value(counter_id, self.counters.counter_value(counter_id) + delta)

    def bytes_mapped(self, delta: int) -> None:
        """Adds ``delta`` to "Bytes currently mapped"."""
        self._bytes_mapped = max(0, self._bytes_mapped + delta)
        self.counters.set_counter_value(self.system[c.SystemCounter.BYTES_CURRENTLY_MAPPED], self._bytes_mapped)

    # -- logs and stream counters ----------------------------------------------------------------------

    def create_publication_log(self, registration_id: int, stream_id: int, params: PublicationParams) -> LogBuffers:
        """``publications/<registrationId>.logbuffer`` with the channel's session id (or a new one), its initial
        position, and aeronmd's metadata for its settings."""
        ctx = self.ctx
        path = self.publications_dir / f"{registration_id}{LOG_SUFFIX}"
        self.ensure_wake_semaphore(stream_id)
        if params.session_id is None:
            session_id = self.new_session_id()
        else:
            session_id = params.session_id
            self.reserve_session_id(session_id)
        start = params.initial_position
        try:
            log = LogBuffers.create(path, term_length=params.term_length, mtu=params.mtu, session_id=session_id,
                                    stream_id=stream_id, correlation_id=registration_id,
                                    initial_term_id=None if start is None else start.initial_term_id,
                                    publication_window_length=params.window_length, mode=ctx.file_mode,
                                    pre_touch=not params.sparse, reserve=ctx.storage_reserve)
        except BaseException:
            self.release_session_id(session_id)
            raise
        try:
            if start is not None:
                _start_at(log, start.initial_term_id, start.term_id, start.term_offset)
            fill_publication_metadata(log, params.linger_timeout_ns, params.untethered_window_limit_timeout_ns,
                                      params.untethered_resting_timeout_ns, signal_eos=params.signal_eos,
                                      sparse=params.sparse, socket_sndbuf=params.socket_sndbuf or 0,
                                      socket_rcvbuf=params.socket_rcvbuf or 0,
                                      spies_simulate_connection=params.spies_simulate_connection)
        except BaseException:
            self._discard(log)
            raise
        self.bytes_mapped(os.path.getsize(path))
        return log

    def allocate_stream_counters(self, type_ids: Sequence[int], registration_id: int, session_id: int,
                                 stream_id: int, channel: str, client_id: int = 0) -> list[int]:
        """One stream-position counter per type (in order), as Aeron keys and labels them; pub-lmt is owned
        by ``client_id``.  None is left allocated when one fails."""
        key = c.stream_position_key(registration_id, session_id, stream_id, channel)
        counter_ids: list[int] = []
        try:
            for type_id in type_ids:
                label = c.stream_position_label(c.STREAM_COUNTER_NAMES[type_id], registration_id, session_id,
                                                stream_id, channel)
                owner = client_id if type_id == c.PUBLISHER_LIMIT_TYPE_ID else c.DEFAULT_OWNER_ID
                counter_ids.append(self.counters.allocate(type_id, label, key, registration_id=registration_id,
                                                          owner_id=owner))
        except BaseException:
            self.free_counters(counter_ids)
            raise
        return counter_ids

    def free_counters(self, counter_ids: Sequence[int]) -> None:
        for counter_id in counter_ids:
            self.counters.free(counter_id)

    def _discard(self, log: LogBuffers) -> None:
        """A log whose entity could not be completed: closed and deleted, its session id released."""
        self.release_session_id(log.session_id)
        log.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(log.path)

    def delete_log(self, log: LogBuffers, *, publication: bool = True) -> None:
        """A closed entity's log: unmapped from the count, closed, deleted (clients that still map it keep
        their pages); a publication's session id becomes free."""
        with contextlib.suppress(OSError):
            self.bytes_mapped(-os.path.getsize(log.path))
        if publication:
            self.release_session_id(log.session_id)
        log.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(log.path)
