"""The windows and limits the driver derives from a log's term length and a setting, each rule written once.

- publication window: how far pub-lmt runs ahead of the slowest subscriber (IPC) or of snd-pos (UDP): the
  configured window, or half a term when none is; at most a term on IPC, half a term on UDP (the term behind
  snd-pos stays intact for retransmits);
- trip gain: pub-lmt moves only once it would grow by more than window / 8 (fewer writes to a hot cache line);
  the native duties are handed the gain with the window;
- untethered window limit: an untethered subscriber further behind than the window, less some slack (the
  trip gain, window / 8, behind an IPC publication's consumers; a quarter window behind a network
  publication's snd-pos, for its spies), is falling behind;
- retained window: how far behind snd-pos a NAK may reach and still be answered: T/2 + the largest message
  (a receiver's window is at most T/2, so an honest NAK never asks for older data; Aeron's rule);
- receiver window: what a receiver's status messages offer the sender: the window the first subscription
  naming ``rcv-wnd`` asks for, else the driver's, else 128 KiB; at most half a term, so a sender never laps a
  term the receiver may still be reading.

Channel resolution (:mod:`logbuf.driver.channel_params`), the publications, the conductors and the sans-IO
specifications all take these values from here; the native duties are handed them in their add commands.
"""

from __future__ import annotations

from collections.abc import Iterable

from logbuf.logbuffer.descriptor import compute_max_message_length

DEFAULT_INITIAL_WINDOW_LENGTH = 128 * 1024  # the receiver window when nothing configures one (Aeron's)


def max_publication_window(term_length: int, *, network: bool) -> int:
    """The largest publication window: a term on IPC, half a term on UDP."""
    return term_length // 2 if network else term_length


def publication_window(term_length: int, configured: int = 0, *, network: bool = False) -> int:
    """The publication window for a log of ``term_length``: ``configured`` (0: none, half a term) capped at
    :func:`max_publication_window`."""
    if configured:
        return min(configured, max_publication_window(term_length, network=network))
    return term_length // 2


def check_publication_window(window_length: int, term_length: int, *, network: bool) -> None:
    """ValueError unless ``0 < window_length <=`` :func:`max_publication_window`."""
    limit = max_publication_window(term_length, network=network)
    if not 0 < window_length <= limit:
        raise ValueError(f"publication window {window_length} must be in (0, {'T/2' if network else 'T'} = {limit}]")


def trip_gain(window_length: int) -> int:
    """How far beyond a new pub-lmt the next move waits for (window / 8)."""
    return window_length // 8


def untethered_window_limit(position: int, window_length: int, *, network: bool = False) -> int:
    """The position an untethered subscriber must stay above to count as keeping up: ``position`` (an IPC
    publication's consumer position, a network publication's snd-pos) less the window, plus the slack (window
    / 8 on IPC, window / 4 for a network publication's spies, as Aeron has them)."""
    slack = window_length // 4 if network else trip_gain(window_length)
    return position - window_length + slack


def retained_window(term_length: int) -> int:
    """How far behind snd-pos a NAK may ask for data and be answered: half a term plus the largest message."""
    return term_length // 2 + compute_max_message_length(term_length)


def receiver_window_length(term_length: int, initial_window_length: int = DEFAULT_INITIAL_WINDOW_LENGTH) -> int:
    """``min(initial window, T/2)``: a receiver never lets the sender lap a term it may still be reading."""
    if initial_window_length <= 0:
        raise ValueError("the receiver window must be positive")
    return min(initial_window_length, term_length // 2)


def initial_receiver_window(requested: Iterable[int | None], configured: int = 0) -> int:
    """The receiver window an image starts from (before the cap of :func:`receiver_window_length`): the first
    window ``requested`` (the subscriptions' ``rcv-wnd``, None where one names none), else ``configured`` (the
    driver's setting, 0: none), else the default."""
    return next((w for w in requested if w is not None), configured or DEFAULT_INITIAL_WINDOW_LENGTH)
