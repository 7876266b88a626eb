"""The recorder's streams and their images: subscription, adoption (with resume), retirement.

Each of the three roles (messages, events, capture) is one subscription; each publisher of it is one image,
recorded one at a time in arrival order (``images[0]`` is active, a later one waits until the one before it
has ended and everything it published is in complete files).

**Adoption.**  A new image is *held* (:meth:`Image.hold_position`) before its first poll: polling moves only
the read cursor, while its sub-pos - which holds the publisher back and stops the driver cleaning - moves
only when the commit protocol releases it.

**Restart.**  Each stream is subscribed with ``resume-position=<session>:<released>`` from the checkpoint:
the driver joins the image where the last run released it while that data is still in the log.  What the
checkpoint says is recorded is skipped (capture rows by position and count).  If the driver could not honour
the position (``join_position`` beyond it) or a publisher of the checkpoint does not come back within
``IMAGE_GRACE_S``, that is a loss (:mod:`logbuf.recorder.losses`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from logbuf.client.client import Client
from logbuf.client.image import Image
from logbuf.client.subscription import Subscription
from logbuf.logbuffer.header import Header
from logbuf.recorder.checkpoint import Checkpoint
from logbuf.recorder.config import RecorderConfig
from logbuf.recorder.losses import LossReport

MESSAGES, EVENTS, CAPTURE = "messages", "events", "capture"
IMAGE_GRACE_S = 2.0  # how long a restarted recorder waits for the publishers of its checkpoint
_MIN_HOLD_BYTES = 4096

EventHandler = Callable[[memoryview, Header], None]


class RecordedImage:
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
        self.hold_threshold = hold_bytes or max(_MIN_HOLD_BYTES, window // 2)
        self.ended = False  # finished, and everything up to its end is in complete files
        self.resumed_exactly = False
        self.handler: EventHandler | None = None

    @property
    def held(self) -> int:
        """Bytes read but not yet released to the driver."""
        return self.image.position - self.released

    def at_end(self) -> bool:
        """Its publisher finished and everything it published is handled.  A closed image is asked too (its
        log stays mapped while the image holds it): the driver closes an image as soon as every sub-pos is at
        its end, so one released to its end before its publisher finished may close before a cycle saw it
        open at its end."""
        image = self.image
        if self.end_of_stream is None and image.is_end_of_stream():
            self.end_of_stream = image.log.end_of_stream_position
        return self.end_of_stream is not None and self.processed >= self.end_of_stream


class Stream:
    """One role's subscription and the images of it adopted so far."""

    __slots__ = ("role", "stream_id", "subscription", "images", "adopted", "retired")

    def __init__(self, role: str, stream_id: int, subscription: Subscription) -> None:
        self.role = role
        self.stream_id = stream_id
        self.subscription = subscription
        self.images: list[RecordedImage] = []  # in arrival order; images[0] is the one being recorded
        self.adopted: set[int] = set()
        self.retired: set[int] = set()  # session ids of images finished (or given up) in this run

    @property
    def active(self) -> RecordedImage | None:
        return self.images[0] if self.images else None


def resume_channel(channel: str, positions: dict[int, int]) -> str:
    """``channel`` with ``resume-position=<session>:<position>,...`` added (Aeron URI syntax)."""
    if not positions:
        return channel
    value = ",".join(f"{session}:{position}" for session, position in sorted(positions.items()))
    return f"{channel}{'|' if '?' in channel else '?'}resume-position={value}"


class StreamSet(Mapping[str, Stream]):
    """The recorder's streams by role.  ``checkpoint`` gives the latest commit's checkpoint (``None`` on a
    new recording): resume positions and owed publishers come from it."""

    def __init__(self, client: Client, config: RecorderConfig, losses: LossReport,
                 checkpoint: Callable[[], Checkpoint | None], event_handler: Callable[[RecordedImage], EventHandler]
                 ) -> None:
        self._config = config
        self._losses = losses
        self._checkpoint = checkpoint
        self._event_handler = event_handler
        self._started = time.monotonic()
        self._streams: dict[str, Stream] = {}
        start = checkpoint()
        self._missing_checked = start is None
        self._alignment_decided = False
        # capture first: a DELIVERED row is published after its message, so joining capture no later than
        # messages means every message we see has its row still to come
        for role, stream_id in ((CAPTURE, config.capture_stream), (EVENTS, config.events_stream),
                                (MESSAGES, config.messages_stream)):
            if stream_id is None:
                continue
            positions = {}
            if start is not None:
                positions = {i.session_id: i.released for i in start.streams.get(role, ()) if not i.ended}
            subscription = client.add_subscription(resume_channel(config.channel, positions), stream_id)
            self._streams[role] = Stream(role, stream_id, subscription)
        # idle waits sleep on the busiest stream's semaphore (each stream has its own)
        self.wait_subscription = self._streams.get(MESSAGES, next(iter(self._streams.values()))).subscription

    def __getitem__(self, role: str) -> Stream:
        return self._streams[role]

    def __iter__(self) -> Iterator[str]:
        return iter(self._streams)

    def __len__(self) -> int:
        return len(self._streams)

    def active(self, role: str) -> RecordedImage | None:
        """The image of ``role`` being recorded, if that stream is recorded and has one."""
        stream = self._streams.get(role)
        return stream.active if stream else None

    # -- adoption ----------------------------------------------------------------------------------------

    def adopt(self) -> bool | None:
        """Takes up the images that appeared since the last call.  Returns, once per restart, whether the
        messages and capture streams both resumed exactly where the last commit left them (then the join
        pairs them by position from the start); ``None`` otherwise."""
        for stream in self._streams.values():
            for image in stream.subscription.images:
                if image.correlation_id in stream.adopted:
                    continue
                stream.adopted.add(image.correlation_id)
                image.hold_position()  # before the first poll: nothing is released until it is durable
                state = RecordedImage(image, self._config.hold_bytes)
                if stream.role == EVENTS:
                    state.handler = self._event_handler(state)
                self._resume(stream, state)
                stream.images.append(state)
        aligned = None
        if not self._alignment_decided and self._checkpoint() is not None:
            pair = [self.active(r) for r in (MESSAGES, CAPTURE) if r in self._streams]
            active = [p for p in pair if p is not None]
            if len(active) == 2:
                aligned = all(p.resumed_exactly for p in active)
                self._alignment_decided = True
        if not self._missing_checked and time.monotonic() - self._started >= IMAGE_GRACE_S:
            self._missing_checked = True
            self._check_missing_publishers()
        return aligned

    def _resume(self, stream: Stream, state: RecordedImage) -> None:
        checkpoint = self._checkpoint()
        cp = checkpoint.image(stream.role, state.image.session_id) if checkpoint else None
        if checkpoint is None or cp is None:
            return
        join = state.image.join_position
        if join > cp.released:
            self._losses.loss(stream.role, f"the driver no longer had positions {cp.released}..{join} of stream "
                                           f"{stream.stream_id} session {cp.session_id} (restarted too late?)",
                              after_stop=checkpoint.clean_stop, session_id=cp.session_id,
                              first_position=cp.released, end_position=join)
        else:
            state.resumed_exactly = join == cp.released
            state.skip_packets_through = cp.written_through
            if state.resumed_exactly:
                state.skip_frame, state.skip_entries = cp.released, cp.skip_entries

    def _check_missing_publishers(self) -> None:
        checkpoint = self._checkpoint()
        assert checkpoint is not None
        for role, images in checkpoint.streams.items():
            stream = self._streams.get(role)
            seen = {s.image.session_id for s in stream.images} if stream else set()
            for cp in images:
                if not cp.ended and cp.session_id not in seen:
                    self._losses.loss(role, f"the publisher of stream {cp.stream_id} session {cp.session_id} is "
                                            f"gone: what it published after position {cp.released} was not "
                                            "recorded",
                                      after_stop=checkpoint.clean_stop, session_id=cp.session_id,
                                      first_position=cp.released, end_position=None)

    # -- retirement --------------------------------------------------------------------------------------

    def retire_finished(self) -> None:
        """A finished image whose every byte is recorded makes way for the next image of its stream.  One the
        driver closed before it was all read (its publisher went and the drain timed out) is a loss.  Call
        only while the client is open (images close with the client: nothing to conclude then)."""
        for stream in self._streams.values():
            while stream.images:
                state = stream.images[0]
                # closed at its end: not a loss; the commit that marks it ended comes first ("end of stream")
                if state.image.is_closed and not state.ended and not state.at_end():
                    state.ended = True
                    self._losses.loss(stream.role, f"the image of stream {stream.stream_id} session "
                                                   f"{state.image.session_id} closed at position "
                                                   f"{state.image.position} before the recorder read all of it",
                                      session_id=state.image.session_id, first_position=state.image.position,
                                      end_position=None)
                if not (state.ended and (len(stream.images) > 1 or state.image.is_closed)):
                    break
                stream.retired.add(state.image.session_id)
                stream.images.pop(0)
