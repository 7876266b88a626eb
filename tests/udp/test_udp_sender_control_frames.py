"""The native sender agent's check of datagrams on a control socket (``lbd_snd_control_valid``) against
:func:`logbuf.protocol.datagram.classify`, its specification: hostile bytes and mutated real frames alike,
the agent acts on a datagram exactly when the specification decodes it as control frames."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logbuf.native import ffi, lib
from logbuf.protocol import ErrorFrame, Nak, RttMeasurement, StatusMessage
from logbuf.protocol.datagram import ControlPacket, classify
from logbuf.protocol.header import MalformedFrameError
from logbuf.protocol.setup import SetupFrame

PROFILE = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

frames = st.sampled_from([
    StatusMessage(1, 2, 3, 64, 4096, 99).encode(),
    StatusMessage(1, 2, 3, 64, 4096, 99, 0x80, b"feedback").encode(),
    Nak(1, 2, 3, 96, 1000).encode(),
    RttMeasurement(1, 2, 12345, 0, 99, 0x80).encode(),
    ErrorFrame(1, 2, 99, 0, 7, "no such stream").encode(),
    SetupFrame(0, 1, 2, 3, 3, 65536, 1408, 0).encode(),
    bytes(32),  # a PAD header: data, not control
])


def spec_valid(datagram: bytes) -> bool:
    try:
        return isinstance(classify(datagram), ControlPacket)
    except MalformedFrameError:
        return False


def native_valid(datagram: bytes) -> bool:
    buffer = ffi.from_buffer("uint8_t[]", datagram) if datagram else ffi.new("uint8_t[1]")
    return bool(lib.lbd_snd_control_valid(buffer, len(datagram)))


@PROFILE
@given(parts=st.lists(frames, min_size=1, max_size=3),
       mutations=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=4),
       cut=st.integers(0, 8))
def test_mutated_control_datagrams_are_judged_as_the_specification_judges_them(
        parts: list[bytes], mutations: list[tuple[int, int]], cut: int) -> None:
    datagram = bytearray(b"".join(parts))
    for at, value in mutations:
        if at < len(datagram):
            datagram[at] = value
    data = bytes(datagram[: len(datagram) - cut] if cut < len(datagram) else datagram)
    assert native_valid(data) == spec_valid(data), data.hex()


@PROFILE
@given(st.binary(max_size=120))
def test_random_bytes_are_judged_as_the_specification_judges_them(data: bytes) -> None:
    assert native_valid(data) == spec_valid(data), data.hex()


def test_real_control_frames_are_valid() -> None:
    assert native_valid(StatusMessage(1, 2, 3, 64, 4096, 99).encode() + Nak(1, 2, 3, 96, 1000).encode())
    assert not native_valid(b"")
    assert not native_valid(bytes(32))
