"""``Recorder``: the feed handler's logbuf streams -> a crash-safe, rolling Parquet recording.

Subscribes to the three streams of :mod:`logbuf.feed.published` and writes the recording format of
:mod:`logbuf.recording.schema`::

    messages 1001 ─batch_poll─▶ 64-byte raw rows ──────┐
    capture  1003 ─batch_poll─▶ DELIVERED runs ────────┴─▶ DeliveryJoin ─▶ stage ─▶ SessionTimeline, decode ─┐
                             └▶ PACKET rows ──────────────────────────────▶ stage ─▶ SessionTimeline ─────────┤
    events   1002 ─poll───────▶ SESSION_CHANGED ─▶ SessionTimeline;  GAP_* ─▶ GapBook ───────────────────────┤
                                                                                                              ▼
                                          writer thread: Parquet encode, seal (fsync) ◀── Arrow tables (queue)

Per cycle the data streams are polled before the events stream: whatever event was published before a
message is then already visible (see :mod:`logbuf.recorder.sessions`).

This module is the duty cycle: polling, joining, staging and statistics.  The other concepts live beside it:

    streams   subscriptions, image adoption (held, resumed from the checkpoint) and retirement
    commit    the commit protocol: plan, seal, checkpoint, publish, release (durability)
    losses    data the recording will not have: an error, or (``allow_loss``) a logged line - never silent
    config    RecorderConfig, RecorderStats, RecorderError

**Cost.**  Python never loops per message: per poll batch (up to 4096 frames) one 64-byte row take and
a positional join; per ~250 k staged rows one ITCH decode per type present and one Arrow table; Parquet
encoding on the writer thread (Arrow releases the GIL).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import posix_ipc

from logbuf.client.client import Client, Counter, connect
from logbuf.cnc.counters import RECORDER_COUNTER_TYPE_ID
from logbuf.errors import LogbufError
from logbuf.feed import published as pub
from logbuf.logbuffer.frame import UNFRAGMENTED
from logbuf.logbuffer.header import Header
from logbuf.recorder.checkpoint import Checkpoint
from logbuf.recorder.columns import IN_FLIGHT, TableBuilder, capture_messages, concat_rows, decode_columns
from logbuf.recorder.commit import CommitProtocol
from logbuf.recorder.config import RecorderConfig, RecorderError, RecorderStats
from logbuf.recorder.epoch_writer import BackgroundWriter, EpochWriter, publish_files, remove_stale
from logbuf.recorder.gaps import GapBook, GapRow
from logbuf.recorder.join import DeliveryJoin, expand_runs
from logbuf.recorder.losses import LossReport, RecorderDataLoss
from logbuf.recorder.sessions import SessionTimeline
from logbuf.recorder.streams import CAPTURE, EVENTS, IMAGE_GRACE_S, MESSAGES, RecordedImage, StreamSet
from logbuf.recording import schema

LOCK_FILE = "_recorder.lock"
COUNTER_NAMES = ("messages rows", "packets rows", "gaps rows", "files completed", "bytes completed",
                 "held bytes", "lag bytes", "commits", "losses")
_COUNTER_INTERVAL_S = 0.1
_IDLE_WAIT_S = 0.01
_FINAL_DRAIN_S = 1.0
_FINAL_DRAIN_WAIT_S = 0.005


class Recorder:
    """Records until :meth:`stop` (or a duration, or the end of the session); see the module doc.

    ``Recorder(config).run()`` in the foreground, or ``run`` on a thread and ``stop()`` from another; the
    recording is consistent after any stop or crash.  ``progress`` is called about every second."""

    def __init__(self, config: RecorderConfig, client: Client | None = None, *,
                 progress: Callable[[RecorderStats], None] | None = None, progress_interval_s: float = 1.0) -> None:
        self.config = config
        self.root = Path(config.output)
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self._stop = threading.Event()
        self._lock_fd: int | None = None
        self._own_client = client is None
        self.client: Client | None = None
        self._started = time.monotonic()
        try:
            # the driver first: without one nothing is created (no directory, lock or marker left behind)
            self.client = client or connect(config.driver_directory, connect_timeout=config.connect_timeout_s)
            self._open_recording()
            self._setup()
        except BaseException:
            self.close()
            raise

    # -- set-up ------------------------------------------------------------------------------------------

    def _open_recording(self) -> None:
        cfg = self.config
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._lock_fd, 32, 0).decode(errors="replace").strip()
            raise RecorderError(f"{self.root} is being recorded by another recorder (pid {holder or '?'})") from None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        cp = Checkpoint.load(self.root)
        # finish the last commit (files it names that are still hidden), then drop every half-written file
        self.rolled_forward = publish_files(self.root, [(t, f) for t, f in cp.publish]) if cp else 0
        self.removed_stale = remove_stale(self.root)
        self.writer = EpochWriter(self.root, rows_per_file=cfg.rows_per_file, row_group_rows=cfg.row_group_rows,
                                  compression=cfg.compression)
        self.sink = BackgroundWriter(self.writer)  # Parquet encoding off the polling thread
        self.timeline = (SessionTimeline.from_state(cfg.default_session, cp.sessions) if cp and cp.sessions
                         else SessionTimeline(cfg.default_session))
        self.gap_book = GapBook.from_state(cp.open_gaps) if cp else GapBook()
        self.join = DeliveryJoin()
        self.builder = TableBuilder()
        self.losses = LossReport(self.root, cfg.allow_loss)
        self.commits = CommitProtocol(self.root, self.writer, self.sink, self.join, cp, cfg.commit_interval_s,
                                      self.losses)
        self._base_totals: dict[str, int] = dict(cp.totals) if cp else {}
        self._last_durable = cp.last_durable if cp else None

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The last commit's checkpoint (the previous run's until this run commits; ``None``: a new recording)."""
        return self.commits.checkpoint

    def _setup(self) -> None:
        assert self.client is not None
        self.streams = StreamSet(self.client, self.config, self.losses, lambda: self.commits.checkpoint,
                                 self._event_handler)
        self.commits.streams = self.streams
        self._staged_messages: list[np.ndarray] = []
        self._staged_message_rows = 0
        self._staged_packets: list[np.ndarray] = []
        self._staged_packet_rows = 0
        self._rows = {name: 0 for name in schema.DATASETS}
        self._malformed = 0
        self._cycle = 0
        self._eos_cycle: int | None = None
        self._messages_drained = False
        self._capture_drained = False
        self._events_waived = False
        self._messages_image_since: float | None = None
        self._mismatches_seen = 0
        self._make_counters()

    def _make_counters(self) -> None:
        assert self.client is not None
        self.counters: dict[str, Counter] = {}
        for name in COUNTER_NAMES:
            self.counters[name] = self.client.add_counter(RECORDER_COUNTER_TYPE_ID, f"recorder: {name}",
                                                          name.replace(" ", "_").encode())
        self._next_counters = 0.0
        self._next_progress = time.monotonic() + self.progress_interval_s

    # -- polling -----------------------------------------------------------------------------------------

    def _events_ready(self) -> bool:
        """Whether messages may be polled: the session timeline needs the events that precede them, so the
        events image must be there first (the handler creates all its publications at start; a publisher
        without an events stream is waited for only ``IMAGE_GRACE_S``)."""
        events = self.streams.get(EVENTS)
        if events is None or events.images or self._events_waived:
            return True
        if self._messages_image_since is None:
            self._messages_image_since = time.monotonic()
        if time.monotonic() - self._messages_image_since < IMAGE_GRACE_S:
            return False
        self._events_waived = True
        self.losses.warn_once("no-events", f"no publisher on the events stream {events.stream_id}: recording messages "
                                            "without session changes and gaps")
        return True

    def _poll_messages(self) -> int:
        stream = self.streams.get(MESSAGES)
        state = stream.active if stream is not None else None
        self._messages_drained = True
        if stream is None or state is None or not self._events_ready():
            return 0
        image = state.image
        total = 0
        for _ in range(self.config.max_batches_per_cycle):
            start = image.position
            batch = image.batch_poll()
            n = batch.count
            if n == 0:
                batch.commit()  # steps over padding at a term's end
                if image.position == start:
                    break
                state.processed = image.position
                continue
            if not (batch.flags & UNFRAGMENTED == UNFRAGMENTED).all():
                raise RecorderError(f"stream {stream.stream_id} carries a fragmented frame near position {start}: "
                                    "the messages stream holds one ITCH message per frame")
            starts = np.empty(n, dtype=np.int64)
            starts[0] = start
            starts[1:] = batch.positions[:-1]
            rows = capture_messages(batch.buffer, batch.payload_offsets, batch.lengths, batch.reserved_values, starts)
            batch.commit()
            state.processed = image.position
            self.join.add_messages(rows)
            total += n
        else:
            self._messages_drained = False
        return total

    def _poll_capture(self) -> int:
        """Capture frames in batches, vectorised.  Every capture row is 32 bytes and a fragment's payload is a
        multiple of 32 (MTU - header), so each fragment holds whole rows: no reassembly, and a restart may
        resume at any fragment."""
        stream = self.streams.get(CAPTURE)
        state = stream.active if stream is not None else None
        self._capture_drained = True
        if stream is None or state is None:
            return 0
        image = state.image
        total = 0
        self._capture_drained = False
        for _ in range(self.config.max_batches_per_cycle):
            start = image.position
            batch = image.batch_poll()
            n = batch.count
            if n == 0:
                batch.commit()  # steps over padding at a term's end
                if image.position == start:
                    self._capture_drained = True
                    break
                state.processed = image.position
                continue
            lengths = batch.lengths.astype(np.int64)
            if (lengths % pub.CAPTURE_ROW_LENGTH).any():
                raise RecorderError(f"stream {stream.stream_id}: a capture frame near position {start} is not a whole "
                                    f"number of {pub.CAPTURE_ROW_LENGTH}-byte rows")
            data, _ = batch.gather()  # every payload, back to back, in one native copy
            ends = batch.positions.copy()
            starts = np.concatenate(([start], ends[:-1]))
            kinds = batch.reserved_values.copy()
            batch.commit()
            state.processed = image.position
            per_frame = lengths // pub.CAPTURE_ROW_LENGTH
            rows = data.view(np.dtype(f"V{pub.CAPTURE_ROW_LENGTH}"))
            row_kind = np.repeat(kinds, per_frame)
            packets = (row_kind == pub.CAPTURE_PACKETS) & (np.repeat(ends, per_frame) > state.skip_packets_through)
            if packets.any():  # (rows of frames ending at or before skip_packets_through were recorded already)
                staged = rows[packets].view(pub.PACKET_ROW)
                self._staged_packets.append(staged)
                self._staged_packet_rows += staged.size
            delivered = row_kind == pub.CAPTURE_DELIVERED
            if delivered.any():
                entries = expand_runs(rows[delivered].view(pub.DELIVERED_ROW), np.repeat(starts, per_frame)[delivered])
                if state.skip_frame >= 0:  # the first frame after a restart: its first entries were joined before
                    drop = (entries["frame_start"] == state.skip_frame) & (entries["index"] < state.skip_entries)
                    entries = entries[~drop]
                    state.skip_frame = -1
                self.join.add_entries(entries)
            unknown = ~np.isin(kinds, (pub.CAPTURE_PACKETS, pub.CAPTURE_DELIVERED))
            if unknown.any():
                self.losses.warn_once("capture-kind", "capture frames of unknown kind "
                                                      f"{sorted(set(kinds[unknown].tolist()))} ignored")
            total += n
        return total

    def _poll_events(self, limit: int = 256) -> int:
        stream = self.streams.get(EVENTS)
        state = stream.active if stream else None
        if state is None:
            return 0
        assert state.handler is not None
        total = 0
        while True:
            n = state.image.poll(state.handler, limit)
            total += n
            if n < limit:
                return total

    def _event_handler(self, state: RecordedImage) -> Callable[[memoryview, Header], None]:
        def on_event(buffer: memoryview, header: Header) -> None:
            self._on_event(pub.FeedEvent.decode(buffer))  # 48 bytes: never fragmented
            state.processed = header.position
        return on_event

    def _on_event(self, event: pub.FeedEvent) -> None:
        session = self._session_name(event.session)
        kind = event.kind
        rows: list[GapRow] = []
        if kind == pub.SESSION_CHANGED:
            self.timeline.on_session_changed(session or self.config.default_session, event.time_ns)
        elif kind == pub.GAP_DETECTED:
            rows = self.gap_book.detected(session or self.timeline.message_session, event.first, event.last,
                                          event.time_ns)
        elif kind == pub.GAP_RECOVERED:
            rows = self.gap_book.recovered(session or self.timeline.message_session, event.first, event.last,
                                           event.time_ns)
        elif kind == pub.GAP_UNRECOVERABLE:
            rows = self.gap_book.unrecoverable(session or self.timeline.message_session, event.first, event.last,
                                               event.time_ns)
        elif kind == pub.END_OF_SESSION and self._eos_cycle is None:
            self._eos_cycle = self._cycle
        if rows:
            self._write_gaps(rows)

    def _session_name(self, raw: bytes) -> str | None:
        text = raw.decode("ascii", errors="replace").rstrip(" \x00")
        if not text:
            return None
        try:
            return schema.check_session(text)
        except schema.RecordingFormatError:
            self.losses.warn_once(f"session-{text}", f"session {text!r} cannot name a partition; using the default")
            return None

    # -- the duty cycle ----------------------------------------------------------------------------------

    def _client_alive(self) -> bool:
        return self.client is not None and not self.client.is_closed

    def do_work(self) -> int:
        """One cycle: poll messages, capture, then events (see :mod:`logbuf.recorder.sessions` for why in
        this order), join, stage, and commit when due.  Returns the number of frames handled."""
        self._cycle += 1
        aligned = self.streams.adopt()
        if aligned is not None:
            self.join.aligned = aligned
        polled_messages = self._poll_messages()
        work = polled_messages + self._poll_capture() + self._poll_events()
        if polled_messages:
            self.timeline.note_messages()  # after this cycle's events: a change published first is the join
        result = self.join.take()
        if result.orphans:
            orphans = concat_rows(result.orphans, IN_FLIGHT)
            self.losses.loss(MESSAGES, f"{orphans.size} messages (sequences {int(orphans['sequence'][0])}.."
                                       f"{int(orphans['sequence'][-1])}) came without their DELIVERED rows "
                                       "(capture stream joined late, or lost)",
                             sequences=[int(orphans["sequence"][0]), int(orphans["sequence"][-1])],
                             count=int(orphans.size))
        if self.join.mismatches != self._mismatches_seen:
            self._mismatches_seen = self.join.mismatches
            self.losses.warn(f"a DELIVERED row disagreed with the messages stream ({self.join.mismatches} times "
                             "so far); re-aligned by sequence")
        for chunk in result.joined:
            self._staged_messages.append(chunk)
            self._staged_message_rows += chunk.size
        if self._staged_message_rows >= self.config.stage_rows or self._staged_packet_rows >= self.config.stage_rows:
            self._flush_staged()
        if self.commits.inflight is not None:
            if self.commits.sealed():
                self.commits.finish(release=self._client_alive())
        else:
            reason = self.commits.reason(has_staged=bool(self._staged_messages or self._staged_packets))
            if reason:
                self.commit(reason, wait=False)
        if self._client_alive():
            self.streams.retire_finished()
        now = time.monotonic()
        if now >= self._next_counters:
            self._next_counters = now + _COUNTER_INTERVAL_S
            self._publish_counters()
        if self.progress is not None and now >= self._next_progress:
            self._next_progress = now + self.progress_interval_s
            self.progress(self.stats())
        return work

    def _flush_staged(self) -> None:
        if self._staged_messages:
            rows = concat_rows(self._staged_messages, IN_FLIGHT)
            self._staged_messages, self._staged_message_rows = [], 0
            segments = self.timeline.split_messages(rows["sequence"])
            columns = decode_columns(rows)
            self._malformed += int(columns.malformed.sum())
            table = self.builder.messages(columns)
            for segment in segments:
                part = table if len(segments) == 1 and segment.stop - segment.start == table.num_rows \
                    else table.slice(segment.start, segment.stop - segment.start)
                self.sink.write(schema.MESSAGES, segment.session, part)
                self._rows[schema.MESSAGES] += part.num_rows
            if self.timeline.last_sequence is not None:
                self._last_durable = {"session": self.timeline.message_session,
                                      "sequence": self.timeline.last_sequence}
        if self._staged_packets:
            rows = concat_rows(self._staged_packets, pub.PACKET_ROW)
            self._staged_packets, self._staged_packet_rows = [], 0
            for session, index in self.timeline.split_packets(rows["arrival_ns"]):
                part = rows if index is None else rows[index]
                self.sink.write(schema.PACKETS, session, self.builder.packets(part))
                self._rows[schema.PACKETS] += part.size

    def _write_gaps(self, rows: list[GapRow]) -> None:
        by_session: dict[str, list] = {}
        for session, *row in rows:
            by_session.setdefault(session, []).append(tuple(row))
        for session, session_rows in by_session.items():
            self.sink.write(schema.GAPS, session, self.builder.gaps(session_rows))
            self._rows[schema.GAPS] += len(session_rows)

    # -- commits (the protocol is logbuf.recorder.commit) -------------------------------------------------

    def commit(self, reason: str = "requested", *, clean_stop: bool = False, wait: bool = True) -> None:
        """Makes everything handled so far durable and visible, then releases it to the driver.

        The files are sealed on the writer thread; with ``wait=False`` polling goes on meanwhile and
        :meth:`do_work` finishes the commit (checkpoint, publish, release) once the seal is done.  One commit
        is in flight at a time."""
        if self.commits.inflight is not None:
            self.commits.finish(release=self._client_alive())
        self._flush_staged()
        # everything the checkpoint says is taken now, with the seal queued behind exactly these writes
        self.commits.begin(reason, clean_stop=clean_stop, last_durable=self._last_durable,
                           sessions=self.timeline.state(), open_gaps=self.gap_book.state(), totals=self.totals())
        if wait:
            self.commits.finish(release=self._client_alive())

    def totals(self) -> dict[str, int]:
        """Rows recorded per dataset over every run of this recording."""
        return {name: self._base_totals.get(name, 0) + self._rows[name] for name in schema.DATASETS}

    # -- running -----------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks :meth:`run` to finish (thread- and signal-safe): it completes the open files and returns."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _end_of_session_reached(self) -> bool:
        """END_OF_SESSION was seen in an earlier cycle, and since then the data streams were polled dry and
        every message joined: everything the handler published before the event is handled."""
        return (self._eos_cycle is not None and self._cycle > self._eos_cycle and self._messages_drained
                and self._capture_drained and self.join.pending_messages == 0)

    def run(self, duration_s: float | None = None, until_end_of_session: bool = False) -> RecorderStats:
        """Records until :meth:`stop`, ``duration_s`` or (optionally) the end of the session; then completes
        every file and releases everything.  Returns the final statistics."""
        deadline = None if duration_s is None else time.monotonic() + duration_s
        clean = False
        try:
            while not self._stop.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                work = self.do_work()
                if until_end_of_session and self._end_of_session_reached():
                    break
                if not work:
                    self._idle()
            clean = True
        finally:
            self._finish(clean)
        return self.stats()

    def _idle(self) -> None:
        # a signal may wake us (SIGTERM -> stop()): the loop looks at the stop flag next
        with contextlib.suppress(posix_ipc.SignalError):
            self.streams.wait_subscription.wait(_IDLE_WAIT_S)

    def _finish(self, clean: bool) -> None:
        if clean and self.client is not None and not self.client.is_closed:
            try:
                # what is already published: drain it so the joins complete (bounded)
                until = time.monotonic() + _FINAL_DRAIN_S
                while time.monotonic() < until:
                    if not self.do_work():
                        if self.join.pending_messages == 0:
                            break
                        time.sleep(_FINAL_DRAIN_WAIT_S)
                rows = self.gap_book.close_all()  # the recording ends: open gaps are unrecovered as far as we know
                if rows:
                    self._write_gaps(rows)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.commit("error")
                raise
        if clean:
            self.commit("stop", clean_stop=True)
        else:  # keep what is handled (a commit is all or nothing), but let the original error through
            with contextlib.suppress(Exception):
                self.commit("error")
        self._publish_counters()

    # -- statistics --------------------------------------------------------------------------------------

    def stats(self) -> RecorderStats:
        """This run's statistics now."""
        held = lag = 0
        for role, stream in getattr(self, "streams", {}).items():
            state = stream.active
            if state is None or state.image.is_closed:
                continue
            held = max(held, state.held)
            if role == MESSAGES:
                lag = max(0, state.image.log.producer_position() - state.image.position)
        return RecorderStats(
            elapsed_s=time.monotonic() - self._started,
            messages=self._rows[schema.MESSAGES], packets=self._rows[schema.PACKETS], gaps=self._rows[schema.GAPS],
            files=self.writer.files_published, bytes=self.writer.bytes_published, commits=self.commits.commits,
            held_bytes=held, lag_bytes=lag, pending_join=self.join.pending_messages,
            duplicates=self.timeline.duplicates, orphans=self.join.orphans, malformed=self._malformed,
            mismatches=self.join.mismatches, skipped_entries=self.join.skipped_entries,
            losses=self.losses.count, last_sequence=self.timeline.last_sequence, session=self.timeline.message_session,
            counts=self.totals(),
        )

    def _publish_counters(self) -> None:
        if self.client is None or self.client.is_closed:
            return
        s = self.stats()
        values = {"messages rows": s.messages, "packets rows": s.packets, "gaps rows": s.gaps,
                  "files completed": s.files, "bytes completed": s.bytes, "held bytes": s.held_bytes,
                  "lag bytes": s.lag_bytes, "commits": s.commits, "losses": s.losses}
        for name, value in values.items():
            self.counters[name].set(value)

    # -- lifetime ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the client (if the recorder made it) and unlocks the recording; call after :meth:`run`."""
        sink = getattr(self, "sink", None)
        if sink is not None:
            sink.close()
        client, self.client = self.client, None
        if client is not None:
            if self._own_client:
                client.close()
            else:
                for stream in getattr(self, "streams", {}).values():
                    with contextlib.suppress(LogbufError):
                        stream.subscription.close()
                for counter in getattr(self, "counters", {}).values():
                    with contextlib.suppress(LogbufError):
                        counter.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Recorder", "RecorderConfig", "RecorderDataLoss", "RecorderError", "RecorderStats"]
