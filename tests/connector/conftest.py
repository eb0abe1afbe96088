"""The connector's Spark fixture: one local SparkSession for the whole run.

local[2] (the machine has 2 cores), 2 shuffle partitions, no UI, UTC, and the driver
bound to 127.0.0.1 (by default Spark picks the first non-loopback address). Python workers
run this interpreter (PYSPARK_PYTHON), so they import the installed package. The
source is never registered by hand: `format("quorumqueue")` must resolve through
PySpark's own discovery of `pyspark_quorumqueue`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator["SparkSession"]:  # noqa: F821
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (SparkSession.builder.master("local[2]").appName("quorumqueue-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
