"""The driver's one channel-resolving step: every key refused or honoured by name, values checked against the
driver's own settings (sans-IO: no driver runs here)."""

from __future__ import annotations

import pytest

from logbuf.channel import AERON_URI_KEYS, ChannelUri, FlowControlSpec, InvalidChannelError
from logbuf.driver.channel_params import (
    DEFAULT_UNTETHERED_RESTING_TIMEOUT_NS,
    InitialPosition,
    check_keys,
    resolve_publication,
    resolve_subscription,
)
from logbuf.driver.context import DriverContext

CTX = DriverContext(ipc_term_length=64 * 1024, network_term_length=128 * 1024)
UDP = "aeron:udp?endpoint=127.0.0.1:40456"


def _refused(channel: str, key: str) -> str:
    with pytest.raises(InvalidChannelError) as info:
        uri = ChannelUri.parse(channel)
        resolve_publication(uri, CTX)
        resolve_subscription(uri, CTX)
    assert key in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("key", sorted(k for k, (status, _) in AERON_URI_KEYS.items() if status == "refused"))
@pytest.mark.parametrize("base", ["aeron:ipc", UDP])
def test_every_refused_aeron_key_is_refused_by_name(base: str, key: str) -> None:
    sep = "|" if "?" in base else "?"
    message = _refused(f"{base}{sep}{key}=1", key)
    assert "not supported" in message


@pytest.mark.parametrize("key", ["foo", "term-lenght", "sesion-id", "Endpoint"])
@pytest.mark.parametrize("base", ["aeron:ipc", UDP])
def test_unknown_and_misspelt_keys_are_refused_by_name(base: str, key: str) -> None:
    sep = "|" if "?" in base else "?"
    assert "unknown channel parameter" in _refused(f"{base}{sep}{key}=1", key)


@pytest.mark.parametrize("channel,key", [
    ("aeron:ipc?tether=maybe", "tether"),
    (UDP + "|tether=false", "tether"),
    (UDP + "|eos=false", "eos"),
    (UDP + "|cc=cubic", "cc"),
    (UDP + "|fc=min,g:1/2", "fc"),
    (UDP + "|fc=tagged,g:x", "fc"),
    (UDP + "|control-mode=response", "control-mode"),
    ("aeron:udp?control-mode=dynamic", "control-mode"),
    (UDP + "|max-resend=257", "max-resend"),
    (UDP + "|max-resend=0", "max-resend"),
    (UDP + "|gtag=x", "gtag"),
    ("aeron:ipc?max-resend=4", "max-resend"),
    (UDP + "|reliable=maybe", "reliable"),
    (UDP + "|rejoin=yes", "rejoin"),
    (UDP + "|group=sometimes", "group"),
    (UDP + "|nak-delay=fast", "nak-delay"),
    ("aeron:ipc?nak-delay=1ms", "nak-delay"),
    ("aeron:ipc?group=true", "group"),
    ("aeron:ipc?reliable=false", "reliable"),
    ("aeron:ipc?so-sndbuf=64k", "so-sndbuf"),
    ("aeron:ipc?interface=127.0.0.1", "interface"),
    ("aeron-spy:" + UDP + "|tether=maybe", "tether"),
    (UDP + "|ssc=yes", "ssc"),
    ("aeron:ipc?ssc=true", "ssc"),
])
def test_values_not_honoured_are_refused_by_name(channel: str, key: str) -> None:
    _refused(channel, key)


def test_mdc_tagged_and_max_resend_settings_resolve() -> None:
    pub = resolve_publication(ChannelUri.parse("aeron:udp?control=127.0.0.1:40457|control-mode=dynamic|"
                                               "fc=tagged,g:7/2,t:2s|max-resend=4"), CTX)
    assert pub.flow_control is not None and pub.max_resend == 4
    assert (pub.flow_control.strategy, pub.flow_control.group_tag, pub.flow_control.group_min_size,
            pub.flow_control.receiver_timeout_ns) == ("tagged", 7, 2, 2_000_000_000)
    assert ChannelUri.parse(UDP + "|fc=tagged,g:/3").flow_control() == FlowControlSpec("tagged", None, None, 3)
    assert resolve_publication(ChannelUri.parse("aeron:udp?control-mode=manual"), CTX).max_resend is None
    sub = resolve_subscription(ChannelUri.parse(UDP + "|control=127.0.0.1:40457|gtag=-5"), CTX)
    assert sub.group_tag == -5


def test_ipc_mtu_is_checked_against_the_drivers_ipc_term_length() -> None:
    # T/8 of the driver's 64 KiB IPC term is 8 KiB: 16 KiB is refused as a channel error, not a crash
    message = _refused("aeron:ipc?mtu=16384", "mtu")
    assert "65536" in message
    assert resolve_publication(ChannelUri.parse("aeron:ipc?mtu=8192"), CTX).mtu == 8192
    big = resolve_publication(ChannelUri.parse("aeron:ipc?term-length=1m|mtu=16384"), CTX)
    assert (big.term_length, big.mtu) == (1 << 20, 16384)


def test_defaults_come_from_the_driver_context() -> None:
    ipc = resolve_publication(ChannelUri.parse("aeron:ipc"), CTX)
    assert (ipc.term_length, ipc.mtu, ipc.window_length) == (64 * 1024, CTX.mtu, 32 * 1024)
    assert ipc.linger_timeout_ns == CTX.publication_linger_timeout_ns and ipc.session_id is None
    assert ipc.untethered_resting_timeout_ns == DEFAULT_UNTETHERED_RESTING_TIMEOUT_NS
    udp = resolve_publication(ChannelUri.parse(UDP), CTX)
    assert udp.term_length == 128 * 1024 and not udp.term_length_given


def test_publication_settings() -> None:
    params = resolve_publication(ChannelUri.parse(
        "aeron:ipc?session-id=778|pub-wnd=16k|linger=250ms|sparse=false|eos=false|"
        "untethered-window-limit-timeout=500ms|untethered-resting-timeout=2000000"), CTX)
    assert params.session_id == 778 and params.window_length == 16 * 1024
    assert params.linger_timeout_ns == 250_000_000 and not params.sparse and not params.signal_eos
    assert params.untethered_window_limit_timeout_ns == 500_000_000
    assert params.untethered_resting_timeout_ns == 2_000_000  # a bare number is nanoseconds, as Aeron's


def test_pub_wnd_bounds() -> None:
    _refused("aeron:ipc?pub-wnd=64k", "pub-wnd")  # more than half the 64 KiB term
    _refused("aeron:ipc?pub-wnd=1k", "pub-wnd")  # less than the MTU


def test_initial_position() -> None:
    params = resolve_publication(ChannelUri.parse("aeron:ipc?init-term-id=5|term-id=7|term-offset=1024"), CTX)
    assert params.initial_position == InitialPosition(5, 7, 1024)
    assert params.initial_position.position(64 * 1024) == 2 * 64 * 1024 + 1024
    _refused("aeron:ipc?init-term-id=5|term-id=7", "init-term-id")  # a complete set or none
    _refused("aeron:ipc?init-term-id=5|term-id=7|term-offset=100", "term-offset")  # not frame aligned
    _refused("aeron:ipc?init-term-id=5|term-id=7|term-offset=131072", "term-offset")  # beyond the term
    _refused("aeron:ipc?init-term-id=5|term-id=4|term-offset=0", "term-id")  # before the initial term


def test_session_id_must_be_an_int32() -> None:
    _refused("aeron:ipc?session-id=abc", "session-id")
    _refused("aeron:ipc?session-id=2147483648", "session-id")
    _refused("aeron:ipc?session-id=tag:7", "session-id")


def test_subscription_settings() -> None:
    params = resolve_subscription(ChannelUri.parse("aeron:ipc?session-id=779|tether=false"), CTX)
    assert params.session_id == 779 and not params.tether
    assert params.matches(779) and not params.matches(778)
    assert resolve_subscription(ChannelUri.parse("aeron:ipc"), CTX).matches(778)
    udp = resolve_subscription(ChannelUri.parse(UDP + "|rcv-wnd=64k|so-rcvbuf=256k|cc=static"), CTX)
    assert (udp.receiver_window, udp.socket_rcvbuf) == (64 * 1024, 256 * 1024)


def test_receiver_keys_of_a_subscription() -> None:
    default = resolve_subscription(ChannelUri.parse(UDP), CTX)
    assert (default.reliable, default.rejoin, default.group, default.nak_delay_ns, default.manual) == (
        True, True, "infer", None, False)
    udp = resolve_subscription(ChannelUri.parse(UDP + "|reliable=false|rejoin=false|group=true|nak-delay=2ms"), CTX)
    assert (udp.reliable, udp.rejoin, udp.group, udp.nak_delay_ns) == (False, False, "true", 2_000_000)
    assert resolve_subscription(ChannelUri.parse(UDP + "|nak-delay=500"), CTX).nak_delay_ns == 500
    mds = resolve_subscription(ChannelUri.parse("aeron:udp?control-mode=manual"), CTX)
    assert mds.manual
    _refused("aeron:udp?control-mode=manual|endpoint=127.0.0.1:40456", "control-mode")


def test_receive_destinations_refuse_the_subscriptions_keys_by_name() -> None:
    from logbuf.driver.channel_params import INVALID_DESTINATION_KEYS, check_destination

    check_destination(ChannelUri.parse(UDP + "|interface=127.0.0.1"))
    for key, value in zip(INVALID_DESTINATION_KEYS, ("1408", "64k", "64k", "64k", "1"), strict=True):
        with pytest.raises(InvalidChannelError, match=f"must not contain the key: {key}"):
            check_destination(ChannelUri.parse(f"{UDP}|{key}={value}"))
    with pytest.raises(InvalidChannelError, match="receive destination"):
        check_destination(ChannelUri.parse("aeron:ipc"))


def test_one_channel_string_serves_both_ends() -> None:
    # keys Aeron reads on the other side are accepted (no effect there), as aeronmd accepts them
    uri = ChannelUri.parse(UDP + "|term-length=64k|mtu=1408|session-id=5")
    check_keys(uri)
    assert resolve_subscription(uri, CTX).session_id == 5
    assert resolve_publication(ChannelUri.parse("aeron:ipc?tether=false"), CTX).session_id is None


def test_interface_forms() -> None:
    from logbuf.driver.udp_channel import parse_interface

    assert str(parse_interface("127.0.0.0/8")) == "127.0.0.1:0"  # the local address in that subnet
    assert str(parse_interface("127.0.0.0:4000/8")) == "127.0.0.1:4000"
    assert str(parse_interface("127.0.0.1:4000")) == "127.0.0.1:4000"
    assert str(parse_interface("[::1]:5")) == "[::1]:5"
    assert str(parse_interface("::1")) == "[::1]:0"
    with pytest.raises(InvalidChannelError, match="no local interface"):
        parse_interface("203.0.113.0/24")  # TEST-NET-3: never a local address here
    with pytest.raises(InvalidChannelError, match="prefix"):
        parse_interface("127.0.0.0/99")


def test_the_docs_table_lists_every_key_with_its_status() -> None:
    from support import ROOT

    text = (ROOT / "docs" / "interop.md").read_text()
    for key, (status, _) in AERON_URI_KEYS.items():
        assert f"| `{key}` | {status} |" in text, key


def test_a_spy_channel_keeps_its_prefix_and_takes_tether_false() -> None:
    uri = ChannelUri.parse("aeron-spy:" + UDP + "|tether=false|session-id=7")
    assert uri.spy and uri.is_udp
    assert uri.canonical().startswith("aeron-spy:aeron:udp?")
    params = resolve_subscription(uri, CTX)
    assert not params.tether and params.matches(7) and not params.matches(8)
    assert not ChannelUri.parse(UDP).spy


def test_a_spy_reads_udp_publications_only() -> None:
    with pytest.raises(InvalidChannelError, match="aeron-spy"):
        ChannelUri.parse("aeron-spy:aeron:ipc")


def test_ssc_and_the_untethered_timeouts_resolve_on_udp_publications() -> None:
    params = resolve_publication(ChannelUri.parse(
        UDP + "|ssc=true|untethered-window-limit-timeout=300ms|untethered-resting-timeout=1s"), CTX)
    assert params.spies_simulate_connection
    assert (params.untethered_window_limit_timeout_ns, params.untethered_resting_timeout_ns) == (300_000_000,
                                                                                                  1_000_000_000)
    assert not resolve_publication(ChannelUri.parse(UDP), CTX).spies_simulate_connection
    driver_wide = DriverContext(network_term_length=128 * 1024, spies_simulate_connection=True)
    assert resolve_publication(ChannelUri.parse(UDP), driver_wide).spies_simulate_connection  # the default
    assert not resolve_publication(ChannelUri.parse(UDP + "|ssc=false"), driver_wide).spies_simulate_connection


def test_a_chosen_session_id_stays_reserved_while_any_publication_has_it() -> None:
    from logbuf.driver.context import DriverContext
    from logbuf.driver.services import DriverServices

    services = DriverServices(DriverContext(), None, {}, respond=lambda *a: None,  # type: ignore[arg-type]
                              record_error=lambda text: None, next_correlation_id=lambda: 0,
                              ensure_wake_semaphore=lambda stream: None)
    chosen = 123_456_789
    services.reserve_session_id(chosen)  # two streams' publications chose it
    services.reserve_session_id(chosen)
    services.release_session_id(chosen)  # one of them closed
    services._next_session_id = chosen
    assert services.new_session_id() == chosen + 1  # the other still has it
    services._next_session_id = -5
    generated = [services.new_session_id() for _ in range(10)]
    assert all(not -1 <= s <= 1000 for s in generated) and generated[:4] == [-5, -4, -3, -2]
