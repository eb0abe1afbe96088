"""The Spark driver that bench/connector_vs_kafka.py kills: a source -> Delta query.

    python bench/vs_kafka_driver.py --kind kafka|quorumqueue --address A --name N
        --table DIR --checkpoint DIR --per-trigger 5000 [--available-now]

Runs `readStream` from the topic or queue (bench/vs_kafka_spark.Side, as the other
workloads read it) into the Delta table `--table` with checkpoint `--checkpoint`,
`--per-trigger` messages per micro-batch, until killed (processing-time trigger 0) or,
with `--available-now`, until everything there is was written; then exits 0. The
benchmark starts it in a session of its own and SIGKILLs that session (the driver,
its JVM and Spark's Python workers at once) part-way, restarts it from the same
checkpoint, and finally counts the table: every message exactly once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.vs_kafka_spark import Side, session  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("kafka", "quorumqueue"), required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--per-trigger", type=int, default=5000)
    parser.add_argument("--available-now", action="store_true")
    arguments = parser.parse_args(argv)
    spark = session(f"vs-kafka-driver-{arguments.kind}", kafka=arguments.kind == "kafka")
    try:
        side = Side(arguments.kind, arguments.address, arguments.name)
        writer = (side.stream(spark, arguments.per_trigger).writeStream.format("delta")
                  .option("checkpointLocation", arguments.checkpoint))
        writer = (writer.trigger(availableNow=True) if arguments.available_now
                  else writer.trigger(processingTime="0 seconds"))
        query = writer.start(arguments.table)
        print(f"query {query.id} started", flush=True)
        query.awaitTermination()
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", file=sys.stderr, flush=True)
            return 1
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
