"""The driver's derived windows and limits (:mod:`logbuf.driver.windows`), and that channel resolution, the
publications and the IPC duty take them from there."""

from __future__ import annotations

import os
import tempfile

import pytest

from logbuf import LogBuffers, Position
from logbuf.channel import ChannelUri
from logbuf.driver.channel_params import resolve_publication
from logbuf.driver.context import DriverContext
from logbuf.driver.ipc_publication import IpcPublicationDuty
from logbuf.driver.udp.retransmit import RetransmitHandler
from logbuf.driver.windows import (
    DEFAULT_INITIAL_WINDOW_LENGTH,
    check_publication_window,
    initial_receiver_window,
    max_publication_window,
    publication_window,
    receiver_window_length,
    retained_window,
    trip_gain,
    untethered_window_limit,
)
from logbuf.logbuffer.descriptor import compute_max_message_length

T = 64 * 1024
KiB = 1024


def test_publication_window_defaults_to_half_a_term_on_both_media() -> None:
    assert publication_window(T) == publication_window(T, network=True) == T // 2


@pytest.mark.parametrize(("configured", "network", "expected"), [
    (8 * KiB, False, 8 * KiB), (8 * KiB, True, 8 * KiB),
    (48 * KiB, False, 48 * KiB), (48 * KiB, True, T // 2),  # UDP keeps the term behind snd-pos intact
    (4 * T, False, T), (4 * T, True, T // 2),
])
def test_publication_window_is_capped_per_medium(configured: int, network: bool, expected: int) -> None:
    assert publication_window(T, configured, network=network) == expected
    assert expected <= max_publication_window(T, network=network)


def test_check_publication_window() -> None:
    check_publication_window(T, T, network=False)
    check_publication_window(T // 2, T, network=True)
    for window, network in ((0, False), (T + 32, False), (0, True), (T // 2 + 32, True)):
        with pytest.raises(ValueError, match=f"publication window {window} must be in"):
            check_publication_window(window, T, network=network)


def test_trip_gain_and_untethered_window_limit() -> None:
    assert trip_gain(T // 2) == T // 16
    # an untethered subscriber keeps up while it is less than the window, less the slack, behind: the trip gain
    # behind an IPC publication's consumers, a quarter window behind a network publication's snd-pos (spies)
    assert untethered_window_limit(10 * T, T // 2) == 10 * T - T // 2 + T // 16
    assert untethered_window_limit(10 * T, T // 2, network=True) == 10 * T - T // 2 + T // 8


def test_receiver_window() -> None:
    assert receiver_window_length(T) == T // 2  # the default is over half a term of 64 KiB
    assert receiver_window_length(256 * T) == DEFAULT_INITIAL_WINDOW_LENGTH
    assert receiver_window_length(256 * T, 1024 * KiB) == 1024 * KiB
    with pytest.raises(ValueError):
        receiver_window_length(T, 0)


def test_initial_receiver_window_first_requested_then_driver_then_default() -> None:
    assert initial_receiver_window([None, 32 * KiB, 64 * KiB], 16 * KiB) == 32 * KiB
    assert initial_receiver_window([None, None], 16 * KiB) == 16 * KiB
    assert initial_receiver_window([], 0) == DEFAULT_INITIAL_WINDOW_LENGTH


def test_channel_resolution_uses_the_rules() -> None:
    ctx = DriverContext.build(ipc_term_length=T, network_term_length=T, ipc_publication_window=48 * KiB,
                              network_publication_window=48 * KiB)
    ipc = resolve_publication(ChannelUri.parse("aeron:ipc"), ctx)
    udp = resolve_publication(ChannelUri.parse("aeron:udp?endpoint=127.0.0.1:40125"), ctx)
    assert ipc.window_length == publication_window(T, 48 * KiB) == 48 * KiB
    assert udp.window_length == publication_window(T, 48 * KiB, network=True) == T // 2
    default = DriverContext.build(ipc_term_length=T)
    assert resolve_publication(ChannelUri.parse("aeron:ipc"), default).window_length == T // 2


def test_ipc_duty_uses_the_rules() -> None:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="logbuf-windows-", dir=base) as directory:
        log = LogBuffers.create(os.path.join(directory, "log"), term_length=T, session_id=1, stream_id=2)
        try:
            duty = IpcPublicationDuty(log, Position.standalone(), Position.standalone(), lambda: ())
            assert (duty.window_length, duty.trip_gain) == (T // 2, T // 16)
            with pytest.raises(ValueError, match="must be in"):
                IpcPublicationDuty(log, Position.standalone(), Position.standalone(), lambda: (),
                                   window_length=T + 32)
        finally:
            log.close()


def test_retained_window_is_half_a_term_plus_the_largest_message() -> None:
    assert retained_window(T) == T // 2 + compute_max_message_length(T) == T // 2 + T // 8
    # the sender's NAK check takes its default from here
    assert RetransmitHandler(T, 0).retained_window == retained_window(T)
