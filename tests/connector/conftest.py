"""The connector's Spark fixtures: one local SparkSession for the whole run.

local[2] (the machine has 2 cores), 2 shuffle partitions, no UI, UTC, the driver
bound to 127.0.0.1 (by default Spark picks the first non-loopback address), and Delta
Lake (the jars `make setup` fetched, its SQL extension and catalog), all from
`quorumqueue.jobs.delta`, which the main job uses too. Python workers run this
interpreter (PYSPARK_PYTHON), so they import the installed package. The source is
never registered by hand: `format("quorumqueue")` must resolve through PySpark's own
discovery of `pyspark_quorumqueue`.

`spark` starts without Delta when its jars are missing or built for another Spark
(so the tests that do not write Delta still run); `delta_spark`, the same session,
fails a test that needs Delta with the reason and what to do, except in `make
test`'s second run on a PySpark that Delta has no build for
(QUORUMQUEUE_TESTS_WITHOUT_DELTA, the Makefile's SPARK_NEWEST), where it skips
with that reason: those tests run in the first.

Every Spark JVM the suite starts (this session, the drivers the kill tests start
and kill, the main job's, the notebooks' kernels, the Spark Connect server, the
jobs' command line) runs with `TEST_JVM_OPTIONS`, put in SPARK_SUBMIT_OPTS when
this file is imported: spark-submit adds that variable to the JVM's command line,
and the child processes inherit it. The JIT stops at C1 (no C2: its compiler
threads were most of a short-lived JVM's CPU) and the collector is the serial one
(no parallel GC threads). Measured on a small Delta and streaming workload in a
fresh local session (load 14-29 on 2 cores): JVM CPU 75 s -> 34-40 s, session
start 112-222 s -> 26-30 s. The tests' data are small, so C2's faster code never
pays for its compiling. Users' sessions are not changed (jobs/delta.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from quorumqueue.jobs.delta import DeltaJarsMissing, local_spark_conf, use_this_interpreter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_delta_missing: list[str] = []

TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
if TEST_JVM_OPTIONS not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(
        filter(None, (os.environ.get("SPARK_SUBMIT_OPTS"), TEST_JVM_OPTIONS)))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    use_this_interpreter()
    try:
        conf = local_spark_conf("quorumqueue-tests")
    except DeltaJarsMissing as missing:
        _delta_missing.append(str(missing))
        conf = local_spark_conf("quorumqueue-tests", delta=False)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def delta_spark(spark) -> SparkSession:
    """The session, for tests that write or read Delta tables."""
    if _delta_missing:
        without = os.environ.get("QUORUMQUEUE_TESTS_WITHOUT_DELTA")
        if without:  # `make test`'s run on a PySpark Delta has no build for
            pytest.skip(without)
        pytest.fail(f"this test needs Delta Lake: {_delta_missing[0]}")
    return spark
