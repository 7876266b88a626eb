"""``NetworkConductor``: the conductor's UDP half - network publications, UDP subscriptions, channel
endpoints and images (Aeron's DriverConductor, the parts about ``aeron:udp`` channels).

It is called by :class:`~logbuf.driver.conductor.DriverConductor` for commands on UDP channels and by the
receive channel endpoints when a SETUP asks for a new image or an image ends; it registers what it creates
with the :class:`Receiver` duty and hands publications and send endpoints to the native sender agent
(:class:`Sender`) through its command queue; the agent's events (removals acknowledged, publications drained)
come back in :meth:`NetworkConductor.update`.  A log, counter or socket the agent uses is released only once it
acknowledged the removal.

- publications: one :class:`SendChannelEndpoint` per transport (endpoint + interface), shared by every
  publication on it; non-exclusive publications of one stream on one transport share a log and a session;
  counters pub-pos, pub-lmt, snd-pos, snd-lmt, snd-bpe (+ the endpoint's snd-channel status);
- spies (``aeron-spy:aeron:udp?...``): a :class:`SpySubscription` links to every active network publication of
  its channel (same endpoint and interface) and stream - and to every later one - with its own sub-pos counter
  and an image of the publication's log (source identity ``aeron:ipc``, as aeronmd); the sender agent counts
  its position in pub-lmt;
- subscriptions: one :class:`ReceiveChannelEndpoint` per transport (it binds the endpoint), streams counted;
  each image gets ``images/<correlationId>.logbuffer``, rcv-hwm and rcv-pos, and one sub-pos per subscription,
  announced with ON_AVAILABLE_IMAGE; an image that times out or ends is announced with ON_UNAVAILABLE_IMAGE.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import random
import time
from collections.abc import Callable
from typing import Any

from logbuf.channel import DEFAULT_GROUP_TAG, ChannelUri, InvalidChannelError
from logbuf.cnc import counters as c
from logbuf.cnc.loss_report import LossReport
from logbuf.cnc.messages import (
    AvailableImage,
    ControlResponse,
    ErrorCode,
    SubscriptionReady,
    UnavailableImage,
)
from logbuf.directory import LOG_SUFFIX, wake_semaphore_name
from logbuf.driver.channel_params import (
    PublicationParams,
    SubscriptionParams,
    check_destination,
    confirm_match,
)
from logbuf.driver.command_error import CommandError
from logbuf.driver.ipc_publication import PublicationState, SubscriberLink
from logbuf.driver.log_metadata import fill_image_metadata
from logbuf.driver.network_counters import SENDER_AGENT_COUNTERS, NetworkCounters
from logbuf.driver.network_publication import NetworkPublication, NetworkPublicationPositions
from logbuf.driver.publication_image import ImageWaker, PublicationImage
from logbuf.driver.receive_channel import MDS_KEY, ReceiveChannelEndpoint, ReceiveDestination
from logbuf.driver.receiver import Receiver
from logbuf.driver.send_channel import SendChannelEndpoint
from logbuf.driver.sender import Sender
from logbuf.driver.services import DriverServices
from logbuf.driver.udp import (
    FlowControl,
    MinMulticastFlowControl,
    RetransmitHandler,
    TaggedFlowControl,
    UnicastFlowControl,
    receiver_window_length,
)
from logbuf.driver.udp.loss_detector import DEFAULT_UNICAST_RETRY_RATIO, Gap
from logbuf.driver.udp.retransmit import DEFAULT_MAX_ACTIONS
from logbuf.driver.udp.status_schedule import DEFAULT_SM_TIMEOUT_NS
from logbuf.driver.udp_channel import SocketAddress, UdpChannel, UnknownHostError, describe_sockaddr
from logbuf.driver.udp_transport import TransportOptions, TransportRole, UdpTransport
from logbuf.driver.windows import initial_receiver_window
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import ffi, lib
from logbuf.protocol.setup import SetupFrame

# channel endpoint status values (Aeron's ChannelEndpointStatus)
CHANNEL_STATUS_ACTIVE = 1
CHANNEL_STATUS_CLOSING = 2
SETUP_GROUP_FLAG = 0x40  # a SETUP's flag: the sender asks its receivers for group semantics
MAX_REJECT_REASON_LENGTH = 1023  # bytes of an ERR frame's text (Aeron's limit for a rejection's reason)


def errno_text(number: int | None) -> str:
    """An OS error as aeronmd's message begins: ``(98) Address already in use``.

    A socket the driver cannot open answers the command with GENERIC_ERROR and this, as aeronmd does: Aeron's
    clients take CHANNEL_ENDPOINT_ERROR for an endpoint that failed later (its id is a status counter's), never
    as the answer to the registration they await."""
    return f"({number}) {os.strerror(number)}" if number else "(0) unknown OS error"


def treat_as_multicast(group: str, channel_is_multicast: bool, setup_flags: int) -> bool:
    """Aeron's group semantics of a new image (``group=`` of its subscription): randomised multicast NAK
    delays for ``true``; unicast ones for ``false``; ``infer`` - a multicast channel, or a SETUP carrying the
    sender's group flag."""
    if group == "infer":
        return channel_is_multicast or bool(setup_flags & SETUP_GROUP_FLAG)
    return group == "true"


class NetworkSubscription:
    """A subscription on a UDP channel: the receive endpoint it reads from and its resolved parameters."""

    __slots__ = ("registration_id", "client_id", "stream_id", "channel", "endpoint", "params")

    def __init__(self, registration_id: int, client_id: int, stream_id: int, channel: str,
                 endpoint: ReceiveChannelEndpoint, params: SubscriptionParams | None = None) -> None:
        self.registration_id = registration_id
        self.client_id = client_id
        self.stream_id = stream_id
        self.channel = channel
        self.endpoint = endpoint
        self.params = params

    def matches(self, stream_id: int, session_id: int) -> bool:
        """Whether an image of ``session_id`` on ``stream_id`` is for this subscription."""
        return stream_id == self.stream_id and (self.params is None or self.params.matches(session_id))


class SpySubscription:
    """An ``aeron-spy:`` subscription: the send transport it spies on (:attr:`UdpChannel.key`), its stream and
    resolved parameters (session, tether)."""

    __slots__ = ("registration_id", "client_id", "stream_id", "channel", "transport_key", "params")

    def __init__(self, registration_id: int, client_id: int, stream_id: int, channel: str, transport_key: str,
                 params: SubscriptionParams) -> None:
        self.registration_id = registration_id
        self.client_id = client_id
        self.stream_id = stream_id
        self.channel = channel
        self.transport_key = transport_key
        self.params = params

    def matches(self, publication: NetworkPublication) -> bool:
        """Whether this spy reads ``publication`` (its transport, stream, and session when it names one)."""
        return (publication.endpoint_key == self.transport_key and publication.stream_id == self.stream_id
                and self.params.matches(publication.session_id))


SPY_SOURCE_IDENTITY = "aeron:ipc"  # what aeronmd announces as a spy image's source


def _check_socket_buffers(transport: UdpTransport, channel: UdpChannel, sndbuf: int | None,
                          rcvbuf: int | None) -> None:
    """A channel that names socket buffers must agree with the endpoint it shares (one socket)."""
    for key, wanted, asked in (("so-sndbuf", sndbuf, transport.options.socket_sndbuf),
                               ("so-rcvbuf", rcvbuf, transport.options.socket_rcvbuf)):
        if wanted is not None and wanted != asked:
            raise CommandError(ErrorCode.INVALID_CHANNEL,
                               f"channel {channel}: {key}={wanted} differs from the endpoint's ({asked})")


class ImageLossObserver:
    """Records an image's losses in the driver's loss report: its entry on the first, observations after."""

    def __init__(self, report: LossReport, epoch_ms: Callable[[], int], session_id: int, stream_id: int,
                 channel: str, source: str) -> None:
        self.report = report
        self.epoch_ms = epoch_ms
        self.session_id = session_id
        self.stream_id = stream_id
        self.channel = channel
        self.source = source
        self.entry_offset: int | None = None  # -1: the report is full, nothing more is recorded

    def __call__(self, gap: Gap) -> None:
        now_ms = self.epoch_ms()
        if self.entry_offset is None:
            self.entry_offset = self.report.create_entry(gap.length, now_ms, self.session_id, self.stream_id,
                                                         self.channel, self.source)
        elif self.entry_offset >= 0:
            self.report.record_observation(self.entry_offset, gap.length, now_ms)


class NetworkConductor:
    """The driver conductor's ``aeron:udp`` half: channel endpoints, network publications, subscriptions
    and images (see the module docstring)."""

    def __init__(self, services: DriverServices) -> None:
        self.services = services
        self.network_counters = NetworkCounters(services.counters, services.system)
        system = services.system
        self.sender = Sender({name: services.counters.position(system[system_id]).pointer
                              for name, system_id in SENDER_AGENT_COUNTERS.items()})
        self._closing_publications: dict[int, NetworkPublication] = {}
        self._closing_endpoints: dict[int, SendChannelEndpoint] = {}
        self.receiver = Receiver(receive_batch=services.ctx.receive_batch)
        self.network_counters.native_receiver = self.receiver.counters
        self._endpoints_by_id: dict[int, ReceiveChannelEndpoint] = {}
        self._truncated_images: set[int] = set()  # asked to go (their log shrank): the agent has not let go yet
        self._reject_reasons: dict[int, Any] = {}  # REJECT_IMAGE texts, kept until their image is gone
        self._unlinking: set[int] = set()  # sub-pos counter ids of removed subscribers the agent has not let go
        self._next_endpoint_id = 1
        self._receive_impairment: Any = None  # set by _transport for a receive transport
        self._send_impairment: Any = None
        self.publications: list[NetworkPublication] = []
        self.subscriptions: dict[int, NetworkSubscription] = {}
        self.spies: dict[int, SpySubscription] = {}
        self.send_endpoints: dict[str, SendChannelEndpoint] = {}
        self.receive_endpoints: dict[str, ReceiveChannelEndpoint] = {}
        self._rng = random.SystemRandom()
        self._transports_opened = 0
        self._mdc_instances = 0  # MDC channels without a control port: one endpoint each
        self.now_ns = 0

    # -- channels and endpoints ------------------------------------------------------------------------

    @staticmethod
    def udp_channel(uri: ChannelUri) -> UdpChannel:
        try:
            return UdpChannel.from_uri(uri)
        except UnknownHostError as exc:
            raise CommandError(ErrorCode.UNKNOWN_HOST, str(exc)) from None
        except InvalidChannelError as exc:
            raise CommandError(ErrorCode.INVALID_CHANNEL, str(exc)) from None

    def _transport(self, channel: UdpChannel, role: TransportRole, socket_sndbuf: int | None = None,
                   socket_rcvbuf: int | None = None) -> UdpTransport:
        ctx = self.services.ctx
        index = self._transports_opened
        self._transports_opened += 1
        options = TransportOptions(
            socket_rcvbuf=ctx.socket_rcvbuf if socket_rcvbuf is None else socket_rcvbuf,
            socket_sndbuf=ctx.socket_sndbuf if socket_sndbuf is None else socket_sndbuf,
            receive_batch=ctx.receive_batch,
            send_impairment=ctx.impairment("send", index) if role is not TransportRole.RECEIVE else None,
            # the receiver agent impairs what it receives and sends itself (the same parameters, natively)
            receive_impairment=None,
        )
        if role is TransportRole.RECEIVE:
            self._receive_impairment = ctx.impairment("receive", index)
            self._send_impairment = ctx.impairment("send", index)
        try:
            return UdpTransport(channel, role, options)
        except OSError as exc:
            raise CommandError(
                ErrorCode.GENERIC_ERROR,
                f"{errno_text(exc.errno)}\nchannel {channel}: cannot open its {role.value} socket: {exc.strerror or exc}",
            ) from None

    def _status_counters(self, type_id: int, name: str, sockaddr_name: str, channel: str, address: str,
                         registration_id: int) -> tuple[int, int]:
        """A channel endpoint's status counter and its local socket address counter, as Aeron labels them
        (``snd-channel: <channel> <address>``, ``snd-local-sockaddr: <status id> <address>``)."""
        status = self.services.counters.allocate(type_id, c.channel_status_label(name, channel, address),
                                        c.channel_status_key(channel), registration_id=registration_id)
        self.services.counters.set_counter_value(status, CHANNEL_STATUS_ACTIVE)
        try:
            sockaddr = self.services.counters.allocate(c.LOCAL_SOCKADDR_TYPE_ID,
                                              c.local_sockaddr_label(sockaddr_name, status, address),
                                              c.local_sockaddr_key(status, address), registration_id=registration_id)
        except BaseException:
            self.services.counters.free(status)
            raise
        self.services.counters.set_counter_value(sockaddr, CHANNEL_STATUS_ACTIVE)
        return status, sockaddr

    def _send_endpoint(self, channel: UdpChannel, uri: ChannelUri, registration_id: int,
                       sndbuf: int | None = None, rcvbuf: int | None = None) -> SendChannelEndpoint:
        if channel.is_multi_destination and (channel.explicit_control is None or channel.explicit_control.port == 0):
            # as aeronmd: no control address (or an ephemeral one) makes an endpoint of its own
            self._mdc_instances += 1
            channel = dataclasses.replace(channel, instance=self._mdc_instances)
        endpoint = self.send_endpoints.get(channel.key)
        if endpoint is not None:
            _check_socket_buffers(endpoint.transport, channel, sndbuf, rcvbuf)
        if endpoint is None:
            transport = self._transport(channel, TransportRole.SEND, sndbuf, rcvbuf)
            try:
                status, sockaddr = self._status_counters(
                    c.SEND_CHANNEL_STATUS_TYPE_ID, c.SEND_CHANNEL_STATUS_NAME, c.SEND_LOCAL_SOCKADDR_NAME,
                    uri.canonical(), str(transport.local_address), registration_id)
            except BaseException:
                transport.close()
                raise
            endpoint = SendChannelEndpoint(channel, transport, self.network_counters, status,
                                           self.sender.next_endpoint_id())
            endpoint.local_sockaddr_counter_id = sockaddr
            self.send_endpoints[channel.key] = endpoint
            command = self.sender.new_command(lib.LBD_SND_ADD_ENDPOINT)
            endpoint.fill_add_command(command)
            self.sender.offer(command)
        return endpoint

    def _close_send_endpoint(self, endpoint: SendChannelEndpoint) -> None:
        """Asks the agent to let go of the endpoint; its sockets and counters go when it acknowledged."""
        if self.send_endpoints.get(endpoint.key) is endpoint:
            del self.send_endpoints[endpoint.key]
        self._closing_endpoints[endpoint.endpoint_id] = endpoint
        command = self.sender.new_command(lib.LBD_SND_REMOVE_ENDPOINT)
        command.endpoint_id = endpoint.endpoint_id
        self.sender.offer(command)

    def _send_endpoint_removed(self, endpoint: SendChannelEndpoint) -> None:
        self.services.counters.free(endpoint.local_sockaddr_counter_id)
        self.services.counters.free(endpoint.status_counter_id)
        endpoint.close()

    def _receive_endpoint(self, channel: UdpChannel, uri: ChannelUri, registration_id: int,
                          params: SubscriptionParams | None = None) -> ReceiveChannelEndpoint:
        endpoint = self.receive_endpoints.get(channel.receive_key)
        sndbuf = None if params is None else params.socket_sndbuf
        rcvbuf = None if params is None else params.socket_rcvbuf
        if endpoint is not None and endpoint.closing:
            # its images may still be sending end-of-stream SMs (about a second): asked again, they end now
            self.receiver.offer(self.receiver.command(lib.LBD_CMD_REMOVE_ENDPOINT, endpoint_id=endpoint.endpoint_id))
            self._await_endpoint_removed(endpoint)  # its socket must be closed before this one binds
            endpoint = None
        if endpoint is not None and endpoint.transport is not None:
            _check_socket_buffers(endpoint.transport, channel, sndbuf, rcvbuf)
            has_control = None if endpoint.channel is None else endpoint.channel.explicit_control
            for key, wanted, has in (("control", channel.explicit_control, has_control),
                                     ("gtag", None if params is None else params.group_tag, endpoint.group_tag)):
                if wanted != has:
                    raise CommandError(ErrorCode.INVALID_CHANNEL, f"channel {channel}: {key} differs from the "
                                                                  f"endpoint's ({has})")
        if endpoint is None:
            self._receive_impairment = None
            transport = self._transport(channel, TransportRole.RECEIVE, sndbuf, rcvbuf)
            impairment = self._receive_impairment
            try:
                status, sockaddr = self._status_counters(
                    c.RECEIVE_CHANNEL_STATUS_TYPE_ID, c.RECEIVE_CHANNEL_STATUS_NAME, c.RECEIVE_LOCAL_SOCKADDR_NAME,
                    uri.canonical(), str(transport.receive_address), registration_id)
            except BaseException:
                transport.close()
                raise
            endpoint_id = self._next_endpoint_id
            self._next_endpoint_id += 1
            endpoint = ReceiveChannelEndpoint(channel, transport, endpoint_id, self._rng.randint(1, 2**63 - 1),
                                              status_counter_id=status)
            endpoint.local_sockaddr_counter_id = sockaddr
            endpoint.group_tag = None if params is None else params.group_tag
            endpoint.nak_delay_ns = None if params is None else params.nak_delay_ns
            fields: dict[str, Any] = {"endpoint_id": endpoint_id, "fd": transport.recv_fd, "send_fd": transport.send_fd,
                                      "receiver_id": endpoint.receiver_id}
            if channel.control is not None:  # multicast: SMs and NAKs go to the control group
                fields["address"] = channel.control.sockaddr
            elif channel.explicit_control is not None:  # control=: SMs and NAKs go there (an MDC sender)
                fields["address"] = channel.explicit_control.sockaddr
                fields["explicit_control"] = 1
            if params is not None and params.group_tag is not None:
                fields.update(group_tag=params.group_tag, has_group_tag=1)
            if impairment is not None:
                fields.update(drop=impairment.drop, duplicate=impairment.duplicate, reorder=impairment.reorder,
                              delay_ns=impairment.delay_ns, jitter_ns=impairment.jitter_ns,
                              reorder_delay_ns=impairment.reorder_delay_ns, seed=impairment.seed)
            send = self._send_impairment
            if send is not None:
                fields.update(send_drop=send.drop, send_duplicate=send.duplicate, send_reorder=send.reorder,
                              send_delay_ns=send.delay_ns, send_jitter_ns=send.jitter_ns,
                              send_reorder_delay_ns=send.reorder_delay_ns, send_seed=send.seed)
            self.receiver.offer(self.receiver.command(lib.LBD_CMD_ADD_ENDPOINT, **fields))
            self.receive_endpoints[channel.receive_key] = endpoint
            self._endpoints_by_id[endpoint_id] = endpoint
        return endpoint

    def _close_receive_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
        """Asks the agent to let go of the endpoint; its socket closes when the agent says it has."""
        if endpoint.closing:
            return
        endpoint.closing = True
        self.receiver.offer(self.receiver.command(lib.LBD_CMD_REMOVE_ENDPOINT, endpoint_id=endpoint.endpoint_id))

    def _endpoint_removed(self, endpoint: ReceiveChannelEndpoint) -> None:
        self._endpoints_by_id.pop(endpoint.endpoint_id, None)
        if self.receive_endpoints.get(endpoint.key) is endpoint:
            del self.receive_endpoints[endpoint.key]
        for image in list(endpoint.images.values()):
            self._close_image(endpoint, image, notify=True)
        if endpoint.local_sockaddr_counter_id >= 0:
            self.services.counters.free(endpoint.local_sockaddr_counter_id)
        for destination in endpoint.destinations.values():
            self.services.counters.free(destination.local_sockaddr_counter_id)
        self.services.counters.free(endpoint.status_counter_id)
        endpoint.close()

    def _await_endpoint_removed(self, endpoint: ReceiveChannelEndpoint, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while endpoint.endpoint_id in self._endpoints_by_id:
            if time.monotonic() > deadline:
                raise CommandError(ErrorCode.GENERIC_ERROR, f"{errno_text(errno.EADDRINUSE)}\n"
                                   f"channel {endpoint.key}: its previous socket is still open")
            if self.receiver.runs_inline:
                self.receiver.do_work(time.monotonic_ns())
            else:
                time.sleep(0.0005)
            self.on_receiver_events(time.monotonic_ns())

    # -- publications ----------------------------------------------------------------------------------

    def _flow_control(self, params: PublicationParams) -> FlowControl:
        spec = params.flow_control
        timeout = self.services.ctx.flow_control_receiver_timeout_ns
        if spec is not None and spec.receiver_timeout_ns is not None:
            timeout = spec.receiver_timeout_ns
        if spec is not None and spec.strategy == "min":
            return MinMulticastFlowControl(timeout)
        if spec is not None and spec.strategy == "tagged":
            return TaggedFlowControl(DEFAULT_GROUP_TAG if spec.group_tag is None else spec.group_tag,
                                     spec.group_min_size or 0, timeout)
        # unicast, and "max" (Aeron's multicast and MDC default): the limit follows the furthest receiver
        return UnicastFlowControl(timeout)

    def add_publication(self, registration_id: int, uri: ChannelUri, params: PublicationParams, stream_id: int,
                        exclusive: bool, client_id: int = 0) -> NetworkPublication:
        """The stream's publication on this channel (a new one unless a shared one exists); ``client_id``
        owns a new one's pub-lmt counter."""
        channel = self.udp_channel(uri)
        flow_control = self._flow_control(params)
        if not exclusive:
            for publication in self.publications:
                if (publication.is_exclusive or publication.stream_id != stream_id
                        or publication.endpoint_key != channel.key or publication.state != PublicationState.ACTIVE):
                    continue
                mismatch = confirm_match(params, publication.log.term_length, publication.log.mtu,
                                         publication.session_id, f"stream-id={stream_id} channel={channel.key}")
                if mismatch is not None:
                    raise CommandError(ErrorCode.GENERIC_ERROR, mismatch)  # aeronmd's code for it
                return publication
        if params.session_id is not None:
            for publication in self.publications:
                if (publication.stream_id == stream_id and publication.session_id == params.session_id
                        and publication.endpoint_key == channel.key and publication.state != PublicationState.CLOSED):
                    raise CommandError(
                        ErrorCode.GENERIC_ERROR,  # as aeronmd answers a clash
                        f"existing publication has clashing session-id={params.session_id} for "
                        f"stream-id={stream_id} channel={channel.key}")
        endpoint = self._send_endpoint(channel, uri, registration_id, params.socket_sndbuf, params.socket_rcvbuf)
        try:
            return self._new_publication(registration_id, uri, channel, endpoint, stream_id, exclusive,
                                         params, flow_control, client_id)
        except BaseException:
            if endpoint.is_unused:
                self._close_send_endpoint(endpoint)
            raise

    def _new_publication(self, registration_id: int, uri: ChannelUri, channel: UdpChannel,
                         endpoint: SendChannelEndpoint, stream_id: int, exclusive: bool, params: PublicationParams,
                         flow_control: FlowControl, client_id: int) -> NetworkPublication:
        ctx = self.services.ctx
        services = self.services
        term_length, mtu, window = params.term_length, params.mtu, params.window_length
        # the client's publication opens the stream's wake-up semaphore (nobody waits on it)
        log = services.create_publication_log(registration_id, stream_id, params)
        name = uri.canonical()
        counter_ids: list[int] = []
        try:
            counter_ids = services.allocate_stream_counters(
                (c.PUBLISHER_POSITION_TYPE_ID, c.PUBLISHER_LIMIT_TYPE_ID, c.SENDER_POSITION_TYPE_ID,
                 c.SENDER_LIMIT_TYPE_ID, c.SENDER_BPE_TYPE_ID), registration_id, log.session_id, stream_id, name,
                client_id)
            publication = NetworkPublication(
                registration_id=registration_id,
                channel=name,
                is_exclusive=exclusive,
                log=log,
                sender=self.sender,
                endpoint_key=endpoint.key,
                endpoint_id=endpoint.endpoint_id,
                destination=b"" if channel.is_multi_destination else endpoint.transport.channel.data.sockaddr,
                channel_status_id=endpoint.status_counter_id,
                positions=NetworkPublicationPositions(*(self.services.counters.position(i) for i in counter_ids)),
                window_length=window,
                max_datagrams=ctx.send_batch,
                flow_control=flow_control,
                # as Aeron: max-resend bounds a group's retransmits; a unicast publication has one, reused
                retransmit=RetransmitHandler(term_length, log.initial_term_id,
                                             max_actions=params.max_resend or DEFAULT_MAX_ACTIONS,
                                             group_semantics=channel.is_multicast or channel.is_multi_destination),
                now_ns=self.now_ns,
                mtu=mtu,
                ttl=channel.ttl,
                spies_simulate_connection=params.spies_simulate_connection,
                untethered_window_limit_timeout_ns=params.untethered_window_limit_timeout_ns,
                untethered_resting_timeout_ns=params.untethered_resting_timeout_ns,
                unblock_timeout_ns=ctx.unblock_timeout_ns,
            )
            endpoint.add(publication)
        except BaseException:
            services.free_counters(counter_ids)
            services.delete_log(log)
            raise
        self.publications.append(publication)
        command = self.sender.new_command(lib.LBD_SND_ADD_PUBLICATION)
        publication.fill_add_command(command)
        self.sender.offer(command)
        return publication

    def close_publication(self, publication: NetworkPublication) -> None:
        """Drained or lingered long enough: the agent lets go of it, then (on its acknowledgement) counters
        are freed and the file deleted; the endpoint is closed when unused."""
        with contextlib.suppress(ValueError):
            self.publications.remove(publication)
        publication.close()
        for link in publication.subscribers.values():  # (their counters go with the publication's)
            self._announce_spy_unavailable(publication, link)  # every linked spy, resting ones too (aeronmd)
        self._closing_publications[publication.registration_id] = publication
        command = self.sender.new_command(lib.LBD_SND_REMOVE_PUBLICATION)
        command.endpoint_id = publication.endpoint_id
        command.publication_id = publication.registration_id
        self.sender.offer(command)
        endpoint = self.send_endpoints.get(publication.endpoint_key)
        if endpoint is not None and endpoint.endpoint_id == publication.endpoint_id:
            endpoint.remove(publication)
            if endpoint.is_unused:
                self._close_send_endpoint(endpoint)

    # -- multi-destination-cast: manual destinations ---------------------------------------------------

    def publication(self, registration_id: int) -> NetworkPublication | None:
        """The network publication of this registration id (any client's), or None."""
        for publication in self.publications:
            if publication.registration_id == registration_id:
                return publication
        return None

    def destination_endpoint(self, publication: NetworkPublication, channel: str) -> tuple[SendChannelEndpoint,
                                                                                             bytes]:
        """The manual MDC endpoint of ``publication`` and the sockaddr of destination ``channel``: what aeronmd
        checks, with its codes (INVALID_CHANNEL for a spy or a key destinations must not carry, GENERIC_ERROR
        for a channel without manual control or a destination without an endpoint)."""
        if channel.startswith("aeron-spy:"):
            raise CommandError(ErrorCode.INVALID_CHANNEL, f"Aeron spies are invalid as send destinations: {channel}")
        uri: ChannelUri | None
        try:
            uri = ChannelUri.parse(channel)
        except InvalidChannelError:
            uri = None  # answered below as a destination without an endpoint
        for key in ("mtu", "rcv-wnd", "so-rcvbuf", "so-sndbuf", "response-correlation-id"):
            if uri is not None and key in uri.params:
                raise CommandError(ErrorCode.INVALID_CHANNEL,
                                   f"destinations must not contain the key: {key} channel={channel}")
        endpoint = self.send_endpoints.get(publication.endpoint_key)
        if endpoint is None or not endpoint.is_manual:
            raise CommandError(ErrorCode.GENERIC_ERROR,
                               f"channel does not allow manual control of destinations: {channel}")
        target = uri.endpoint() if uri is not None and uri.is_udp else None
        if target is None:
            raise CommandError(ErrorCode.GENERIC_ERROR, f"incorrect URI format for destination: {channel}")
        if target[1] == 0:
            raise CommandError(ErrorCode.GENERIC_ERROR,
                               f"endpoint has port=0 for send destination: channel={channel}")
        try:
            address = SocketAddress.resolve(target[0], target[1], "endpoint")
        except InvalidChannelError as exc:
            raise CommandError(ErrorCode.UNKNOWN_HOST, str(exc)) from None
        return endpoint, address.sockaddr

    def add_destination(self, publication: NetworkPublication, channel: str, correlation_id: int) -> None:
        """ADD_DESTINATION: the publication's manual MDC endpoint sends to ``channel``'s endpoint too."""
        endpoint, sockaddr = self.destination_endpoint(publication, channel)
        if len(endpoint.destinations) >= lib.LBD_SND_MAX_DESTINATIONS:  # the agent would not send to it
            raise CommandError(ErrorCode.GENERIC_ERROR, f"publication already has "
                               f"{lib.LBD_SND_MAX_DESTINATIONS} destinations (at most): {channel}")
        endpoint.destinations.append((sockaddr, correlation_id))
        command = self.sender.new_command(lib.LBD_SND_ADD_DESTINATION)
        command.endpoint_id = endpoint.endpoint_id
        command.publication_id = correlation_id
        command.now_ns = self.now_ns
        command.destination_length = len(sockaddr)
        command.destination[0 : len(sockaddr)] = sockaddr
        self.sender.offer(command)

    def remove_destination(self, publication: NetworkPublication, channel: str) -> None:
        """REMOVE_DESTINATION: nothing more goes to ``channel``'s endpoint (a destination not there: no-op)."""
        endpoint, sockaddr = self.destination_endpoint(publication, channel)
        self._forget_destination(endpoint, lambda entry: entry[0] == sockaddr)
        command = self.sender.new_command(lib.LBD_SND_REMOVE_DESTINATION)
        command.endpoint_id = endpoint.endpoint_id
        command.destination_length = len(sockaddr)
        command.destination[0 : len(sockaddr)] = sockaddr
        self.sender.offer(command)

    def remove_destination_by_id(self, publication: NetworkPublication, destination_id: int) -> bool:
        """REMOVE_DESTINATION_BY_ID: the destination its ADD_DESTINATION (correlation id ``destination_id``)
        added goes; False when the publication has no manual destinations (an unknown id: nothing goes)."""
        endpoint = self.send_endpoints.get(publication.endpoint_key)
        if endpoint is None or not endpoint.is_manual:
            return False
        sockaddr = self._forget_destination(endpoint, lambda entry: entry[1] == destination_id)
        if sockaddr is not None:  # the agent takes one destination at that address: the same one, or its twin
            command = self.sender.new_command(lib.LBD_SND_REMOVE_DESTINATION)
            command.endpoint_id = endpoint.endpoint_id
            command.destination_length = len(sockaddr)
            command.destination[0 : len(sockaddr)] = sockaddr
            self.sender.offer(command)
        return True

    @staticmethod
    def _forget_destination(endpoint: SendChannelEndpoint,
                            matches: Callable[[tuple[bytes, int]], bool]) -> bytes | None:
        """The last destination that ``matches`` leaves the endpoint's list (as the agent removes the last
        added at an address); its sockaddr, or None."""
        for i in range(len(endpoint.destinations) - 1, -1, -1):
            if matches(endpoint.destinations[i]):
                return endpoint.destinations.pop(i)[0]
        return None

    def _publication_removed(self, publication: NetworkPublication) -> None:
        self.services.free_counters([link.counter_id for link in publication.subscribers.values()])
        publication.subscribers.clear()
        self.services.free_counters(publication.counter_ids)
        self.services.delete_log(publication.log)

    def _on_sender_events(self) -> int:
        events = self.sender.poll_events()
        for event in events:
            if event.type == lib.LBD_SND_PUBLICATION_REMOVED:
                publication = self._closing_publications.pop(event.publication_id, None)
                if publication is not None:
                    self._publication_removed(publication)
            elif event.type == lib.LBD_SND_ENDPOINT_REMOVED:
                endpoint = self._closing_endpoints.pop(event.endpoint_id, None)
                if endpoint is not None:
                    self._send_endpoint_removed(endpoint)
            elif event.type == lib.LBD_SND_PUBLICATION_DRAINED:
                for publication in self.publications:
                    if publication.registration_id == event.publication_id:
                        publication.on_drained(event.value)
            elif event.type == lib.LBD_SND_LOG_CORRUPTED:
                self.services.record_error(f"network publication {event.publication_id}: corrupted frame header at "
                                           f"position {event.value}; nothing more is sent from its log")
            elif event.type == lib.LBD_SND_SEND_ERROR:
                self.services.record_error(f"send endpoint {event.endpoint_id}: send failed: "
                                           f"{os.strerror(event.value)}")
            elif event.type == lib.LBD_SND_PUBLICATION_ERROR:
                # a receiver sent an ERR frame (it rejected the image): recorded as aeronmd records it
                publication = next((p for p in self.publications if p.registration_id == event.publication_id), None)
                if publication is not None:
                    self.services.record_error(
                        f"onPublicationError: registrationId={publication.registration_id}, sessionId="
                        f"{publication.session_id}, streamId={publication.stream_id}, errorCode={event.value}")
            elif event.type == lib.LBD_SND_COMMAND_REFUSED:
                self.services.record_error(f"sender agent refused command {event.value} (endpoint "
                                           f"{event.endpoint_id}, publication {event.publication_id})")
        return len(events)

    # -- spies -----------------------------------------------------------------------------------------

    def add_spy_subscription(self, registration_id: int, client_id: int, uri: ChannelUri,
                             params: SubscriptionParams, stream_id: int) -> SpySubscription:
        """A spy on this driver's network publications of ``uri``'s transport and ``stream_id``: answered
        ON_SUBSCRIPTION_READY (no channel status counter, as aeronmd), then an image of each one now active."""
        channel = self.udp_channel(uri)
        self.services.ensure_wake_semaphore(stream_id)
        spy = SpySubscription(registration_id, client_id, stream_id, uri.canonical(), channel.key, params)
        # every counter first: a refused spy (no counter left) must leave nothing behind - no spy linked to later
        # publications, and above all no link that nobody reads holding a publisher back
        links: list[tuple[NetworkPublication, SubscriberLink]] = []
        try:
            for publication in self.publications:
                if spy.matches(publication) and self._accepts_spies(publication):
                    links.append((publication, self._new_spy_link(spy, publication)))
        except BaseException:
            self.services.free_counters([link.counter_id for _, link in links])
            raise
        self.spies[registration_id] = spy
        self.services.respond(ControlResponse.ON_SUBSCRIPTION_READY,
                              SubscriptionReady(registration_id, c.NULL_COUNTER_ID))
        for publication, link in links:
            publication.add_spy(link)
            self._announce_spy_available(publication, link)
        return spy

    @staticmethod
    def _accepts_spies(publication: NetworkPublication) -> bool:
        """Aeron's rule: an active publication, or a draining one that spies still read and whose sender
        has not reached the end of its log."""
        if publication.state == PublicationState.ACTIVE:
            return True
        return (publication.state == PublicationState.DRAINING
                and any(link.included_in_limit for link in publication.subscribers.values())
                and publication.log.producer_position() > publication.snd_pos)

    def link_spies(self, publication: NetworkPublication) -> None:
        """Every spy of a new publication's channel and stream reads it from now on (after its READY)."""
        for spy in list(self.spies.values()):
            if spy.matches(publication) and spy.registration_id not in publication.subscribers:
                self._link_spy(spy, publication)

    def _link_spy(self, spy: SpySubscription, publication: NetworkPublication) -> None:
        link = self._new_spy_link(spy, publication)
        publication.add_spy(link)
        self._announce_spy_available(publication, link)

    def _new_spy_link(self, spy: SpySubscription, publication: NetworkPublication) -> SubscriberLink:
        """A spy's link to ``publication`` with its sub-pos counter at the join position (not yet added)."""
        join = publication.snd_pos  # Aeron's join position for a spy: the sender's position
        label = c.stream_position_label(c.SUBSCRIBER_POSITION_NAME, spy.registration_id, publication.session_id,
                                        publication.stream_id, spy.channel, join)
        key = c.stream_position_key(spy.registration_id, publication.session_id, publication.stream_id,
                                    spy.channel)
        counters = self.services.counters
        counter_id = counters.allocate(c.SUBSCRIBER_POSITION_TYPE_ID, label, key,
                                       registration_id=spy.registration_id, owner_id=spy.client_id,
                                       reference_id=publication.registration_id)
        position = counters.position(counter_id)
        position.set(join)
        return SubscriberLink(spy.registration_id, spy.client_id, counter_id, position, join,
                              is_tether=spy.params.tether, now_ns=self.now_ns)

    def _announce_spy_available(self, publication: NetworkPublication, link: SubscriberLink) -> None:
        self.services.respond(
            ControlResponse.ON_AVAILABLE_IMAGE,
            AvailableImage(publication.registration_id, publication.session_id, publication.stream_id,
                           link.subscription_id, link.counter_id, str(publication.log.path), SPY_SOURCE_IDENTITY))

    def _announce_spy_unavailable(self, publication: NetworkPublication, link: SubscriberLink,
                                  channel: str | None = None) -> None:
        """ON_UNAVAILABLE_IMAGE to a spy, naming its channel (aeronmd names ``aeron:ipc`` when an untethered
        spy leaves)."""
        if channel is None:
            spy = self.spies.get(link.subscription_id)
            channel = spy.channel if spy is not None else publication.channel
        self.services.respond(
            ControlResponse.ON_UNAVAILABLE_IMAGE,
            UnavailableImage(publication.registration_id, link.subscription_id, publication.stream_id, channel))

    def _remove_spy_subscription(self, registration_id: int) -> None:
        self.spies.pop(registration_id, None)
        for publication in self.publications:
            link = publication.remove_spy(registration_id)
            if link is not None:
                # a freed counter is not reused before its free-for-reuse deadline: the agent's last reads
                # (before it takes the removal) are safe
                self.services.counters.free(link.counter_id)

    def _check_untethered_spies(self) -> int:
        work = 0
        for publication in self.publications:
            # (draining too: a stalled untethered spy then rests rather than holding the closed publication)
            if publication.state not in (PublicationState.ACTIVE, PublicationState.DRAINING) \
                    or not publication.subscribers:
                continue
            for event in publication.check_untethered(self.now_ns):
                if event.available:
                    self._announce_spy_available(publication, event.link)
                elif event.available is False:
                    self._announce_spy_unavailable(publication, event.link, SPY_SOURCE_IDENTITY)
                work += 1
        return work

    # -- subscriptions ---------------------------------------------------------------------------------

    def add_subscription(self, registration_id: int, client_id: int, uri: ChannelUri, params: SubscriptionParams,
                         stream_id: int) -> NetworkSubscription:
        if params.manual:
            self._check_clash(MDS_KEY, uri, params, stream_id)
            endpoint = self._mds_endpoint(uri, registration_id, params)
        else:
            channel = self.udp_channel(uri)
            self._check_clash(channel.receive_key, uri, params, stream_id)
            endpoint = self._receive_endpoint(channel, uri, registration_id, params)
        self.services.ensure_wake_semaphore(stream_id)
        subscription = NetworkSubscription(registration_id, client_id, stream_id, uri.canonical(), endpoint, params)
        if endpoint.add_subscription(stream_id):
            self.receiver.offer(self.receiver.command(lib.LBD_CMD_ADD_SUBSCRIPTION, endpoint_id=endpoint.endpoint_id,
                                                      stream_id=stream_id))
        self.subscriptions[registration_id] = subscription
        return subscription

    def _check_clash(self, key: str, uri: ChannelUri, params: SubscriptionParams, stream_id: int) -> None:
        """Subscriptions of one stream on one endpoint (whose sessions can meet) share its images: they must
        agree on ``reliable`` and ``rejoin`` (aeronmd's GENERIC_ERROR otherwise)."""
        for other in self.subscriptions.values():
            if (other.endpoint.key != key or other.endpoint.closing or other.stream_id != stream_id
                    or other.params is None):
                continue
            if None not in (params.session_id, other.params.session_id) and params.session_id != other.params.session_id:
                continue
            for name, mine, theirs in (("reliable", params.reliable, other.params.reliable),
                                       ("rejoin", params.rejoin, other.params.rejoin)):
                if mine != theirs:
                    raise CommandError(ErrorCode.GENERIC_ERROR,
                                       f"option conflicts with existing subscription: {name}="
                                       f"{'true' if mine else 'false'} existingChannel={other.channel} channel={uri}")

    def _mds_endpoint(self, uri: ChannelUri, registration_id: int,
                      params: SubscriptionParams) -> ReceiveChannelEndpoint:
        """The MDS endpoint (``control-mode=manual``): no socket until destinations are added."""
        endpoint = self.receive_endpoints.get(MDS_KEY)
        if endpoint is not None and endpoint.closing:
            self._await_endpoint_removed(endpoint)
            endpoint = None
        if endpoint is not None:
            return endpoint
        counters = self.services.counters
        status = counters.allocate(c.RECEIVE_CHANNEL_STATUS_TYPE_ID,
                                   c.channel_status_label(c.RECEIVE_CHANNEL_STATUS_NAME, uri.canonical(), ""),
                                   c.channel_status_key(uri.canonical()), registration_id=registration_id)
        counters.set_counter_value(status, CHANNEL_STATUS_ACTIVE)
        endpoint_id = self._next_endpoint_id
        self._next_endpoint_id += 1
        endpoint = ReceiveChannelEndpoint(None, None, endpoint_id, self._rng.randint(1, 2**63 - 1),
                                          status_counter_id=status, uri=uri)
        endpoint.socket_sndbuf, endpoint.socket_rcvbuf = params.socket_sndbuf, params.socket_rcvbuf
        endpoint.nak_delay_ns = params.nak_delay_ns
        endpoint.group_tag = params.group_tag
        tag: dict[str, Any] = {} if params.group_tag is None else {"group_tag": params.group_tag, "has_group_tag": 1}
        self.receiver.offer(self.receiver.command(lib.LBD_CMD_ADD_ENDPOINT, endpoint_id=endpoint_id, fd=-1, send_fd=-1,
                                                  receiver_id=endpoint.receiver_id, manual=1, **tag))
        self.receive_endpoints[MDS_KEY] = endpoint
        self._endpoints_by_id[endpoint_id] = endpoint
        return endpoint

    def add_receive_destination(self, subscription: NetworkSubscription, channel: str, destination_id: int) -> None:
        """ADD_RCV_DESTINATION: a socket on ``channel`` (``aeron:udp?endpoint=...``) that feeds the MDS
        subscription's endpoint, known to the agent as ``destination_id``."""
        endpoint = subscription.endpoint
        if not endpoint.is_manual:
            raise CommandError(ErrorCode.INVALID_CHANNEL, "channel does not allow manual control")
        try:
            uri = ChannelUri.parse(channel)
            check_destination(uri)
        except InvalidChannelError as exc:
            raise CommandError(ErrorCode.INVALID_CHANNEL, str(exc)) from None
        udp = self.udp_channel(uri)
        if len(endpoint.destinations) >= lib.LBD_MAX_DESTINATIONS:
            raise CommandError(ErrorCode.GENERIC_ERROR, f"channel {endpoint.uri}: at most "
                                                        f"{lib.LBD_MAX_DESTINATIONS} receive destinations")
        transport = self._transport(udp, TransportRole.RECEIVE, endpoint.socket_sndbuf, endpoint.socket_rcvbuf)
        address = str(transport.receive_address)
        try:  # each destination's local socket address, as aeronmd counts it
            sockaddr = self.services.counters.allocate(
                c.LOCAL_SOCKADDR_TYPE_ID,
                c.local_sockaddr_label(c.RECEIVE_LOCAL_SOCKADDR_NAME, endpoint.status_counter_id, address),
                c.local_sockaddr_key(endpoint.status_counter_id, address), registration_id=destination_id)
        except BaseException:
            transport.close()
            raise
        self.services.counters.set_counter_value(sockaddr, CHANNEL_STATUS_ACTIVE)
        endpoint.destinations[destination_id] = ReceiveDestination(destination_id, udp, transport, sockaddr)
        fields: dict[str, Any] = {"endpoint_id": endpoint.endpoint_id, "destination_id": destination_id,
                                  "fd": transport.recv_fd, "send_fd": transport.send_fd}
        if udp.control is not None:  # multicast: SMs and NAKs go to the control group
            fields["address"] = udp.control.sockaddr
        self.receiver.offer(self.receiver.command(lib.LBD_CMD_ADD_DESTINATION, **fields))

    def remove_receive_destination(self, subscription: NetworkSubscription, channel: str) -> None:
        """REMOVE_RCV_DESTINATION: the destination on that transport stops feeding the endpoint (its socket
        closes when the agent let go); none there is no error, as aeronmd."""
        endpoint = subscription.endpoint
        if not endpoint.is_manual:
            raise CommandError(ErrorCode.INVALID_CHANNEL, "channel does not allow manual control")
        try:
            uri = ChannelUri.parse(channel)
        except InvalidChannelError as exc:
            raise CommandError(ErrorCode.INVALID_CHANNEL, str(exc)) from None
        key = self.udp_channel(uri).receive_key
        for destination in endpoint.destinations.values():
            if destination.channel.receive_key == key and not destination.removing:
                destination.removing = True
                self.receiver.offer(self.receiver.command(lib.LBD_CMD_REMOVE_DESTINATION,
                                                          endpoint_id=endpoint.endpoint_id,
                                                          destination_id=destination.id))
                return

    def reject_image(self, correlation_id: int, reason: str) -> bool:
        """REJECT_IMAGE of a UDP image: the agent stops taking its data and sends ERR frames until its
        liveness runs out; False when no UDP image has that id."""
        text = reason.encode("utf-8")
        for endpoint in self._endpoints_by_id.values():
            image = endpoint.images.get(correlation_id)
            if image is None:
                continue
            if len(text) > MAX_REJECT_REASON_LENGTH:
                raise CommandError(ErrorCode.GENERIC_ERROR, "Invalidation reason_text must be 1023 bytes or less")
            buffer = ffi.new("uint8_t[]", text or b"\0")
            self._reject_reasons[correlation_id] = buffer  # the agent copies it when it takes the command
            self.receiver.offer(self.receiver.command(lib.LBD_CMD_REJECT_IMAGE, image_id=correlation_id,
                                                      text=buffer, text_length=len(text)))
            return True
        return False

    def images_to_link(self, subscription: NetworkSubscription) -> int:
        """How many existing images ``subscription`` would join (a sub-pos counter each)."""
        return sum(1 for image in subscription.endpoint.images_of(subscription.stream_id)
                   if subscription.matches(image.stream_id, image.session_id))

    def link_existing_images(self, subscription: NetworkSubscription) -> None:
        """A subscription that arrives while images of its stream exist joins them at their live end."""
        for image in subscription.endpoint.images_of(subscription.stream_id):
            if subscription.matches(image.stream_id, image.session_id):
                self._link(subscription, image, image.subscriber_join_position())

    def remove_subscription(self, registration_id: int) -> None:
        if registration_id in self.spies:
            self._remove_spy_subscription(registration_id)
            return
        subscription = self.subscriptions.pop(registration_id, None)
        if subscription is None:
            return
        endpoint = subscription.endpoint
        for image in endpoint.images_of(subscription.stream_id):
            self._unlink(image, registration_id)
        if endpoint.remove_subscription(subscription.stream_id):
            # the stream's last subscription: the agent's images send end-of-stream SMs for a while (a min or
            # tagged sender lets this receiver go), then end and are reported (IMAGE_REMOVED)
            for image in endpoint.images_of(subscription.stream_id):
                image.begin_removing()
            self.receiver.offer(self.receiver.command(lib.LBD_CMD_REMOVE_SUBSCRIPTION,
                                                      endpoint_id=endpoint.endpoint_id,
                                                      stream_id=subscription.stream_id))
        if endpoint.is_unused:
            self._close_receive_endpoint(endpoint)

    def _unlink(self, image: PublicationImage, registration_id: int) -> None:
        link = image.remove_subscriber(registration_id)
        if link is None:
            return
        # the agent may read (and a resumed subscriber's join write) the counter until it acknowledges the
        # removal: freed then (SUBSCRIBER_REMOVED), never before, or a new counter could take its place
        self._unlinking.add(link.counter_id)
        self.receiver.offer(self.receiver.command(lib.LBD_CMD_REMOVE_SUBSCRIBER, image_id=image.correlation_id,
                                                  position=self._position_pointer(link.position),
                                                  subscriber_id=link.counter_id))

    @staticmethod
    def _position_pointer(position: Any) -> Any:
        return ffi.cast("int64_t *", position.pointer)

    # -- images ----------------------------------------------------------------------------------------

    def on_receiver_events(self, now_ns: int) -> int:
        """Drains the receiver agent's events: images to create or that ended, losses, corrupt images."""
        events = self.receiver.poll_events()
        for event in events:
            if event.type == lib.LBD_EVENT_SUBSCRIBER_REMOVED:  # whether or not its endpoint is still here
                if event.subscriber_id in self._unlinking:
                    self._unlinking.discard(event.subscriber_id)
                    self.services.counters.free(event.subscriber_id)
                continue
            endpoint = self._endpoints_by_id.get(event.endpoint_id)
            if event.type == lib.LBD_EVENT_ENDPOINT_REMOVED:
                if endpoint is not None:
                    self._endpoint_removed(endpoint)
            elif endpoint is None:
                continue
            elif event.type == lib.LBD_EVENT_CREATE_IMAGE:
                if not endpoint.closing:
                    setup = SetupFrame(event.term_offset, event.session_id, event.stream_id, event.initial_term_id,
                                       event.active_term_id, event.term_length, event.mtu, event.ttl, event.flags)
                    self._on_create_image(endpoint, setup, event.address, now_ns, event.destination_id)
            elif event.type == lib.LBD_EVENT_DESTINATION_REMOVED:
                destination = endpoint.destinations.pop(event.destination_id, None)
                if destination is not None:
                    self.services.counters.free(destination.local_sockaddr_counter_id)
                    destination.transport.close()
            elif event.type == lib.LBD_EVENT_IMAGE_REMOVED:
                image = endpoint.images.get(event.image_id)
                if image is not None:
                    self._close_image(endpoint, image, notify=True)
            elif event.type == lib.LBD_EVENT_LOSS:
                image = endpoint.images.get(event.image_id)
                if image is not None and image.loss_observer is not None:
                    image.loss_observer(Gap(event.term_id, event.term_offset, event.length))
            elif event.type == lib.LBD_EVENT_CORRUPT_IMAGE:
                image = endpoint.images.get(event.image_id)
                where = image.source_identity if image is not None else "?"
                self.services.record_error(
                    f"image {event.image_id} (session {event.session_id} stream {event.stream_id} from {where}) "
                    f"closed: an impossible frame in its term {event.term_id} at offset {event.term_offset}")
        return len(events)

    def _refuse(self, source: bytes, why: str) -> None:
        """A SETUP over a limit: one error-log entry per source (its observation count counts the refusals)."""
        self.services.record_error(f"SETUP from {describe_sockaddr(source)} refused: {why}")

    def _check_limits(self, endpoint: ReceiveChannelEndpoint, setup: SetupFrame, source: bytes) -> str | None:
        ctx = self.services.ctx
        if setup.term_length > ctx.max_image_term_length:
            return f"term length {setup.term_length} is over the limit of {ctx.max_image_term_length}"
        if len(endpoint.images) >= ctx.max_images_per_channel:
            return f"the channel has its limit of {ctx.max_images_per_channel} images"
        images = [i for e in self._endpoints_by_id.values() for i in e.images.values()]
        if len(images) >= ctx.max_images:
            return f"the driver has its limit of {ctx.max_images} images"
        if sum(1 for i in images if i.source == source) >= ctx.max_images_per_source:
            return f"the source has its limit of {ctx.max_images_per_source} images"
        return None

    def _on_create_image(self, endpoint: ReceiveChannelEndpoint, setup: SetupFrame, source: bytes,
                         now_ns: int, destination_id: int = 0) -> None:
        subscriptions = [s for s in self.subscriptions.values()
                         if s.endpoint is endpoint and s.matches(setup.stream_id, setup.session_id)]
        if not subscriptions:
            return
        try:
            d.check_mtu(setup.mtu, setup.term_length)
        except ValueError as exc:
            self._refuse(source, str(exc))
            return
        why = self._check_limits(endpoint, setup, source)
        if why is not None:
            self._refuse(source, why)
            return
        try:
            self._create_image(endpoint, setup, source, subscriptions, destination_id)
        except (OSError, ValueError) as exc:  # the agent asks again after its pending timeout
            self.services.record_error(f"cannot create an image for session {setup.session_id} stream {setup.stream_id}: "
                              f"{type(exc).__name__}: {exc}")

    def _create_image(self, endpoint: ReceiveChannelEndpoint, setup: SetupFrame, source: bytes,
                      subscriptions: list[NetworkSubscription], destination_id: int = 0) -> None:
        ctx = self.services.ctx
        correlation_id = self.services.next_correlation_id()
        # rcv-wnd of the first subscription that named one, else the driver's; the first one's other settings
        initial_window = initial_receiver_window((s.params.receiver_window for s in subscriptions
                                                  if s.params is not None), ctx.receiver_window)
        first = subscriptions[0].params
        sparse = not ctx.pre_touch if first is None else first.sparse
        reliable = True if first is None else first.reliable
        rejoin = True if first is None else first.rejoin
        multicast = treat_as_multicast("infer" if first is None else first.group, endpoint.is_multicast, setup.flags)
        window = receiver_window_length(setup.term_length, initial_window)
        path = self.services.images_dir / f"{correlation_id}{LOG_SUFFIX}"
        log = LogBuffers.create(
            path,
            term_length=setup.term_length,
            mtu=setup.mtu,
            session_id=setup.session_id,
            stream_id=setup.stream_id,
            initial_term_id=setup.initial_term_id,
            correlation_id=correlation_id,
            receiver_window_length=window,
            mode=ctx.file_mode,
            pre_touch=not sparse,
            reserve=ctx.storage_reserve,
        )
        counter_ids: list[int] = []
        try:
            fill_image_metadata(log, initial_window, sparse=sparse,
                                socket_sndbuf=0 if first is None else first.socket_sndbuf or 0,
                                socket_rcvbuf=0 if first is None else first.socket_rcvbuf or 0, rejoin=rejoin,
                                reliable=reliable, group=multicast)
            join = setup.join_position()
            name = endpoint.uri.canonical()
            observer = None
            if self.services.loss_report is not None:
                observer = ImageLossObserver(self.services.loss_report, self.services.epoch_ms, setup.session_id,
                                             setup.stream_id, name, describe_sockaddr(source))
            key = c.stream_position_key(correlation_id, setup.session_id, setup.stream_id, name)
            for type_id in (c.RECEIVER_HWM_TYPE_ID, c.RECEIVER_POSITION_TYPE_ID):
                label = c.stream_position_label(c.STREAM_COUNTER_NAMES[type_id], correlation_id, setup.session_id,
                                                setup.stream_id, name)
                counter_ids.append(self.services.counters.allocate(type_id, label, key, registration_id=correlation_id))
            image = PublicationImage(
                correlation_id=correlation_id,
                channel=name,
                log=log,
                session_id=setup.session_id,
                stream_id=setup.stream_id,
                join_position=join,
                source=source,
                source_identity=describe_sockaddr(source),
                rcv_hwm=self.services.counters.position(counter_ids[0]),
                rcv_pos=self.services.counters.position(counter_ids[1]),
                waker=ImageWaker(log, wake_semaphore_name(ctx.directory, setup.stream_id)),
                loss_observer=observer,
            )
        except BaseException:
            for counter_id in counter_ids:
                self.services.counters.free(counter_id)
            log.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        # nak-delay: the endpoint's channel's (the subscription that opened it), as aeronmd
        nak_delay_ns = ctx.nak_unicast_delay_ns if endpoint.nak_delay_ns is None else endpoint.nak_delay_ns
        self.receiver.offer(self.receiver.command(
            lib.LBD_CMD_ADD_IMAGE,
            endpoint_id=endpoint.endpoint_id,
            image_id=correlation_id,
            session_id=setup.session_id,
            stream_id=setup.stream_id,
            term_length=setup.term_length,
            initial_term_id=setup.initial_term_id,
            window_length=window,
            join_position=join,
            terms=ffi.cast("uint8_t *", log.term_pointer(0)),
            meta=ffi.cast("uint8_t *", log.meta.pointer(0)),
            rcv_hwm=self._position_pointer(image.rcv_hwm),
            rcv_pos=self._position_pointer(image.rcv_pos),
            wake=image.waker.semaphore,
            liveness_timeout_ns=ctx.image_liveness_timeout_ns,
            sm_timeout_ns=DEFAULT_SM_TIMEOUT_NS,
            nak_delay_ns=nak_delay_ns,
            nak_retry_ns=max(nak_delay_ns * DEFAULT_UNICAST_RETRY_RATIO, 1),
            nak_max_backoff_ns=ctx.nak_multicast_max_backoff_ns,
            nak_group_size=ctx.nak_multicast_group_size,
            multicast=1 if multicast else 0,
            give_up_ns=-1 if ctx.loss_give_up_ns is None else ctx.loss_give_up_ns,
            address=source,
            destination_id=destination_id,
            reliable=1 if reliable else 0,
            rejoin=1 if rejoin else 0,
        ))
        endpoint.images[correlation_id] = image
        self.services.bytes_mapped(os.path.getsize(path))
        for subscription in subscriptions:
            self._link(subscription, image, join)

    def _link(self, subscription: NetworkSubscription, image: PublicationImage, join: int) -> None:
        # Aeron's sub-pos: the subscription's registration id and channel, owned by its client, referring to
        # the image it reads
        label = c.stream_position_label(c.SUBSCRIBER_POSITION_NAME, subscription.registration_id,
                                        image.session_id, image.stream_id, subscription.channel, join)
        key = c.stream_position_key(subscription.registration_id, image.session_id, image.stream_id,
                                    subscription.channel)
        counter_id = self.services.counters.allocate(c.SUBSCRIBER_POSITION_TYPE_ID, label, key,
                                            registration_id=subscription.registration_id,
                                            owner_id=subscription.client_id, reference_id=image.correlation_id)
        position = self.services.counters.position(counter_id)
        position.set(join)
        image.add_subscriber(
            SubscriberLink(subscription.registration_id, subscription.client_id, counter_id, position, join)
        )
        self.receiver.offer(self.receiver.command(lib.LBD_CMD_ADD_SUBSCRIBER, image_id=image.correlation_id,
                                                  position=self._position_pointer(position)))
        self.services.respond(
            ControlResponse.ON_AVAILABLE_IMAGE,
            AvailableImage(image.correlation_id, image.session_id, image.stream_id, subscription.registration_id,
                           counter_id, str(image.log.path), image.source_identity),
        )

    def close_truncated_images(self) -> int:
        """Asks the receiver agent to end every image whose log file shrank under the driver's mapping (one
        error-log entry each); its subscribers are told when the agent has let go (``IMAGE_REMOVED``), as for
        an image that ended.  A slow-path check: one ``stat`` per image, on the conductor's timer."""
        work = 0
        for endpoint in self._endpoints_by_id.values():
            for image in endpoint.images.values():
                if image.correlation_id in self._truncated_images:
                    continue
                why = image.log.check_truncated()
                if why is None:
                    continue
                self._truncated_images.add(image.correlation_id)
                self.services.record_error(
                    f"{why}: image {image.correlation_id} (session {image.session_id} stream {image.stream_id} "
                    f"from {image.source_identity}) closed")
                self.receiver.offer(self.receiver.command(lib.LBD_CMD_REMOVE_IMAGE, image_id=image.correlation_id))
                work += 1
        return work

    def _close_image(self, endpoint: ReceiveChannelEndpoint, image: PublicationImage, *, notify: bool) -> None:
        """The agent has let go of the image: its subscribers are told, its counters freed, its log closed."""
        endpoint.images.pop(image.correlation_id, None)
        self._truncated_images.discard(image.correlation_id)
        self._reject_reasons.pop(image.correlation_id, None)
        for link in list(image.subscribers.values()):
            image.remove_subscriber(link.subscription_id)
            self.services.counters.free(link.counter_id)
            subscription = self.subscriptions.get(link.subscription_id)
            if notify:
                self.services.respond(
                    ControlResponse.ON_UNAVAILABLE_IMAGE,
                    UnavailableImage(image.correlation_id, link.subscription_id, image.stream_id,
                                     subscription.channel if subscription is not None else image.channel),
                )
        for counter_id in image.counter_ids():
            self.services.counters.free(counter_id)
        path = image.log.path
        with contextlib.suppress(OSError):
            self.services.bytes_mapped(-os.path.getsize(path))
        image.close()
        # clients that still map the file keep their pages; the name is gone
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    # -- duty cycle ------------------------------------------------------------------------------------

    def update(self, now_ns: int) -> int:
        """The conductor's per-cycle duty: the sender agent's events (the agent itself keeps pub-pos, pub-lmt
        and cleaning of every network publication)."""
        self.now_ns = now_ns
        return self._on_sender_events() + self.on_receiver_events(now_ns) + self._check_untethered_spies()

    def on_timer(self, now_ns: int) -> int:
        """Timer duty: claims a dead publisher left in a network publication's log are padded (counted in
        the unblocked-publications system counter)."""
        work = 0
        for publication in self.publications:
            if publication.on_timer(now_ns):
                self.services.increment(c.SystemCounter.UNBLOCKED_PUBLICATIONS)
                work += 1
        return work

    def close(self) -> None:
        """Driver shutdown: sockets closed, logs closed and deleted (the agent's thread has stopped)."""
        for endpoint in list(self._endpoints_by_id.values()):
            for image in list(endpoint.images.values()):
                image.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(image.log.path)
            endpoint.images.clear()
            endpoint.close()
        self._endpoints_by_id.clear()
        self._unlinking.clear()  # the agent is gone: nothing reads those counters any more
        # the counters outlive the agent: keep a copy of its last values for the final publish
        final = ffi.new("lbd_receiver_counters_t *")
        ffi.memmove(final, self.receiver.counters, ffi.sizeof("lbd_receiver_counters_t"))
        self.network_counters.native_receiver = final
        self.receiver.close()
        self.sender.close()  # no duty runs any more: nothing points into the logs or sockets after this
        for send_endpoint in [*self.send_endpoints.values(), *self._closing_endpoints.values()]:
            send_endpoint.close()
        for publication in [*self.publications, *self._closing_publications.values()]:
            publication.log.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(publication.log.path)
        self.receive_endpoints.clear()
        self.send_endpoints.clear()
        self._closing_endpoints.clear()
        self._closing_publications.clear()
        self.publications.clear()
        self.network_counters.publish()

