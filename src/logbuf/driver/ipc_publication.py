"""The conductor's duties for one IPC publication (a log shared by publishers and subscribers on this host).

Every duty cycle: sample pub-pos from the active tail; move pub-lmt to ``min(sub-pos) + window`` once it has
grown by more than the trip gain (window/8: fewer writes to a hot cache line); clean the terms behind the
slowest subscriber; with no subscribers, pub-lmt falls back to the consumer position and isConnected is
false.  On the timer: unblock a claim that has held the consumers still for longer than the unblock timeout;
once the publication drains (no publisher left), at once: a claim still open there was left by a dead publisher.

A closed publication drains as aeronmd's does: it stays until every subscriber that holds it back (tethered,
or untethered and not resting) has read to the end of stream, with no deadline.  A subscriber that leaves (its
subscription closed, or its client timed out) no longer holds it; an untethered one that stalls goes through
linger to resting and no longer counts.  The channel's linger does not cut a subscriber's tail off.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence

from logbuf.driver.lifecycle import PublicationEvent, PublicationLifecycle, PublicationState
from logbuf.driver.windows import (
    check_publication_window,
    publication_window,
    trip_gain,
    untethered_window_limit,
)
from logbuf.logbuffer.frame import FRAME_ALIGNMENT
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.logbuffer.term_cleaner import LogCleaner
from logbuf.logbuffer.term_unblocker import unblock
from logbuf.position import Position

DEFAULT_UNBLOCK_TIMEOUT_NS = 15_000_000_000


class IpcPublicationDuty:
    def __init__(
        self,
        log: LogBuffers,
        publisher_position: Position,
        publisher_limit: Position,
        subscriber_positions: Callable[[], Sequence[Position]],
        *,
        window_length: int | None = None,
        unblock_timeout_ns: int = DEFAULT_UNBLOCK_TIMEOUT_NS,
        on_unblocked: Callable[[], None] | None = None,
    ) -> None:
        self.log = log
        self.publisher_position = publisher_position
        self.publisher_limit = publisher_limit
        self.subscriber_positions = subscriber_positions
        self.window_length = window_length or publication_window(log.term_length)
        check_publication_window(self.window_length, log.term_length, network=False)
        self.trip_gain = trip_gain(self.window_length)
        self.unblock_timeout_ns = unblock_timeout_ns
        self.on_unblocked = on_unblocked
        consumer = log.producer_position()
        self.cleaner = LogCleaner(log, consumer)
        self.trip_limit = 0
        self.consumer_position = consumer
        self._last_consumer_position = consumer
        self._time_of_last_consumer_move_ns: int | None = None
        self.unblocked_count = 0

    def update(self) -> int:
        """One duty cycle: pub-pos, pub-lmt, cleaning, isConnected.  Returns work done (0 when idle)."""
        work = 0
        producer = self.log.producer_position()
        self.publisher_position.set(producer)
        positions = self.subscriber_positions()
        if positions:
            min_sub = min(p.get() for p in positions)
            self.consumer_position = max(min_sub, self.consumer_position)
            proposed = min_sub + self.window_length
            if proposed > self.trip_limit:
                # never clean past what a subscriber may still be reading, nor past the producer
                work += self.cleaner.clean_to(min(min_sub, producer))
                self.publisher_limit.set(proposed)
                self.trip_limit = proposed + self.trip_gain
                work += 1
            if not self.log.is_connected:
                self.log.is_connected = True
        else:
            # no subscriber: nothing may be appended past where consumers last were
            if self.publisher_limit.get() > self.consumer_position:
                self.publisher_limit.set(self.consumer_position)
                self.trip_limit = self.consumer_position
                work += 1
            if self.log.is_connected:
                self.log.is_connected = False
        return work

    def check_for_blocked_publisher(self, now_ns: int) -> bool:
        """Timer duty: if consumers sat still for the unblock timeout while the producer is ahead, pad the
        stuck claim.  Returns True when something was unblocked."""
        consumer = self.consumer_position
        producer = self.log.producer_position()
        if consumer != self._last_consumer_position or producer <= consumer:
            self._last_consumer_position = consumer
            self._time_of_last_consumer_move_ns = now_ns
            return False
        if self._time_of_last_consumer_move_ns is None:
            self._time_of_last_consumer_move_ns = now_ns
            return False
        if now_ns - self._time_of_last_consumer_move_ns <= self.unblock_timeout_ns:
            return False
        if unblock(self.log, consumer):
            self.unblocked_count += 1
            self._time_of_last_consumer_move_ns = now_ns
            if self.on_unblocked is not None:
                self.on_unblocked()
            return True
        return False

    def unblock_draining(self) -> bool:
        """Timer duty of a draining publication (no publisher left): a claim that blocks the consumers can only
        be a dead publisher's, so it is padded at once, without the unblock timeout.  True when it was."""
        consumer = self.consumer_position
        if self.log.producer_position() <= consumer or not unblock(self.log, consumer):
            return False
        self.unblocked_count += 1
        if self.on_unblocked is not None:
            self.on_unblocked()
        return True


class TetherState(enum.Enum):
    """Where an untethered subscriber stands (Aeron's IPC publication): ``active`` holds the publication back
    like any subscriber; one that stayed more than a window behind for the window-limit timeout is told its
    image is gone and ``linger``s (still counted) for another such timeout, then ``rest``s (not counted) for the
    resting timeout, then rejoins where its publication lets a new subscriber join, with the same sub-pos
    counter."""

    ACTIVE = "active"
    LINGER = "linger"
    RESTING = "resting"


class SubscriberLink:
    """One subscription reading one publication's log: its sub-pos counter, whether its position counts
    toward the publication's pub-lmt (:attr:`included_in_limit`), and for an untethered subscription
    (``tether=false``) its :class:`TetherState`."""

    __slots__ = ("subscription_id", "client_id", "counter_id", "position", "join_position", "included",
                 "is_tether", "tether_state", "time_of_last_update_ns")

    def __init__(self, subscription_id: int, client_id: int, counter_id: int, position: Position, join: int,
                 included: bool = True, *, is_tether: bool = True, now_ns: int = 0) -> None:
        self.subscription_id = subscription_id
        self.client_id = client_id
        self.counter_id = counter_id
        self.position = position
        self.join_position = join
        self.included = included  # False: left out of the limit by the conductor, whatever its tether state
        self.is_tether = is_tether
        self.tether_state = TetherState.ACTIVE
        self.time_of_last_update_ns = now_ns

    @property
    def included_in_limit(self) -> bool:
        """Whether this subscriber's position holds the publication back (pub-lmt, cleaning, draining)."""
        return self.included and self.tether_state != TetherState.RESTING


class UntetheredEvent:
    """A change of an untethered subscriber: ``available`` False = ON_UNAVAILABLE_IMAGE, True =
    ON_AVAILABLE_IMAGE again (the link rejoined at ``join_position``), None = only whether it counts toward
    the limit changed (it went resting)."""

    __slots__ = ("link", "available")

    def __init__(self, link: SubscriberLink, available: bool | None) -> None:
        self.link = link
        self.available = available


def advance_untethered(links: Iterable[SubscriberLink], now_ns: int, window_limit: int, rejoin_position: int,
                       window_limit_timeout_ns: int, resting_timeout_ns: int) -> list[UntetheredEvent]:
    """Moves untethered links through active -> linger -> resting -> active (see :class:`TetherState`), for an
    IPC publication and a network publication's spies alike: a link at or below ``window_limit`` for the
    window-limit timeout lingers, for as long again it rests, after the resting timeout it rejoins at
    ``rejoin_position``.  Returns what the caller announces; a link whose ``available`` is not False changed
    whether it counts toward the limit."""
    events: list[UntetheredEvent] = []
    for link in links:
        if link.is_tether:
            continue
        if link.tether_state == TetherState.ACTIVE:
            if link.position.get() > window_limit:
                link.time_of_last_update_ns = now_ns
            elif now_ns - link.time_of_last_update_ns >= window_limit_timeout_ns:
                link.tether_state = TetherState.LINGER
                link.time_of_last_update_ns = now_ns
                events.append(UntetheredEvent(link, available=False))
        elif link.tether_state == TetherState.LINGER:
            if now_ns - link.time_of_last_update_ns >= window_limit_timeout_ns:
                link.tether_state = TetherState.RESTING
                link.time_of_last_update_ns = now_ns
                events.append(UntetheredEvent(link, available=None))
        elif now_ns - link.time_of_last_update_ns >= resting_timeout_ns:
            link.position.set(rejoin_position)
            link.join_position = rejoin_position
            link.tether_state = TetherState.ACTIVE
            link.time_of_last_update_ns = now_ns
            events.append(UntetheredEvent(link, available=True))
    return events


class IpcPublication(PublicationLifecycle):
    """A log on this host shared by the publishers of one stream (or owned by one exclusive publisher).

    The driver entity: the log file, its pub-pos and pub-lmt counters, the subscribers' sub-pos links, the
    publishers attached (by registration id) and its life cycle (:mod:`logbuf.driver.lifecycle`: active,
    draining, closed).  The per-cycle work is the :class:`IpcPublicationDuty`.
    """

    def __init__(
        self,
        *,
        registration_id: int,
        channel: str,
        is_exclusive: bool,
        log: LogBuffers,
        publisher_position: Position,
        publisher_limit: Position,
        pub_pos_counter_id: int,
        pub_lmt_counter_id: int,
        window_length: int,
        unblock_timeout_ns: int,
        on_unblocked: Callable[[], None],
        untethered_window_limit_timeout_ns: int = 5_000_000_000,
        untethered_resting_timeout_ns: int = 10_000_000_000,
        linger_timeout_ns: int = 5_000_000_000,
    ) -> None:
        self.registration_id = registration_id
        self.window_length = window_length
        self.untethered_window_limit_timeout_ns = untethered_window_limit_timeout_ns
        self.untethered_resting_timeout_ns = untethered_resting_timeout_ns
        self.linger_timeout_ns = linger_timeout_ns
        self.channel = channel
        self.is_exclusive = is_exclusive
        self.log = log
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.pub_pos_counter_id = pub_pos_counter_id
        self.pub_lmt_counter_id = pub_lmt_counter_id
        self.channel_status_id = -1  # IPC has no channel endpoint
        self.subscribers: dict[int, SubscriberLink] = {}
        self._positions: tuple[Position, ...] = ()
        self._untethered: tuple[SubscriberLink, ...] = ()
        # the furthest position a subscriber that left had read to: where the next one joins if none is left
        # (Aeron's consumer position is the fastest subscriber's)
        self._furthest_departed = 0
        self.publishers: dict[int, int] = {}  # publication link registration id -> client id
        self.drain_deadline_ns = 0
        # set by a conductor whose native duty runs this publication (it stops unblocking a draining one)
        self.on_draining: Callable[[IpcPublication], None] | None = None
        self.duty = IpcPublicationDuty(
            log,
            publisher_position,
            publisher_limit,
            lambda: self._positions,
            window_length=window_length,
            unblock_timeout_ns=unblock_timeout_ns,
            on_unblocked=on_unblocked,
        )

    # -- links ---------------------------------------------------------------------------------------

    def add_subscriber(self, link: SubscriberLink) -> None:
        self.subscribers[link.subscription_id] = link
        self._refresh_positions()

    def remove_subscriber(self, subscription_id: int) -> SubscriberLink | None:
        link = self.subscribers.pop(subscription_id, None)
        if link is not None and link.included_in_limit:
            self._furthest_departed = max(self._furthest_departed, link.position.get())
        self._refresh_positions()
        return link

    def set_included(self, subscription_id: int, included: bool) -> bool:
        """Whether the link's position may count toward pub-lmt; False for an unknown link."""
        link = self.subscribers.get(subscription_id)
        if link is None:
            return False
        link.included = included
        self._refresh_positions()
        return True

    def _refresh_positions(self) -> None:
        # the positions pub-lmt, cleaning and draining wait for: every link included in the limit
        self._positions = tuple(s.position for s in self.subscribers.values() if s.included_in_limit)
        self._untethered = tuple(s for s in self.subscribers.values() if not s.is_tether)

    @property
    def has_untethered(self) -> bool:
        return bool(self._untethered)

    def check_untethered(self, now_ns: int, consumer_position: int | None = None,
                         clean_position: int | None = None) -> list[UntetheredEvent]:
        """Moves untethered subscribers through active -> linger -> resting -> active (see
        :class:`TetherState`); returns what the conductor must announce or hand to the native duty.  One that
        rests rejoins where a new subscriber would join (:meth:`join_position`), as Aeron's.
        ``consumer_position`` and ``clean_position``: the publication's, where the native duty keeps them."""
        events: list[UntetheredEvent] = []
        untethered = self._untethered
        if not untethered:
            return events
        included = [s.position.get() for s in self.subscribers.values() if s.included_in_limit]
        consumer = max([*included, self.duty.consumer_position if consumer_position is None else consumer_position])
        window_limit = untethered_window_limit(consumer, self.window_length)
        rejoin = self.join_position(consumer_position, clean_position)
        events = advance_untethered(untethered, now_ns, window_limit, rejoin,
                                    self.untethered_window_limit_timeout_ns, self.untethered_resting_timeout_ns)
        if any(event.available is not False for event in events):  # whether a link counts changed
            self._refresh_positions()
        return events

    def join_position(self, consumer_position: int | None = None, clean_position: int | None = None) -> int:
        """Where a new subscriber starts, as Aeron's IPC publication has it: beside the slowest subscriber that
        holds the publication back (it reads what they all still may), or, with none, where the furthest
        subscriber got to (the producer position before any).  ``consumer_position`` and ``clean_position``:
        the publication's, where the native duty keeps them."""
        producer = self.log.producer_position()
        positions = [s.position.get() for s in self.subscribers.values() if s.included_in_limit]
        if positions:
            join = min(positions)
        else:
            consumer = self.duty.consumer_position if consumer_position is None else consumer_position
            join = max(consumer, self._furthest_departed)
        # sub-pos counters are written by clients: a join is a frame boundary the log still holds, or live
        clean = self.duty.cleaner.clean_position if clean_position is None else clean_position
        if not clean <= join <= producer or join % FRAME_ALIGNMENT:
            return producer
        return join

    # -- duty cycle ------------------------------------------------------------------------------------

    def update(self) -> int:
        return self.duty.update()

    def on_timer(self, now_ns: int) -> bool:
        """Unblocks a stalled concurrent claim (while active), or any claim that blocks the subscribers of a
        draining publication not yet drained (exclusive too: its publisher is gone); True when it did."""
        if self.state == PublicationState.DRAINING:
            return not self.is_drained(now_ns) and self.duty.unblock_draining()
        if self.is_exclusive or self.state != PublicationState.ACTIVE:
            return False
        return self.duty.check_for_blocked_publisher(now_ns)

    def start_draining(self, now_ns: int, linger_ns: int) -> None:
        """No publisher is left: mark the end of stream; the subscribers read to it (see :meth:`is_drained`).
        ``linger_ns`` is not a deadline for them (as aeronmd); it is kept for what the driver reports."""
        self._transition(PublicationEvent.DRAIN)
        if self.on_draining is not None:
            self.on_draining(self)
        self.log.end_of_stream_position = self.log.producer_position()
        self.drain_deadline_ns = now_ns + linger_ns

    def is_drained(self, now_ns: int) -> bool:
        """Every subscriber that holds the publication back read to the end of stream.  As aeronmd, no deadline
        cuts a subscriber's tail off: one that leaves, or an untethered one that stalls and rests, stops
        counting."""
        end = self.log.producer_position()
        return all(s.position.get() >= end for s in self.subscribers.values() if s.included_in_limit)
