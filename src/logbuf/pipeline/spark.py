"""The SparkSession the pipeline runs on: Java found, quiet, no UI, bounded memory, reused.

- **Java**: Spark 4 needs Java 17+. :func:`find_java_home` looks at ``$JAVA_HOME``, the ``java`` on ``PATH`` and
  ``/usr/lib/jvm/*`` (preferring 17 and 21, the releases Spark 4 is tested on), checking each with
  ``java -version``. None found: :class:`JavaNotFoundError` says to run ``scripts/ensure-java.sh`` (which
  installs Debian's ``openjdk-17-jre-headless`` non-interactively and prints the JAVA_HOME).
- **Python**: ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are the running interpreter, so Python workers
  (and a spark-submit driver) import the same environment.
- **Quiet**: a log4j2 configuration at ERROR (written to the session's tmp dir), no console progress bar, no UI.
- **Bounded**: ``spark.driver.memory`` (the whole heap in local mode), explicit ``spark.sql.shuffle.partitions``
  with adaptive execution coalescing them, ``spark.driver.maxResultSize``; scratch space in a tmp dir of ours.
- **Loopback**: the driver binds to 127.0.0.1 (this machine has no other network).
- **Reuse**: an active session is returned as is; under ``spark-submit`` the submitted master and memory win.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from logbuf.errors import LogbufError
from logbuf.pipeline.errors import PipelineConfigError

MIN_JAVA_MAJOR = 17
PREFERRED_JAVA_MAJORS = (17, 21)
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')

_LOG4J2 = """\
# everything at ERROR; Spark's shell logic compares its own logger (under org.apache.spark) with the root: equal
# levels keep it from announcing "Setting default log level"
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.sparkproject.name = org.sparkproject
logger.sparkproject.level = error
# closing a shuffle file of a job cancelled by Ctrl-C logs an ERROR; a failed write itself fails its task
logger.blockwriter.name = org.apache.spark.storage.DiskBlockObjectWriter
logger.blockwriter.level = fatal
"""


class JavaNotFoundError(LogbufError, RuntimeError):
    """No Java 17+ runtime: Spark cannot start."""


def java_major(java: str) -> int | None:
    """Major version of a ``java`` executable (``1.8`` -> 8), or None if it does not run."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(done.stderr + done.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


_RELEASE_VERSION = re.compile(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', re.MULTILINE)


def home_major(home: str) -> int | None:
    """Major version of the Java at ``home``: from its ``release`` file when it has one (reading it costs
    nothing, while each ``java -version`` starts a JVM: seconds on a busy machine), else from ``java -version``."""
    try:
        with open(os.path.join(home, "release")) as f:
            match = _RELEASE_VERSION.search(f.read())
    except OSError:
        match = None
    if match:
        major = int(match.group(1))
        return int(match.group(2) or 0) if major == 1 else major
    return java_major(os.path.join(home, "bin", "java"))


def _candidates() -> list[str]:
    homes = []
    if os.environ.get("JAVA_HOME"):
        homes.append(os.environ["JAVA_HOME"])
    on_path = shutil.which("java")
    if on_path:
        homes.append(str(Path(on_path).resolve().parents[1]))
    homes += sorted(glob.glob("/usr/lib/jvm/*"))
    seen, out = set(), []
    for home in homes:
        real = os.path.realpath(home)
        if real not in seen and os.access(os.path.join(real, "bin", "java"), os.X_OK):
            seen.add(real)
            out.append(real)
    return out


def find_java_home(min_major: int = MIN_JAVA_MAJOR) -> str:
    """A JAVA_HOME with Java ``min_major``+; ``$JAVA_HOME`` first if it qualifies, then 17/21, then any newer."""
    found: list[tuple[int, str]] = []
    for home in _candidates():
        major = home_major(home)
        if major is not None and major >= min_major:
            if os.environ.get("JAVA_HOME") and os.path.realpath(os.environ["JAVA_HOME"]) == home:
                return home
            found.append((major, home))
    if not found:
        raise JavaNotFoundError(
            f"Spark needs Java {min_major} or newer and none was found (JAVA_HOME, PATH, /usr/lib/jvm). "
            "Run scripts/ensure-java.sh (installs openjdk-17-jre-headless) and set JAVA_HOME to what it prints."
        )
    found.sort(key=lambda mh: (mh[0] not in PREFERRED_JAVA_MAJORS, mh[0]))
    return found[0][1]


def under_spark_submit() -> bool:
    """True in a driver started by ``spark-submit`` (the JVM exists already and owns master and memory)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


@dataclass(frozen=True)
class SparkSettings:
    master: str | None = None  # None: local[*], or what spark-submit was given
    app_name: str = "logbuf-analyze"
    driver_memory: str = "2g"
    shuffle_partitions: int | None = None  # None: 4 per core
    max_result_size: str = "1g"
    tmp_dir: str | None = None  # None: $TMPDIR/logbuf-spark-<uid>
    extra: dict[str, str] = field(default_factory=dict)

    def partitions(self) -> int:
        if self.shuffle_partitions is not None:
            if self.shuffle_partitions < 1:
                raise PipelineConfigError("shuffle_partitions must be >= 1")
            return self.shuffle_partitions
        return 4 * (os.cpu_count() or 2)

    def scratch(self) -> str:
        return self.tmp_dir or os.path.join(tempfile.gettempdir(), f"logbuf-spark-{os.getuid()}")


def configure_environment(settings: SparkSettings) -> str:
    """Set JAVA_HOME, PYSPARK_PYTHON, PYSPARK_DRIVER_PYTHON and SPARK_LOCAL_IP; returns the scratch dir."""
    if not under_spark_submit():
        os.environ["JAVA_HOME"] = find_java_home()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    scratch = settings.scratch()
    os.makedirs(scratch, exist_ok=True)
    return scratch


def write_log4j_config(path: str) -> str:
    """The quiet log4j2 configuration (ERROR and up) at ``path``; also used by the standalone check."""
    with open(path, "w") as f:
        f.write(_LOG4J2)
    return path


def session_conf(settings: SparkSettings, scratch: str) -> dict[str, str]:
    log4j = write_log4j_config(os.path.join(scratch, "log4j2.properties"))
    java_options = f"-Dlog4j2.configurationFile=file:{log4j} -Djava.io.tmpdir={scratch}"
    conf = {
        "spark.app.name": settings.app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(settings.partitions()),
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.driver.maxResultSize": settings.max_result_size,
        "spark.local.dir": scratch,
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # the per-message pass takes a partition's pieces whole: large Arrow batches cost less per row
        "spark.sql.execution.arrow.maxRecordsPerBatch": "262144",
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        "spark.sql.parquet.enableVectorizedReader": "true",
        # scan tasks of at most 32 MB: a few large tasks leave a core idle in the last wave (2 cores here)
        "spark.sql.files.maxPartitionBytes": str(32 * 1024 * 1024),
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
    }
    if not under_spark_submit():
        conf["spark.driver.memory"] = settings.driver_memory
    conf.update(settings.extra)
    return conf


def get_spark(settings: SparkSettings | None = None):
    """The active SparkSession, or a new one configured as above."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    settings = settings or SparkSettings()
    scratch = configure_environment(settings)
    builder = SparkSession.builder
    master = settings.master or (None if under_spark_submit() else "local[*]")
    if master is not None:
        builder = builder.master(master)
    for key, value in session_conf(settings, scratch).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
