"""The commit protocol: what is handled becomes durable and visible, and only then is released to the driver.

One commit, in order::

    plan      per stream, how far the active image may be released (messages: to the first message
              still waiting for its DELIVERED row; capture: to the first entry still unjoined)
    seal      close + fsync every open file, still hidden (on the writer thread; polling goes on)
    checkpoint positions, session and gap state, totals and the sealed files (atomic rename)
    publish   rename the sealed files to their visible names (:mod:`logbuf.recorder.epoch_writer`)
    release   move each image's sub-pos to its planned position: the publisher may reuse that space

A commit is due (:meth:`CommitProtocol.reason`) when a file fills up (``rows_per_file``) or its hour ends,
when the held-back bytes of a stream reach its hold threshold (half of its publication window: the publisher
is never blocked for long), when a publisher finishes, every ``commit_interval_s``, and on stop.  One commit
is in flight at a time.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from logbuf.recorder.checkpoint import Checkpoint, ImageCheckpoint
from logbuf.recorder.epoch_writer import BackgroundWriter, EpochWriter, SealedFile
from logbuf.recorder.join import DeliveryJoin
from logbuf.recorder.losses import LossReport
from logbuf.recorder.streams import CAPTURE, MESSAGES, RecordedImage, StreamSet

Plan = dict[str, tuple[RecordedImage, ImageCheckpoint]]


@dataclass
class PendingCommit:
    """A commit whose files are being sealed on the writer thread."""

    reason: str
    plan: Plan
    checkpoint: Checkpoint  # all but the files to publish
    sealed: Future


class CommitProtocol:
    """Plans, starts and finishes commits of one recording (see the module doc)."""

    def __init__(self, root: Path, writer: EpochWriter, sink: BackgroundWriter, join: DeliveryJoin,
                 checkpoint: Checkpoint | None, interval_s: float, losses: LossReport) -> None:
        self.root = root
        self.writer = writer
        self.sink = sink
        self.join = join
        self.streams: StreamSet | None = None  # set once subscribed
        self.checkpoint = checkpoint  # the last commit's (the previous run's until this run commits)
        self.epoch = checkpoint.epoch if checkpoint else 0
        self.interval_s = interval_s
        self.losses = losses
        self.commits = 0  # finished in this run
        self.last_commit = time.monotonic()
        self.inflight: PendingCommit | None = None
        self._unpublished: list[SealedFile] = []

    def release_plan(self) -> Plan:
        """Per stream, the active image's checkpoint entry if everything staged were written now."""
        plan: Plan = {}
        for role, stream in (self.streams or {}).items():
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

    def reason(self, has_staged: bool) -> str | None:
        """Why a commit is due now (``None``: not due).  ``has_staged``: rows wait to be written."""
        if self.writer.has_sealed:
            return "file complete"
        plan = self.release_plan()
        progress = any(entry.released > state.released for state, entry in plan.values())
        for state, entry in plan.values():
            if entry.ended and not state.ended:
                # its last bytes may have been released before its end of stream was seen: only a commit marks
                # it ended, and the next image of its stream (whose partner the join may be waiting on) waits
                return "end of stream"
            held = state.held
            if not held:
                continue
            if held >= state.hold_threshold:
                if progress:
                    return "window"
                if self.join.pending_messages:
                    self.losses.warn_once("stalled", f"{self.join.pending_messages} messages are waiting for "
                                                     "their DELIVERED rows on the capture stream; is the feed "
                                                     "handler running with --capture?")
            if state.at_end() and progress:
                return "end of stream"  # the driver drains it only for a linger timeout: release it now
        if time.monotonic() - self.last_commit >= self.interval_s and (progress or self.writer.has_open or has_staged):
            return "interval"
        return None

    def begin(self, reason: str, *, clean_stop: bool, last_durable: dict | None, sessions: dict,
              open_gaps: list[dict], totals: dict[str, int]) -> None:
        """Takes the checkpoint of everything handled (the caller has queued every write) and queues the seal
        behind exactly those writes."""
        assert self.inflight is None, "one commit at a time"
        plan = self.release_plan()
        streams: dict[str, list[ImageCheckpoint]] = {}
        for role, stream in (self.streams or {}).items():
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
                if self.streams is not None and role in self.streams:
                    known |= self.streams[role].retired
                streams.setdefault(role, []).extend(i for i in images if i.session_id not in known and not i.ended)
        checkpoint = Checkpoint(epoch=self.epoch + 1, streams=streams, last_durable=last_durable, sessions=sessions,
                                open_gaps=open_gaps, totals=totals, clean_stop=clean_stop)
        self.inflight = PendingCommit(reason, plan, checkpoint, self.sink.seal_async())

    def finish(self, release: bool) -> None:
        """Waits for the seal, saves the checkpoint, publishes the files, then releases the images to the
        driver (``release``: the client is still open)."""
        inflight, self.inflight = self.inflight, None
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
        self.commits += 1
        self.last_commit = time.monotonic()
        for state, entry in inflight.plan.values():
            if release and not state.image.is_closed:
                state.image.release_to(entry.released)
            state.released = entry.released
            state.ended = entry.ended

    def sealed(self) -> bool:
        """A commit is in flight and its seal is done (:meth:`finish` will not wait)."""
        return self.inflight is not None and self.inflight.sealed.done()
