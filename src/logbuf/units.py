"""Time units: the one definition of how many nanoseconds a microsecond, millisecond and second hold.

Every duration logbuf keeps is an integer count of nanoseconds (``*_ns``), as Aeron's are; these constants
convert to and from the units people write (``5 * NANOS_PER_MILLI``, ``ns / NANOS_PER_SECOND``).  Also the
one wall clock in milliseconds (``epoch_ms``: cnc.dat's heartbeats and timestamps).  The module imports
nothing of logbuf's, so every layer may use it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

NANOS_PER_MICRO: Final = 1_000
NANOS_PER_MILLI: Final = 1_000_000
NANOS_PER_SECOND: Final = 1_000_000_000

MICROS_PER_SECOND: Final = NANOS_PER_SECOND // NANOS_PER_MICRO
MILLIS_PER_SECOND: Final = NANOS_PER_SECOND // NANOS_PER_MILLI

#: nanoseconds per unit suffix of a duration written as text (``"500us"``, ``"5ms"``, ``"1s"``)
NANOS_PER_UNIT: Final[Mapping[str, int]] = MappingProxyType({
    "ns": 1,
    "us": NANOS_PER_MICRO,
    "ms": NANOS_PER_MILLI,
    "s": NANOS_PER_SECOND,
})


def epoch_ms() -> int:
    """Milliseconds since the epoch: the clock of cnc.dat's heartbeats, error log and loss report timestamps."""
    return time.time_ns() // NANOS_PER_MILLI
