"""``Header``: a flyweight over the frame header of the fragment a handler is being given.

One instance per image is re-pointed at each fragment (nothing is allocated per message); fields are read
from shared memory only when asked for: ``frame_length``, ``flags``, ``type``, ``term_offset``, ``session_id``,
``stream_id``, ``term_id``, ``reserved_value``, ``position`` (the stream position just after the fragment),
plus ``initial_term_id`` and ``position_bits``.  Valid only inside the handler call: reading a field
afterwards raises :class:`~logbuf.errors.UnboundHeaderError` (copy what you need, e.g. ``header.position``).

The type is native (``logbuf._client.Header``); ``Header(initial_term_id, position_bits)`` makes an unbound one.
"""

from __future__ import annotations

from logbuf.native import client

__all__ = ["Header"]

Header = client.Header
