"""A Spark Connect client program, run by test_spark_connect.py in a process of its own.

    python -m tests.connector.connect_app URI SOURCE OTHER TARGET CHECKPOINTS

`SparkSession.builder.remote("local[2]")` starts a Spark Connect server inside this
process (PySpark starts a classic session with the Connect plugin, which cannot start
beside another session, hence a process apart from the suite's `spark` fixture) and
connects to it over gRPC. The caller sets SPARK_TESTING, which is how PySpark's own
Connect tests get the server on a free port: with it the local server binds port 0 and
the client asks the JVM which port it got (pyspark.sql.connect.client.core,
DefaultChannelBuilder.default_port); without it both use 15002. The server binds
127.0.0.1.

The program uses the connector through the Connect client's DataFrame API only:
1. a stream from queue SOURCE into a memory sink (Trigger.AvailableNow, 10 a batch);
2. a stream from queue OTHER into the quorumqueue sink, routed to queue TARGET;
3. a batch write (`df.write`) of one row into TARGET;
and prints the first query's lag (connector/lag.py) and one line, `RESULT {json}`, with what it saw.
"""

from __future__ import annotations

import json
import os
import sys


def connect_session():
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote("local[2]")
    for key, value in {"spark.connect.grpc.binding.address": "127.0.0.1",
                       "spark.driver.host": "127.0.0.1",
                       "spark.driver.bindAddress": "127.0.0.1",
                       "spark.ui.enabled": "false",
                       "spark.sql.shuffle.partitions": "2"}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main(uri: str, source: str, other: str, target: str, checkpoints: str) -> dict:
    from quorumqueue.connector.lag import lag_metrics

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = connect_session()
    try:
        read = (spark.readStream.format("quorumqueue").option("uri", uri)
                .option("queue", source).option("maxMessagesPerTrigger", "10").load()
                .writeStream.format("memory").queryName("from_queue")
                .option("checkpointLocation", f"{checkpoints}/read")
                .trigger(availableNow=True).start())
        read.awaitTermination(120)
        rows = spark.sql("select message_id, offset from from_queue").collect()
        write = (spark.readStream.format("quorumqueue").option("uri", uri)
                 .option("queue", other).load()
                 .select("body", "message_id")
                 .writeStream.format("quorumqueue").option("uri", uri)
                 .option("routingKey", target)
                 .option("checkpointLocation", f"{checkpoints}/write")
                 .trigger(availableNow=True).start())
        write.awaitTermination(120)
        (spark.createDataFrame([("batch-1", b"one")], "message_id string, body binary")
         .write.format("quorumqueue").mode("append").option("uri", uri)
         .option("routingKey", target).save())
        return {"session": type(spark).__module__,
                "read_error": _text(read.exception()),
                "write_error": _text(write.exception()),
                "message_ids": sorted(row.message_id for row in rows),
                "offsets": sorted(row.offset for row in rows),
                "batches": [p.numInputRows for p in read.recentProgress if p.numInputRows],
                # a Connect client reads the progress by attribute (PySpark 4.2's Connect
                # progress answers progress["numInputRows"] with None)
                "lag": lag_metrics(read.lastProgress.sources[0])}
    finally:
        spark.stop()


def _text(error) -> str | None:
    return None if error is None else str(error)


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(*sys.argv[1:6])), flush=True)
