"""logbuf benchmarks (not part of the test run): ``python -m bench [peers|transport|profile]`` or ``./run bench``.

``peers`` (the default) measures logbuf against the IPC a Python engineer uses today (see ``suite``),
``transport`` logbuf's own rigs, ``profile`` where the per-message path spends its time.
"""
