"""A local SparkSession that writes and reads Delta tables, for jobs, tests and benchmarks.

Responsibilities
    - `delta_jars`: the Delta Lake jars `make setup` fetched with Maven into `jars/`
      at the repository root (or the folder named by $QUORUMQUEUE_JARS), checked
      against PySpark's version before Spark starts.
    - `local_spark_conf`: the settings of a local session on 2 cores bound to
      127.0.0.1, in UTC, with those jars on `spark.jars` and Delta's SQL extension
      and catalog; `local_spark` builds the session from them.
    - `create_source_table`: the Delta table a quorumqueue stream appends to, with
      file statistics on the columns worth skipping on only (`SOURCE_STATS_COLUMNS`).
    - `merge_on_message_id`: a foreachBatch function that upserts a stream's batches
      into such a table with Delta's MERGE keyed on `message_id` (Delta's Python
      API, `delta.tables.DeltaTable`): at-least-once messages (consume mode) into a
      table that holds each message once.

How it works
    Delta publishes one build per Spark minor version, named
    `delta-spark_<spark minor>_2.13-<delta version>.jar`. The jar found must be the
    build for the running PySpark's minor version: any other fails at the first read
    with a NoSuchMethodError from deep inside Delta, so the mismatch is reported here
    first, with what to do. Nothing is downloaded at run time (no `--packages`).

Invariants
    - Python workers run this interpreter (PYSPARK_PYTHON), so they import the package
      and PySpark discovers the quorumqueue source in them.
    - Delta's state reconstruction uses 2 partitions (the default, 50, is a cost of
      seconds per small table on 2 cores), and no checksum file is written per
      commit (an optional integrity file whose computation follows every commit).
    - Delta computes min/max/null-count statistics of every file it writes for the
      first 32 columns of a table (`delta.dataSkippingNumIndexedCols`): for the
      source's 20 columns that is all of them, though only a few are worth skipping
      files by (a body or a header map never is). A
      table made by `create_source_table` keeps statistics on `queue`, `offset` and
      `timestamp` only (`delta.dataSkippingStatsColumns`); a table a stream creates
      by itself keeps Delta's default.
    - Such a table also tells Parquet (`SOURCE_PARQUET_PROPERTIES`, table properties
      Delta hands to the Parquet writer of every write into it) not to try a dictionary
      on `body` and `offset` and not to keep min/max statistics of `body`: for the
      source's unique offsets and bodies a dictionary is built for every file's first
      page and then thrown away (Parquet keeps one only when it is smaller than the
      values, never for unique values), and a body's min/max is no use for skipping
      (Delta's own statistics already leave it out). The files hold the same values in
      the same encoding (plain) for unique bodies; a table of many identical bodies
      gets plain bodies, which snappy still compresses. Measured: the executors' CPU
      writing 500,000 rows of the source's schema 1.03 -> 0.81 s (medians of five)
      (bench/README.md, connector_source.py, "fourth session").

Not here
    What the jobs do with the session (orders_to_delta.py).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JARS_ENV = "QUORUMQUEUE_JARS"
REPO_ROOT = Path(__file__).resolve().parents[1]
DELTA_BUILD = re.compile(r"delta-spark_(?P<spark>\d+\.\d+)_2\.13-(?P<delta>[\w.\-]+)\.jar")

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
    # the per-version checksum file costs a state reconstruction after every commit
    "spark.databricks.delta.writeChecksumFile.enabled": "false",
}


class DeltaJarsMissing(RuntimeError):
    """Delta's jars are not where `make setup` puts them, or are for another Spark."""


def jars_folder() -> Path:
    return Path(os.environ.get(JARS_ENV) or REPO_ROOT / "jars")


def delta_jars(folder: Path | None = None, spark_version: str | None = None) -> list[str]:
    """The jars to put on `spark.jars`: every jar in `folder`, which must hold the
    Delta build for `spark_version` (default: the installed PySpark's)."""
    folder = folder or jars_folder()
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    builds = [match for jar in jars if (match := DELTA_BUILD.fullmatch(jar.name))]
    if not builds:
        raise DeltaJarsMissing(
            f"Delta Lake's jars are not in {folder}: run `make setup`, which fetches them "
            f"with Maven (or set ${JARS_ENV} to a folder holding delta-spark_<spark>_2.13 "
            "and delta-storage jars)")
    minor = ".".join(spark_version.split(".")[:2])
    if [build["spark"] for build in builds] != [minor]:
        found = ", ".join(build.string for build in builds)
        raise DeltaJarsMissing(
            f"{folder} holds {found}, but PySpark is {spark_version}: Delta's jars must be "
            f"the build for Spark {minor}. Set DELTA_SPARK in the Makefile to {minor} "
            "(if Delta publishes that build) and run `make setup`, or install the PySpark "
            "that pyproject.toml names")
    return [str(jar) for jar in jars]


def local_spark_conf(app_name: str, delta: bool = True) -> dict[str, str]:
    """Settings of a local session on 2 cores, bound to 127.0.0.1, in UTC; with Delta
    (its jars, SQL extension and catalog) unless `delta` is false."""
    conf = {
        "spark.master": "local[2]",
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    }
    if delta:
        conf |= {"spark.jars": ",".join(delta_jars()), **DELTA_CONF}
    return conf


# Columns of the quorumqueue source worth data skipping: which queue, where in it, when.
SOURCE_STATS_COLUMNS = ("queue", "offset", "timestamp")
# Parquet writer settings per column (parquet-mr's `key#column`), as table properties of
# the source's table: see the module header. Work Parquet would do and then discard
# (a dictionary of unique values) or that no reader uses (a body's min/max).
SOURCE_PARQUET_PROPERTIES = {
    "parquet.enable.dictionary#body": "false",
    "parquet.enable.dictionary#offset": "false",
    "parquet.column.statistics.enabled#body": "false",
}


def create_source_table(spark: "SparkSession", location: str,
                        stats_columns: Sequence[str] | None = SOURCE_STATS_COLUMNS) -> None:
    """Create, unless it exists, the Delta table at `location` with the quorumqueue
    source's schema (every column nullable, as a stream would create it), file
    statistics on `stats_columns` only (None: Delta's default, the first 32 columns)
    and SOURCE_PARQUET_PROPERTIES."""
    from ..connector.schema import SCHEMA

    columns = ", ".join(f"`{field.name}` {field.dataType.simpleString()}"
                        for field in SCHEMA.fields)
    unknown = set(stats_columns or ()) - set(SCHEMA.fieldNames())
    if unknown:
        raise ValueError(f"not columns of the quorumqueue source: {sorted(unknown)}")
    properties = dict(SOURCE_PARQUET_PROPERTIES)
    if stats_columns is not None:
        properties["delta.dataSkippingStatsColumns"] = ",".join(stats_columns)
    listed = ", ".join(f"'{key}' = '{value}'" for key, value in properties.items())
    target = location.replace("`", "``")
    spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{target}` ({columns}) USING delta "
              f"TBLPROPERTIES ({listed})")


def merge_on_message_id(location: str) -> "Callable[[DataFrame, int], None]":
    """A function for `writeStream.foreachBatch` that upserts each batch of the
    quorumqueue source into the Delta table at `location` (made by
    `create_source_table` if missing), keyed on `message_id`:

        stream.writeStream.foreachBatch(merge_on_message_id("/tables/orders"))

    A message delivered again (consume mode is at-least-once: connector/README.md,
    "Consume mode") replaces its earlier row instead of adding one; within a batch the
    copy with the lowest (queue, offset) is the one merged. Messages without a
    `message_id` cannot be matched and are inserted every time they arrive.
    """

    def merge(batch: "DataFrame", batch_id: int) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        spark = batch.sparkSession
        create_source_table(spark, location)
        keyed = batch.where(F.col("message_id").isNotNull())
        first = Window.partitionBy("message_id").orderBy("queue", "offset")
        once = (keyed.withColumn("_copy", F.row_number().over(first))
                .where(F.col("_copy") == 1).drop("_copy"))
        rows = once.unionByName(batch.where(F.col("message_id").isNull()))
        (DeltaTable.forPath(spark, location).alias("t")
         .merge(rows.alias("s"), "t.message_id = s.message_id")
         .whenMatchedUpdateAll()
         .whenNotMatchedInsertAll()
         .execute())

    return merge


def use_this_interpreter() -> None:
    """Spark's Python workers run this interpreter, which has the package installed."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"


def local_spark(app_name: str, conf: dict[str, str] | None = None) -> "SparkSession":
    """A local session with `local_spark_conf`, or with `conf` instead if given."""
    from pyspark.sql import SparkSession

    use_this_interpreter()
    builder = SparkSession.builder
    for key, value in (local_spark_conf(app_name) if conf is None else conf).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
