"""Runnable samples: the IPC throughput and ping-pong rigs used by ``logbuf demo`` and ``bench/``."""
