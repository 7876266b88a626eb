"""``DriverConductor``: the media driver's conductor — commands in, responses out, duties on every log.

Each duty cycle (``do_work(now_ns)``):

1. read client commands from the to-driver ring buffer (bounded per cycle) and answer on the broadcast;
2. run every IPC publication's duty: pub-pos, pub-lmt (min sub-pos + window, with hysteresis),
   cleaning behind the slowest subscriber, isConnected; and every network publication's (pub-lmt follows
   snd-pos + window while a receiver is connected, cleaning one term behind snd-pos);
3. beat the driver heartbeat (the ring's consumer heartbeat, epoch ms) and publish the network system
   counters;
4. on the timer (every ``timer_interval_ns``): unblock stalled claims, time out dead clients, unblock a
   to-driver record a dead client left half-written, and finish draining publications (linger, then
   delete their files).

The driver conductor owns clients, commands and the duty cycle; the entities are its two halves', both handed
one :class:`DriverServices` (counters, responses, errors, ids, log and counter allocation): ``aeron:ipc`` goes
to the :class:`IpcConductor` (IPC publications and subscriptions), ``aeron:udp`` to the
:class:`NetworkConductor`, which owns channel endpoints, network publications and images and feeds the
:class:`Sender` and :class:`Receiver` agents (``self.sender``, ``self.receiver``: native duties the media driver runs
on its threading mode's agent threads).

Every command is decoded and validated before it touches any state; a bad one is answered with ON_ERROR
(Aeron's codes) and recorded in the error log, never raised out of the duty cycle.  The conductor is
sans-IO about time: callers pass ``now_ns`` (monotonic) and the epoch-ms clock is injectable.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from logbuf.channel import ChannelUri, InvalidChannelError
from logbuf.cnc import counters as c
from logbuf.cnc.broadcast import BroadcastTransmitter
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.counters import CountersManager
from logbuf.cnc.error_log import DistinctErrorLog
from logbuf.cnc.errors import (
    CountersFullError,
    MalformedCommandError,
    RingBufferCorruptedError,
    UnknownCommandTypeError,
)
from logbuf.cnc.loss_report import LossReport
from logbuf.cnc.messages import (
    ClientTimeout,
    ControlCommand,
    ControlResponse,
    CounterMessage,
    CounterUpdate,
    DestinationMessage,
    ErrorCode,
    ErrorResponse,
    OperationSuccess,
    PublicationMessage,
    PublicationReady,
    RejectImageMessage,
    RemoveMessage,
    StaticCounterMessage,
    SubscriptionMessage,
    SubscriptionReady,
    TerminateDriverMessage,
    decode_command,
)
from logbuf.driver.agents import AERON_THREADING_MODE, NativeDuty, add, propose_max
from logbuf.driver.channel_params import resolve_publication, resolve_subscription
from logbuf.driver.command_error import CommandError
from logbuf.driver.context import DriverContext
from logbuf.driver.ipc_conductor import IpcConductor, SubscriptionLink
from logbuf.driver.ipc_publication import IpcPublication
from logbuf.driver.lifecycle import PublicationState
from logbuf.driver.native_ipc import NativeIpcDuty
from logbuf.driver.network_conductor import NetworkConductor, NetworkSubscription, SpySubscription
from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.services import DriverServices
from logbuf.units import NANOS_PER_MILLI, epoch_ms

NULL_VALUE = -1
COMMANDS_PER_CYCLE = 16

# system counters the conductor maintains
ERRORS = c.SystemCounter.ERRORS
UNBLOCKED_COMMANDS = c.SystemCounter.UNBLOCKED_COMMANDS
CLIENT_LIVENESS_TIMEOUTS = c.SystemCounter.CLIENT_TIMEOUTS
CONDUCTOR_MAX_CYCLE_TIME = c.SystemCounter.CONDUCTOR_MAX_CYCLE_TIME
CONDUCTOR_CYCLE_THRESHOLD_EXCEEDED = c.SystemCounter.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED
CYCLE_THRESHOLD_NS = c.DEFAULT_CYCLE_THRESHOLD_NS  # a conductor cycle longer than this is counted
NETWORK_COUNTERS_INTERVAL_NS = 1_000_000  # the network system counters reach cnc.dat at least this often

Publication = IpcPublication | NetworkPublication

__all__ = ["ClientSession", "CommandError", "DriverConductor", "SubscriptionLink"]


class ClientSession:
    __slots__ = ("client_id", "heartbeat_counter_id", "publication_links", "subscriptions", "counters", "closed")

    def __init__(self, client_id: int, heartbeat_counter_id: int) -> None:
        self.client_id = client_id
        self.heartbeat_counter_id = heartbeat_counter_id
        self.publication_links: dict[int, Publication] = {}  # link registration id -> publication
        self.subscriptions: set[int] = set()
        self.counters: dict[int, int] = {}  # registration id -> counter id
        self.closed = False


class DriverConductor:
    def __init__(
        self,
        ctx: DriverContext,
        cnc: CncFile,
        *,
        epoch_ms: Callable[[], int] = epoch_ms,
        ensure_wake_semaphore: Callable[[int], None] | None = None,
        on_terminate: Callable[[], None] | None = None,
        loss_report: LossReport | None = None,
    ) -> None:
        self.ctx = ctx
        self.cnc = cnc
        self.epoch_ms = epoch_ms
        self.ring = cnc.to_driver
        self.transmitter: BroadcastTransmitter = cnc.broadcast_transmitter()
        self.counters: CountersManager = cnc.counters_manager(epoch_ms)
        self.error_log: DistinctErrorLog = cnc.distinct_error_log(epoch_ms)
        # Aeron's labels name the threading mode (its MAX_CYCLE_TIME and THRESHOLD_EXCEEDED counters)
        self.system = self.counters.allocate_system_counters(c.system_counter_labels(
            threading_mode=AERON_THREADING_MODE[ctx.threading_mode], cycle_threshold_ns=CYCLE_THRESHOLD_NS))
        self.ensure_wake_semaphore = ensure_wake_semaphore or (lambda stream_id: None)
        self.on_terminate = on_terminate
        #: called on each timer tick with the time (ns) on the conductor's thread; each answers its work count
        self.timer_hooks: list[Callable[[int], int]] = []
        self.clients: dict[int, ClientSession] = {}
        self.subscriptions: dict[int, SubscriptionLink | NetworkSubscription | SpySubscription] = {}
        self.services = DriverServices(
            ctx,
            self.counters,
            self.system,
            respond=self._send,
            record_error=self._record_error,
            next_correlation_id=self.ring.next_correlation_id,
            ensure_wake_semaphore=self.ensure_wake_semaphore,
            loss_report=loss_report,
            epoch_ms=epoch_ms,
        )
        self.ipc = IpcConductor(self.services)
        self.network = NetworkConductor(self.services)
        self.sender = self.network.sender
        self.receiver = self.network.receiver
        self._next_network_counters_ns = 0
        self._last_heartbeat_ms = 0
        self._next_timer_ns: int | None = None
        self._last_ring_head = self.ring.consumer_position()
        self._time_of_last_ring_move_ns = 0
        self._max_cycle_ns = 0
        self._now_ns = 0
        self._linger_ns: dict[int, int] = {}  # publication registration id -> its channel's linger timeout

    # -- the duty cycle --------------------------------------------------------------------------------

    def do_work(self, now_ns: int) -> int:
        self._now_ns = now_ns
        self.network.now_ns = now_ns
        self.ipc.now_ns = now_ns
        work = self._read_commands()
        work += self.ipc.update()
        work += self.network.update(now_ns)
        if now_ns >= self._next_network_counters_ns:
            self._next_network_counters_ns = now_ns + NETWORK_COUNTERS_INTERVAL_NS
            self.network.network_counters.publish()
        now_ms = self.epoch_ms()
        if now_ms != self._last_heartbeat_ms:
            self._last_heartbeat_ms = now_ms
            self.ring.consumer_heartbeat_time = now_ms
        if self._next_timer_ns is None:
            self._next_timer_ns = now_ns + self.ctx.timer_interval_ns
            self._time_of_last_ring_move_ns = now_ns
        elif now_ns >= self._next_timer_ns:
            self._next_timer_ns = now_ns + self.ctx.timer_interval_ns
            work += self.on_timer(now_ns, now_ms)
        return work

    def record_cycle_time(self, cycle_ns: int) -> None:
        # atomic: the native conductor agent writes the same two counters
        if cycle_ns > self._max_cycle_ns:
            self._max_cycle_ns = cycle_ns
            propose_max(self.counters.position(self.system[CONDUCTOR_MAX_CYCLE_TIME]), cycle_ns)
        if cycle_ns > CYCLE_THRESHOLD_NS:
            add(self.counters.position(self.system[CONDUCTOR_CYCLE_THRESHOLD_EXCEEDED]))

    # -- native duties ---------------------------------------------------------------------------------

    def native_duties(self) -> dict[str, NativeDuty]:
        """The data-plane duties for native agents, by role (``sender``, ``receiver``, ``conductor``); a role
        absent here runs as a Python duty in the media driver's loop.  The first call hands the IPC limit
        duties to their native duty (``conductor``)."""
        if self.ipc.native is None:
            unblocked = self.counters.position(self.system[c.SystemCounter.UNBLOCKED_PUBLICATIONS])
            self.ipc.use_native(NativeIpcDuty(self.ctx.timer_interval_ns, unblocked_publications=unblocked))
        assert self.ipc.native is not None
        return {"conductor": self.ipc.native.duty, **self.network_native_duties()}

    def network_native_duties(self) -> dict[str, NativeDuty]:
        """The sender's and receiver's native duties, which the media driver places on its threading mode's
        native agents (the Python loop then only reads their events, in :meth:`do_work`)."""
        return {"sender": self.sender.native_duty(), "receiver": self.receiver.native_duty()}

    def cycle_counters(self, role: str) -> tuple[int, int]:
        """The (max cycle time, threshold exceeded) system counter ids of an agent role."""
        ids = {
            "conductor": (CONDUCTOR_MAX_CYCLE_TIME, CONDUCTOR_CYCLE_THRESHOLD_EXCEEDED),
            "sender": (c.SystemCounter.SENDER_MAX_CYCLE_TIME, c.SystemCounter.SENDER_CYCLE_TIME_THRESHOLD_EXCEEDED),
            "receiver": (c.SystemCounter.RECEIVER_MAX_CYCLE_TIME,
                         c.SystemCounter.RECEIVER_CYCLE_TIME_THRESHOLD_EXCEEDED),
        }[role]
        return self.system[ids[0]], self.system[ids[1]]

    def on_timer(self, now_ns: int, now_ms: int) -> int:
        work = self.ipc.on_timer(now_ns) + self.network.on_timer(now_ns)
        work += self._check_client_liveness(now_ms)
        work += self._check_blocked_commands(now_ns)
        work += self._close_truncated_streams()
        publications: list[Publication] = [*self.ipc.publications, *self.network.publications]
        for publication in [p for p in publications if p.state == PublicationState.DRAINING]:
            if publication.is_drained(now_ns):
                self._close_publication(publication)
                work += 1
        for hook in self.timer_hooks:
            work += hook(now_ns)
        return work

    def _close_truncated_streams(self) -> int:
        """Closes each publication and image whose log file shrank under the driver's mapping (any process with
        write access can truncate it; the native SIGBUS guard keeps the agents alive on zero pages meanwhile),
        with one error-log entry each.  A publication goes as a drained one does (the agents let go first); its
        publishers' links stay, so their clients' removes are still answered."""
        work = 0
        publications: list[Publication] = [*self.ipc.publications, *self.network.publications]
        for publication in publications:
            why = publication.log.check_truncated()
            if why is None:
                continue
            self._record_error(f"{why}: publication {publication.registration_id} (session {publication.session_id} "
                               f"stream {publication.stream_id}) closed")
            self._close_publication(publication)
            work += 1
        return work + self.network.close_truncated_images()

    def on_duty_error(self, duty: Any, exc: BaseException) -> None:
        """An exception escaped a duty cycle (a bug): recorded in the error log, the driver carries on."""
        where = getattr(duty, "__qualname__", repr(duty))
        self._record_error(f"{where}: {type(exc).__name__}: {exc}")

    def _increment(self, system_id: int, delta: int = 1) -> None:
        counter_id = self.system[system_id]  # (not through services: the error log counts before they exist)
        self.counters.set_counter_value(counter_id, self.counters.counter_value(counter_id) + delta)

    # -- commands --------------------------------------------------------------------------------------

    def _read_commands(self) -> int:
        try:
            return self.ring.read(self._on_command, COMMANDS_PER_CYCLE)
        except RingBufferCorruptedError as exc:
            # a client wrote garbage into the ring: drop what is pending rather than stop serving everyone
            discarded = self.ring.discard_pending()
            self._record_error(f"to-driver ring corrupted ({exc}); discarded {discarded} bytes of commands")
            return 1

    def _on_command(self, msg_type_id: int, body: memoryview) -> None:
        correlation_id = NULL_VALUE
        if len(body) >= 16:
            correlation_id = struct.unpack_from("<q", body, 8)[0]
        try:
            command = decode_command(msg_type_id, body)
            correlation_id = command.correlation_id
            self._dispatch(ControlCommand(msg_type_id), command)
        except UnknownCommandTypeError as exc:
            self._reject(correlation_id, ErrorCode.UNKNOWN_COMMAND_TYPE_ID, str(exc))
        except MalformedCommandError as exc:
            self._reject(correlation_id, ErrorCode.MALFORMED_COMMAND, f"malformed command {msg_type_id:#x}: {exc}")
        except CommandError as exc:
            self._reject(correlation_id, exc.code, str(exc))
        except CountersFullError as exc:
            self._reject(correlation_id, ErrorCode.STORAGE_SPACE, str(exc))
        except OSError as exc:
            self._reject(correlation_id, ErrorCode.STORAGE_SPACE, f"cannot create the log: {exc}")
        except Exception as exc:  # a bug must not take the driver down: answer, log, carry on
            self._reject(correlation_id, ErrorCode.GENERIC_ERROR, f"{type(exc).__name__}: {exc}")

    def _reject(self, correlation_id: int, code: ErrorCode, message: str) -> None:
        self._record_error(f"{code.name}: {message}")
        self._send(ControlResponse.ON_ERROR, ErrorResponse(correlation_id, int(code), message[:1024]))

    def _record_error(self, text: str) -> None:
        self.error_log.record(text)
        self._increment(ERRORS)

    def _send(self, response: ControlResponse, message: Any) -> None:
        self.transmitter.transmit(int(response), message.encode())

    def _dispatch(self, command: ControlCommand, msg: Any) -> None:
        client = self._client(msg.client_id)
        if command == ControlCommand.ADD_PUBLICATION:
            self._add_publication(client, msg, exclusive=False)
        elif command == ControlCommand.ADD_EXCLUSIVE_PUBLICATION:
            self._add_publication(client, msg, exclusive=True)
        elif command == ControlCommand.REMOVE_PUBLICATION:
            self._remove_publication(client, msg)
        elif command == ControlCommand.ADD_SUBSCRIPTION:
            self._add_subscription(client, msg)
        elif command == ControlCommand.REMOVE_SUBSCRIPTION:
            self._remove_subscription(client, msg)
        elif command == ControlCommand.CLIENT_KEEPALIVE:
            self.counters.set_counter_value(client.heartbeat_counter_id, self.epoch_ms())
        elif command == ControlCommand.ADD_COUNTER:
            self._add_counter(client, msg)
        elif command == ControlCommand.REMOVE_COUNTER:
            self._remove_counter(client, msg)
        elif command == ControlCommand.CLIENT_CLOSE:
            self._release_client(client)
        elif command == ControlCommand.TERMINATE_DRIVER:
            self._terminate(msg)
        elif command == ControlCommand.ADD_STATIC_COUNTER:
            self._add_static_counter(msg)
        elif command in (ControlCommand.ADD_DESTINATION, ControlCommand.REMOVE_DESTINATION):
            self._send_destination(client, msg, command)
        elif command in (ControlCommand.ADD_RCV_DESTINATION, ControlCommand.REMOVE_RCV_DESTINATION):
            self._receive_destination(client, msg, command)
        elif command == ControlCommand.REJECT_IMAGE:
            self._reject_image(msg)
        elif command == ControlCommand.REMOVE_DESTINATION_BY_ID:
            # as aeronmd: OPERATION_SUCCESS for a manual MDC publication; nothing at all (no answer, no error
            # log) for an unknown publication or one without manual destinations
            publication = self.network.publication(msg.registration_id)
            if publication is not None and self.network.remove_destination_by_id(publication, msg.destination_id):
                self._send(ControlResponse.ON_OPERATION_SUCCESS, OperationSuccess(msg.correlation_id))

    def _client(self, client_id: int) -> ClientSession:
        """The client's session; its first command allocates its heartbeat counter (type 11)."""
        client = self.clients.get(client_id)
        if client is None:
            counter_id = self.counters.allocate(
                c.CLIENT_HEARTBEAT_TYPE_ID,
                c.client_heartbeat_label(client_id),
                c.client_heartbeat_key(client_id),
                registration_id=client_id,
                owner_id=client_id,
            )
            self.counters.set_counter_value(counter_id, self.epoch_ms())
            client = ClientSession(client_id, counter_id)
            self.clients[client_id] = client
            # as Aeron's driver: the client learns its heartbeat counter (and completes its label)
            self._send(ControlResponse.ON_COUNTER_READY, CounterUpdate(client_id, counter_id))
        return client

    # -- publications ----------------------------------------------------------------------------------

    def _parse_channel(self, channel: str) -> ChannelUri:
        try:
            return ChannelUri.parse(channel)
        except InvalidChannelError as exc:
            raise CommandError(ErrorCode.INVALID_CHANNEL, str(exc)) from None

    def _add_publication(self, client: ClientSession, msg: PublicationMessage, exclusive: bool) -> None:
        uri = self._parse_channel(msg.channel)
        if uri.spy:
            raise CommandError(ErrorCode.INVALID_CHANNEL, f"channel {uri}: aeron-spy: is for subscriptions only")
        try:
            params = resolve_publication(uri, self.ctx)
        except InvalidChannelError as exc:
            raise CommandError(ErrorCode.INVALID_CHANNEL, str(exc)) from None
        publication: Publication
        created = False
        if uri.is_udp:
            count = len(self.network.publications)
            publication = self.network.add_publication(msg.correlation_id, uri, params, msg.stream_id, exclusive,
                                                       client.client_id)
            created = len(self.network.publications) > count
        else:
            publication, created = self.ipc.add_publication(msg.correlation_id, uri, params, msg.stream_id,
                                                            exclusive, client.client_id)
        if created:
            self._linger_ns[publication.registration_id] = params.linger_timeout_ns
        publication.publishers[msg.correlation_id] = client.client_id
        client.publication_links[msg.correlation_id] = publication
        response = (
            ControlResponse.ON_EXCLUSIVE_PUBLICATION_READY if exclusive else ControlResponse.ON_PUBLICATION_READY
        )
        self._send(
            response,
            PublicationReady(
                msg.correlation_id,
                publication.registration_id,
                publication.session_id,
                publication.stream_id,
                publication.pub_lmt_counter_id,
                publication.channel_status_id,
                str(publication.log.path),
            ),
        )
        if created and isinstance(publication, IpcPublication):
            self.ipc.link_subscriptions(publication)  # Aeron's order: READY first, then the images
        elif created and isinstance(publication, NetworkPublication):
            self.network.link_spies(publication)

    def _remove_publication(self, client: ClientSession, msg: RemoveMessage) -> None:
        publication = client.publication_links.get(msg.registration_id)
        if publication is None:
            raise CommandError(ErrorCode.UNKNOWN_PUBLICATION, f"unknown publication {msg.registration_id}")
        self._unlink_publisher(client, msg.registration_id)
        self._send(ControlResponse.ON_OPERATION_SUCCESS, OperationSuccess(msg.correlation_id))

    def _unlink_publisher(self, client: ClientSession, link_id: int) -> None:
        publication = client.publication_links.pop(link_id)
        publication.publishers.pop(link_id, None)
        if not publication.publishers and publication.state == PublicationState.ACTIVE:
            linger = self._linger_ns.get(publication.registration_id, self.ctx.publication_linger_timeout_ns)
            publication.start_draining(self._now_ns, linger)

    def _close_publication(self, publication: Publication) -> None:
        """Drained (or lingered long enough): images go away, counters are freed, the file is deleted."""
        self._linger_ns.pop(publication.registration_id, None)
        if isinstance(publication, NetworkPublication):
            self.network.close_publication(publication)
        else:
            self.ipc.close_publication(publication)

    # -- subscriptions ---------------------------------------------------------------------------------

    def _add_subscription(self, client: ClientSession, msg: SubscriptionMessage) -> None:
        uri = self._parse_channel(msg.channel)
        try:
            params = resolve_subscription(uri, self.ctx)
        except InvalidChannelError as exc:
            raise CommandError(ErrorCode.INVALID_CHANNEL, str(exc)) from None
        if msg.correlation_id in self.subscriptions:
            raise CommandError(ErrorCode.GENERIC_ERROR, f"registration id {msg.correlation_id} already in use")
        if uri.spy:
            self.subscriptions[msg.correlation_id] = self.network.add_spy_subscription(
                msg.correlation_id, client.client_id, uri, params, msg.stream_id)
            client.subscriptions.add(msg.correlation_id)
            return
        if uri.is_udp:
            network = self.network.add_subscription(msg.correlation_id, client.client_id, uri, params,
                                                    msg.stream_id)
            self.subscriptions[msg.correlation_id] = network
            client.subscriptions.add(msg.correlation_id)
            needed = self.network.images_to_link(network)
            if self.counters.available() < needed:  # refused before READY, so the client sees the refusal
                self._drop_subscription(client, msg.correlation_id)
                raise CountersFullError(f"unable to allocate {needed} subscriber position counters for the "
                                        f"existing images of stream {msg.stream_id}")
            self._send(ControlResponse.ON_SUBSCRIPTION_READY,
                       SubscriptionReady(msg.correlation_id, network.endpoint.status_counter_id))
            try:
                self.network.link_existing_images(network)
            except BaseException:  # refused (no counter left): no link may stay behind, holding an image back
                self._drop_subscription(client, msg.correlation_id)
                raise
            return
        subscription = self.ipc.add_subscription(msg.correlation_id, client.client_id, uri, params, msg.stream_id)
        self.subscriptions[msg.correlation_id] = subscription
        client.subscriptions.add(msg.correlation_id)

    def _remove_subscription(self, client: ClientSession, msg: RemoveMessage) -> None:
        if msg.registration_id not in client.subscriptions:
            raise CommandError(ErrorCode.UNKNOWN_SUBSCRIPTION, f"unknown subscription {msg.registration_id}")
        self._drop_subscription(client, msg.registration_id)
        self._send(ControlResponse.ON_OPERATION_SUCCESS, OperationSuccess(msg.correlation_id))

    def _drop_subscription(self, client: ClientSession, registration_id: int) -> None:
        client.subscriptions.discard(registration_id)
        subscription = self.subscriptions.pop(registration_id, None)
        if isinstance(subscription, NetworkSubscription | SpySubscription):
            self.network.remove_subscription(registration_id)
        else:
            self.ipc.remove_subscription(registration_id)

    # -- counters --------------------------------------------------------------------------------------

    def _add_counter(self, client: ClientSession, msg: CounterMessage) -> None:
        if msg.type_id < 0:
            raise CommandError(ErrorCode.GENERIC_ERROR, f"counter type id {msg.type_id} must be >= 0")
        counter_id = self.counters.allocate(
            msg.type_id, msg.label, msg.key, registration_id=msg.correlation_id, owner_id=client.client_id
        )
        client.counters[msg.correlation_id] = counter_id
        self._send(ControlResponse.ON_COUNTER_READY, CounterUpdate(msg.correlation_id, counter_id))

    def _remove_counter(self, client: ClientSession, msg: RemoveMessage) -> None:
        counter_id = client.counters.pop(msg.registration_id, None)
        if counter_id is None:
            raise CommandError(ErrorCode.UNKNOWN_COUNTER, f"unknown counter {msg.registration_id}")
        self.counters.free(counter_id)
        self._send(ControlResponse.ON_OPERATION_SUCCESS, OperationSuccess(msg.correlation_id))
        self._send(ControlResponse.ON_UNAVAILABLE_COUNTER, CounterUpdate(msg.registration_id, counter_id))

    def _add_static_counter(self, msg: StaticCounterMessage) -> None:
        """Aeron's static counter: the one of this type and registration id, else a new one; owned by no
        client's lifetime (it stays when the client goes)."""
        counter_id = self.counters.find(msg.type_id, msg.registration_id)
        if counter_id == c.NULL_COUNTER_ID:
            # owned by no client (owner id -1, as aeronmd writes it)
            counter_id = self.counters.allocate(msg.type_id, msg.label, msg.key, registration_id=msg.registration_id,
                                                owner_id=NULL_VALUE)
        self._send(ControlResponse.ON_STATIC_COUNTER, CounterUpdate(msg.correlation_id, counter_id))

    # -- destinations (a manual multi-destination-cast publication's; subscriptions' are answered as aeronmd
    # answers for subscriptions without manual control) and images ----------------------------------------

    def _send_destination(self, client: ClientSession, msg: DestinationMessage, command: ControlCommand) -> None:
        """ADD_DESTINATION / REMOVE_DESTINATION on a network publication (found by its registration id, any
        client's, as aeronmd does): OPERATION_SUCCESS with the correlation id, or aeronmd's error."""
        publication = self.network.publication(msg.registration_id)
        if publication is None:
            where = "add destination" if command == ControlCommand.ADD_DESTINATION else "remove destination,"
            raise CommandError(ErrorCode.UNKNOWN_PUBLICATION, f"unknown {where} client_id="
                                                              f"{client.client_id} registration_id={msg.registration_id}")
        if command == ControlCommand.ADD_DESTINATION:
            self.network.add_destination(publication, msg.channel, msg.correlation_id)
        else:
            self.network.remove_destination(publication, msg.channel)
        self._send(ControlResponse.ON_OPERATION_SUCCESS, OperationSuccess(msg.correlation_id))

    def _receive_destination(self, client: ClientSession, msg: DestinationMessage, command: ControlCommand) -> None:
        """ADD/REMOVE_RCV_DESTINATION of an MDS subscription (control-mode=manual), answered as aeronmd."""
        subscription = self.subscriptions.get(msg.registration_id)
        if not isinstance(subscription, NetworkSubscription):
            raise CommandError(ErrorCode.UNKNOWN_SUBSCRIPTION, f"unknown subscription client_id={client.client_id} "
                                                               f"registration_id={msg.registration_id}")
        if command == ControlCommand.ADD_RCV_DESTINATION:
            self.network.add_receive_destination(subscription, msg.channel, msg.correlation_id)
        else:
            self.network.remove_receive_destination(subscription, msg.channel)
        self._send(ControlResponse.ON_OPERATION_SUCCESS, OperationSuccess(msg.correlation_id))

    def _reject_image(self, msg: RejectImageMessage) -> None:
        if not self.network.reject_image(msg.image_correlation_id, msg.reason):
            raise CommandError(ErrorCode.GENERIC_ERROR,
                               f"Unable to resolve image for correlationId={msg.image_correlation_id}")
        self._send(ControlResponse.ON_OPERATION_SUCCESS, OperationSuccess(msg.correlation_id))

    # -- clients ---------------------------------------------------------------------------------------

    def _release_client(self, client: ClientSession) -> None:
        """Frees everything a client holds (it closed, or it stopped heart-beating)."""
        if client.closed:
            return
        client.closed = True
        for link_id in list(client.publication_links):
            self._unlink_publisher(client, link_id)
        for registration_id in list(client.subscriptions):
            self._drop_subscription(client, registration_id)
        for registration_id, counter_id in list(client.counters.items()):
            self.counters.free(counter_id)
            self._send(ControlResponse.ON_UNAVAILABLE_COUNTER, CounterUpdate(registration_id, counter_id))
        client.counters.clear()
        self.counters.free(client.heartbeat_counter_id)
        self._send(ControlResponse.ON_UNAVAILABLE_COUNTER, CounterUpdate(client.client_id, client.heartbeat_counter_id))
        del self.clients[client.client_id]

    def _check_client_liveness(self, now_ms: int) -> int:
        timeout_ms = self.ctx.client_liveness_timeout_ns // NANOS_PER_MILLI
        work = 0
        for client in list(self.clients.values()):
            last = self.counters.counter_value(client.heartbeat_counter_id)
            if now_ms - last > timeout_ms:
                self._release_client(client)
                self._send(ControlResponse.ON_CLIENT_TIMEOUT, ClientTimeout(client.client_id))
                self._increment(CLIENT_LIVENESS_TIMEOUTS)
                work += 1
        return work

    def _check_blocked_commands(self, now_ns: int) -> int:
        """A client that died half-way through writing a command must not wedge the ring for everyone."""
        head = self.ring.consumer_position()
        if head != self._last_ring_head or self.ring.producer_position() == head:
            self._last_ring_head = head
            self._time_of_last_ring_move_ns = now_ns
            return 0
        if now_ns - self._time_of_last_ring_move_ns > self.ctx.client_liveness_timeout_ns:
            try:
                unblocked = self.ring.unblock()
            except RingBufferCorruptedError as exc:
                self._record_error(f"to-driver ring corrupted while unblocking ({exc})")
                self.ring.discard_pending()
                unblocked = True
            if unblocked:
                self._increment(UNBLOCKED_COMMANDS)
                self._time_of_last_ring_move_ns = now_ns
                return 1
        return 0

    def _terminate(self, msg: TerminateDriverMessage) -> None:
        token = self.ctx.terminate_token
        if token is None or msg.token != token:
            raise CommandError(ErrorCode.NOT_SUPPORTED, "driver termination by command is not enabled")
        self._send(ControlResponse.ON_OPERATION_SUCCESS, OperationSuccess(msg.correlation_id))
        if self.on_terminate is not None:
            self.on_terminate()

    # -- shutdown --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Driver shutdown: heartbeat NULL (clients see it at once), logs closed and deleted."""
        self.ring.consumer_heartbeat_time = 0
        self.network.close()
        self.ipc.close()
        if self.ipc.native is not None:
            self.ipc.native.close()
