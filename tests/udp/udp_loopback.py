"""A deterministic loopback of one network publication and one receiver, in virtual time, for the tests.

publication log (ExclusivePublication) -> PublicationSender -> Impairment -> ReceiverDispatcher/ImageReceiver
-> image log -> Image (subscriber); SMs and NAKs go back through a second Impairment.  The test plays the
conductor: pub-lmt = snd-pos + T/2 while connected, cleaning one term behind snd-pos.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from logbuf import ExclusivePublication, FragmentAssembler, Image, LogBuffers, Position
from logbuf.driver.udp import (
    CreateImage,
    FlowControl,
    ImageReceiver,
    ImageRemoved,
    Impairment,
    PublicationSender,
    ReceiverDispatcher,
    Reply,
)
from logbuf.logbuffer.term_cleaner import LogCleaner
from logbuf.protocol import ErrorFrame, Nak, RttMeasurement, StatusMessage, classify

SEQ = struct.Struct("<Q")


def message(seq: int, size: int) -> bytes:
    """``size`` bytes (>= 8) starting with the sequence number; the rest derived from it, so a mixed-up byte
    anywhere is caught."""
    body = bytes((seq * 31 + i) & 0xFF for i in range(size - SEQ.size))
    return SEQ.pack(seq) + body


@dataclass
class Config:
    term_length: int = 64 * 1024
    mtu: int = 1408
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay_ns: int = 50_000
    jitter_ns: int = 0
    seed: int = 1
    give_up_ns: int | None = None
    initial_term_id: int = 5
    flow_control: Callable[[], FlowControl] | None = None
    step_ns: int = 20_000
    max_datagrams: int = 4
    fragments_per_poll: int = 64
    # True drops a datagram on its way (after the impairment's dice): to make a loss nobody can repair
    drop_forward: Callable[[bytes], bool] | None = None
    drop_backward: Callable[[bytes], bool] | None = None


@dataclass
class Received:
    sequences: list[int] = field(default_factory=list)
    corrupt: int = 0


class Loopback:
    def __init__(self, make_log: Callable[..., LogBuffers], config: Config, *, name: str = "") -> None:
        self.config = c = config
        self._make_log = lambda file, **kwargs: make_log(name + file, **kwargs)
        self.now = 0
        self.pub_log = self._make_log("pub.logbuffer", term_length=c.term_length, mtu=c.mtu, session_id=77,
                                stream_id=1001, initial_term_id=c.initial_term_id)
        self.pub_lmt = Position.standalone(0)
        self.publication = ExclusivePublication(self.pub_log, self.pub_lmt)
        self.sender = PublicationSender(self.pub_log, self.now,
                                        flow_control=c.flow_control() if c.flow_control else None)
        self.cleaner = LogCleaner(self.pub_log, 0)
        self.forward = Impairment(c.drop, c.duplicate, c.reorder, c.delay_ns, c.seed, jitter_ns=c.jitter_ns)
        self.backward = Impairment(c.drop, c.duplicate, c.reorder, c.delay_ns, c.seed + 1000, jitter_ns=c.jitter_ns)
        self.sender_alive = True  # False: the sender process is gone (nothing more leaves it)
        self.received = Received()
        self.receivers_started = 0
        self.removed: list[ImageRemoved] = []
        self.start_receiver()

    # -- receiver process ----------------------------------------------------------------------------

    def start_receiver(self) -> None:
        """A (new) receiver: a fresh dispatcher with no images, as after a restart."""
        self.receivers_started += 1
        self.dispatcher = ReceiverDispatcher(receiver_id=1000 + self.receivers_started)
        self.dispatcher.add_subscription(1001)
        self.image: ImageReceiver | None = None
        self.subscriber: Image | None = None
        self.assembler = FragmentAssembler(self._on_message)

    def _on_message(self, buffer: memoryview, header: object) -> None:
        data = bytes(buffer)
        seq = SEQ.unpack_from(data)[0]
        if data != message(seq, len(data)):
            self.received.corrupt += 1
        self.received.sequences.append(seq)

    def _create_image(self, event: CreateImage) -> None:
        setup = event.setup
        log = self._make_log(f"image-{self.receivers_started}.logbuffer", term_length=setup.term_length,
                             mtu=setup.mtu, session_id=setup.session_id, stream_id=setup.stream_id,
                             initial_term_id=setup.initial_term_id)
        join = setup.join_position()
        self.image = ImageReceiver(log, join, self.now, receiver_id=self.dispatcher.receiver_id,
                                   give_up_ns=self.config.give_up_ns, counters=self.dispatcher.counters)
        self.subscriber = Image(log, Position.standalone(join))
        self.dispatcher.add_image(self.image, event.source)

    def _handle(self, events: list) -> None:
        for event in events:
            if isinstance(event, Reply):
                raw = event.frame.encode()
                if self.config.drop_backward is None or not self.config.drop_backward(raw):
                    self.backward.submit(raw, self.now)
            elif isinstance(event, CreateImage):
                self._create_image(event)
            elif isinstance(event, ImageRemoved):
                self.removed.append(event)
                self.image = None

    # -- one tick of every party ---------------------------------------------------------------------

    def step(self, *, poll_subscriber: bool = True) -> None:
        c = self.config
        self.now += c.step_ns
        now = self.now
        if self.sender_alive:
            for item in self.sender.poll(now, max_datagrams=c.max_datagrams):
                self._send(item)
        for datagram in self.forward.poll(now):
            self._handle(self.dispatcher.on_datagram(datagram, now, "sender"))
        if poll_subscriber and self.subscriber is not None:
            self.subscriber.poll(self.assembler, c.fragments_per_poll)
        consumption = self.subscriber.subscriber_position.get() if self.subscriber is not None else 0
        self._handle(self.dispatcher.poll(now, lambda image: consumption))
        for datagram in self.backward.poll(now):
            if not self.sender_alive:
                continue
            for frame in classify(datagram).frames:
                if isinstance(frame, StatusMessage):
                    self.sender.on_status_message(frame, now)
                elif isinstance(frame, Nak):
                    for item in self.sender.on_nak(frame, now):
                        self._send(item)
                elif isinstance(frame, RttMeasurement):
                    reply = self.sender.on_rtt_measurement(frame, now)
                    if reply is not None:
                        self._send(reply)
                elif isinstance(frame, ErrorFrame):
                    self.sender.on_error_frame(frame, now)
        self._conductor()

    def _send(self, item: object) -> None:
        raw = bytes(item.buffer)  # type: ignore[attr-defined]
        if self.config.drop_forward is None or not self.config.drop_forward(raw):
            self.forward.submit(raw, self.now)
        self.sender.on_sent(item, len(item.buffer), self.now)  # type: ignore[attr-defined,arg-type]

    def _conductor(self) -> None:
        snd_pos = self.sender.snd_pos
        T = self.config.term_length
        if self.sender.is_connected:
            self.pub_lmt.set(snd_pos + T // 2)
            self.pub_log.is_connected = True
        else:
            self.pub_lmt.set(snd_pos)
            self.pub_log.is_connected = False
        self.cleaner.clean_to(snd_pos - T)

    # -- helpers -------------------------------------------------------------------------------------

    def offer(self, data: bytes) -> bool:
        return self.publication.offer(data) > 0

    def publish(self, messages: list[bytes], *, max_steps: int = 200_000, poll_every: int = 1) -> int:
        """Offers every message (stepping while back-pressured); returns the steps taken."""
        steps = 0
        for data in messages:
            while not self.offer(data):
                self.step(poll_subscriber=steps % poll_every == 0)
                steps += 1
                if steps > max_steps:
                    raise AssertionError(f"stuck publishing at snd-pos {self.sender.snd_pos}")
        return steps

    def run_until(self, done: Callable[[], bool], *, max_steps: int = 200_000) -> int:
        steps = 0
        while not done():
            self.step()
            steps += 1
            if steps > max_steps:
                raise AssertionError(f"not done after {steps} steps; received {len(self.received.sequences)}")
        return steps

    def drain(self, count: int, *, max_steps: int = 200_000, poll_every: int = 1) -> int:
        steps = 0
        while len(self.received.sequences) < count:
            self.step(poll_subscriber=steps % poll_every == 0)
            steps += 1
            if steps > max_steps:
                raise AssertionError(f"received {len(self.received.sequences)} of {count}")
        return steps
