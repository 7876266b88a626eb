"""iceoryx2's Python bindings: zero-copy publish-subscribe over shared memory.

The payload type is a fixed-size ``ctypes.c_uint8 * size`` array.  The service is configured not to lose
data — its default subscriber buffer of 2 with safe overflow would silently drop messages: here the
subscriber buffer holds 1024 samples, safe overflow is off and publishers use ``RetryUntilDelivered``
back-pressure.  Publishers ``send_copy`` (the documented way for a ready-made value); the subscriber reads the
stamp in place through ``payload_ptr`` and polls ``receive()`` with a back-off idle strategy (it has no
blocking receive; event-based waiting is a separate service).

Each channel runs in an iceoryx2 domain of its own (a file prefix and a root directory made for it), so the
files iceoryx2 leaves behind - its node registry in /dev/shm, node and service records under its root - are
the channel's to remove when it closes.
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from bench.peers.base import (
    RING,
    RING_MASK,
    STAMP_LENGTH,
    Channel,
    Peer,
    latency_idle,
    message_block,
    throughput_idle,
)

BUFFER = 1024  # subscriber buffer (samples)
MAX_PUBLISHERS = 8


@dataclass(frozen=True)
class IceoryxSpec:
    service: str
    size: int
    prefix: str  # file-name prefix of the channel's iceoryx2 domain
    root: str  # its root directory (ends with "/")


SHM_DIR = "/dev/shm"


def _node(spec: IceoryxSpec) -> Any:
    import iceoryx2 as iox2

    iox2.set_log_level_from_env_or(iox2.LogLevel.Error)  # no "no config file" chatter per process
    config = iox2.config.default()
    config.global_cfg.prefix = iox2.FileName.new(spec.prefix)
    config.global_cfg.root_path = iox2.Path.new(spec.root)
    return iox2.NodeBuilder.new().config(config).create(iox2.ServiceType.Ipc)


def _service(node: Any, spec: IceoryxSpec, create: bool) -> Any:
    import iceoryx2 as iox2

    builder = (
        node.service_builder(iox2.ServiceName.new(spec.service))
        .publish_subscribe(ctypes.c_uint8 * spec.size)
        .subscriber_max_buffer_size(BUFFER)
        .enable_safe_overflow(False)
        .history_size(0)
        .max_publishers(MAX_PUBLISHERS)
        .max_subscribers(1)
    )
    return builder.create() if create else builder.open()


class IceoryxChannel(Channel):
    """The parent creates the service and keeps it alive for the run; the children open it."""

    def __init__(self, size: int) -> None:
        tag = f"{os.getpid()}{os.urandom(4).hex()}"
        root = tempfile.mkdtemp(prefix="logbuf-bench-iox2-")
        self.spec = IceoryxSpec(f"logbuf-bench/{tag}", size, f"iox2lb{tag}_", root + "/")
        self._node: Any = _node(self.spec)
        self._service: Any = _service(self._node, self.spec, create=True)

    def close(self) -> None:
        self._service = None
        self._node = None
        for path in glob.glob(os.path.join(SHM_DIR, self.spec.prefix + "*")):
            os.unlink(path)
        shutil.rmtree(self.spec.root, ignore_errors=True)


class IceoryxSender:
    def __init__(self, spec: IceoryxSpec, producer: int) -> None:
        import iceoryx2 as iox2

        self._node = _node(spec)
        self._service_port = _service(self._node, spec, create=False)
        self._publisher = (
            self._service_port.publisher_builder()
            .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered)
            .create()
        )
        array = ctypes.c_uint8 * spec.size
        block = message_block(spec.size, producer)
        self._ring = [array.from_buffer_copy(block[k * spec.size : (k + 1) * spec.size]) for k in range(RING)]
        self._next = 0

    def send(self, n: int) -> None:
        send_copy, ring = self._publisher.send_copy, self._ring
        for i in range(self._next, self._next + n):
            send_copy(ring[i & RING_MASK])
        self._next += n

    def send_one(self, index: int) -> None:
        self._publisher.send_copy(self._ring[index & RING_MASK])

    def close(self) -> None:
        return None


class IceoryxReceiver:
    def __init__(self, spec: IceoryxSpec) -> None:
        self._node = _node(spec)
        self._service_port = _service(self._node, spec, create=False)
        self._subscriber = self._service_port.subscriber_builder().buffer_size(BUFFER).create()
        self._offset = spec.size - STAMP_LENGTH
        self._idle = throughput_idle()
        self._one_idle = latency_idle()

    def receive(self, n: int) -> int:
        receive, offset, idle = self._subscriber.receive, self._offset, self._idle
        u64 = ctypes.c_uint64.from_address
        total = 0
        for _ in range(n):
            sample = receive()
            if sample is None:
                while (sample := receive()) is None:
                    idle.idle(0)
                idle.reset()
            total += u64(sample.payload_ptr + offset).value
        return total

    def receive_one(self) -> int:
        receive, idle = self._subscriber.receive, self._one_idle
        sample = receive()
        while sample is None:
            idle.idle(0)
            sample = receive()
        idle.reset()
        return ctypes.c_uint64.from_address(sample.payload_ptr + self._offset).value

    def close(self) -> None:
        return None


class Iceoryx2(Peer):
    key = "iceoryx2"
    label = "iceoryx2"
    modules = ("iceoryx2",)
    wait = "backoff"
    rtt_waits = ("backoff",)
    usage = ("`send_copy(ctypes array)` / `receive()` polled with back-off; subscriber buffer 1024, "
             "no safe overflow, RetryUntilDelivered (lossless)")

    def open_channel(self, size: int, producers: int, multi: bool) -> Channel:
        if producers > MAX_PUBLISHERS:
            raise ValueError(f"at most {MAX_PUBLISHERS} publishers")
        return IceoryxChannel(size)

    def sender(self, spec: Any, producer: int, size: int) -> IceoryxSender:
        return IceoryxSender(spec, producer)

    def receiver(self, spec: Any, size: int, wait: str) -> IceoryxReceiver:
        return IceoryxReceiver(spec)
