"""Log buffers in Aeron's layout: descriptor, frames, and one small module per concept
(term reader, scanner, unblocker, cleaner)."""
