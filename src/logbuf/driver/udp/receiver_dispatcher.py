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

A dispatcher made with ``manual=True`` is an MDS endpoint's (``control-mode=manual``): datagrams arrive
through several receive destinations (``destination=`` of :meth:`ReceiverDispatcher.on_datagram`), one image
per session is fed by all of them, and each image keeps a connection per destination it heard its sender on
(the source address, when last heard): SMs and NAKs go to every connection heard from in the last
:data:`DESTINATION_TIMEOUT_NS`, ERR frames to every connection; a reply's ``destination`` is then
``(destination, source)``.  :meth:`ReceiverDispatcher.remove_destination` drops a destination's connections.

Malformed datagrams are counted ("Invalid packets") and dropped; nothing a peer sends raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from logbuf.driver.udp.counters import ReceiverCounters
from logbuf.driver.udp.image_receiver import ImageReceiver, ImageState
from logbuf.protocol.datagram import ControlFrame, DataPacket, Packet, PacketKind, classify
from logbuf.protocol.error_frame import ErrorFrame
from logbuf.protocol.header import MalformedFrameError
from logbuf.protocol.rttm import RttMeasurement
from logbuf.protocol.setup import SetupFrame
from logbuf.protocol.status_message import SEND_SETUP_FLAG, StatusMessage

DEFAULT_ELICIT_INTERVAL_NS = 100_000_000
DEFAULT_PENDING_TIMEOUT_NS = 1_000_000_000
DEFAULT_COOL_DOWN_NS = 1_000_000_000
DESTINATION_TIMEOUT_NS = 5_000_000_000  # MDS: an image answers a destination heard from this recently
MAX_CONNECTIONS = 16  # MDS: connections an image keeps (one per destination)


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


class _Connection:
    __slots__ = ("destination", "source", "last_ns")

    def __init__(self, destination: Any, source: Any, last_ns: int) -> None:
        self.destination = destination
        self.source = source
        self.last_ns = last_ns


class _Entry:
    __slots__ = ("image", "source", "rejoin", "connections")

    def __init__(self, image: ImageReceiver, source: Any, rejoin: bool) -> None:
        self.image = image
        self.source = source
        self.rejoin = rejoin
        self.connections: list[_Connection] = []  # MDS

    def track(self, destination: Any, source: Any, now_ns: int) -> None:
        """MDS: heard the sender through ``destination`` (a new connection the first time)."""
        for connection in self.connections:
            if connection.destination == destination:
                connection.last_ns = now_ns
                return
        if len(self.connections) < MAX_CONNECTIONS and source:
            self.connections.append(_Connection(destination, source, now_ns))


class ReceiverDispatcher:
    def __init__(
        self,
        receiver_id: int,
        *,
        counters: ReceiverCounters | None = None,
        elicit_interval_ns: int = DEFAULT_ELICIT_INTERVAL_NS,
        pending_timeout_ns: int = DEFAULT_PENDING_TIMEOUT_NS,
        cool_down_ns: int = DEFAULT_COOL_DOWN_NS,
        manual: bool = False,
    ) -> None:
        self.receiver_id = receiver_id
        self.manual = manual
        self.counters = ReceiverCounters() if counters is None else counters
        self.elicit_interval_ns = elicit_interval_ns
        self.pending_timeout_ns = pending_timeout_ns
        self.cool_down_ns = cool_down_ns
        self.subscriptions: set[int] = set()
        self.images: dict[tuple[int, int], _Entry] = {}
        self._pending: dict[tuple[int, int], int] = {}  # CreateImage emitted at
        self._elicited: dict[tuple[int, int], int] = {}  # SETUP asked for at
        self._cool_down: dict[tuple[int, int], float] = {}  # ignored until (inf: rejoin=false)
        self._draining: list[_Entry] = []  # images whose subscriptions went: EOS SMs, then ImageRemoved

    # -- driver commands -----------------------------------------------------------------------------

    def add_subscription(self, stream_id: int) -> None:
        self.subscriptions.add(stream_id)

    def remove_subscription(self, stream_id: int, now_ns: int = 0) -> None:
        """The stream's last subscription went: its images take no more data and drain
        (:meth:`ImageReceiver.drain`: EOS SMs for a while), then :meth:`poll` reports each ``REMOVED``; a new
        subscription meanwhile gets new images."""
        self.subscriptions.discard(stream_id)
        for key in [key for key in self.images if key[1] == stream_id]:
            entry = self.images.pop(key)
            entry.image.drain(now_ns)
            self._draining.append(entry)
        for table in (self._pending, self._elicited, self._cool_down):
            for key in [k for k in table if k[1] == stream_id]:
                del table[key]

    def add_image(self, image: ImageReceiver, source: Any = None, *, rejoin: bool = True, destination: Any = None,
                  now_ns: int = 0) -> None:
        """``rejoin=False``: once the image ends, its session is not joined again while subscribed.  MDS: its
        first connection is ``destination`` (the one its SETUP came through) and ``source``, heard at
        ``now_ns``."""
        key = (image.session_id, image.stream_id)
        entry = self.images[key] = _Entry(image, source, rejoin)
        if self.manual:
            entry.track(destination, source, now_ns)
        self._pending.pop(key, None)
        self._elicited.pop(key, None)

    def remove_destination(self, destination: Any) -> None:
        """MDS: no image answers through ``destination`` any more."""
        for entry in self.images.values():
            connections = entry.connections
            k = 0
            while k < len(connections):  # the last one takes a removed one's place (as the agent's array)
                if connections[k].destination == destination:
                    connections[k] = connections[-1]
                    connections.pop()
                else:
                    k += 1

    def image(self, session_id: int, stream_id: int) -> ImageReceiver | None:
        entry = self.images.get((session_id, stream_id))
        return None if entry is None else entry.image

    # -- datagrams -----------------------------------------------------------------------------------

    def on_datagram(self, datagram: bytes | memoryview, now_ns: int, source: Any = None,
                    destination: Any = None) -> list[Event]:
        """One datagram from ``source`` (MDS: through ``destination``)."""
        try:
            packet = classify(datagram)
        except MalformedFrameError:
            self.on_invalid(len(datagram))
            return []
        return self.on_packet(packet, datagram, now_ns, source, destination)

    def on_invalid(self, length: int) -> None:
        """A datagram the caller found malformed (its own check, e.g. the driver's native one): counted."""
        self.counters.bytes_received += length
        self.counters.invalid_packets += 1

    def on_packet(self, packet: Packet, datagram: bytes | memoryview, now_ns: int, source: Any = None,
                  destination: Any = None) -> list[Event]:
        """A datagram already classified (by :func:`classify`, or a check that applies the same rules)."""
        self.counters.bytes_received += len(datagram)
        if isinstance(packet, DataPacket):
            return self._on_data(packet, datagram, now_ns, source, destination)
        out: list[Event] = []
        for frame in packet.frames:
            if isinstance(frame, SetupFrame):
                out.extend(self._on_setup(frame, now_ns, source, destination))
            elif isinstance(frame, RttMeasurement):
                entry = self.images.get((frame.session_id, frame.stream_id))
                if entry is not None:
                    entry.image.on_rtt_measurement(frame, now_ns)
            # SM, NAK and ERR are for senders: not ours to act on
        return out

    def _reply_to(self, source: Any, destination: Any) -> Any:
        return (destination, source) if self.manual else source

    def _on_data(self, packet: DataPacket, datagram: Any, now_ns: int, source: Any, destination: Any) -> list[Event]:
        key = (packet.header.session_id, packet.header.stream_id)
        entry = self.images.get(key)
        if entry is not None:
            heard = entry.image.packets_heard
            entry.image.on_data(packet, datagram, now_ns)
            if self.manual and entry.image.packets_heard != heard:
                entry.track(destination, source, now_ns)
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
        return [Reply(sm, self._reply_to(source, destination))]

    def _on_setup(self, setup: SetupFrame, now_ns: int, source: Any, destination: Any) -> list[Event]:
        key = (setup.session_id, setup.stream_id)
        entry = self.images.get(key)
        if entry is not None:
            if self.manual:
                entry.track(destination, source, now_ns)
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

    def _replies(self, entry: _Entry, frames: list[ControlFrame], now_ns: int) -> list[Event]:
        if self.manual:
            return [Reply(frame, (c.destination, c.source)) for frame in frames for c in entry.connections
                    if isinstance(frame, ErrorFrame) or now_ns < c.last_ns + DESTINATION_TIMEOUT_NS]
        return [Reply(frame, entry.source) for frame in frames]

    def poll(self, now_ns: int, consumption_position: Callable[[ImageReceiver], int]) -> list[Event]:
        """Polls every image (``consumption_position(image)`` gives its slowest subscriber's position) and
        removes those that ended."""
        out: list[Event] = []
        for key, entry in list(self.images.items()):
            image = entry.image
            out.extend(self._replies(entry, image.poll(now_ns, consumption_position(image)), now_ns))
            if image.state is not ImageState.ACTIVE:
                del self.images[key]
                self._cool_down[key] = now_ns + self.cool_down_ns if entry.rejoin else math.inf
                out.append(ImageRemoved(key[0], key[1], image.state))
        for entry in list(self._draining):
            image = entry.image
            frames = image.poll(now_ns, image.rebuild_position)
            out.extend(self._replies(entry, frames, now_ns))
            if image.state is not ImageState.ACTIVE:
                self._draining.remove(entry)
                out.append(ImageRemoved(image.session_id, image.stream_id, image.state))
        return out
