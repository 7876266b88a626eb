"""The retransmission server: MoldUDP64 re-requests answered from a ring of sent messages, fairly, from a process
of its own.


Layers, pure first:

- :class:`RetransmitCore` validates one request and builds its answer (fed bytes, a client and a clock
  reading). Invalid requests — wrong size, wrong session, count 0 or 0xFFFF, a first sequence in the future
  (2**63 and beyond included) or no longer in the ring, a message larger than the answer cap — get no answer,
  only a counter. One answer per request, never longer than the payload budget; the client re-requests the rest.
- :class:`FairService` puts admitted requests in one bounded queue per client and answers them round-robin, one
  per client per turn, so a client that floods waits behind its own requests only. Its token bucket
  (:class:`RateLimiter`) limits how many it may have answered per second.
- :class:`RetransmitServer` is the socket loop: each cycle it drains the socket (up to a bound), then answers
  round-robin. A client that exceeds its rate gets a socket of its own, connected to it on the same port: the
  kernel then queues that client's datagrams apart (a flood overflows its own queue, not everybody's), and the
  loop reads a bounded number of them per cycle.
- :class:`RetransmitProcess` runs a server in a child process (no interpreter lock shared with a replay's send
  loop), reading a ring in an anonymous shared mapping (memfd) the parent writes. The parent binds the socket
  and passes it; the child stops when the parent closes its control pipe, or dies (end of file on the pipe).

One module per concept: :mod:`.ring` (the ring and its layout), :mod:`.rate` (token buckets), :mod:`.core`
(request checks and answers, :class:`~.core.RetransmitStats`), :mod:`.fair` (round-robin service),
:mod:`.server` (the socket loop), :mod:`.process` (the child process).
"""
