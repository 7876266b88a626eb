"""The fair service in C: a batch of received requests checked, rate-limited and queued, and a batch of answers
built and sent, each with one call (``native/rtx_fair.c``) and no Python per request.

:class:`~.fair.FairService` (with :class:`~.rate.RateLimiter` and :meth:`~.core.RetransmitCore.check`) is its
specification, rule for rule; a property test drives both with the same requests, clients and clock readings
and compares every outcome. Clients are raw sockaddr bytes (at most 32), as recvmmsg gives them."""

from __future__ import annotations

import os
import weakref
from dataclasses import fields
from typing import Any

from logbuf.exchange.retransmit.core import RetransmitCore, RetransmitStats
from logbuf.exchange.retransmit.fair import DEFAULT_QUEUE
from logbuf.exchange.retransmit.rate import RateLimiter
from logbuf.exchange.retransmit.ring import RetransmitError
from logbuf.marketdata.moldudp64 import HEADER_LENGTH
from logbuf.native import ffi, lib

#: RetransmitStats' fields the C service counts, with their RTX_STAT_* indices (the others are the server's)
_COUNTED = tuple((f.name, getattr(lib, f"RTX_STAT_{f.name.upper()}")) for f in fields(RetransmitStats)
                 if hasattr(lib, f"RTX_STAT_{f.name.upper()}"))
ADDRESS_SLOT = lib.RTX_ADDRESS_SLOT


class NativeFairService:
    """:class:`~.fair.FairService` in C: one bounded queue per client, answered round-robin, a token bucket
    per client (``limiter``'s rate, burst and number of clients remembered; None: no rate limit).

    The ring and the day file are those of ``core`` (kept alive with the service)."""

    def __init__(self, core: RetransmitCore, limiter: RateLimiter | None = None, queue: int = DEFAULT_QUEUE,
                 max_clients: int = 4_096) -> None:
        if queue < 1 or max_clients < 1:
            raise RetransmitError("the per-client queue and max_clients must be >= 1")
        limiter = limiter if limiter is not None else core.limiter
        self.core = core
        self.queue = queue
        self.max_clients = max_clients
        self.limiter = limiter
        ring = core.ring
        c = lib.rtx_service_create(
            core._c_session, core._c_seq, core._c_offset, ring.mask, core._c_next, core._c_buffer, len(core.view),
            core.budget - HEADER_LENGTH, limiter.rate if limiter else 1.0, limiter.burst if limiter else 1.0,
            limiter.max_clients if limiter else 0, queue, max_clients, int.from_bytes(os.urandom(8), "little"))
        if c == ffi.NULL:
            raise RetransmitError(f"cannot create the retransmission service (queue {queue}, max_clients "
                                  f"{max_clients}: out of range or out of memory)")
        self._c = c
        self._finalizer = weakref.finalize(self, lib.rtx_service_destroy, c)
        self._counters = ffi.new("int64_t[]", lib.RTX_STAT_COUNT)
        # for receive() / next_request(): one request at a time
        self._one_slot = ffi.new("uint8_t[]", HEADER_LENGTH + 1)
        self._one_length = ffi.new("int32_t[1]")
        self._one_address = ffi.new("uint8_t[]", ADDRESS_SLOT)
        self._one_address_length = ffi.new("int32_t[1]")
        self._one_flag = ffi.new("uint8_t[1]")
        self._one_first = ffi.new("int64_t[1]")
        self._one_count = ffi.new("int64_t[1]")
        self.over_rate = False
        # the distinct clients over their rate in one drain
        self._over_max = 64
        self._over_addresses = ffi.new("uint8_t[]", self._over_max * ADDRESS_SLOT)
        self._over_lengths = ffi.new("int32_t[]", self._over_max)
        self._over_count = ffi.new("int32_t[1]")

    @property
    def c(self) -> Any:
        """The ``rtx_service_t *``."""
        return self._c

    @property
    def pending(self) -> int:
        """Clients waiting for an answer."""
        return int(lib.rtx_service_pending(self._c))

    @property
    def stats(self) -> RetransmitStats:
        """A snapshot of the outcome counters (the socket-level ones, kernel drops and isolations, are the
        server's)."""
        lib.rtx_service_stats(self._c, self._counters)
        return RetransmitStats(**{name: int(self._counters[index]) for name, index in _COUNTED})

    def receive_batch(self, slots: Any, slot_length: int, lengths: Any, addresses: Any, address_slot: int,
                      address_lengths: Any, count: int, now_ns: int, flags: Any) -> int:
        """Takes ``count`` received datagrams (cffi arrays as ``lbn_recv_batch`` fills them): each counted,
        checked, rate-limited and queued; ``flags[i]`` says ``RTX_ADMITTED`` and/or ``RTX_OVER_RATE``. Returns
        how many were over rate."""
        return int(lib.rtx_service_receive(self._c, slots, slot_length, lengths, addresses, address_slot,
                                           address_lengths, count, now_ns, flags))

    def drain(self, fd: int, limit: int, now_ns: int) -> tuple[int, list[bytes]]:
        """Reads up to ``limit`` datagrams from socket ``fd`` (recvmmsg, 64 at a time) and takes each as
        :meth:`receive` would: (datagrams read, the distinct clients found over their rate, at most 64)."""
        read = lib.rtx_service_drain(self._c, fd, limit, now_ns, self._over_addresses, self._over_lengths,
                                     self._over_max, self._over_count)
        over = self._over_count[0]
        if not over:
            return int(read), []
        lengths = self._over_lengths
        return int(read), [bytes(ffi.buffer(self._over_addresses + k * ADDRESS_SLOT, lengths[k]))
                           for k in range(over)]

    def receive(self, request: bytes | memoryview, client: bytes, now_ns: int) -> bool:
        """:meth:`FairService.receive` of one request (False: dropped, the reason counted); :attr:`over_rate`
        tells whether the client was over its rate or its queue."""
        if len(client) > ADDRESS_SLOT:
            raise ValueError(f"a client is at most {ADDRESS_SLOT} bytes of sockaddr, not {len(client)}")
        length = len(request)
        ffi.memmove(self._one_slot, bytes(request[: HEADER_LENGTH + 1]), min(length, HEADER_LENGTH + 1))
        self._one_length[0] = length if length <= HEADER_LENGTH else -1  # longer: cut, as recvmmsg would
        ffi.memmove(self._one_address, client, len(client))
        self._one_address_length[0] = len(client)
        lib.rtx_service_receive(self._c, self._one_slot, HEADER_LENGTH + 1, self._one_length, self._one_address,
                                ADDRESS_SLOT, self._one_address_length, 1, now_ns, self._one_flag)
        flag = self._one_flag[0]
        self.over_rate = bool(flag & lib.RTX_OVER_RATE)
        return bool(flag & lib.RTX_ADMITTED)

    def next_request(self) -> tuple[bytes, int, int] | None:
        """:meth:`FairService.next_request`: (client, first sequence, count) of the next client's oldest
        request, taken out of its queue."""
        if not lib.rtx_service_pop(self._c, 1, self._one_first, self._one_count, self._one_address, ADDRESS_SLOT,
                                   self._one_address_length):
            return None
        client = bytes(ffi.buffer(self._one_address, self._one_address_length[0]))
        return client, int(self._one_first[0]), int(self._one_count[0])

    def answer(self, fd: int, max_answers: int) -> int:
        """Answers up to ``max_answers`` requests in turn from socket ``fd`` (built and sent in C, every outcome
        counted); how many answers went."""
        return int(lib.rtx_service_answer(self._c, fd, max_answers))

    def close(self) -> None:
        """Frees the C state (the service is unusable after)."""
        self._finalizer()
