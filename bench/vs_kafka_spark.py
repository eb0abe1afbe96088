"""Spark's side of bench/connector_vs_kafka.py: one session, both connectors, same bytes.

Responsibilities
    `session()`: a local[2] Spark session with Delta's jars and Spark's Kafka connector
    (spark-sql-kafka-0-10) on `spark.jars`, so the quorumqueue source and sink and
    Kafka's run in one JVM with the same settings. `Side` names one system and how
    Spark reads and writes it (`stream`, `write`), and the column that holds a
    message's bytes (`body` for quorumqueue, `value` for Kafka), and the columns both
    sources have (`common_columns`, renamed alike). `sequence(column)`:
    the 8-byte sequence number every body starts with (bench/vs_kafka_loader.py),
    which the checks count distinct.

How it works
    Both sides are read and written as their documented user would: Kafka with
    `subscribe` and `startingOffsets=earliest`, `maxOffsetsPerTrigger` for a batch
    limit, the sink with `kafka.acks=all`; quorumqueue with `uri` and `queue`,
    `maxMessagesPerTrigger`, the sink with `routingKey` (the default exchange).
    Nothing else is tuned on either side, unless a run passes `options` (`Side.stream`).

Not here
    The brokers (bench/kafka_broker.py, bench/brokers.py), the loaders, the rounds and
    the report (bench/connector_vs_kafka.py), the exactly-once driver process
    (bench/vs_kafka_driver.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.kafka_broker import spark_kafka_jars

# The columns the latency workload appends to Delta on both sides (Side.common_columns).
COMMON_COLUMNS = ("body", "source", "offset")
SPARK_DRIVER_MEMORY = "4g"   # 100,000 x 4 KB per run; local mode's executors live in it


def session_conf(app_name: str, kafka: bool = True) -> dict[str, str]:
    """Spark's settings; `kafka=False` leaves Spark's Kafka connector out (a run of the
    quorumqueue side alone, which needs no `make bench-kafka-setup`)."""
    from quorumqueue.jobs.delta import local_spark_conf

    conf = local_spark_conf(app_name)
    if kafka:
        conf["spark.jars"] = ",".join([conf["spark.jars"], *spark_kafka_jars()])
    conf["spark.driver.memory"] = SPARK_DRIVER_MEMORY
    # Spark's sockets to its Python workers (and to the Python driver, for collect) are
    # local TCP without TCP_NODELAY: the command of a task and then its input go out
    # as two small writes, and the second waits for the worker's delayed ACK, 40 ms on
    # Linux, in every task of a Python data source. Unix domain sockets have neither;
    # both sides run with them (connector/README.md, "Latency"; bench/README.md).
    conf["spark.python.unix.domain.socket.enabled"] = "true"
    return conf


def session(app_name: str, kafka: bool = True):
    from quorumqueue.jobs.delta import local_spark

    return local_spark(app_name, session_conf(app_name, kafka))


def spark_jvm_pid(spark) -> int:
    """The pid of the session's JVM (PySpark's gateway process)."""
    return spark.sparkContext._gateway.proc.pid


@dataclass(frozen=True, slots=True)
class Side:
    """One system under test: `kind` is "kafka" or "quorumqueue"; `address` its
    bootstrap server or AMQP URI; `name` the topic or queue."""

    kind: str
    address: str
    name: str

    @property
    def body_column(self) -> str:
        return "value" if self.kind == "kafka" else "body"

    def common_columns(self) -> list[tuple[str, str]]:
        """(this source's column, its name on both sides) for the columns both sources
        have (COMMON_COLUMNS): the message's bytes (`value` for Kafka), where it came
        from (the topic, the queue) and its position (the partition's offset, the
        lease sequence): binary, string and long on both sides."""
        source = "topic" if self.kind == "kafka" else "queue"
        return list(zip((self.body_column, source, "offset"), COMMON_COLUMNS))

    def stream(self, spark, per_trigger: int | None = None,
               options: dict[str, str] | None = None):
        """The stream as its documented user reads it, plus `options` (for an A/B of one
        option: bench/connector_vs_kafka.py --qq-option)."""
        reader = spark.readStream
        if self.kind == "kafka":
            reader = (reader.format("kafka").option("kafka.bootstrap.servers", self.address)
                      .option("subscribe", self.name).option("startingOffsets", "earliest"))
            if per_trigger:
                reader = reader.option("maxOffsetsPerTrigger", str(per_trigger))
        else:
            reader = (reader.format("quorumqueue").option("uri", self.address)
                      .option("queue", self.name))
            if per_trigger:
                reader = reader.option("maxMessagesPerTrigger", str(per_trigger))
        for key, value in (options or {}).items():
            reader = reader.option(key, value)
        return reader.load()

    def write(self, frame) -> None:
        """`frame` (one binary column `body`) published to the topic or queue."""
        if self.kind == "kafka":
            (frame.withColumnRenamed("body", "value").write.format("kafka")
             .option("kafka.bootstrap.servers", self.address).option("topic", self.name)
             .option("kafka.acks", "all").save())
        else:
            (frame.write.format("quorumqueue").mode("append").option("uri", self.address)
             .option("routingKey", self.name).save())


def sequence(column):
    """The sequence number at the start of every body, as a column (8 octets)."""
    from pyspark.sql import functions as F

    return F.substring(column, 1, 8)


def bodies(spark, messages: int, size: int, partitions: int):
    """A DataFrame of `messages` bodies as the loaders make them (8-byte sequence,
    then the 0..255 pattern), in `partitions` partitions, cached and counted."""
    from pyspark.sql import functions as F

    pattern = (bytes(range(256)) * (size // 256 + 1))[8:size]
    frame = (spark.range(0, messages, 1, partitions)
             .select(F.concat(F.unhex(F.lpad(F.hex("id"), 16, "0")), F.lit(pattern))
                     .alias("body"))
             .cache())
    if frame.count() != messages:
        raise RuntimeError("the cached bodies lost rows")
    return frame
