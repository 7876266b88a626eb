"""`logbuf feed`'s addresses as an operator mistypes them: a feed's host is an IPv4 address written in full (its
socket binds it or joins it as a multicast group, so a host name or a short form means nothing there), and the
retransmission server is never port 0 (a request sent there reaches no server). Each is one usage line naming
the option, decided before a driver or a socket is touched."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_feed_cli_settings import Ran, feed  # noqa: F401  (the fixture: logbuf feed in this process)

from logbuf.feed import config


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--feed-a", "localhost:30001", "'localhost' is not an IPv4 address"),  # was: no option named
    ("--feed-b", "feeds.example:30002", "'feeds.example' is not an IPv4 address"),
    ("--feed-a", "10.1:30001", "'10.1' is not an IPv4 address"),  # inet_aton would take it as 10.0.0.1
    ("--feed-b", "233.54.12:30002", "'233.54.12' is not an IPv4 address"),
    ("--retransmit", "127.0.0.1:0", "port 0 reaches no server"),  # was: accepted, no request ever answered
])
def test_a_bad_address_is_one_usage_line_naming_the_option(feed: Callable[..., Ran], option: str, value: str,  # noqa: F811
                                                           says: str) -> None:
    ran = feed(option, value)
    lines = ran.stderr.splitlines()
    assert ran.returncode == 2, ran.stderr
    assert len(lines) == 1 and lines[0].startswith(f"logbuf feed: error: argument {option}: "), ran.stderr
    assert says in lines[0]
    assert "Traceback" not in ran.stderr


def test_addresses_the_handler_can_use_still_parse() -> None:
    parse_feed = next(o.type for o in config.FEED_OPTIONS if o.flag == "--feed-a")
    parse_server = next(o.type for o in config.FEED_OPTIONS if o.flag == "--retransmit")
    assert parse_feed is not None and parse_server is not None
    assert parse_feed("233.54.12.1:30001") == ("233.54.12.1", 30001)
    assert parse_feed("127.0.0.1:0") == ("127.0.0.1", 0)  # an ephemeral port for a feed (tests, a printed port)
    assert parse_feed("OFF") is None
    assert parse_server("10.0.0.9:30010") == ("10.0.0.9", 30010)
    assert parse_server("localhost:30010") == ("localhost", 30010)  # the server's socket resolves a name


@pytest.mark.parametrize(("args", "says"), [
    (("--feed-a", "239.1.1.1:30001", "--feed-b", "239.1.1.1:30001"),
     "--feed-a and --feed-b are both 239.1.1.1:30001"),  # every datagram on both feeds: copies, not sources
    (("--feed-a", "127.0.0.1:30001", "--feed-b", "127.0.0.1:30002", "--retransmit", "127.0.0.1:30001"),
     "--retransmit 127.0.0.1:30001 is --feed-a's address"),
])
def test_feeds_that_are_not_two_sources_are_refused(feed: Callable[..., Ran], args: tuple[str, ...],  # noqa: F811
                                                   says: str) -> None:
    ran = feed(*args)
    assert ran.returncode == 2, ran.stderr
    assert says in ran.stderr and "Traceback" not in ran.stderr

