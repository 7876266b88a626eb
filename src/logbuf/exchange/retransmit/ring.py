"""The retransmission ring: the last ``2**bits`` (sequence -> frame offset) entries, one writer, any readers.

The ring maps a sequence number to the file offset of its frame; a power-of-two size makes the slot
``seq & (size - 1)``. It lives in one flat int64 buffer (a numpy array, or a shared mapping that a replay
writes and a server process reads)::

    word 0            next_sequence (one past the highest published; written after the slots)
    words 1..7        reserved (the slots start on a cache line of their own)
    words 8..         seq[size]      slot.seq == seq  <=> the slot still holds seq
    then              offset[size]   frame offset in the day file

A sequence is served only when it is not in the future (``seq < next``), not overwritten
(``seq >= next - size`` and ``slot.seq == seq``, the lap check). Because the frames of consecutive sequences
are consecutive in the day file, an answer is the 20-byte header plus one slice of the file. A reader trusts
"""

from __future__ import annotations

import mmap

import numpy as np

from logbuf.errors import LogbufError

DEFAULT_RING_BITS = 20
MIN_RING_BITS, MAX_RING_BITS = 1, 30
RING_HEADER_WORDS = 8
_NEXT_WORD = 0


class RetransmitError(LogbufError, ValueError):
    """A retransmission server setting is out of range, or its child process could not start."""


def ring_bytes(bits: int) -> int:
    """Bytes of a ring of ``2**bits`` slots (header included)."""
    return (RING_HEADER_WORDS + 2 * (1 << bits)) * 8


class MessageRing:
    """The last ``2**bits`` (sequence -> frame offset) entries; one writer, any number of readers.

    ``buffer`` (optional, writable, at least :func:`ring_bytes` long) holds the ring, e.g. a shared mapping;
    by default the ring owns a zeroed numpy array.
    """

    def __init__(
        self, bits: int = DEFAULT_RING_BITS, buffer: mmap.mmap | bytearray | memoryview | np.ndarray | None = None
    ) -> None:
        if not MIN_RING_BITS <= bits <= MAX_RING_BITS:
            raise RetransmitError(f"ring bits must be within {MIN_RING_BITS}..{MAX_RING_BITS}, not {bits}")
        self.bits = bits
        self.capacity = 1 << bits
        self.mask = self.capacity - 1
        words = RING_HEADER_WORDS + 2 * self.capacity
        if buffer is None:
            self._words = np.zeros(words, dtype=np.int64)
            self._words[_NEXT_WORD] = 1  # sequence numbers start at 1
        else:
            raw = np.frombuffer(buffer, dtype=np.uint8)
            if raw.size < words * 8:
                raise RetransmitError(f"a ring of 2**{bits} slots needs {words * 8} bytes, the buffer has {raw.size}")
            self._words = raw[: words * 8].view(np.int64)
        self._seq = self._words[RING_HEADER_WORDS : RING_HEADER_WORDS + self.capacity]
        self._offset = self._words[RING_HEADER_WORDS + self.capacity :]

    @property
    def seq_array(self) -> np.ndarray:
        """The slots' sequences (int64, ``capacity`` of them): what a reader in C confirms each offset with."""
        return self._seq

    @property
    def offset_array(self) -> np.ndarray:
        """The slots' frame offsets (int64, ``capacity`` of them)."""
        return self._offset

    @property
    def next_word(self) -> np.ndarray:
        """The one int64 word holding the next sequence (a view: a reader in C loads it with acquire)."""
        return self._words[_NEXT_WORD : _NEXT_WORD + 1]

    @property
    def next_sequence(self) -> int:
        """One past the highest published sequence (as read from the ring: a reader must not trust it)."""
        return int(self._words[_NEXT_WORD])

    def reset(self) -> None:
        """An empty ring whose next sequence is 1 (for a buffer that did not start zeroed)."""
        self._seq[:] = 0
        self._words[_NEXT_WORD] = 1

    def publish(self, first_sequence: int, frames: np.ndarray) -> None:
        """Messages ``first_sequence ..`` at frame offsets ``frames``; sequences must continue the ring's."""
        if first_sequence != self.next_sequence:
            raise RetransmitError(f"ring expects sequence {self.next_sequence}, got {first_sequence}")
        n = int(frames.size)
        keep = min(n, self.capacity)  # only the last ``capacity`` can survive anyway
        seqs = np.arange(first_sequence + n - keep, first_sequence + n, dtype=np.int64)
        slots = seqs & self.mask
        # seq before offset, next_sequence last: a reader that reads offset then seq never pairs a new offset
        # with the old sequence (x86 keeps stores, and loads, in program order)
        self._seq[slots] = seqs
        self._offset[slots] = frames[n - keep :]
        self._words[_NEXT_WORD] = first_sequence + n

    def lowest_sequence(self) -> int:
        return max(1, self.next_sequence - self.capacity)

    def offset(self, sequence: int, next_sequence: int | None = None) -> int | None:
        """Frame offset of ``sequence`` if the ring still holds it (lap check), else None."""
        upper = self.next_sequence if next_sequence is None else next_sequence
        if not max(1, upper - self.capacity) <= sequence < upper:
            return None
        slot = sequence & self.mask
        offset = int(self._offset[slot])
        # read the offset, then confirm the slot was not overwritten meanwhile (seqlock-style)
        return offset if int(self._seq[slot]) == sequence else None
