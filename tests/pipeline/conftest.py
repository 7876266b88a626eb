"""Pipeline test fixtures: ONE SparkSession for the whole run, one scenario recording, one analysis of it.

Spark tests are marked ``spark`` and skipped, with the reason, when pyspark or a Java 17+ runtime is missing;
everything else here runs on numpy/pyarrow alone.

Timeouts: the suite's 120 s default fits a quiet machine, not Spark's start-up (a JVM, then the first jobs'
code generation) on two cores kept busy by other work. Every test that uses the shared session (directly or
through ``analysis``) gets :data:`SPARK_TEST_TIMEOUT_S` unless it sets its own: the first such test also pays
for starting Spark and for the shared analysis.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

pytest.importorskip("pyarrow", reason="the pipeline needs the analytics extra (pyarrow)")

from logbuf.exchange.synth import OPEN_NS  # noqa: E402
from logbuf.pipeline.scenario import FreezeSpec, ScenarioConfig, ScenarioTruth, generate  # noqa: E402

NANOS_PER_MILLI = 1_000_000
SPARK_TEST_TIMEOUT_S = 600  # Spark start-up + the shared analysis, with both cores busy elsewhere
SPARK_FIXTURES = {"spark", "analysis"}
SCENARIO = ScenarioConfig(
    messages=60_000,
    seed=11,
    b_delay_ns=4 * NANOS_PER_MILLI,
    jitter_ns=200_000,
    loss_a=0.003,
    loss_b=0.003,
    freezes=(FreezeSpec(feed="A", at_ns=OPEN_NS + 300 * NANOS_PER_MILLI, duration_ns=150 * NANOS_PER_MILLI),),
    both_lost=(30_000, 30_019),
    unrecovered=(45_000, 45_006),
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here not in Path(str(item.path)).parents:
            continue
        uses_spark = SPARK_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses_spark and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ScenarioTruth]:
    root = tmp_path_factory.mktemp("pipeline") / "recording"
    truth = generate(SCENARIO, root, progress=False)
    return root, truth


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark", reason="the Spark tests need pyspark (analytics extra)")
    from logbuf.pipeline.spark import JavaNotFoundError, SparkSettings, find_java_home, get_spark

    try:
        find_java_home()
    except JavaNotFoundError as exc:
        pytest.skip(f"no Java 17+ for Spark: {exc}")
    session = get_spark(SparkSettings(master="local[2]", driver_memory="1g", shuffle_partitions=4,
                                      app_name="logbuf-tests"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def analysis(spark, scenario, tmp_path_factory: pytest.TempPathFactory):
    from logbuf.pipeline.job import analyze

    root, _ = scenario
    out = tmp_path_factory.mktemp("analysis")
    return analyze(spark, root, out, progress="off")
