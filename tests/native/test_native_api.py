"""The Python face of the native modules: bounds-checked AtomicBuffer, layout agreement, argument errors."""

from __future__ import annotations

import pytest

from logbuf.errors import ClosedError, MessageTooLargeError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f
from logbuf.native import AtomicBuffer, check_layout, client


def test_plain_accessors_are_bounds_checked_by_their_size() -> None:
    buf = AtomicBuffer(bytearray(8))
    buf.put_i64(0, -2)
    assert buf.get_i32(4) == -1
    for call in (lambda: buf.get_i32(6), lambda: buf.get_i64(1), lambda: buf.put_i32(5, 1),
                 lambda: buf.put_i64(4, 1), lambda: buf.get_bytes(4, 5), lambda: buf.put_bytes(7, b"ab"),
                 lambda: buf.set_memory(2, 7), lambda: buf.get_i32(-1)):
        with pytest.raises(IndexError):
            call()


def test_released_buffer_raises_closed() -> None:
    buf = AtomicBuffer(bytearray(16))
    buf.release()
    with pytest.raises(ClosedError):
        buf.get_i64_acquire(0)
    with pytest.raises(ClosedError):
        buf.get_i32(0)


def test_native_layout_equals_the_python_constants() -> None:
    for name, value in client.LAYOUT.items():
        assert getattr(f, name, getattr(d, name, None)) == value, name
    check_layout(f, vars(d))  # what descriptor runs at import


def test_layout_check_refuses_a_disagreeing_build() -> None:
    with pytest.raises(ImportError, match="HEADER_LENGTH"):
        check_layout({**vars(f), "HEADER_LENGTH": 64}, vars(d))


def test_offering_str_is_a_clear_type_error(pipe) -> None:
    p = pipe()
    with pytest.raises(TypeError, match="offer takes bytes-like data, not str"):
        p.pub.offer("text")
    with pytest.raises(TypeError, match="not str"):
        p.pub.offer_batch("text", lengths=[4])
    with pytest.raises(MessageTooLargeError):
        p.pub.offer(bytes(p.pub.max_message_length + 1))
    assert p.pub.offer(memoryview(b"abc"), reserved_value=7) > 0
    got = p.drain()
    assert got == [(b"abc", 7, f.UNFRAGMENTED)]
