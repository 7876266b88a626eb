"""The peers measured by ``python -m bench peers``: logbuf's APIs and what a Python engineer uses today.

Each is a :class:`~bench.peers.base.Peer`; the order here is the order of the table rows.  Peers are looked
up by key in the spawned processes, so a peer object never has to be pickled.
"""

from __future__ import annotations

import importlib

from bench.peers.base import Peer
from bench.peers.faster_fifo_peers import FasterFifo, FasterFifoBatch
from bench.peers.iceoryx2_peer import Iceoryx2
from bench.peers.logbuf_peers import LogbufBatch, LogbufDriver, LogbufPerMessage
from bench.peers.naive_ring_peer import NaiveRing
from bench.peers.posix_mq_peer import PosixMessageQueue
from bench.peers.stdlib_peers import MpPipe, MpQueue
from bench.peers.zmq_peer import ZmqPushPull

PEERS: dict[str, Peer] = {
    p.key: p
    for p in (
        LogbufPerMessage(),
        LogbufBatch(),
        LogbufDriver(),
        NaiveRing(),
        MpQueue(),
        MpPipe(),
        FasterFifo(),
        FasterFifoBatch(),
        ZmqPushPull(),
        PosixMessageQueue(),
        Iceoryx2(),
    )
}


def peer(key: str) -> Peer:
    """A registered peer by key, or ``"module:Class"`` for a Peer subclass defined elsewhere (the spawned
    processes import it the same way)."""
    if key in PEERS:
        return PEERS[key]
    module, sep, name = key.partition(":")
    if not sep:
        raise KeyError(f"unknown peer {key!r}; choose from {', '.join(PEERS)} or give module:Class")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Peer)):
        raise TypeError(f"{key} is not a Peer subclass")
    return cls()


__all__ = ["PEERS", "Peer", "peer"]
