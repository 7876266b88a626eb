"""The exchange simulator: what the feed handler is tested against.

- :mod:`.synth` writes a synthetic ITCH 5.0 day (``logbuf synth``), :mod:`.dayfile` reads and writes day files;
- :mod:`.replay` sends a day as MoldUDP64 feeds A and B with faults (``logbuf replay``);
- :mod:`.retransmit` answers MoldUDP64 re-requests (``logbuf retransmit``, or a child of the replay);
- :mod:`.commands` is their command line.

It speaks to the feed handler only over the network: neither package imports the other."""
