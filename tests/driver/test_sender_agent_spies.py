"""Spies in the native sender agent alone (no conductor): their sub-pos counters hold pub-lmt back (the slowest
of snd-pos and the included spies plus the window), spies-simulate-connection makes an included spy a
connection and moves snd-pos to the fastest spy, and a spy's counter - client-written, so hostile - never moves
snd-pos past the producer or off a frame boundary.  Spy commands for unknown publications or beyond the limit
are refused on the events queue."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from logbuf.channel import ChannelUri
from logbuf.driver.ipc_publication import SubscriberLink, TetherState
from logbuf.driver.network_publication import NetworkPublication, NetworkPublicationPositions
from logbuf.driver.send_channel import SendChannelEndpoint
from logbuf.driver.sender import Sender
from logbuf.driver.udp.flow_control import UnicastFlowControl
from logbuf.driver.udp.retransmit import RetransmitHandler
from logbuf.driver.udp_channel import UdpChannel
from logbuf.driver.udp_transport import TransportRole, UdpTransport
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer.log_buffers import LogBuffers
from logbuf.native import lib
from logbuf.position import Position
from logbuf.protocol import encode_data_frame

T = 64 * 1024
WINDOW = T // 4
SESSION, STREAM, INITIAL_TERM_ID = 7, 9, 100


@contextmanager
def agent(tmp_path: Path, ssc: bool) -> Iterator[tuple[Sender, NetworkPublication, LogBuffers]]:
    """A sender agent with one publication to a socket that never answers (no receiver ever connects)."""
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    channel = UdpChannel.from_uri(ChannelUri.parse(f"aeron:udp?endpoint=127.0.0.1:{silent.getsockname()[1]}"))
    transport = UdpTransport(channel, TransportRole.SEND)
    log = LogBuffers.create(tmp_path / "pub.logbuffer", term_length=T, session_id=SESSION, stream_id=STREAM,
                            initial_term_id=INITIAL_TERM_ID)
    sender = Sender()
    try:
        endpoint = SendChannelEndpoint(channel, transport, endpoint_id=sender.next_endpoint_id())
        publication = NetworkPublication(
            registration_id=42, channel=str(channel.uri), is_exclusive=True, log=log, sender=sender,
            endpoint_key=endpoint.key, endpoint_id=endpoint.endpoint_id, destination=channel.data.sockaddr,
            channel_status_id=-1, positions=NetworkPublicationPositions(*(Position.standalone() for _ in range(5))),
            window_length=WINDOW, max_datagrams=8, flow_control=UnicastFlowControl(),
            retransmit=RetransmitHandler(T, INITIAL_TERM_ID), now_ns=time.monotonic_ns(),
            spies_simulate_connection=ssc,
        )
        for command, fill in ((lib.LBD_SND_ADD_ENDPOINT, endpoint.fill_add_command),
                              (lib.LBD_SND_ADD_PUBLICATION, publication.fill_add_command)):
            c = sender.new_command(command)
            fill(c)
            sender.offer(c)
        cycle(sender)
        yield sender, publication, log
    finally:
        sender.close()
        transport.close()
        silent.close()
        log.close()


def cycle(sender: Sender) -> None:
    sender.do_work(time.monotonic_ns())


def spy(publication: NetworkPublication, subscription_id: int, position: int, tether: bool = True) -> SubscriberLink:
    link = SubscriberLink(subscription_id, 1, subscription_id, Position.standalone(position), position,
                          is_tether=tether)
    publication.add_spy(link)
    return link


def commit(log: LogBuffers, frames: int) -> int:
    """``frames`` committed 64-byte frames from offset 0; returns the producer position."""
    offset = 0
    for _ in range(frames):
        frame = encode_data_frame(bytes(32), term_offset=offset, session_id=SESSION, stream_id=STREAM,
                                  term_id=INITIAL_TERM_ID)
        log.terms.view[offset: offset + len(frame)] = frame
        offset += len(frame)
    log.meta.put_i64_release(d.TERM_TAIL_COUNTERS_OFFSET, d.pack_tail(INITIAL_TERM_ID, offset))
    return offset


def test_without_ssc_a_spy_alone_is_no_connection(tmp_path: Path) -> None:
    with agent(tmp_path, ssc=False) as (sender, publication, log):
        spy(publication, 1, 0)
        commit(log, 4)
        cycle(sender)
        assert publication.positions.pub_lmt.get() == 0 and not log.is_connected
        assert publication.snd_pos == 0


def test_with_ssc_spies_connect_hold_pub_lmt_at_the_slowest_and_move_snd_pos_to_the_fastest(tmp_path: Path) -> None:
    with agent(tmp_path, ssc=True) as (sender, publication, log):
        slow = spy(publication, 1, 0)
        fast = spy(publication, 2, 0)
        cycle(sender)
        assert log.is_connected and publication.positions.pub_lmt.get() == WINDOW
        end = commit(log, 100)
        fast.position.set(end)
        slow.position.set(4096)  # more than the trip gain (window / 8) on: pub-lmt moves
        cycle(sender)
        assert publication.snd_pos == end  # nothing to send to: the sender follows the fastest spy
        assert publication.positions.pub_lmt.get() == 4096 + WINDOW  # the slowest holds the publisher

        # hostile counters: past the producer, or off a frame boundary, never move snd-pos
        fast.position.set(end + 4096)
        cycle(sender)
        assert publication.snd_pos == end
        fast.position.set(-5)
        slow.position.set(end)
        cycle(sender)
        assert publication.snd_pos == end and publication.positions.pub_lmt.get() >= 4096 + WINDOW

        # a spy left out of the limit (an untethered one resting) no longer holds it; with none left the
        # publication is no longer connected and pub-lmt falls back to snd-pos
        for link in (fast, slow):
            link.included = False
            sender.offer(publication._spy_command(lib.LBD_SND_SET_SPY_INCLUDED, link))
        cycle(sender)
        assert not log.is_connected and publication.positions.pub_lmt.get() == end
        assert sender.poll_events() == []


def test_spy_commands_for_unknown_publications_are_refused_and_spies_are_not_capped(tmp_path: Path) -> None:
    with agent(tmp_path, ssc=True) as (sender, publication, log):
        fast = [spy(publication, 100 + i, 0) for i in range(99)]  # aeronmd has no limit: nor the agent's arrays
        spy(publication, 199, 0)  # the hundredth
        while sender.pending_commands:  # (the agent takes a bounded number of commands per cycle)
            cycle(sender)
        end = commit(log, 40)  # past the trip gain (a window/8)
        for link in fast:
            link.position.set(end)
        link = SubscriberLink(7, 1, 7, Position.standalone(0), 0)
        command = publication._spy_command(lib.LBD_SND_ADD_SPY, link)
        command.publication_id = 999
        sender.offer(command)
        while sender.pending_commands:  # (the agent takes a bounded number of commands per cycle)
            cycle(sender)
        cycle(sender)
        refused = [(e.type, e.publication_id, e.value) for e in sender.poll_events()]
        assert refused == [(lib.LBD_SND_COMMAND_REFUSED, 999, lib.LBD_SND_ADD_SPY)]
        assert publication.snd_pos == end and publication.positions.pub_lmt.get() == WINDOW  # the 100th holds it
        assert publication.remove_spy(199) is not None
        cycle(sender)
        assert publication.positions.pub_lmt.get() == end + WINDOW
        assert sender.poll_events() == []


def test_an_untethered_spy_is_measured_against_snd_pos_and_rejoins_there(tmp_path: Path) -> None:
    ms = 1_000_000
    with agent(tmp_path, ssc=True) as (sender, publication, log):
        publication.untethered_window_limit_timeout_ns = 200 * ms
        publication.untethered_resting_timeout_ns = 300 * ms
        reader = spy(publication, 1, 0)
        idle = spy(publication, 2, 0, tether=False)
        end = commit(log, 1000)  # 64000 bytes
        reader.position.set(WINDOW - WINDOW // 4)  # snd-pos follows the reader (ssc): the idle one is at the
        cycle(sender)  # window limit, snd-pos - window + window / 4, not past it
        assert publication.snd_pos == WINDOW - WINDOW // 4
        assert publication.check_untethered(0) == [] and publication.check_untethered(200 * ms) != []
        assert idle.tether_state == TetherState.LINGER and idle.included_in_limit
        assert [e.available for e in publication.check_untethered(400 * ms)] == [None]  # resting: not counted
        reader.position.set(end)
        cycle(sender)
        assert publication.snd_pos == end and publication.positions.pub_lmt.get() == end + WINDOW
        events = publication.check_untethered(700 * ms)
        assert [e.available for e in events] == [True] and idle.position.get() == end == idle.join_position
        cycle(sender)
        assert sender.poll_events() == []


def test_a_draining_publication_waits_for_its_spies_past_the_linger(tmp_path: Path) -> None:
    with agent(tmp_path, ssc=True) as (sender, publication, log):
        reader = spy(publication, 1, 0)
        end = commit(log, 10)
        publication.start_draining(now_ns=0, linger_ns=1_000)
        publication.on_drained(3)  # the agent: no receiver
        assert not publication.is_drained(10)  # the spy has not read to the end of stream
        assert not publication.is_drained(10 * 1_000)  # nor after the linger (aeronmd waits for its spies)
        reader.position.set(end)
        assert publication.is_drained(10)
        reader.position.set(0)
        publication.remove_spy(1)
        assert publication.is_drained(10)  # a spy that left holds nothing
