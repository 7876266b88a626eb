"""The pipeline's errors (no heavy imports: the CLI catches them before pyspark loads)."""

from __future__ import annotations

from logbuf.errors import LogbufError


class PipelineError(LogbufError):
    """The analysis or the scenario generator failed (an internal inconsistency, not the user's input)."""


class PipelineConfigError(PipelineError, ValueError):
    """An option of ``logbuf analyze`` / ``logbuf scenario`` (or their configuration objects) cannot work."""
