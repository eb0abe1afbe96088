"""The Spark sink's publish rate against plain confirmed publishers, side by side, one run.

    python bench/connector_sink.py [--messages 100000] [--size 1024] [--partitions 2]
        [--rounds 3] [--json PATH]

One bundled broker; each measurement publishes ``--messages`` persistent messages of
``--size`` bytes into a fresh quorum queue through the default exchange, with
publisher confirms, and checks the queue then holds exactly that many:

1. ``loadgen``: the raw-asyncio generator of ``bench/amqp_loadgen.py`` (one
   connection, 1,000 unconfirmed at most): what the broker takes from a client
   that costs almost nothing.
2. ``pika``: a plain confirmed publisher written with pika, no Spark (one
   connection, 1,000 in flight, each message sent with pika's own
   ``channel.basic_publish``): **the baseline of the target**. It is
   ``connector/publisher.py``'s window and confirm handling with pika's per-message
   send (``PikaBasicPublish``), i.e. the connector's publisher as it was before it
   wrote a window's frames at once.
   ``publisher``: ``connector/publisher.py`` as the sink uses it, plain messages.
   ``publisher+keys``: the same, publishing exactly what one sink task publishes
   (the idempotency headers included, built from an Arrow batch by the sink's
   code): the sink minus Spark.
3. ``sink``: ``df.write.format("quorumqueue")`` of a cached DataFrame of the same
   bodies in ``--partitions`` partitions (Spark ``local[2]``), timed around
   ``save()``; a small write first warms up Spark's Python workers.

``--rounds`` (3) interleave them (so a slow moment of the shared machine hurts one
round of each, not one publisher). The table shows each one's msgs/s, median
(min-max) over the rounds, and the sink's ratio to each, the median of the rounds'
ratios (min-max): target >= 0.8x the plain pika publisher ``pika``, goal 0.95x.
The default 100,000 messages take a plain publisher about 2.5 s; at 20,000 (0.5 s)
starting the Spark job is a fifth of the sink's time. Spark and the broker share the machine's
cores, as they would on one host; run it on an otherwise idle machine. Progress
goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import pika  # noqa: E402

from bench.amqp_loadgen import (LoadSettings, connect, declare_fresh_queue,  # noqa: E402
                                delete_and_close, publish_all)
from tests.support.broker import BrokerProcess  # noqa: E402

TARGET_RATIO, GOAL_RATIO = 0.8, 0.95   # sink / plain confirmed publisher


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message (>= 8)")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the sink's input")
    parser.add_argument("--rounds", type=int, default=3, help="measure everything this many times")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    arguments = parser.parse_args(argv)
    for name in ("messages", "partitions", "rounds"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if arguments.size < 8:
        parser.error("--size must be at least 8 (the load generator's bodies carry a number)")
    return arguments


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def quorum_queue(uri: str, prefix: str) -> str:
    name = f"{prefix}-{os.urandom(4).hex()}"
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        connection.channel().queue_declare(name, durable=True,
                                           arguments={"x-queue-type": "quorum"})
    return name


def settle(uri: str, queue: str, expected: int) -> None:
    """Check the queue holds exactly `expected` messages, then delete it."""
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        channel = connection.channel()
        ready = channel.queue_declare(queue, passive=True).method.message_count
        channel.queue_delete(queue)
    if ready != expected:
        raise SystemExit(f"{queue} holds {ready} messages, expected {expected}")


def measure_loadgen(broker: BrokerProcess, arguments: argparse.Namespace) -> float:
    settings = LoadSettings("127.0.0.1", broker.port, messages=arguments.messages,
                            size=arguments.size, queue_type="quorum")

    async def run() -> float:
        generator = await connect(settings)
        try:
            queue = await declare_fresh_queue(generator, "bench-sink-loadgen")
            result = await publish_all(generator, queue)  # checks the count itself
            await delete_and_close(generator, queue)
            return result.rate
        finally:
            generator.close()

    return asyncio.run(run())


def measure_pika(broker: BrokerProcess, arguments: argparse.Namespace,
                 keyed: bool = False, pikas_frames: bool = False) -> float:
    from quorumqueue.connector.options import parse_sink_options
    from quorumqueue.connector.publisher import ConfirmedPublisher, Outgoing

    queue = quorum_queue(broker.uri, "bench-sink-pika")
    options = parse_sink_options({"uri": broker.uri, "routingKey": queue})
    body = b"x" * arguments.size
    persistent = pika.BasicProperties(delivery_mode=2)
    messages = (keyed_messages(options, body, arguments.messages) if keyed else
                (Outgoing(row, "", queue, body, persistent) for row in range(arguments.messages)))
    publisher = (PikaBasicPublish if pikas_frames else ConfirmedPublisher)(
        options.addresses, False, 30.0, lambda _p: None)
    began = time.perf_counter()
    publisher.run(messages)
    elapsed = time.perf_counter() - began
    settle(broker.uri, queue, arguments.messages)
    return arguments.messages / elapsed


def _pika_basic_publish():
    from quorumqueue.connector.publisher import ConfirmedPublisher

    class PikaBasicPublish(ConfirmedPublisher):
        """The connector's publisher (same window, same confirm handling) sending each
        message with pika's own ``channel.basic_publish``, as a plain pika program does:
        the baseline of the target. (The connector writes a window's frames at once.)"""

        def _encode(self, message, frames) -> None:
            frames.append(message)

        def _write(self, frames, messages: int) -> None:
            for message in frames:
                self._channel.basic_publish(message.exchange, message.routing_key,
                                            message.body, message.properties, self._mandatory)

    return PikaBasicPublish


PikaBasicPublish = _pika_basic_publish()


def keyed_messages(options, body: bytes, count: int, batch_rows: int = 10_000):
    """What one sink task publishes for `count` rows of `body` (keys included), in
    Arrow batches of `batch_rows` (Spark's spark.sql.execution.arrow.maxRecordsPerBatch
    default): what the sink's `write` hands its publisher (`to_outgoing`; a connector
    without it, the rows one by one)."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType

    from quorumqueue.connector import sink_rows

    convert = getattr(sink_rows, "to_outgoing", sink_rows.to_messages)
    batches = [pa.record_batch([pa.array([body] * min(batch_rows, count - start), pa.binary())],
                               names=["body"]) for start in range(0, count, batch_rows)]
    plan = sink_rows.input_plan(StructType([StructField("body", BinaryType())]), options)
    key = sink_rows.IdempotencyKey(f"spark-query/{os.urandom(16).hex()}/0", 1 << 32)
    return convert(batches, plan, options, key)


def measure_sink(spark, broker: BrokerProcess, arguments: argparse.Namespace) -> float:
    from pyspark.sql import functions as F

    bodies = (spark.range(0, arguments.messages, 1, arguments.partitions)
              .select(F.expr(f"cast(repeat('x', {arguments.size}) as binary)").alias("body"))
              .cache())
    bodies.count()
    queue = quorum_queue(broker.uri, "bench-sink-spark")
    writer = (bodies.write.format("quorumqueue").mode("append").option("uri", broker.uri)
              .option("routingKey", queue))
    began = time.perf_counter()
    writer.save()
    elapsed = time.perf_counter() - began
    bodies.unpersist()
    settle(broker.uri, queue, arguments.messages)
    return arguments.messages / elapsed


def start_spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-connector-sink")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def warm_up(spark, broker: BrokerProcess) -> None:
    """Start Spark's Python workers and import the connector in them."""
    queue = quorum_queue(broker.uri, "bench-sink-warmup")
    (spark.range(0, 100, 1, 2).selectExpr("cast(id as string) as body").write
     .format("quorumqueue").mode("append").option("uri", broker.uri)
     .option("routingKey", queue).save())
    settle(broker.uri, queue, 100)


def report(rounds: list[dict[str, float]], arguments: argparse.Namespace) -> None:
    names = list(rounds[0])
    print(f"\nSpark sink vs plain confirmed publishers: {arguments.messages:,} x "
          f"{arguments.size} B persistent messages into a quorum queue, {len(rounds)} round(s); "
          "median (min-max)")
    print(f"{'publisher':<16}{'msg/s':>26}")
    for name in names:
        print(f"{name:<16}{spread([r[name] for r in rounds], ',.0f'):>26}")
    for baseline in names:
        if baseline != "sink":
            ratios = [r["sink"] / r[baseline] for r in rounds]
            print(f"sink / {baseline:<14}{spread(ratios, '.2f', 'x'):>20}")
    ratio = statistics.median(r["sink"] / r["pika"] for r in rounds)
    verdict = ("meets the goal" if ratio >= GOAL_RATIO else "meets the target"
               if ratio >= TARGET_RATIO else "BELOW the target")
    print(f"sink / pika (median of the rounds' ratios) {ratio:.2f}x {verdict} (target "
          f"{TARGET_RATIO}x, goal {GOAL_RATIO}x); round by round: "
          + ", ".join(f"{r['sink'] / r['pika']:.2f}x" for r in rounds))


def spread(values: list[float], form: str, unit: str = "") -> str:
    return (f"{statistics.median(values):{form}}{unit} ({min(values):{form}}-"
            f"{max(values):{form}}{unit})")


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    rounds: list[dict[str, float]] = []
    with BrokerProcess() as broker:
        say("starting Spark ...")
        spark = start_spark()
        try:
            warm_up(spark, broker)
            for number in range(1, arguments.rounds + 1):
                rates = {}
                for name, measure in (
                        ("loadgen", lambda: measure_loadgen(broker, arguments)),
                        ("pika", lambda: measure_pika(broker, arguments, pikas_frames=True)),
                        ("publisher", lambda: measure_pika(broker, arguments)),
                        ("publisher+keys", lambda: measure_pika(broker, arguments, keyed=True)),
                        ("sink", lambda: measure_sink(spark, broker, arguments))):
                    rates[name] = measure()
                    say(f"round {number}: {name} {rates[name]:,.0f} msg/s")
                rounds.append(rates)
        finally:
            spark.stop()
    report(rounds, arguments)
    if arguments.json:
        arguments.json.write_text(json.dumps({"settings": vars(arguments) | {"json": None},
                                              "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
