"""The Python face of the native modules: bounds-checked AtomicBuffer, layout agreement, argument errors."""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace

import pytest

from logbuf.client.image import ControlledPollAction
from logbuf.client.publication import PublicationResult
from logbuf.errors import ClosedError, MessageTooLargeError
from logbuf.logbuffer import descriptor as d
from logbuf.logbuffer import frame as f
from logbuf.native import AtomicBuffer, check_codes, check_control_layout, check_layout, client, lib
from logbuf.protocol import error_frame, nak, rttm, setup, status_message


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
    # the limits a native publication applies are among the checked constants, not figures of its own
    assert {"POSITION_TERM_COUNT_BITS", "MAX_MESSAGE_TERM_DIVISOR", "MAX_MESSAGE_LENGTH_CAP"} <= set(client.LAYOUT)


def test_layout_check_refuses_a_disagreeing_build() -> None:
    with pytest.raises(ImportError, match="HEADER_LENGTH"):
        check_layout({**vars(f), "HEADER_LENGTH": 64}, vars(d))


CONTROL_CODECS = {"status_message": status_message, "nak": nak, "setup": setup, "rttm": rttm,
                  "error_frame": error_frame}


def test_control_frame_layouts_equal_the_protocol_codecs() -> None:
    assert set(client.CONTROL_LAYOUT) == set(CONTROL_CODECS)
    for frame, table in client.CONTROL_LAYOUT.items():
        for name, value in table.items():
            assert getattr(CONTROL_CODECS[frame], name) == value, (frame, name)
    # every field offset a codec names is one the C names too (the check covers whole frames)
    for frame, module in CONTROL_CODECS.items():
        offsets = {name for name in vars(module) if name.endswith("_OFFSET")}
        assert offsets <= set(client.CONTROL_LAYOUT[frame]), (frame, offsets - set(client.CONTROL_LAYOUT[frame]))
    check_control_layout(CONTROL_CODECS)  # what logbuf.protocol runs at import
    types = ("HDR_TYPE_NAK", "HDR_TYPE_SM", "HDR_TYPE_ERR", "HDR_TYPE_SETUP", "HDR_TYPE_RTTM")
    assert {name: client.LAYOUT[name] for name in types} == {name: getattr(f, name) for name in types}


def test_control_layout_check_refuses_a_disagreeing_build() -> None:
    wrong = SimpleNamespace(**{**vars(nak), "TERM_ID_FIELD_OFFSET": 20})  # the NAK's codec with a field moved
    with pytest.raises(ImportError, match="nak frame: TERM_ID_FIELD_OFFSET is 16 in C, 20 in Python"):
        check_control_layout({**CONTROL_CODECS, "nak": wrong})
    with pytest.raises(ImportError, match="control frames"):
        check_control_layout({k: v for k, v in CONTROL_CODECS.items() if k != "rttm"})


def test_result_codes_and_poll_actions_equal_the_python_enums() -> None:
    assert {r.name: r.value for r in PublicationResult} == client.RESULT_CODES
    assert {name: getattr(lib, f"LB_{name}") for name in client.RESULT_CODES} == client.RESULT_CODES
    assert {a.name: a.value for a in ControlledPollAction} == client.POLL_ACTIONS


def test_code_check_refuses_a_disagreeing_build() -> None:
    with pytest.raises(ImportError, match="CLOSED"):
        check_codes("RESULT_CODES", {**{r.name: r.value for r in PublicationResult}, "CLOSED": -6})
    with pytest.raises(ImportError, match="BREAK"):
        check_codes("POLL_ACTIONS", {"ABORT": 1, "COMMIT": 3, "CONTINUE": 4})


def test_both_modules_run_one_copy_of_the_core_library() -> None:
    core = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "liblogbuf-core" in line}
    assert len(core) == 1, core  # one library mapped, beside the modules that link it
    path = Path(next(iter(core)))
    assert path.parent == Path(client.__file__).parent
    # the cffi module has no lb_offer_batch of its own: looked up from it, the symbol is the core's (the code
    # that appends to the lb_publication_t Publication.native_struct() hands over)
    import logbuf._native

    def address(library: str) -> int | None:
        return ctypes.cast(ctypes.CDLL(library)["lb_offer_batch"], ctypes.c_void_p).value

    assert address(logbuf._native.__file__) == address(str(path))


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
