"""``ReceiverDispatcher``: routes a receive channel's datagrams to images, sans-IO (Aeron's
DataPacketDispatcher).

Per ``(session id, stream id)`` of a subscribed stream:

- DATA / PAD / heartbeat for an image we have: to the image;
- DATA for a session we have no image for: ask the sender for a SETUP (an SM with flag 0x80), at most once
  per ``elicit_interval_ns`` - this is how a receiver that starts or restarts mid-stream joins (not for an
  end-of-stream heartbeat: an ended stream is not worth joining);
- SETUP for a session we have no image for: a :class:`CreateImage` event (once; again after
  ``pending_timeout_ns`` if the driver never added the image) - the conductor creates the image log with the
  SETUP's initial term id, term length and MTU, then calls :meth:`add_image` with an :class:`ImageReceiver`
  starting at ``setup.join_position()``;
- an image that timed out or reached end of stream is removed (:class:`ImageRemoved`) and its session is
  ignored for ``cool_down_ns``, so a lingering sender's heartbeats do not recreate it at once; an image added
  with ``rejoin=False`` (Aeron's ``rejoin=false``) leaves its session ignored until the stream is unsubscribed.

Malformed datagrams are counted ("Invalid packets") and dropped; nothing a peer sends raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from logbuf.driver.udp.counters import ReceiverCounters
from logbuf.driver.udp.image_receiver import ImageReceiver, ImageState
from logbuf.protocol.datagram import ControlFrame, DataPacket, Packet, PacketKind, classify
from logbuf.protocol.header import MalformedFrameError
from logbuf.protocol.rttm import RttMeasurement
from logbuf.protocol.setup import SetupFrame
from logbuf.protocol.status_message import SEND_SETUP_FLAG, StatusMessage

DEFAULT_ELICIT_INTERVAL_NS = 100_000_000
DEFAULT_PENDING_TIMEOUT_NS = 1_000_000_000
DEFAULT_COOL_DOWN_NS = 1_000_000_000


class Reply(NamedTuple):
    """A control frame to send to ``destination`` (the source address the frame answers)."""

    frame: ControlFrame
    destination: Any


class CreateImage(NamedTuple):
    setup: SetupFrame
    source: Any


class ImageRemoved(NamedTuple):
    session_id: int
    stream_id: int
    reason: ImageState


Event = Reply | CreateImage | ImageRemoved


class _Entry:
    __slots__ = ("image", "source", "rejoin")

    def __init__(self, image: ImageReceiver, source: Any, rejoin: bool) -> None:
        self.image = image
        self.source = source
        self.rejoin = rejoin


class ReceiverDispatcher:
    def __init__(
        self,
        receiver_id: int,
        *,
        counters: ReceiverCounters | None = None,
        elicit_interval_ns: int = DEFAULT_ELICIT_INTERVAL_NS,
        pending_timeout_ns: int = DEFAULT_PENDING_TIMEOUT_NS,
        cool_down_ns: int = DEFAULT_COOL_DOWN_NS,
    ) -> None:
        self.receiver_id = receiver_id
        self.counters = ReceiverCounters() if counters is None else counters
        self.elicit_interval_ns = elicit_interval_ns
        self.pending_timeout_ns = pending_timeout_ns
        self.cool_down_ns = cool_down_ns
        self.subscriptions: set[int] = set()
        self.images: dict[tuple[int, int], _Entry] = {}
        self._pending: dict[tuple[int, int], int] = {}  # CreateImage emitted at
        self._elicited: dict[tuple[int, int], int] = {}  # SETUP asked for at
        self._cool_down: dict[tuple[int, int], float] = {}  # ignored until (inf: rejoin=false)

    # -- driver commands -----------------------------------------------------------------------------

    def add_subscription(self, stream_id: int) -> None:
        self.subscriptions.add(stream_id)

    def remove_subscription(self, stream_id: int) -> list[ImageRemoved]:
        self.subscriptions.discard(stream_id)
        removed = [key for key in self.images if key[1] == stream_id]
        for key in removed:
            del self.images[key]
        for table in (self._pending, self._elicited, self._cool_down):
            for key in [k for k in table if k[1] == stream_id]:
                del table[key]
        return [ImageRemoved(s, st, ImageState.ACTIVE) for s, st in removed]

    def add_image(self, image: ImageReceiver, source: Any = None, *, rejoin: bool = True) -> None:
        """``rejoin=False``: once the image ends, its session is not joined again while subscribed."""
        key = (image.session_id, image.stream_id)
        self.images[key] = _Entry(image, source, rejoin)
        self._pending.pop(key, None)
        self._elicited.pop(key, None)

    def image(self, session_id: int, stream_id: int) -> ImageReceiver | None:
        entry = self.images.get((session_id, stream_id))
        return None if entry is None else entry.image

    # -- datagrams -----------------------------------------------------------------------------------

    def on_datagram(self, datagram: bytes | memoryview, now_ns: int, source: Any = None) -> list[Event]:
        try:
            packet = classify(datagram)
        except MalformedFrameError:
            self.on_invalid(len(datagram))
            return []
        return self.on_packet(packet, datagram, now_ns, source)

    def on_invalid(self, length: int) -> None:
        """A datagram the caller found malformed (its own check, e.g. the driver's native one): counted."""
        self.counters.bytes_received += length
        self.counters.invalid_packets += 1

    def on_packet(self, packet: Packet, datagram: bytes | memoryview, now_ns: int, source: Any = None) -> list[Event]:
        """A datagram already classified (by :func:`classify`, or a check that applies the same rules)."""
        self.counters.bytes_received += len(datagram)
        if isinstance(packet, DataPacket):
            return self._on_data(packet, datagram, now_ns, source)
        out: list[Event] = []
        for frame in packet.frames:
            if isinstance(frame, SetupFrame):
                out.extend(self._on_setup(frame, now_ns, source))
            elif isinstance(frame, RttMeasurement):
                entry = self.images.get((frame.session_id, frame.stream_id))
                if entry is not None:
                    entry.image.on_rtt_measurement(frame, now_ns)
            # SM, NAK and ERR are for senders: not ours to act on
        return out

    def _on_data(self, packet: DataPacket, datagram: Any, now_ns: int, source: Any) -> list[Event]:
        key = (packet.header.session_id, packet.header.stream_id)
        entry = self.images.get(key)
        if entry is not None:
            entry.image.on_data(packet, datagram, now_ns)
            return []
        if key[1] not in self.subscriptions or key in self._pending or self._cooling(key, now_ns):
            return []
        if packet.kind is PacketKind.HEARTBEAT and packet.header.is_end_of_stream:
            return []  # a stream that has ended is not worth joining
        last = self._elicited.get(key)
        if last is not None and now_ns - last < self.elicit_interval_ns:
            return []
        self._elicited[key] = now_ns
        sm = StatusMessage(key[0], key[1], 0, 0, 0, self.receiver_id, SEND_SETUP_FLAG)
        self.counters.status_messages_sent += 1
        return [Reply(sm, source)]

    def _on_setup(self, setup: SetupFrame, now_ns: int, source: Any) -> list[Event]:
        key = (setup.session_id, setup.stream_id)
        entry = self.images.get(key)
        if entry is not None:
            entry.image.on_setup(setup, now_ns)
            return []
        if key[1] not in self.subscriptions or self._cooling(key, now_ns):
            return []
        since = self._pending.get(key)
        if since is not None and now_ns - since < self.pending_timeout_ns:
            return []
        self._pending[key] = now_ns
        return [CreateImage(setup, source)]

    def _cooling(self, key: tuple[int, int], now_ns: int) -> bool:
        until = self._cool_down.get(key)
        if until is None:
            return False
        if now_ns < until:
            return True
        del self._cool_down[key]
        return False

    # -- duty cycle ----------------------------------------------------------------------------------

    def poll(self, now_ns: int, consumption_position: Callable[[ImageReceiver], int]) -> list[Event]:
        """Polls every image (``consumption_position(image)`` gives its slowest subscriber's position) and
        removes those that ended."""
        out: list[Event] = []
        for key, entry in list(self.images.items()):
            image = entry.image
            frames = image.poll(now_ns, consumption_position(image))
            if frames:
                out.extend(Reply(frame, entry.source) for frame in frames)
            if image.state is not ImageState.ACTIVE:
                del self.images[key]
                self._cool_down[key] = now_ns + self.cool_down_ns if entry.rejoin else math.inf
                out.append(ImageRemoved(key[0], key[1], image.state))
        return out
