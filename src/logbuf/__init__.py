"""logbuf: an Aeron-style shared-memory log-buffer transport for Python.

The public API is re-exported here, lazily: ``import logbuf`` loads no submodule; the first use of a name
(``logbuf.connect``, ``from logbuf import MediaDriver``) imports the module that defines it.  That keeps
short-lived commands (``logbuf stat``) from paying for the driver and its UDP stack.  See README.md for
the architecture.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time ``__getattr__`` below resolves these
    from logbuf.client.client import Client, connect
    from logbuf.client.fragment_assembler import FragmentAssembler
    from logbuf.client.image import ControlledPollAction, FragmentBatch, Image
    from logbuf.client.publication import (
        ADMIN_ACTION,
        BACK_PRESSURED,
        CLOSED,
        MAX_POSITION_EXCEEDED,
        NOT_CONNECTED,
        BatchResult,
        BufferClaim,
        ConcurrentPublication,
        ExclusivePublication,
        Publication,
        PublicationResult,
    )
    from logbuf.client.subscription import Subscription
    from logbuf.driver.context import DriverContext
    from logbuf.driver.media_driver import ActiveDriverError, DriverDirectoryError, MediaDriver
    from logbuf.errors import (
        ClaimStateError,
        ClientTimeoutError,
        ClosedError,
        DriverTimeout,
        InvalidLogBufferError,
        LogbufError,
        LogCorruptedError,
        MessageTooLargeError,
        ReentrantPollError,
        RegistrationError,
        UnboundHeaderError,
    )
    from logbuf.idle import (
        BackoffIdleStrategy,
        BusySpinIdleStrategy,
        SleepingIdleStrategy,
        YieldingIdleStrategy,
    )
    from logbuf.logbuffer.header import Header
    from logbuf.logbuffer.log_buffers import LogBuffers
    from logbuf.native import AtomicBuffer
    from logbuf.position import Position

    __version__: str


def _version() -> str:
    # one source of truth: the version in pyproject.toml, as recorded by the installer
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("logbuf")
    except PackageNotFoundError:  # a source tree on sys.path that was never installed
        return "0+unknown"


# public name -> defining module (``__all__`` below lists the same names; a test keeps them equal)
_EXPORTS: dict[str, str] = {
    "Client": "logbuf.client.client",
    "connect": "logbuf.client.client",
    "FragmentAssembler": "logbuf.client.fragment_assembler",
    "ControlledPollAction": "logbuf.client.image",
    "FragmentBatch": "logbuf.client.image",
    "Image": "logbuf.client.image",
    "ADMIN_ACTION": "logbuf.client.publication",
    "BACK_PRESSURED": "logbuf.client.publication",
    "CLOSED": "logbuf.client.publication",
    "MAX_POSITION_EXCEEDED": "logbuf.client.publication",
    "NOT_CONNECTED": "logbuf.client.publication",
    "BatchResult": "logbuf.client.publication",
    "BufferClaim": "logbuf.client.publication",
    "ConcurrentPublication": "logbuf.client.publication",
    "ExclusivePublication": "logbuf.client.publication",
    "Publication": "logbuf.client.publication",
    "PublicationResult": "logbuf.client.publication",
    "Subscription": "logbuf.client.subscription",
    "DriverContext": "logbuf.driver.context",
    "ActiveDriverError": "logbuf.driver.media_driver",
    "DriverDirectoryError": "logbuf.driver.media_driver",
    "MediaDriver": "logbuf.driver.media_driver",
    "ClaimStateError": "logbuf.errors",
    "ClientTimeoutError": "logbuf.errors",
    "ClosedError": "logbuf.errors",
    "ReentrantPollError": "logbuf.errors",
    "UnboundHeaderError": "logbuf.errors",
    "DriverTimeout": "logbuf.errors",
    "InvalidLogBufferError": "logbuf.errors",
    "LogbufError": "logbuf.errors",
    "LogCorruptedError": "logbuf.errors",
    "MessageTooLargeError": "logbuf.errors",
    "RegistrationError": "logbuf.errors",
    "BackoffIdleStrategy": "logbuf.idle",
    "BusySpinIdleStrategy": "logbuf.idle",
    "SleepingIdleStrategy": "logbuf.idle",
    "YieldingIdleStrategy": "logbuf.idle",
    "Header": "logbuf.logbuffer.header",
    "LogBuffers": "logbuf.logbuffer.log_buffers",
    "AtomicBuffer": "logbuf.native",
    "Position": "logbuf.position",
}

__all__ = [
    "ADMIN_ACTION",
    "ActiveDriverError",
    "AtomicBuffer",
    "BACK_PRESSURED",
    "BackoffIdleStrategy",
    "BatchResult",
    "BufferClaim",
    "BusySpinIdleStrategy",
    "CLOSED",
    "ClaimStateError",
    "Client",
    "ClientTimeoutError",
    "ClosedError",
    "ReentrantPollError",
    "UnboundHeaderError",
    "ConcurrentPublication",
    "ControlledPollAction",
    "DriverContext",
    "DriverDirectoryError",
    "DriverTimeout",
    "ExclusivePublication",
    "FragmentAssembler",
    "FragmentBatch",
    "Header",
    "Image",
    "InvalidLogBufferError",
    "LogBuffers",
    "LogCorruptedError",
    "LogbufError",
    "MAX_POSITION_EXCEEDED",
    "MediaDriver",
    "MessageTooLargeError",
    "NOT_CONNECTED",
    "Position",
    "Publication",
    "PublicationResult",
    "RegistrationError",
    "SleepingIdleStrategy",
    "Subscription",
    "YieldingIdleStrategy",
    "connect",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    else:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'logbuf' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later look-ups are plain attribute reads
    return value


def __dir__() -> list[str]:
    # the public names, loaded or not, plus the usual module attributes (not this module's helpers)
    return sorted(set(__all__) | {name for name in globals() if name.startswith("__")})
