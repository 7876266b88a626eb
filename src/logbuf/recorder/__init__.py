"""``logbuf record``: the feed handler's logbuf streams -> a crash-safe, rolling Parquet recording.

The public names are imported lazily: the package (and so the ``logbuf`` command line) loads without pyarrow,
which only recording itself needs (the ``analytics`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logbuf.recorder.recorder import (
        Recorder,
        RecorderConfig,
        RecorderDataLoss,
        RecorderError,
        RecorderStats,
    )

__all__ = ["Recorder", "RecorderConfig", "RecorderDataLoss", "RecorderError", "RecorderStats"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from logbuf.recorder import recorder

        return getattr(recorder, name)
    raise AttributeError(f"module 'logbuf.recorder' has no attribute {name!r}")
