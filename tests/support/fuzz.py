"""Hypothesis helpers for hostile input: a well-formed datagram mutated the ways a broken or forged peer would."""

from __future__ import annotations

from hypothesis import strategies as st


def mutate(draw: st.DrawFn, datagram: bytes, mutations: tuple[int, int] = (0, 3), extend: int = 64) -> bytes:
    """``mutations`` (at least, at most) changes to ``datagram``: a flipped bit, a truncation, up to ``extend``
    trailing bytes, a random 32-bit word."""
    raw = bytearray(datagram)
    for _ in range(draw(st.integers(*mutations))):
        action = draw(st.sampled_from(["flip", "truncate", "extend", "word"]))
        if action == "flip" and raw:
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif action == "truncate":
            del raw[draw(st.integers(0, len(raw))):]
        elif action == "extend":
            raw += draw(st.binary(min_size=1, max_size=extend))
        elif action == "word" and len(raw) >= 4:
            i = draw(st.integers(0, (len(raw) - 4) // 4)) * 4
            raw[i : i + 4] = draw(st.integers(-(2**31), 2**31 - 1)).to_bytes(4, "little", signed=True)
    return bytes(raw)
