"""One Apache Kafka broker in KRaft mode on loopback, for bench/connector_vs_kafka.py.

Responsibilities
    Start a single-node Kafka (broker and controller in one JVM, as Kafka's quickstart
    runs it) from the jars `make bench-kafka-setup` put in bench/jars/kafka/, on free
    127.0.0.1 ports with a fresh log directory, in a process session of its own
    (setsid); create and delete topics and read their end offsets (confluent-kafka's
    AdminClient and Consumer); stop it (SIGTERM, then SIGKILL of its session) and remove
    the directory.

How it works
    The server.properties are those of Kafka's KRaft quickstart (`config/server.properties`)
    with the replication factors of internal topics at 1 and the listeners on the picked
    ports; the JVM gets the heap and GC flags of `kafka-server-start.sh` (-Xmx1G -Xms1G,
    G1). The log directory is formatted with `kafka.tools.StorageTool format` first.
    The broker is up once an AdminClient lists its topics.

Invariants
    - Nothing listens beyond 127.0.0.1; every process started here is stopped on exit.
    - A broker that exits or never answers fails with the tail of its own log.

Not here
    The workloads and the report (bench/connector_vs_kafka.py), the loaders
    (bench/vs_kafka_loader.py).
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from quorumqueue.cli.launcher import pick_free_ports

REPO_ROOT = Path(__file__).resolve().parent.parent
KAFKA_JARS = REPO_ROOT / "bench" / "jars" / "kafka"
SPARK_KAFKA_JARS = REPO_ROOT / "bench" / "jars" / "spark-kafka"
# kafka-server-start.sh's defaults (KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS)
JVM_OPTIONS = ("-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
               "-Djava.awt.headless=true")
LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
"""


class KafkaSetupMissing(RuntimeError):
    """The jars are not there: `make bench-kafka-setup` fetches them."""


def spark_kafka_jars() -> list[str]:
    """The jars Spark's Kafka source and sink need beyond Spark's own."""
    jars = sorted(str(path) for path in SPARK_KAFKA_JARS.glob("*.jar"))
    if not any("spark-sql-kafka" in jar for jar in jars):
        raise KafkaSetupMissing(f"no spark-sql-kafka jar in {SPARK_KAFKA_JARS}: run "
                                "`make bench-kafka-setup` (Maven fetches it)")
    return jars


def _properties(port: int, controller_port: int, log_dir: Path) -> str:
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={log_dir}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "",
    ])


class KafkaBroker:
    """A fresh single-node KRaft broker; use as a context manager."""

    def __init__(self, startup_timeout: float = 120.0) -> None:
        if not any(KAFKA_JARS.glob("kafka_2.13-*.jar")):
            raise KafkaSetupMissing(f"no Kafka broker jars in {KAFKA_JARS}: run "
                                    "`make bench-kafka-setup` (Maven fetches them)")
        self.startup_timeout = startup_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="qq-bench-kafka-")
        self.directory = Path(self._tmp.name)
        self.port, self.controller_port = pick_free_ports(2)
        self.process: subprocess.Popen | None = None
        self.log_path = self.directory / "kafka.log"
        self._log = None
        self._admin = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _java(self, main: str, *arguments: str) -> list[str]:
        return ["java", *JVM_OPTIONS, f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
                "-cp", f"{KAFKA_JARS}/*", main, *arguments]

    def start(self) -> KafkaBroker:
        config = self.directory / "server.properties"
        config.write_text(_properties(self.port, self.controller_port, self.directory / "data"))
        (self.directory / "log4j2.properties").write_text(LOG4J)
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        formatted = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)),
            capture_output=True, text=True, timeout=self.startup_timeout)
        if formatted.returncode:
            raise RuntimeError(f"kafka-storage format failed:\n{formatted.stdout}{formatted.stderr}")
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self._java("kafka.Kafka", str(config)), stdout=self._log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka exited with {self.process.returncode}:\n{self.log()}")
            try:  # the listener first, so librdkafka logs no refused connection
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                self.admin().list_topics(timeout=5)
                return self
            except Exception:  # noqa: BLE001 - OSError, KafkaException until it is up
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Kafka did not answer within {self.startup_timeout}s:\n{self.log()}")

    def admin(self):
        """One AdminClient, kept: a client collected while its futures run fails them."""
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self._admin

    def create_topic(self, name: str, partitions: int) -> str:
        from confluent_kafka.admin import NewTopic

        for future in self.admin().create_topics(
                [NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
            future.result(timeout=60)
        return name

    def delete_topic(self, name: str) -> None:
        for future in self.admin().delete_topics([name]).values():
            future.result(timeout=60)

    def end_offsets(self, topic: str) -> int:
        """The sum of the topic's partitions' end offsets: how many records it holds."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-offsets",
                             "enable.auto.commit": False})
        try:
            partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
            return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                       for p in partitions)
        finally:
            consumer.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        self._admin = None  # before the broker goes, or librdkafka logs its reconnects
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> KafkaBroker:
        try:
            return self.start()
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
        self._tmp.cleanup()
