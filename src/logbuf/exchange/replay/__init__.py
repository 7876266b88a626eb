"""The replay: an ITCH day file sent as a MoldUDP64 downstream feed (A and B), a sans-IO core plus a socket loop.

Pipeline (everything left of the socket loop is pure and driven by the file and the configuration only)::

    DayFileReader --blocks--> Packetiser --PacketPlan--> FeedScheduler (A) --+
                                                     \\-> FeedScheduler (B) --+--> ReplayCore.events()
                                                                                    (time-ordered SendEvents)
                                                                                 ReplayCore.batches()
                                                                                    (the same, as SendBatches)
                                                                                           |
                                                        ReplayServer: sleep until due, publish to the
                                                        retransmission ring, send each feed's due packets

One module per concept:

- :mod:`.config`: the settings (:class:`~.config.ReplayConfig`, per feed :class:`~.config.FeedConfig` and
  :class:`~.config.FaultConfig`), checked when built;
- :mod:`.plans`: cutting the day file's frames into packets (:class:`~.plans.Packetiser`);
- :mod:`.schedule`: one feed's send schedule (delay, jitter, heartbeats, loss, duplication, reordering, drop
  ranges, end of session) and what it sent (:class:`~.schedule.FeedSendStats`);
- :mod:`.freeze`: head-end freezes and the catch-up packets that follow them;
- :mod:`.core`: :class:`~.core.ReplayCore`, the feeds' schedules merged into time-ordered sends, per packet or in
  batches;
- :mod:`.wire`: building a batch's packets once into one buffer (:class:`~.wire.SendBatch`);
- :mod:`.sender`: :class:`~.sender.ReplayServer`, the socket loop (sendmmsg, UDP GSO) and its summary.
"""
