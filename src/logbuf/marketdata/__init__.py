"""Market-data wire formats: MoldUDP64 packets (:mod:`.moldudp64`) and ITCH 5.0 messages (:mod:`.itch`).

Pure codecs, imported by both the exchange simulator (:mod:`logbuf.exchange`) and the feed handler
(:mod:`logbuf.feed`), and by nothing they import."""
