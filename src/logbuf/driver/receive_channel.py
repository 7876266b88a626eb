"""``ReceiveChannelEndpoint``: one UDP receive channel (its sockets), the streams subscribed on it, and the
images rebuilt from it (Aeron's ReceiveChannelEndpoint + DataPacketDispatcher).

Every receiver duty cycle:

1. :meth:`receive` - a few ``recvmmsg`` batches; data datagrams (already checked natively) go straight to
   their image, control datagrams through :func:`~logbuf.protocol.classify` to the dispatcher, malformed ones
   are counted ("Invalid packets") and dropped; a SETUP for a subscribed stream asks the conductor (the
   ``create_image`` callback) to create an image; subscribers of images that received data are woken;
2. :meth:`poll` - every image's loss scan, NAK timer, cleaning, liveness and status messages; replies go to
   the datagram's source (unicast) or to the control group (multicast); images that ended are handed to the
   ``image_removed`` callback.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from logbuf.driver.network_counters import NetworkCounters
from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.udp import CreateImage, ImageReceiver, ImageRemoved, ImageState, ReceiverDispatcher, Reply
from logbuf.driver.udp_channel import UdpChannel
from logbuf.driver.udp_transport import DATA, HEARTBEAT, MALFORMED, NOT_DATA, Received, UdpTransport
from logbuf.logbuffer.frame import HEADER_STRUCT
from logbuf.protocol.data import DataHeader
from logbuf.protocol.datagram import DataPacket, PacketKind

MAX_BATCHES_PER_CYCLE = 4

_KINDS = {PacketKind.DATA.value: PacketKind.DATA, PacketKind.PAD.value: PacketKind.PAD,
          PacketKind.HEARTBEAT.value: PacketKind.HEARTBEAT}
_unpack_header = HEADER_STRUCT.unpack_from
_unpack_ids = struct.Struct("<ii").unpack_from  # session id, stream id of a data frame
_IDS_OFFSET = 12

CreateImageCallback = Callable[["ReceiveChannelEndpoint", CreateImage, int], None]
ImageRemovedCallback = Callable[["ReceiveChannelEndpoint", PublicationImage, ImageState], None]


class ReceiveChannelEndpoint:
    def __init__(
        self,
        channel: UdpChannel,
        transport: UdpTransport,
        dispatcher: ReceiverDispatcher,
        counters: NetworkCounters,
        *,
        create_image: CreateImageCallback,
        image_removed: ImageRemovedCallback,
        status_counter_id: int = -1,
    ) -> None:
        self.channel = channel
        self.key = channel.receive_key
        self.transport = transport
        self.dispatcher = dispatcher
        self.receiver_id = dispatcher.receiver_id
        self.counters = counters
        self.status_counter_id = status_counter_id
        self.local_sockaddr_counter_id = -1  # rcv-local-sockaddr, when the conductor allocated one
        self._create_image = create_image
        self._image_removed = image_removed
        self.stream_refs: dict[int, int] = {}  # stream id -> subscriptions on it
        self.images: dict[tuple[int, int], PublicationImage] = {}
        # multicast: SM/NAK go to the control group, where the senders listen
        self._control = channel.control.sockaddr if channel.control is not None else None
        self._poll_due = True  # datagrams arrived (or images changed) since the last poll
        self._next_poll_ns = 0  # the images' next timer (SM, NAK, give-up, liveness)

    # -- subscriptions and images (conductor) ----------------------------------------------------------

    def add_subscription(self, stream_id: int) -> None:
        self.stream_refs[stream_id] = self.stream_refs.get(stream_id, 0) + 1
        self.dispatcher.add_subscription(stream_id)

    def remove_subscription(self, stream_id: int) -> list[PublicationImage]:
        """One subscription of ``stream_id`` fewer; the stream's images when it was the last (they end)."""
        refs = self.stream_refs.get(stream_id, 0) - 1
        if refs > 0:
            self.stream_refs[stream_id] = refs
            return []
        self.stream_refs.pop(stream_id, None)
        self.dispatcher.remove_subscription(stream_id)
        gone = [key for key in self.images if key[1] == stream_id]
        return [self.images.pop(key) for key in gone]

    @property
    def is_unused(self) -> bool:
        return not self.stream_refs

    def add_image(self, image: PublicationImage) -> None:
        self.images[(image.session_id, image.stream_id)] = image
        self.dispatcher.add_image(image.receiver, image.source)
        self._poll_due = True

    def images_of(self, stream_id: int) -> list[PublicationImage]:
        return [image for key, image in self.images.items() if key[1] == stream_id]

    # -- receiver duty ---------------------------------------------------------------------------------

    def receive(self, now_ns: int) -> int:
        """Reads what arrived (a few batches at most); returns the datagrams handled.

        In-order DATA for an image with nothing missing - nearly everything on a healthy network - goes into
        the image natively, a run of datagrams per call (:meth:`PublicationImage.rebuild_in_order`); every
        other datagram takes the Python path (:meth:`_on_received`)."""
        transport = self.transport
        if transport.receive_impairment is not None:
            return self._receive_impaired(now_ns)
        work = 0
        poll_due = False
        images = self.images
        counters = self.dispatcher.counters
        arrays = transport.batch_arrays
        kinds = transport.kinds
        for _ in range(MAX_BATCHES_PER_CYCLE):
            n = transport.receive_raw()
            i = 0
            while i < n:
                if kinds[i] == DATA:
                    image = images.get(_unpack_ids(transport.slot(i), _IDS_OFFSET))
                    if image is not None:
                        taken, taken_bytes = image.rebuild_in_order(arrays, i, n, now_ns)
                        if taken > i:
                            counters.bytes_received += taken_bytes
                            i = taken
                            continue
                poll_due |= self._on_received(transport.received(i), now_ns)
                i += 1
            work += n
            if n < transport.options.receive_batch:
                break
        self._after_receive(work, poll_due, now_ns)
        return work

    def _receive_impaired(self, now_ns: int) -> int:
        """Through a receive impairment every datagram is a copy: all of them take the Python path."""
        work = 0
        poll_due = False
        for _ in range(MAX_BATCHES_PER_CYCLE):
            batch = self.transport.receive(now_ns)
            for received in batch:
                poll_due |= self._on_received(received, now_ns)
            work += len(batch)
            if len(batch) < self.transport.options.receive_batch:
                break
        self._after_receive(work, poll_due, now_ns)
        return work

    def _on_received(self, received: Received, now_ns: int) -> bool:
        """One datagram through the dispatcher; True when the images must be polled for it."""
        datagram, source, kind, frame_count, term_span = received
        dispatcher = self.dispatcher
        if kind > 0:
            fields = _unpack_header(datagram, 0)
            header = DataHeader(fields[0], fields[4], fields[5], fields[6], fields[7], fields[2], fields[3], fields[8])
            packet = DataPacket(_KINDS[kind], header, frame_count, len(datagram), term_span)
            events = dispatcher.on_packet(packet, datagram, now_ns, source)
            poll_due = kind == HEARTBEAT  # it may end the stream or reveal loss at the tail
        elif kind == NOT_DATA:
            events = dispatcher.on_datagram(datagram, now_ns, source)
            poll_due = True
        else:
            assert kind == MALFORMED
            dispatcher.on_invalid(len(datagram))
            return False
        if events:
            self._handle(events, now_ns)
            poll_due = True
        return poll_due

    def _after_receive(self, work: int, poll_due: bool, now_ns: int) -> None:
        if work:
            for image in self.images.values():
                poll_due |= image.receiver.rebuild_position < image.receiver.hwm_position  # a gap to chase
                if image.update_positions():
                    image.waker.wake()
            self._poll_due |= poll_due
        if self.transport.send_impairment is not None:
            self.transport.service(now_ns)

    def poll(self, now_ns: int) -> int:
        """Loss, cleaning, liveness and SMs of every image; returns work done.

        Skipped (a few loads) unless something arrived that needs it (a gap, a heartbeat, control frames, a
        new image), a subscriber moved far enough to owe an SM or free space to clean, or one of the images'
        timers is due: an image's poll would find nothing to do otherwise."""
        images = self.images
        if not images and not self.dispatcher.images:
            return 0
        if (not self._poll_due and now_ns < self._next_poll_ns
                and not any(image.receiver.poll_needed(image.consumption_position()) for image in images.values())):
            return 0
        events = self.dispatcher.poll(now_ns, self._consumption_position)
        for image in images.values():
            if image.update_positions():
                image.waker.wake()  # e.g. a retransmit filled a gap: the frames behind it became readable
            image.update_tail()
        if events:
            self._handle(events, now_ns)
        self._poll_due = False
        self._next_poll_ns = min((image.receiver.next_deadline_ns() for image in self.images.values()),
                                 default=now_ns + 1_000_000_000)
        return len(events)

    def _consumption_position(self, receiver: ImageReceiver) -> int:
        image = self.images.get((receiver.session_id, receiver.stream_id))
        if image is None:
            return receiver.rebuild_position
        return image.consumption_position()

    def _handle(self, events: list, now_ns: int) -> None:
        for event in events:
            if isinstance(event, Reply):
                frame = event.frame.encode()
                destination = self._control if self._control is not None else event.destination
                if destination is None:
                    continue
                self.counters.control_bytes_sent += len(frame)
                self.transport.send([frame], destination, now_ns)
            elif isinstance(event, CreateImage):
                self._create_image(self, event, now_ns)
            elif isinstance(event, ImageRemoved):
                image = self.images.pop((event.session_id, event.stream_id), None)
                if image is not None:
                    self._image_removed(self, image, event.reason)

    def close(self) -> None:
        self.transport.close()

    def __repr__(self) -> str:
        return f"ReceiveChannelEndpoint({self.key}, streams {sorted(self.stream_refs)}, {len(self.images)} images)"
