"""Stage-by-stage progress: one tqdm bar over the job's stages, its postfix fed by Spark's status tracker.

Spark's own console progress bar is off (it interleaves with everything else); instead a daemon thread polls
``SparkContext.statusTracker()`` twice a second and shows the active Spark stages' finished/total tasks.
``mode``: ``"bar"`` (that), ``"lines"`` (one line per finished stage with its time: logs, CI) or ``"off"``;
None picks the bar on a terminal and lines otherwise.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from logbuf.pipeline.errors import PipelineConfigError

_POLL_S = 0.5


class StageProgress:
    def __init__(self, stages: list[str], spark=None, *, mode: str | None = None,
                 stream: TextIO | None = None) -> None:
        from tqdm import tqdm

        self.stream = stream or sys.stderr
        if mode is None:
            mode = "bar" if self.stream.isatty() else "lines"
        if mode not in ("bar", "lines", "off"):
            raise PipelineConfigError(f"progress mode {mode!r}: use bar, lines or off")
        self.mode = mode
        self.interactive = mode == "bar"
        self.stages = stages
        self.timings: dict[str, float] = {}
        self._spark = spark
        self._bar = tqdm(total=len(stages), unit="stage", file=self.stream, disable=not self.interactive,
                         bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} stages [{elapsed}] {postfix}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.interactive and spark is not None:
            self._thread = threading.Thread(target=self._poll, name="spark-progress", daemon=True)
            self._thread.start()

    def _poll(self) -> None:
        tracker = self._spark.sparkContext.statusTracker()
        while not self._stop.wait(_POLL_S):
            try:
                parts = []
                for stage_id in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        parts.append(f"spark stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
                self._bar.set_postfix_str("; ".join(parts[:2]), refresh=True)
            except Exception:  # the context may be stopping; progress is best effort
                return

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._bar.set_description_str(f"analyze: {name}")
        started = time.perf_counter()
        yield  # a stage that fails (or is interrupted) is not reported as done
        seconds = time.perf_counter() - started
        self.timings[name] = seconds
        self._bar.update(1)
        self._bar.set_postfix_str("")
        if self.mode == "lines":
            print(f"analyze: {name} ({seconds:.1f} s)", file=self.stream, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._bar.close()
