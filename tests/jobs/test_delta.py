"""jobs/delta.py: the Delta table a quorumqueue stream appends to keeps file
statistics on the columns worth skipping on only (Delta's default is every column),
and its Parquet files no dictionary of bodies and offsets and no body min/max."""

from __future__ import annotations

import json

import pytest
from pyspark.sql.types import StructField, StructType

from quorumqueue.connector.schema import SCHEMA
from quorumqueue.jobs.delta import SOURCE_STATS_COLUMNS, create_source_table
from tests.connector.conftest import delta_spark, spark  # noqa: F401

ROW = (b"x", "orders", "orders", "", 1, 0, False) + (None,) * 13


def file_statistics(location) -> dict:
    """The statistics of the one file the table's version 1 added."""
    log = (location / "_delta_log" / f"{1:020d}.json").read_text().splitlines()
    [added] = [json.loads(line)["add"] for line in log if '"add"' in line]
    return json.loads(added["stats"])


@pytest.mark.parametrize("columns, kept", [
    (SOURCE_STATS_COLUMNS, {"queue", "offset", "timestamp"}),
    (None, set(SCHEMA.fieldNames())),
])
def test_the_table_keeps_statistics_on_its_columns(delta_spark, tmp_path, columns, kept):  # noqa: F811
    location = tmp_path / "orders"
    create_source_table(delta_spark, str(location), columns)
    create_source_table(delta_spark, str(location), columns)  # exists: left as it is
    delta_spark.createDataFrame([ROW], SCHEMA).write.format("delta").mode("append").save(
        str(location))
    assert set(file_statistics(location)["nullCount"]) == kept
    # every column nullable, as a table a stream creates by itself
    assert delta_spark.read.format("delta").load(str(location)).schema == StructType(
        [StructField(field.name, field.dataType) for field in SCHEMA.fields])


def test_parquet_keeps_no_dictionary_of_bodies_nor_their_min_max(delta_spark, tmp_path):  # noqa: F811
    import pyarrow.parquet as pq

    location = tmp_path / "orders"
    create_source_table(delta_spark, str(location))
    # repeated bodies, offsets and queues: Parquet's default dictionary-encodes them all
    rows = [ROW[:4] + (index % 3,) + ROW[5:] for index in range(100)]
    delta_spark.createDataFrame(rows, SCHEMA).coalesce(1).write.format("delta").mode(
        "append").save(str(location))
    [written] = location.glob("*.parquet")
    columns = pq.ParquetFile(written).metadata.row_group(0)
    chunk = {columns.column(i).path_in_schema: columns.column(i)
             for i in range(columns.num_columns)}
    assert chunk["queue"].has_dictionary_page          # the other columns as before
    assert not chunk["body"].has_dictionary_page
    assert not chunk["offset"].has_dictionary_page
    assert chunk["body"].statistics is None or not chunk["body"].statistics.has_min_max
    assert chunk["offset"].statistics.has_min_max
    assert delta_spark.read.format("delta").load(str(location)).count() == 100


def test_a_column_the_source_does_not_have_is_refused(delta_spark, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="'ofset'"):
        create_source_table(delta_spark, str(tmp_path / "t"), ("queue", "ofset"))


def test_deltas_python_api_is_the_jars_release_and_reads_the_table(delta_spark,  # noqa: F811
                                                                     tmp_path):
    # The Makefile installs delta-spark at DELTA_VERSION, the release of the jars in
    # jars/, with --no-deps (it declares pyspark<=4.2.0; .venv has 4.2.1).
    import delta
    from delta.tables import DeltaTable

    from quorumqueue.jobs.delta import DELTA_BUILD, jars_folder

    [jar] = [m for jar in jars_folder().glob("*.jar") if (m := DELTA_BUILD.fullmatch(jar.name))]
    assert delta.__version__ == jar["delta"]
    location = str(tmp_path / "orders")
    create_source_table(delta_spark, location)
    delta_spark.createDataFrame([ROW], SCHEMA).write.format("delta").mode("append").save(
        location)
    table = DeltaTable.forPath(delta_spark, location)
    assert table.toDF().count() == 1
    assert [row.operation for row in table.history().orderBy("version").collect()] == [
        "CREATE TABLE", "WRITE"]
