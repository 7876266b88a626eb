"""Both settings of the client extension's CPython-internals fast paths, as a pytest parameter.

A test that runs a case under both sets ``LOGBUF_CPYTHON_INTERNALS`` to the parameter's value ("1": the fast
paths, skipped where the build has none; "0": the portable path) for the child processes it starts.
"""

from __future__ import annotations

import pytest

from logbuf import _client

INTERNALS_MODES = [
    pytest.param("1", id="internals", marks=pytest.mark.skipif(
        not _client.CPYTHON_INTERNALS, reason="this build of logbuf._client has no CPython-internals path")),
    pytest.param("0", id="portable"),
]
