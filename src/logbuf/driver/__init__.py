"""The media driver: owns log buffers and counters, and runs the conductor's duties over them."""
