"""The record header shared by the to-driver ring buffer and the to-clients broadcast buffer (Aeron's
``RecordDescriptor``)::

    0                   1                   2                   3
    0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
   +---------------------------------------------------------------+
   |  Length (i32; negative while a ring record is being written)  |
   +---------------------------------------------------------------+
   |                     Type (i32; -1 = padding)                  |
   +---------------------------------------------------------------+
   |                     Body ...  (records aligned to 8 bytes)    |
"""

from __future__ import annotations

LENGTH_OFFSET = 0
TYPE_OFFSET = 4
HEADER_LENGTH = 8
RECORD_ALIGNMENT = 8
PADDING_MSG_TYPE_ID = -1
