"""Issue 3's benchmarks: the transport through the media driver vs driver-less, wake-ups, driver idle CPU."""
