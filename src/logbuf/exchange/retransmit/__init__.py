"""The retransmission server: MoldUDP64 re-requests answered from a ring of sent messages, fairly, from a process
of its own. Layers, pure first, one module each:

- :mod:`.ring`: :class:`~.ring.MessageRing`, the last ``2**bits`` sent messages (sequence -> day-file offset),
  one writer, any readers, in a buffer that may be shared between processes;
- :mod:`.rate`: :class:`~.rate.RateLimiter`, a token bucket per client;
- :mod:`.core`: :class:`~.core.RetransmitCore` checks one request and builds its answer (fed bytes, a client
  and a clock reading); every outcome is counted in :class:`~.core.RetransmitStats`;
- :mod:`.fair`: :class:`~.fair.FairService` puts admitted requests in one bounded queue per client and answers
  them round-robin, one per client per turn, so a client that floods waits behind its own requests only;
- :mod:`.service`: :class:`~.service.NativeFairService`, the same service in C (``native/rtx_fair.c``): a batch
  of requests checked, limited and queued, and a batch of answers built and sent, with no Python per request
  (the three modules above are its specification);
- :mod:`.server`: :class:`~.server.RetransmitServer`, the socket loop (a flooding client gets a socket of its own);
- :mod:`.process`: :class:`~.process.RetransmitProcess` runs a server in a child process (no interpreter lock
  shared with a replay's send loop), reading a ring in an anonymous shared mapping the parent writes.
"""
