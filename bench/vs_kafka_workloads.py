"""The workloads of bench/connector_vs_kafka.py, one run of one side each.

Responsibilities
    `Bench` holds what every run needs (the Spark session, both brokers, a scratch
    folder, the CPU reader) and runs one workload on one side (`Side.kind` "kafka" or
    "quorumqueue"), checks its result and returns what it measured:

    - `source(side, messages, size, per_trigger, sink)`: a fresh topic (`partitions`
      partitions) or quorum queue filled by a loader process, then an AvailableNow
      query from it into Spark's `noop` sink or a new Delta table, timed from `start()`
      to its end; checks every message was read (noop: the progress reports' row
      counts; Delta: rows and distinct sequence numbers).
    - `sink(side, frame)`: a cached DataFrame written with `df.write` into a fresh
      topic or queue, timed around `save()`; checks the topic's end offsets or the
      queue's depth.
    - `latency(side, trigger_ms, rate, seconds, write=...)`: a running query (no batch
      limit, processing-time trigger `trigger_ms`) into `foreachBatch`, which collects
      each batch's send times (cached batch), appends the batch to a Delta table
      (`write`, LATENCY_WRITES: by default the columns both sources have, renamed
      alike), and notes when the rows arrived and when the Delta commit returned,
      while a loader publishes `rate` per second for `seconds`; every message must
      arrive once.
    - `exactly_once(side, messages, per_trigger, kills)`: bench/vs_kafka_driver.py
      into Delta, SIGKILLed (its whole session) `kills` times at a random moment after
      a new Delta commit, restarted from its checkpoint each time, finally run with
      AvailableNow to the end; the table must hold every message exactly once.

How it works
    Loaders and drivers are processes of their own, each in its own session (setsid),
    as both brokers are. CPU is read from /proc around each timed part
    (bench/process_cpu.py): the broker, the loader (latency), Spark's JVM by thread
    group, Spark's Python processes and this process (the driver).

Not here
    The rounds, the medians and the report (bench/connector_vs_kafka.py).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.process_cpu import ProcessCpu, delta
from bench.vs_kafka_spark import Side, sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
LOADER = [sys.executable, str(REPO_ROOT / "bench" / "vs_kafka_loader.py")]
DRIVER = [sys.executable, str(REPO_ROOT / "bench" / "vs_kafka_driver.py")]
ARRIVAL_TIMEOUT_S = 120.0
START_TIMEOUT_S = 180.0   # a latency query's first progress (60 s ran out at load 16)
# What the latency workload's foreachBatch does with a batch after collecting its send
# times: "common" appends the columns both sources have (Side.common_columns: the
# message's bytes, where it came from, its position) to Delta, the same bytes and the
# same work on both sides; "all" appends every column of the source (quorumqueue's 20
# against Kafka's 7, so not the same work); "none" appends nothing.
LATENCY_WRITES = ("common", "all", "none")
KILL_WAIT_S = 300.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Run:
    seconds: float
    messages: int
    cpu: dict[str, float]                 # CPU seconds per process group during the run
    batches: int = 0
    files: int = 0                        # a Delta table's data files (0: not a Delta run)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


@dataclass(frozen=True, slots=True)
class LatencyRun:
    arrival_ms: tuple[float, float]       # p50, p99 publish -> rows in foreachBatch
    commit_ms: tuple[float, float]        # p50, p99 publish -> Delta commit returned
    messages: int
    batches: int
    cpu: dict[str, float]
    # median ms per batch of each phase in Spark's progress reports (durationMs:
    # latestOffset, queryPlanning, addBatch, walCommit, commitOffsets, triggerExecution...),
    # and inside addBatch the foreachBatch's "fb.collect" (persist, collect the send
    # times: the source's read) and "fb.write" (the Delta append)
    phases_ms: dict[str, float] = field(default_factory=dict)
    rows_per_batch: float = 0.0           # median over the batches that read rows


@dataclass(frozen=True, slots=True)
class ExactlyOnceRun:
    published: int
    rows: int
    distinct: int
    kills: int

    @property
    def held(self) -> bool:
        return self.rows == self.distinct == self.published


@dataclass
class Bench:
    spark: object
    kafka: object                         # bench.kafka_broker.KafkaBroker
    qq_uri: str
    qq_port: int
    qq_pid: int
    workdir: Path
    partitions: int = 2                   # Kafka topics' partitions
    _cpu: dict[str, ProcessCpu] = field(default_factory=dict)

    def side(self, kind: str, prefix: str) -> Side:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        return (Side("kafka", self.kafka.bootstrap, name) if kind == "kafka"
                else Side("quorumqueue", self.qq_uri, name))

    def cpu(self, side: Side) -> ProcessCpu:
        from bench.vs_kafka_spark import spark_jvm_pid

        named = {"broker": self.kafka.pid if side.kind == "kafka" else self.qq_pid}
        return ProcessCpu(spark_jvm_pid(self.spark), named)

    # ------------------------------------------------------------ topics and queues

    def create(self, side: Side) -> None:
        if side.kind == "kafka":
            self.kafka.create_topic(side.name, self.partitions)
        else:
            with _amqp(self.qq_uri) as channel:
                channel.queue_declare(side.name, durable=True,
                                      arguments={"x-queue-type": "quorum"})

    def count(self, side: Side) -> int:
        if side.kind == "kafka":
            return self.kafka.end_offsets(side.name)
        with _amqp(self.qq_uri) as channel:
            return channel.queue_declare(side.name, passive=True).method.message_count

    def drop(self, side: Side) -> None:
        if side.kind == "kafka":
            self.kafka.delete_topic(side.name)
        else:
            with _amqp(self.qq_uri) as channel:
                channel.queue_delete(side.name)

    def loader(self, side: Side, mode: str, *arguments: str) -> subprocess.Popen:
        target = (["--bootstrap", side.address, "--topic", side.name] if side.kind == "kafka"
                  else ["--port", str(self.qq_port), "--queue", side.name])
        return subprocess.Popen(LOADER + [mode, side.kind, *target, *arguments],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)

    def fill(self, side: Side, messages: int, size: int) -> None:
        if side.kind == "kafka":
            self.create(side)
        loader = self.loader(side, "fill", "--messages", str(messages), "--size", str(size))
        _finished(loader, "loader")
        held = self.count(side)
        if held != messages:
            raise RuntimeError(f"{side.kind} {side.name} holds {held} messages, not {messages}")

    # ------------------------------------------------------------------- workloads

    def source(self, kind: str, messages: int, size: int, per_trigger: int, sink: str,
               qq_options: dict[str, str] | None = None) -> Run:
        """`qq_options`: more options for the quorumqueue source (not Kafka's)."""
        side = self.side(kind, f"source-{sink}")
        self.fill(side, messages, size)
        table = self.workdir / f"table-{side.name}"
        checkpoint = self.workdir / f"checkpoint-{side.name}"
        cpu = self.cpu(side)
        before = cpu.snapshot()
        began = time.perf_counter()
        options = (qq_options or {}) if kind == "quorumqueue" else {}
        writer = (side.stream(self.spark, per_trigger, options).writeStream.format(sink)
                  .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True))
        query = writer.start(str(table)) if sink == "delta" else writer.start()
        query.awaitTermination()
        seconds = time.perf_counter() - began
        used = delta(before, cpu.snapshot())
        if query.exception() is not None:
            raise RuntimeError(f"{kind} source -> {sink} failed: {query.exception()}")
        reports = [report for report in query.recentProgress if report["numInputRows"]]
        files = 0
        if sink == "delta":
            files = len(list(table.glob("*.parquet")))
            frame = self.spark.read.format("delta").load(str(table))
            rows = frame.count()
            distinct = frame.select(sequence(side.body_column)).distinct().count()
            if rows != messages or distinct != messages:
                raise RuntimeError(f"{kind} -> Delta: {rows} rows, {distinct} distinct, "
                                   f"not {messages}")
        else:
            read = sum(report["numInputRows"] for report in reports)
            if read != messages:
                raise RuntimeError(f"{kind} -> noop read {read} rows, not {messages}")
        self.drop(side)
        shutil.rmtree(table, ignore_errors=True)
        shutil.rmtree(checkpoint, ignore_errors=True)
        return Run(seconds, messages, used, len(reports), files)

    def sink(self, kind: str, frame, messages: int) -> Run:
        side = self.side(kind, "sink")
        self.create(side)
        cpu = self.cpu(side)
        before = cpu.snapshot()
        began = time.perf_counter()
        side.write(frame)
        seconds = time.perf_counter() - began
        used = delta(before, cpu.snapshot())
        held = self.count(side)
        if held != messages:
            raise RuntimeError(f"{kind} sink: {held} messages stored, not {messages}")
        self.drop(side)
        return Run(seconds, messages, used)

    def latency(self, kind: str, trigger_ms: int, rate: int, seconds: float,
                size: int = 256, write: str = "common") -> LatencyRun:
        from pyspark.sql import functions as F

        if write not in LATENCY_WRITES:
            raise ValueError(f"write {write!r}: one of {', '.join(LATENCY_WRITES)}")
        side = self.side(kind, f"latency-{trigger_ms}")
        self.create(side)
        table = str(self.workdir / f"table-{side.name}")
        batches: list[tuple[np.ndarray, int, int]] = []
        inside: list[tuple[int, int, int]] = []   # per batch: collect ns, append ns, rows

        def on_batch(frame, _batch_id) -> None:
            began = time.time_ns()
            if write != "all":
                frame = frame.select(*(F.col(column).alias(name)
                                       for column, name in side.common_columns()))
            frame.persist()
            stamps = frame.select(F.substring(side.body_column if write == "all" else "body",
                                              1, 16).alias("s")).collect()
            arrived = time.time_ns()
            if write != "none":
                frame.write.format("delta").mode("append").save(table)
            committed = time.time_ns()
            frame.unpersist()
            if stamps:
                raw = np.frombuffer(b"".join(row.s for row in stamps), ">u8").reshape(-1, 2)
                batches.append((raw, arrived, committed))
                inside.append((arrived - began, committed - arrived, len(stamps)))

        query = (side.stream(self.spark).writeStream.foreachBatch(on_batch)
                 .option("checkpointLocation", str(self.workdir / f"checkpoint-{side.name}"))
                 .trigger(processingTime=f"{trigger_ms} milliseconds").start())
        try:
            _wait(lambda: query.lastProgress is not None, START_TIMEOUT_S,
                  f"{kind} latency query's start")
            loader = self.loader(side, "steady", "--rate", str(rate), "--seconds", str(seconds),
                                 "--size", str(size))
            cpu = self.cpu(side)
            before = cpu.snapshot()
            expected = int(rate * seconds)
            report = _finished(loader, "steady loader")
            _wait(lambda: sum(len(b[0]) for b in batches) >= expected, ARRIVAL_TIMEOUT_S,
                  f"{kind}: all {expected} messages in foreachBatch")
            used = delta(before, cpu.snapshot()) | {"loader": report.get("cpu_s", 0.0)}
            phases = _phase_medians(query.recentProgress)
            if inside:  # addBatch's two jobs, medians over the batches that read rows
                phases["fb.collect"] = float(np.median([c for c, _w, _n in inside])) / 1e6
                phases["fb.write"] = float(np.median([w for _c, w, _n in inside])) / 1e6
        finally:
            query.stop()
        sequences = np.concatenate([b[0][:, 0] for b in batches])
        if len(sequences) != expected or len(np.unique(sequences)) != expected:
            raise RuntimeError(f"{kind} latency: {len(sequences)} rows, "
                               f"{len(np.unique(sequences))} distinct, not {expected}")
        skip = rate * 2  # the first two seconds: the query's own warm-up
        arrival, commit = [], []
        for raw, arrived, committed in batches:
            kept = raw[raw[:, 0] >= skip, 1].astype(np.int64)
            arrival.append((arrived - kept) / 1e6)
            commit.append((committed - kept) / 1e6)
        arrival_ms, commit_ms = np.concatenate(arrival), np.concatenate(commit)
        self.drop(side)
        shutil.rmtree(table, ignore_errors=True)
        return LatencyRun(tuple(np.percentile(arrival_ms, (50, 99)).tolist()),
                          tuple(np.percentile(commit_ms, (50, 99)).tolist()),
                          expected, len(batches), used, phases,
                          float(np.median([n for _c, _w, n in inside])))

    def exactly_once(self, kind: str, messages: int, per_trigger: int, kills: int,
                     size: int = 256) -> ExactlyOnceRun:
        side = self.side(kind, "exactly-once")
        self.fill(side, messages, size)
        table = self.workdir / f"table-{side.name}"
        checkpoint = self.workdir / f"checkpoint-{side.name}"
        command = DRIVER + ["--kind", kind, "--address", side.address, "--name", side.name,
                            "--table", str(table), "--checkpoint", str(checkpoint),
                            "--per-trigger", str(per_trigger)]
        done = 0
        for kill in range(kills):
            commits = _delta_commits(table)
            driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
            try:
                _wait(lambda: _delta_commits(table) >= commits + 2 or driver.poll() is not None,
                      KILL_WAIT_S, f"{kind}: two more Delta commits")
                if driver.poll() is None:
                    time.sleep(random.uniform(0, 1.0))  # some moment of the next batch
                    os.killpg(driver.pid, signal.SIGKILL)
                    done += 1
                    log(f"  [{kind}] driver killed (kill {kill + 1}) after "
                        f"{_delta_commits(table)} Delta commits")
            finally:
                _reap(driver)
        final = subprocess.Popen(command + ["--available-now"], stdout=subprocess.DEVNULL,
                                 start_new_session=True)
        _finished(final, "the last driver", timeout=KILL_WAIT_S)
        frame = self.spark.read.format("delta").load(str(table))
        rows = frame.count()
        distinct = frame.select(sequence(side.body_column)).distinct().count()
        self.drop(side)
        shutil.rmtree(table, ignore_errors=True)
        shutil.rmtree(checkpoint, ignore_errors=True)
        return ExactlyOnceRun(messages, rows, distinct, done)


class _amqp:
    """A pika channel on the bundled broker, closed on exit."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def __enter__(self):
        import pika

        self.connection = pika.BlockingConnection(pika.URLParameters(self.uri))
        return self.connection.channel()

    def __exit__(self, *exc) -> None:
        self.connection.close()


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def _finished(process: subprocess.Popen, what: str, timeout: float = 600.0) -> dict:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} did not finish within {timeout:.0f}s") from None
    finally:
        if process.returncode is None:  # timed out, or this process is being stopped
            _reap(process)
    if process.returncode:
        raise RuntimeError(f"{what} exited with {process.returncode}")
    lines = (out or "").strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def _reap(process: subprocess.Popen) -> None:
    """Its whole session killed, if still there, and waited for."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()
    try:  # Spark's Python workers outlive a killed JVM for a moment
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _delta_commits(table: Path) -> int:
    log_dir = table / "_delta_log"
    return len(list(log_dir.glob("*.json"))) if log_dir.is_dir() else 0


def _phase_medians(progress: list) -> dict[str, float]:
    """Median ms of each durationMs phase over the batches that read rows (the
    progress reports of a trigger that found nothing new are left out)."""
    phases: dict[str, list[int]] = {}
    for report in progress:
        if report.numInputRows > 0:
            for phase, ms in report.durationMs.items():
                phases.setdefault(phase, []).append(ms)
    return {phase: float(np.median(values)) for phase, values in sorted(phases.items())}

