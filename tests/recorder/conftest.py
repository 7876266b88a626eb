"""Recorder tests need pyarrow (the ``analytics`` extra), but no JVM."""

import pytest

pytest.importorskip("pyarrow")
