"""``IpcConductor``: the driver conductor's ``aeron:ipc`` half - IPC publications, the subscriptions that read
them, and the sub-pos counters linking the two (beside :class:`NetworkConductor`, the ``aeron:udp`` half).

A publication is shared per stream unless exclusive.  A subscription links to every active publication of its
stream (and every later one): a sub-pos counter at the publication's join position (or, with logbuf's
``resume-position`` channel parameter, where the subscriber read up to before, if still in the log), then
ON_AVAILABLE_IMAGE.  A new publication answers its publisher first, then links subscriptions, in Aeron's
order.

The data-limit duties (pub-pos, pub-lmt, cleaning, isConnected, unblocking) run here, in Python, until
:meth:`IpcConductor.use_native` hands them to a native agent (the media driver does, in every threading mode):
from then on this object only sends the native duty commands and, on its acknowledgements, frees sub-pos
counters and deletes logs, so a starved Python thread never holds a publisher back.  The Python duties
(:class:`IpcPublicationDuty`) remain the specification the native one is tested against.
"""

from __future__ import annotations

from logbuf.channel import ChannelUri
from logbuf.cnc import counters as c
from logbuf.cnc.messages import (
    AvailableImage,
    ControlResponse,
    ErrorCode,
    SubscriptionReady,
    UnavailableImage,
)
from logbuf.driver.channel_params import PublicationParams, SubscriptionParams, confirm_match
from logbuf.driver.command_error import CommandError
from logbuf.driver.ipc_publication import IpcPublication, SubscriberLink, TetherState
from logbuf.driver.lifecycle import PublicationState
from logbuf.driver.native_ipc import COMMAND_REFUSED, PUBLICATION_REMOVED, SUBSCRIBER_REMOVED, NativeIpcDuty
from logbuf.driver.services import DriverServices

IPC_SOURCE_IDENTITY = "aeron:ipc"

class SubscriptionLink:
    """An IPC subscription: its registration id, client, stream, channel and resolved parameters (session,
    tether, resume positions)."""

    __slots__ = ("registration_id", "client_id", "stream_id", "channel", "params")

    def __init__(
        self, registration_id: int, client_id: int, stream_id: int, channel: str, params: SubscriptionParams
    ) -> None:
        self.registration_id = registration_id
        self.client_id = client_id
        self.stream_id = stream_id
        self.channel = channel
        self.params = params

    @property
    def resume(self) -> dict[int, int]:
        return self.params.resume_positions

    def matches(self, publication: IpcPublication) -> bool:
        """Whether this subscription reads ``publication`` (its stream, and its session when it names one)."""
        return publication.stream_id == self.stream_id and self.params.matches(publication.session_id)


class IpcConductor:
    """IPC publications and subscriptions (see the module docstring); the driver conductor feeds it."""

    def __init__(self, services: DriverServices) -> None:
        self.services = services
        self.publications: list[IpcPublication] = []
        self.subscriptions: dict[int, SubscriptionLink] = {}
        self.native: NativeIpcDuty | None = None
        self.now_ns = 0  # the driver conductor's clock, set every duty cycle
        # waiting for the native duty's acknowledgement: removed publications (then their files and counters
        # go) and removed subscriber links (then their sub-pos counters go)
        self._closing: dict[int, IpcPublication] = {}
        self._unlinking: dict[tuple[int, int], int] = {}

    def use_native(self, native: NativeIpcDuty) -> None:
        """From now on the native duty moves every publication's limits (the existing ones handed over with
        their state); call before its agent starts or while it runs."""
        if self.native is not None:
            raise RuntimeError("the IPC duties already run natively")
        self.native = native
        for publication in self.publications:
            self._hand_over(publication)

    def _hand_over(self, publication: IpcPublication) -> None:
        native = self.native
        assert native is not None
        native.add_publication(publication)
        publication.on_draining = lambda p: native.draining(p.registration_id)
        if publication.state != PublicationState.ACTIVE:
            native.draining(publication.registration_id)
        for link in publication.subscribers.values():
            native.add_subscriber(publication.registration_id, link)

    # -- publications ----------------------------------------------------------------------------------

    def add_publication(self, registration_id: int, uri: ChannelUri, params: PublicationParams, stream_id: int,
                        exclusive: bool, client_id: int) -> tuple[IpcPublication, bool]:
        """The stream's shared publication, or a new one; ``(publication, created)``.  The caller answers
        the publisher, then calls :meth:`link_subscriptions` for a new one."""
        if not exclusive:
            shared = self._shared_publication(stream_id, params)
            if shared is not None:
                return shared, False
        if params.session_id is not None:
            self._check_session_clash(stream_id, params.session_id)
        return self._new_publication(registration_id, uri, params, stream_id, exclusive, client_id), True

    def _check_session_clash(self, stream_id: int, session_id: int) -> None:
        for publication in self.publications:
            if (publication.stream_id == stream_id and publication.session_id == session_id
                    and publication.state != PublicationState.CLOSED):
                raise CommandError(
                    ErrorCode.GENERIC_ERROR,  # as aeronmd answers a clash
                    f"existing publication has clashing session-id={session_id} for stream-id={stream_id} "
                    f"channel={IPC_SOURCE_IDENTITY}")

    def _shared_publication(self, stream_id: int, params: PublicationParams) -> IpcPublication | None:
        for publication in self.publications:
            if (
                publication.is_exclusive
                or publication.stream_id != stream_id
                or publication.state != PublicationState.ACTIVE
            ):
                continue
            mismatch = confirm_match(params, publication.log.term_length, publication.log.mtu, publication.session_id,
                                     f"stream-id={stream_id} channel={IPC_SOURCE_IDENTITY}")
            if mismatch is not None:
                raise CommandError(ErrorCode.GENERIC_ERROR, mismatch)  # aeronmd's code for it
            return publication
        return None

    def _new_publication(self, registration_id: int, uri: ChannelUri, params: PublicationParams, stream_id: int,
                         exclusive: bool, client_id: int) -> IpcPublication:
        services = self.services
        ctx = services.ctx
        log = services.create_publication_log(registration_id, stream_id, params)
        channel = uri.canonical()
        counter_ids: list[int] = []
        try:
            counter_ids = services.allocate_stream_counters(
                (c.PUBLISHER_POSITION_TYPE_ID, c.PUBLISHER_LIMIT_TYPE_ID), registration_id, log.session_id,
                stream_id, channel, client_id)
            pub_pos_id, pub_lmt_id = counter_ids
            publication = IpcPublication(
                registration_id=registration_id,
                channel=channel,
                is_exclusive=exclusive,
                log=log,
                publisher_position=services.counters.position(pub_pos_id),
                publisher_limit=services.counters.position(pub_lmt_id),
                pub_pos_counter_id=pub_pos_id,
                pub_lmt_counter_id=pub_lmt_id,
                window_length=params.window_length,
                unblock_timeout_ns=ctx.unblock_timeout_ns,
                on_unblocked=lambda: services.increment(c.SystemCounter.UNBLOCKED_PUBLICATIONS),
                untethered_window_limit_timeout_ns=params.untethered_window_limit_timeout_ns,
                untethered_resting_timeout_ns=params.untethered_resting_timeout_ns,
                linger_timeout_ns=params.linger_timeout_ns,
            )
        except BaseException:
            services.free_counters(counter_ids)
            services.delete_log(log)
            raise
        self.publications.append(publication)
        if self.native is not None:
            self._hand_over(publication)
        return publication

    def link_subscriptions(self, publication: IpcPublication) -> None:
        """Every subscription of a new publication's stream reads it from now on."""
        for subscription in list(self.subscriptions.values()):
            if subscription.matches(publication):
                self._link(subscription, publication)

    def close_publication(self, publication: IpcPublication) -> None:
        """Drained (or lingered long enough): images go away, counters are freed, the file is deleted."""
        for link in list(publication.subscribers.values()):
            self._unlink_subscriber(publication, link, notify=True)
        publication.close()
        self.publications.remove(publication)
        if self.native is not None:
            # the agent may be reading the log and counters right now: they go when it says it let go
            self._closing[publication.registration_id] = publication
            self.native.remove_publication(publication.registration_id)
        else:
            self._release_publication(publication)

    def _release_publication(self, publication: IpcPublication) -> None:
        self.services.free_counters((publication.pub_pos_counter_id, publication.pub_lmt_counter_id))
        self.services.delete_log(publication.log)

    # -- subscriptions ---------------------------------------------------------------------------------

    def add_subscription(self, registration_id: int, client_id: int, uri: ChannelUri, params: SubscriptionParams,
                         stream_id: int) -> SubscriptionLink:
        """A new subscription: ON_SUBSCRIPTION_READY, then an image of every active publication of its
        stream (of its session, when the channel names one)."""
        services = self.services
        services.ensure_wake_semaphore(stream_id)
        subscription = SubscriptionLink(registration_id, client_id, stream_id, uri.canonical(), params)
        # every counter first: a subscription refused for want of counters must leave no link behind that
        # nobody reads, holding a publisher back
        links: list[tuple[IpcPublication, SubscriberLink]] = []
        try:
            for publication in self.publications:
                if subscription.matches(publication) and publication.state == PublicationState.ACTIVE:
                    links.append((publication, self._new_link(subscription, publication)))
        except BaseException:
            services.free_counters([link.counter_id for _, link in links])
            raise
        self.subscriptions[registration_id] = subscription
        services.respond(ControlResponse.ON_SUBSCRIPTION_READY, SubscriptionReady(registration_id, c.NULL_COUNTER_ID))
        for publication, link in links:
            self._attach(publication, link)
        return subscription

    def remove_subscription(self, registration_id: int) -> None:
        self.subscriptions.pop(registration_id, None)
        for publication in self.publications:
            link = publication.subscribers.get(registration_id)
            if link is not None:
                self._unlink_subscriber(publication, link, notify=False)

    def _link(self, subscription: SubscriptionLink, publication: IpcPublication) -> None:
        self._attach(publication, self._new_link(subscription, publication))

    def _new_link(self, subscription: SubscriptionLink, publication: IpcPublication) -> SubscriberLink:
        """A subscriber link with its sub-pos counter at the join position (not yet attached)."""
        native = self.native
        consumer = native.consumer_position(publication.registration_id) if native is not None else None
        join = publication.join_position(consumer, self._clean_position(publication))
        wanted = subscription.resume.get(publication.session_id)
        if wanted is not None:
            # still in the log and not cleaned (a dead consumer's sub-pos holds cleaning until it times out);
            # otherwise the oldest position that is: the consumer sees join > wanted and knows what it missed
            oldest = max(self._clean_position(publication), join - 2 * publication.log.term_length, 0)
            join = min(max(wanted, oldest), join)
        # Aeron's sub-pos: the subscription's registration id and channel, owned by its client, referring to
        # the publication it reads
        label = c.stream_position_label(c.SUBSCRIBER_POSITION_NAME, subscription.registration_id,
                                        publication.session_id, publication.stream_id, subscription.channel, join)
        key = c.stream_position_key(subscription.registration_id, publication.session_id, publication.stream_id,
                                    subscription.channel)
        counters = self.services.counters
        counter_id = counters.allocate(c.SUBSCRIBER_POSITION_TYPE_ID, label, key,
                                       registration_id=subscription.registration_id,
                                       owner_id=subscription.client_id, reference_id=publication.registration_id)
        position = counters.position(counter_id)
        position.set(join)
        return SubscriberLink(subscription.registration_id, subscription.client_id, counter_id, position, join,
                              is_tether=subscription.params.tether, now_ns=self.now_ns)

    def _attach(self, publication: IpcPublication, link: SubscriberLink) -> None:
        publication.add_subscriber(link)
        if self.native is not None:
            # (a resumed join the native cleaner passes meanwhile is moved up to the oldest position left)
            self.native.add_subscriber(publication.registration_id, link)
        self._announce_image(publication, link)

    def _announce_image(self, publication: IpcPublication, link: SubscriberLink) -> None:
        self.services.respond(
            ControlResponse.ON_AVAILABLE_IMAGE,
            AvailableImage(publication.registration_id, publication.session_id, publication.stream_id,
                           link.subscription_id, link.counter_id, str(publication.log.path),
                           IPC_SOURCE_IDENTITY),
        )

    def _clean_position(self, publication: IpcPublication) -> int:
        if self.native is not None:
            position = self.native.clean_position(publication.registration_id)
            if position is not None:
                return position
        return publication.duty.cleaner.clean_position

    def set_included(self, publication: IpcPublication, subscription_id: int, included: bool) -> bool:
        """Whether a subscriber link's position counts toward the publication's pub-lmt; False when the
        publication has no such link."""
        if not publication.set_included(subscription_id, included):
            return False
        if self.native is not None:
            self.native.set_included(publication.registration_id, subscription_id, included)
        return True

    def _unlink_subscriber(self, publication: IpcPublication, link: SubscriberLink, notify: bool) -> None:
        publication.remove_subscriber(link.subscription_id)
        if self.native is not None:
            # the agent may be reading the sub-pos counter: it is freed on the acknowledgement
            self._unlinking[(publication.registration_id, link.subscription_id)] = link.counter_id
            self.native.remove_subscriber(publication.registration_id, link.subscription_id)
        else:
            self.services.counters.free(link.counter_id)
        if notify and link.tether_state == TetherState.ACTIVE:  # an untethered one was told when it left
            self.services.respond(
                ControlResponse.ON_UNAVAILABLE_IMAGE,
                UnavailableImage(publication.registration_id, link.subscription_id, publication.stream_id,
                                 publication.channel),
            )

    # -- duties ----------------------------------------------------------------------------------------

    def update(self) -> int:
        """Every publication's conductor duty (pub-pos, pub-lmt, cleaning, isConnected) - with the native duty,
        its acknowledgements instead - and its untethered subscribers' states (an image that goes or comes back
        is announced; whether a link counts toward the limit is handed to the native duty)."""
        if self.native is not None:
            work = self._on_native_events()
        else:
            work = sum(publication.update() for publication in self.publications)
        for publication in self.publications:
            # (draining too: a stalled untethered subscriber then rests rather than holding the closed publication)
            if publication.state in (PublicationState.ACTIVE, PublicationState.DRAINING) and publication.has_untethered:
                work += self._check_untethered(publication)
        return work

    def _check_untethered(self, publication: IpcPublication) -> int:
        native = self.native
        consumer = native.consumer_position(publication.registration_id) if native is not None else None
        events = publication.check_untethered(self.now_ns, consumer,
                                              self._clean_position(publication) if native is not None else None)
        for event in events:
            link = event.link
            if native is not None:
                native.set_included(publication.registration_id, link.subscription_id, link.included_in_limit)
            if event.available:
                self._announce_image(publication, link)
            elif event.available is False:
                self.services.respond(
                    ControlResponse.ON_UNAVAILABLE_IMAGE,
                    UnavailableImage(publication.registration_id, link.subscription_id,
                                     publication.stream_id, publication.channel))
        return len(events)

    def _on_native_events(self) -> int:
        assert self.native is not None
        events = self.native.poll_events()
        for kind, registration_id, subscription_id, value in events:
            if kind == PUBLICATION_REMOVED:
                publication = self._closing.pop(registration_id, None)
                if publication is not None:
                    self._release_publication(publication)
            elif kind == SUBSCRIBER_REMOVED:
                counter_id = self._unlinking.pop((registration_id, subscription_id), None)
                if counter_id is not None:
                    self.services.counters.free(counter_id)
            elif kind == COMMAND_REFUSED:
                self.services.record_error(
                    f"native IPC duty refused command {value} (publication {registration_id}, "
                    f"subscription {subscription_id})")
        return len(events)

    def on_timer(self, now_ns: int) -> int:
        """Unblock checks (the native duty runs its own)."""
        if self.native is not None:
            return 0
        return sum(1 for publication in self.publications if publication.on_timer(now_ns))

    def close(self) -> None:
        """Driver shutdown (the native duty's agent already stopped): every log closed and deleted."""
        for publication in [*self.publications, *self._closing.values()]:
            self.services.delete_log(publication.log)
        self.publications.clear()
        self._closing.clear()
        self._unlinking.clear()
