"""The codec tests compare against itchfeed's pure-Python parser (the reference, not its C++ speed-up)."""

from __future__ import annotations

import os

os.environ.setdefault("ITCH_NO_CPP", "1")
