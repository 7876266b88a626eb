"""Argument types shared by the ``logbuf`` sub-commands (argparse ``type=`` callables)."""

from __future__ import annotations

import argparse

_SUFFIXES = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def count(text: str) -> int:
    """A positive whole number of things: ``5000``, ``50k``, ``2M``, ``1_000_000`` (decimal suffixes)."""
    raw = text.strip().lower().replace("_", "")
    scale = _SUFFIXES.get(raw[-1:], 1)
    digits = raw[:-1] if scale != 1 else raw
    try:
        value = float(digits) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (e.g. 5000, 50k, 2M)") from None
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive whole number")
    return int(value)
