"""Runnable samples: the IPC throughput and ping-pong rigs used by ``logbuf demo`` and ``bench/``, and the feed
handler's example subscriber (:mod:`.book`, ``logbuf book``: top of book from the handler's streams)."""
