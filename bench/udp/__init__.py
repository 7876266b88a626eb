"""UDP benchmarks through the media driver: ``python -m bench.udp``."""
