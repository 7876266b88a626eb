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

**Durability.**  Every image is *held* (:meth:`Image.hold_position`): polling moves only the read cursor,
while the image's sub-pos - which holds the publisher back and stops the driver cleaning - moves only when
the recorder releases it.  It releases only what is in complete files, through the commit of
:mod:`logbuf.recorder.epoch_writer`: seal the open files (on the writer thread, while polling goes on),
write the checkpoint (positions, session and gap state, the files to publish), publish, then release.  A
commit starts when a file fills up (``rows_per_file``) or its hour ends, when the held-back bytes of a
stream reach half of its publication window (read from the log's metadata: the publisher is never blocked
for long), when a publisher finishes, every ``commit_interval_s``, and on stop.

**Restart.**  The last commit is rolled forward and stale ``.tmp`` files deleted, the checkpoint is read,
and each stream is subscribed with ``resume-position=<session>:<released>``: the driver joins the image
where the recorder released it while that data is still in the log (e.g. a restart within the driver's
client liveness timeout, during which the dead recorder's sub-pos still holds it).  What the checkpoint
says is recorded is skipped - messages by sequence, capture rows by position and count - so nothing is
written twice.  If the driver could not honour the position (``join_position`` beyond it) or a publisher
of the checkpoint is gone, the loss is an error (:class:`RecorderDataLoss`) - or, with ``allow_loss``, a
line in ``RECORDING/_recorder_losses.jsonl``, a counter and a warning.  Never silent.

**Cost.**  Python never loops per message: per poll batch (up to 4096 frames) one 64-byte row take and
a positional join; per ~250 k staged rows one ITCH decode per type present and one Arrow table; Parquet
encoding on the writer thread (Arrow releases the GIL).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import posix_ipc

from logbuf.client.client import Client, Counter, connect
from logbuf.client.image import Image
from logbuf.client.subscription import Subscription
from logbuf.errors import LogbufError
from logbuf.feed import published as pub
from logbuf.logbuffer.frame import UNFRAGMENTED
from logbuf.logbuffer.header import Header
from logbuf.recorder.checkpoint import Checkpoint, ImageCheckpoint
from logbuf.recorder.columns import IN_FLIGHT, TableBuilder, capture_messages, concat_rows, decode_columns
from logbuf.recorder.epoch_writer import (
    BackgroundWriter,
    EpochWriter,
    SealedFile,
    publish_files,
    remove_stale,
)
from logbuf.recorder.gaps import GapBook, GapRow
from logbuf.recorder.join import DeliveryJoin, expand_runs
from logbuf.recorder.sessions import SessionTimeline
from logbuf.recording import schema
from logbuf.recording.writer import DEFAULT_ROW_GROUP_ROWS, DEFAULT_ROWS_PER_FILE

RECORDER_COUNTER_TYPE_ID = 1200
LOSSES_FILE = "_recorder_losses.jsonl"
LOCK_FILE = "_recorder.lock"
DEFAULT_SESSION = "UNKNOWN"
MESSAGES, EVENTS, CAPTURE = "messages", "events", "capture"
_COUNTER_INTERVAL_S = 0.1
_IMAGE_GRACE_S = 2.0  # how long a restarted recorder waits for the publishers of its checkpoint
_IDLE_WAIT_S = 0.01


class RecorderError(RuntimeError):
    """The recorder cannot run (bad configuration, another recorder on the same recording, ...)."""


class RecorderDataLoss(RecorderError):
    """Data the recording should contain can no longer be read (raised unless ``allow_loss``)."""


@dataclass
class RecorderConfig:
    output: str | os.PathLike[str]
    driver_directory: str | os.PathLike[str] | None = None
    channel: str = "aeron:ipc"
    messages_stream: int | None = pub.MESSAGES_STREAM
    events_stream: int | None = pub.EVENTS_STREAM
    capture_stream: int | None = pub.CAPTURE_STREAM
    default_session: str = DEFAULT_SESSION  # partition of what comes before the first SESSION_CHANGED
    rows_per_file: int = DEFAULT_ROWS_PER_FILE
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS
    commit_interval_s: float = 30.0  # longest time recorded data waits to become complete files
    allow_loss: bool = False  # record losses in _recorder_losses.jsonl instead of stopping
    compression: str = "zstd"
    stage_rows: int = 262_144  # rows converted to Arrow at once
    max_batches_per_cycle: int = 16  # messages poll batches between looks at the other streams
    hold_bytes: int | None = None  # commit when this much is held back (default: half the publication window)
    connect_timeout_s: float = 5.0  # how long to wait for the media driver

    def __post_init__(self) -> None:
        if self.messages_stream is None and self.events_stream is None and self.capture_stream is None:
            raise ValueError("nothing to record: every stream is disabled")
        if self.messages_stream is not None and self.capture_stream is None:
            raise ValueError("the messages dataset needs the capture stream's DELIVERED rows (feed and arrival "
                             "time of each message): enable the capture stream (feed handler --capture)")
        ids = [s for s in (self.messages_stream, self.events_stream, self.capture_stream) if s is not None]
        if len(set(ids)) != len(ids):
            raise ValueError(f"stream ids must differ, got {ids}")
        schema.check_session(self.default_session)
        for name in ("rows_per_file", "row_group_rows", "stage_rows", "max_batches_per_cycle"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.commit_interval_s <= 0:
            raise ValueError("commit_interval_s must be > 0")


@dataclass
class RecorderStats:
    elapsed_s: float = 0.0
    messages: int = 0  # rows written this run, per dataset
    packets: int = 0
    gaps: int = 0
    files: int = 0  # complete files published this run
    bytes: int = 0
    commits: int = 0
    held_bytes: int = 0  # read but not yet released (largest over the streams)
    lag_bytes: int = 0  # published but not yet read (messages stream)
    pending_join: int = 0  # messages waiting for their DELIVERED rows
    duplicates: int = 0
    orphans: int = 0
    mismatches: int = 0  # DELIVERED entries whose sequence disagreed with the message's (then re-aligned)
    skipped_entries: int = 0  # DELIVERED entries of messages published before the recorder joined
    malformed: int = 0
    losses: int = 0
    last_sequence: int | None = None
    session: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.elapsed_s if self.elapsed_s > 0 else 0.0


class _ImageState:
    """One publisher's image of a stream and how far the recorder has handled it."""

    __slots__ = ("image", "processed", "released", "end_of_stream", "skip_packets_through", "skip_frame",
                 "skip_entries", "hold_threshold", "ended", "resumed_exactly", "handler")

    def __init__(self, image: Image, hold_bytes: int | None = None) -> None:
        self.image = image
        self.processed = image.join_position  # every frame before this was handled
        self.released = image.join_position  # in complete files (and told to the driver while it is there)
        self.end_of_stream: int | None = None  # its publisher's last position, once the publisher finished
        self.skip_packets_through = -1  # capture: PACKET frames ending at or before this are recorded
        self.skip_frame = -1  # capture: the frame whose first skip_entries DELIVERED entries are recorded
        self.skip_entries = 0
        # commit when the held-back bytes reach half the publication window (from the log's metadata; Aeron's
        # default window is half a term), so the publisher always has the other half while files complete
        window = image.log.publication_window_length or image.term_length // 2
        self.hold_threshold = hold_bytes or max(4096, window // 2)
        self.ended = False  # finished, and everything up to its end is in complete files
        self.resumed_exactly = False
        self.handler: Callable[[memoryview, Header], None] | None = None

    @property
    def held(self) -> int:
        return self.image.position - self.released

    def at_end(self) -> bool:
        """Its publisher finished and everything it published is handled.  A closed image is not looked at
        (the client unmaps its log shortly after): only what was learnt before counts."""
        image = self.image
        if self.end_of_stream is None and not image.is_closed and image.is_end_of_stream():
            self.end_of_stream = image.log.end_of_stream_position
        return self.end_of_stream is not None and self.processed >= self.end_of_stream


class _Stream:
    __slots__ = ("role", "stream_id", "subscription", "images", "adopted", "retired")

    def __init__(self, role: str, stream_id: int, subscription: Subscription) -> None:
        self.role = role
        self.stream_id = stream_id
        self.subscription = subscription
        self.images: list[_ImageState] = []  # in arrival order; images[0] is the one being recorded
        self.adopted: set[int] = set()
        self.retired: set[int] = set()  # session ids of images finished (or given up) in this run

    @property
    def active(self) -> _ImageState | None:
        return self.images[0] if self.images else None


@dataclass
class _Commit:
    """A commit whose files are being sealed on the writer thread."""

    reason: str
    plan: dict[str, tuple[_ImageState, ImageCheckpoint]]
    checkpoint: Checkpoint  # all but the files to publish
    sealed: Future


def resume_channel(channel: str, positions: dict[int, int]) -> str:
    """``channel`` with ``resume-position=<session>:<position>,...`` added (Aeron URI syntax)."""
    if not positions:
        return channel
    value = ",".join(f"{session}:{position}" for session, position in sorted(positions.items()))
    return f"{channel}{'|' if '?' in channel else '?'}resume-position={value}"


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
            self._open_recording()
            self.client = client or connect(config.driver_directory, connect_timeout=config.connect_timeout_s)
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
        self.checkpoint = Checkpoint.load(self.root)
        # finish the last commit (files it names that are still hidden), then drop every half-written file
        self.rolled_forward = publish_files(self.root, [(t, f) for t, f in self.checkpoint.publish]) \
            if self.checkpoint else 0
        self.removed_stale = remove_stale(self.root)
        self.writer = EpochWriter(self.root, rows_per_file=cfg.rows_per_file, row_group_rows=cfg.row_group_rows,
                                  compression=cfg.compression)
        self.sink = BackgroundWriter(self.writer)  # Parquet encoding off the polling thread
        cp = self.checkpoint
        self.timeline = (SessionTimeline.from_state(cfg.default_session, cp.sessions) if cp and cp.sessions
                         else SessionTimeline(cfg.default_session))
        self.gap_book = GapBook.from_state(cp.open_gaps) if cp else GapBook()
        self.join = DeliveryJoin()
        self.builder = TableBuilder()
        self.epoch = cp.epoch if cp else 0
        self._base_totals: dict[str, int] = dict(cp.totals) if cp else {}

    def _setup(self) -> None:
        cfg = self.config
        assert self.client is not None
        self.streams: dict[str, _Stream] = {}
        # capture first: a DELIVERED row is published after its message, so joining capture no later than
        # messages means every message we see has its row still to come
        for role, stream_id in ((CAPTURE, cfg.capture_stream), (EVENTS, cfg.events_stream),
                                (MESSAGES, cfg.messages_stream)):
            if stream_id is None:
                continue
            positions = {}
            if self.checkpoint:
                positions = {i.session_id: i.released for i in self.checkpoint.streams.get(role, ()) if not i.ended}
            subscription = self.client.add_subscription(resume_channel(cfg.channel, positions), stream_id)
            self.streams[role] = _Stream(role, stream_id, subscription)
        # idle waits sleep on the busiest stream's semaphore (each stream has its own)
        self._wait_subscription = self.streams.get(MESSAGES, next(iter(self.streams.values()))).subscription
        self._staged_messages: list[np.ndarray] = []
        self._staged_message_rows = 0
        self._staged_packets: list[np.ndarray] = []
        self._staged_packet_rows = 0
        self._rows = {name: 0 for name in schema.DATASETS}
        self._losses = 0
        self._malformed = 0
        self._commits = 0
        self._last_commit = time.monotonic()
        self._cycle = 0
        self._eos_cycle: int | None = None
        self._messages_drained = False
        self._capture_drained = False
        self._missing_checked = self.checkpoint is None
        self._alignment_decided = False
        self._unpublished: list[SealedFile] = []
        self._inflight: _Commit | None = None
        self._events_waived = False
        self._messages_image_since: float | None = None
        self._mismatches_seen = 0
        self._stalled_warned = False
        self._warned: set[str] = set()
        self._last_durable = self.checkpoint.last_durable if self.checkpoint else None
        self._make_counters()

    def _make_counters(self) -> None:
        assert self.client is not None
        names = ("messages rows", "packets rows", "gaps rows", "files completed", "bytes completed",
                 "held bytes", "lag bytes", "commits", "losses")
        self.counters: dict[str, Counter] = {}
        for name in names:
            self.counters[name] = self.client.add_counter(RECORDER_COUNTER_TYPE_ID, f"recorder: {name}",
                                                          name.replace(" ", "_").encode())
        self._next_counters = 0.0
        self._next_progress = time.monotonic() + self.progress_interval_s

    # -- images ------------------------------------------------------------------------------------------

    def _adopt_images(self) -> None:
        for stream in self.streams.values():
            for image in stream.subscription.images:
                if image.correlation_id in stream.adopted:
                    continue
                stream.adopted.add(image.correlation_id)
                image.hold_position()  # before the first poll: nothing is released until it is durable
                state = _ImageState(image, self.config.hold_bytes)
                if stream.role == EVENTS:
                    state.handler = self._event_handler(state)
                self._resume(stream, state)
                stream.images.append(state)
        if not self._alignment_decided and self.checkpoint is not None:
            pair = [self.streams[r].active for r in (MESSAGES, CAPTURE) if r in self.streams]
            if len(pair) == 2 and all(p is not None for p in pair):
                # both streams resume exactly where the last commit left them: pair by position from the start
                self.join.aligned = all(p.resumed_exactly for p in pair)  # type: ignore[union-attr]
                self._alignment_decided = True
        if not self._missing_checked and time.monotonic() - self._started >= _IMAGE_GRACE_S:
            self._missing_checked = True
            self._check_missing_publishers()

    def _resume(self, stream: _Stream, state: _ImageState) -> None:
        cp = self.checkpoint.image(stream.role, state.image.session_id) if self.checkpoint else None
        if cp is None:
            return
        join = state.image.join_position
        if join > cp.released:
            self._loss(stream.role, f"the driver no longer had positions {cp.released}..{join} of stream "
                                    f"{stream.stream_id} session {cp.session_id} (restarted too late?)",
                       after_stop=self.checkpoint.clean_stop, session_id=cp.session_id,
                       first_position=cp.released, end_position=join)
        else:
            state.resumed_exactly = join == cp.released
            state.skip_packets_through = cp.written_through
            if state.resumed_exactly:
                state.skip_frame, state.skip_entries = cp.released, cp.skip_entries

    def _check_missing_publishers(self) -> None:
        assert self.checkpoint is not None
        for role, images in self.checkpoint.streams.items():
            stream = self.streams.get(role)
            seen = {s.image.session_id for s in stream.images} if stream else set()
            for cp in images:
                if not cp.ended and cp.session_id not in seen:
                    self._loss(role, f"the publisher of stream {cp.stream_id} session {cp.session_id} is gone: "
                                     f"what it published after position {cp.released} was not recorded",
                               after_stop=self.checkpoint.clean_stop, session_id=cp.session_id,
                               first_position=cp.released, end_position=None)

    # -- polling -----------------------------------------------------------------------------------------

    def _events_ready(self) -> bool:
        """Whether messages may be polled: the session timeline needs the events that precede them, so the
        events image must be there first (the handler creates all its publications at start; a publisher
        without an events stream is waited for only ``_IMAGE_GRACE_S``)."""
        events = self.streams.get(EVENTS)
        if events is None or events.images or self._events_waived:
            return True
        if self._messages_image_since is None:
            self._messages_image_since = time.monotonic()
        if time.monotonic() - self._messages_image_since < _IMAGE_GRACE_S:
            return False
        self._events_waived = True
        self._warn_once("no-events", f"no publisher on the events stream {events.stream_id}: recording messages "
                                     "without session changes and gaps")
        return True

    def _poll_messages(self) -> int:
        stream = self.streams.get(MESSAGES)
        state = stream.active if stream else None
        self._messages_drained = True
        if state is None or not self._events_ready():
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
        state = stream.active if stream else None
        self._capture_drained = True
        if state is None:
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
                self._warn_once("capture-kind", f"capture frames of unknown kind {sorted(set(kinds[unknown].tolist()))} "
                                                "ignored")
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

    def _event_handler(self, state: _ImageState) -> Callable[[memoryview, Header], None]:
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
            self._warn_once(f"session-{text}", f"session {text!r} cannot name a partition; using the default")
            return None

    # -- the duty cycle ----------------------------------------------------------------------------------

    def do_work(self) -> int:
        """One cycle: poll messages, capture, then events (see :mod:`logbuf.recorder.sessions` for why in
        this order), join, stage, and commit when due.  Returns the number of frames handled."""
        self._cycle += 1
        self._adopt_images()
        polled_messages = self._poll_messages()
        work = polled_messages + self._poll_capture() + self._poll_events()
        if polled_messages:
            self.timeline.note_messages()  # after this cycle's events: a change published first is the join
        result = self.join.take()
        if result.orphans:
            orphans = concat_rows(result.orphans, IN_FLIGHT)
            self._loss(MESSAGES, f"{orphans.size} messages (sequences {int(orphans['sequence'][0])}.."
                                 f"{int(orphans['sequence'][-1])}) came without their DELIVERED rows (capture "
                                 "stream joined late, or lost)",
                       sequences=[int(orphans["sequence"][0]), int(orphans["sequence"][-1])], count=int(orphans.size))
        if self.join.mismatches != self._mismatches_seen:
            self._mismatches_seen = self.join.mismatches
            print(f"logbuf record: warning: a DELIVERED row disagreed with the messages stream "
                  f"({self.join.mismatches} times so far); re-aligned by sequence", file=sys.stderr)
        for chunk in result.joined:
            self._staged_messages.append(chunk)
            self._staged_message_rows += chunk.size
        if self._staged_message_rows >= self.config.stage_rows or self._staged_packet_rows >= self.config.stage_rows:
            self._flush_staged()
        if self._inflight is not None:
            if self._inflight.sealed.done():
                self._finish_commit()
        else:
            reason = self._commit_reason()
            if reason:
                self.commit(reason, wait=False)
        self._retire_finished()
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

    # -- commits -----------------------------------------------------------------------------------------

    def _release_plan(self) -> dict[str, tuple[_ImageState, ImageCheckpoint]]:
        """Per stream, the active image's checkpoint entry if everything staged were written now."""
        plan = {}
        for role, stream in self.streams.items():
            state = stream.active
            if state is None:
                continue
            image = state.image
            entry = ImageCheckpoint(image.session_id, stream.stream_id, state.processed)
            if role == MESSAGES:
                pending = self.join.first_pending_message_position()
                if pending is not None:
                    entry.released = pending
            elif role == CAPTURE:
                entry.written_through = state.processed
                pending_entry = self.join.first_pending_entry()
                if pending_entry is not None:
                    entry.released, entry.skip_entries = pending_entry
            entry.released = max(min(entry.released, image.position), state.released)
            entry.ended = state.at_end() and entry.released >= (state.end_of_stream or 0)
            plan[role] = (state, entry)
        return plan

    def _commit_reason(self) -> str | None:
        if self.writer.has_sealed:
            return "file complete"
        plan = self._release_plan()
        progress = any(entry.released > state.released for state, entry in plan.values())
        for state, _ in plan.values():
            held = state.held
            if not held:
                continue
            if held >= state.hold_threshold:
                if progress:
                    return "window"
                self._warn_stalled(state)
            if state.at_end() and progress:
                return "end of stream"  # the driver drains it only for a linger timeout: release it now
        if time.monotonic() - self._last_commit >= self.config.commit_interval_s and (
                progress or self.writer.has_open or self._staged_messages or self._staged_packets):
            return "interval"
        return None

    def _warn_stalled(self, state: _ImageState) -> None:
        if not self._stalled_warned and self.join.pending_messages:
            self._stalled_warned = True
            print(f"logbuf record: warning: {self.join.pending_messages} messages are waiting for their DELIVERED "
                  "rows on the capture stream; is the feed handler running with --capture?", file=sys.stderr)

    def commit(self, reason: str = "requested", *, clean_stop: bool = False, wait: bool = True) -> None:
        """Makes everything handled so far durable and visible, then releases it to the driver.

        The files are sealed on the writer thread; with ``wait=False`` polling goes on meanwhile and
        :meth:`do_work` finishes the commit (checkpoint, publish, release) once the seal is done.  One commit
        is in flight at a time."""
        if self._inflight is not None:
            self._finish_commit()
        self._flush_staged()
        plan = self._release_plan()
        streams: dict[str, list[ImageCheckpoint]] = {}
        for role, stream in self.streams.items():
            entries = []
            for state in stream.images:
                if role in plan and plan[role][0] is state:
                    entries.append(plan[role][1])
                else:  # waiting behind the active image: nothing of it handled yet
                    entries.append(ImageCheckpoint(state.image.session_id, stream.stream_id, state.released))
            streams[role] = entries
        if self.checkpoint:  # publishers of the last run that have not reappeared yet stay owed
            for role, images in self.checkpoint.streams.items():
                known = {e.session_id for e in streams.get(role, [])}
                if role in self.streams:
                    known |= self.streams[role].retired
                streams.setdefault(role, []).extend(i for i in images if i.session_id not in known and not i.ended)
        # everything the checkpoint says is taken now, with the seal queued behind exactly these writes
        checkpoint = Checkpoint(
            epoch=self.epoch + 1, streams=streams, last_durable=self._last_durable, sessions=self.timeline.state(),
            open_gaps=self.gap_book.state(), totals=self.totals(), clean_stop=clean_stop,
        )
        self._inflight = _Commit(reason, plan, checkpoint, self.sink.seal_async())
        if wait:
            self._finish_commit()

    def _finish_commit(self) -> None:
        inflight, self._inflight = self._inflight, None
        assert inflight is not None
        # files of an earlier commit whose checkpoint or publish failed stay owed until a publish succeeds
        self._unpublished = sealed = self._unpublished + inflight.sealed.result()
        checkpoint = inflight.checkpoint
        checkpoint.publish = [[self.writer.relative(f.temp), self.writer.relative(f.final)] for f in sealed]
        checkpoint.save(self.root)
        self.checkpoint = checkpoint
        self.epoch = checkpoint.epoch
        self.writer.publish(sealed)
        self._unpublished = []
        self._commits += 1
        self._last_commit = time.monotonic()
        alive = self.client is not None and not self.client.is_closed
        for state, entry in inflight.plan.values():
            if alive and not state.image.is_closed:
                state.image.release_to(entry.released)
            state.released = entry.released
            state.ended = entry.ended

    def totals(self) -> dict[str, int]:
        """Rows recorded per dataset over every run of this recording."""
        return {name: self._base_totals.get(name, 0) + self._rows[name] for name in schema.DATASETS}

    def _retire_finished(self) -> None:
        """A finished image whose every byte is recorded makes way for the next image of its stream.  One the
        driver closed before it was all read (its publisher went and the drain timed out) is a loss."""
        if self.client is None or self.client.is_closed:
            return  # images close with the client: nothing to conclude
        for stream in self.streams.values():
            while stream.images:
                state = stream.images[0]
                if state.image.is_closed and not state.ended:
                    state.ended = True
                    self._loss(stream.role, f"the image of stream {stream.stream_id} session "
                                            f"{state.image.session_id} closed at position {state.image.position} "
                                            "before the recorder read all of it",
                               session_id=state.image.session_id, first_position=state.image.position,
                               end_position=None)
                if not (state.ended and (len(stream.images) > 1 or state.image.is_closed)):
                    break
                stream.retired.add(state.image.session_id)
                stream.images.pop(0)

    # -- losses and warnings -----------------------------------------------------------------------------

    def _loss(self, role: str, what: str, *, after_stop: bool = False, **details: object) -> None:
        """Data the recording will not have.  After a deliberate stop (``after_stop``) it is what was published
        while nobody recorded: logged, never an error.  Otherwise an error unless ``allow_loss``."""
        self._losses += 1
        if not after_stop and not self.config.allow_loss:
            raise RecorderDataLoss(f"{what}; rerun with --allow-loss to record the loss and continue")
        if after_stop:
            what += " (while the recorder was stopped)"
        entry = {"time_ns": time.time_ns(), "stream": role, "what": what, "while_stopped": after_stop, **details}
        with open(self.root / LOSSES_FILE, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
        print(f"logbuf record: {'warning: not recorded' if after_stop else 'data loss'}: {what}", file=sys.stderr)

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"logbuf record: warning: {text}", file=sys.stderr)

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
            self._wait_subscription.wait(_IDLE_WAIT_S)

    def _finish(self, clean: bool) -> None:
        if clean and self.client is not None and not self.client.is_closed:
            try:
                # what is already published: drain it so the joins complete (bounded)
                until = time.monotonic() + 1.0
                while time.monotonic() < until:
                    if not self.do_work():
                        if self.join.pending_messages == 0:
                            break
                        time.sleep(0.005)
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
        held = lag = 0
        for role, stream in self.streams.items():
            state = stream.active
            if state is None or state.image.is_closed:
                continue
            held = max(held, state.held)
            if role == MESSAGES:
                lag = max(0, state.image.log.producer_position() - state.image.position)
        return RecorderStats(
            elapsed_s=time.monotonic() - self._started,
            messages=self._rows[schema.MESSAGES], packets=self._rows[schema.PACKETS], gaps=self._rows[schema.GAPS],
            files=self.writer.files_published, bytes=self.writer.bytes_published, commits=self._commits,
            held_bytes=held, lag_bytes=lag, pending_join=self.join.pending_messages,
            duplicates=self.timeline.duplicates, orphans=self.join.orphans, malformed=self._malformed,
            mismatches=self.join.mismatches, skipped_entries=self.join.skipped_entries,
            losses=self._losses, last_sequence=self.timeline.last_sequence, session=self.timeline.message_session,
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


__all__ = ["IN_FLIGHT", "Recorder", "RecorderConfig", "RecorderDataLoss", "RecorderError", "RecorderStats",
           "resume_channel"]
