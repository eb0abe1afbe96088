"""The Spark source into Delta, and into Spark's `noop` sink, against a plain AMQP
consumer, same broker, same run.

    python bench/connector_source.py [--messages 500000] [--size 256]
        [--per-trigger 100000] [--prefetch 1000] [--rounds 3]
        [--sink both|delta|noop] [--stats-columns queue,offset,timestamp|all]
        [--json PATH]

One bundled broker; per round, two durable quorum queues filled with the same
`--messages` persistent messages of `--size` bytes (the load generator of
amqp_throughput.py, publisher confirms). Then, one after the other:

1. **pika**: a plain consumer drains queue A — `basic.qos` prefetch `--prefetch`,
   manual acks (`multiple=true` every half prefetch) — timed from `basic.consume` to
   the last delivery; it checks every message arrived once.
2. **source**: `spark.readStream.format("quorumqueue")` (lease mode,
   maxMessagesPerTrigger `--per-trigger`, so several micro-batches as a running
   query has them; Trigger.AvailableNow) drains queue B into a Delta table
   (`writeStream.format("delta")`), timed from `start()` to the end of the query
   (Spark starting the source's Python process, planning, reads on the executors,
   Parquet and the Delta commits included); it checks the table holds every message
   once. The empty table is created before the clock starts, as a job appending to
   its table finds it, with file statistics on `--stats-columns` (default
   `jobs.delta.SOURCE_STATS_COLUMNS`; `all`: Delta's default, every column).
3. **source -> noop**: the same query into Spark's built-in `noop` sink
   (`writeStream.format("noop")`), which takes every row and writes nothing: the
   standard way to measure a source by itself. It is what the source hands Spark per
   second (the reads on the executors, Arrow batches into rows, the offset and commit
   logs, the fixed start of a query), the comparison on equal terms with pika, which
   writes nothing either. It checks the progress reports counted every message (a
   sink that keeps nothing cannot be checked for duplicates; the Delta run is).

`--sink` (default `both`) picks which of 2 and 3 run; with both, each round is a
triple (pika, source -> Delta, source -> noop) and each is compared with the pika of
its own round. The Delta figure is the one of a job a user runs (Parquet and a Delta
commit per micro-batch: work pika does not do); the noop figure is the source's own
throughput; neither stands for the other.

Before the rounds, a warm-up query of the same shape (`--messages`, `--per-trigger`)
runs untimed per sink, so the Python workers are up and the JVM has compiled the hot paths,
as in a query that has been running for a while. A small warm-up is not enough: the
JVM's JIT compiler threads were measured busy for 19 CPU-seconds over a fresh
session's first 30 s of this workload, and still 1.2-2.8 CPU-seconds per 200,000
messages after a 20,000-message warm-up, on a machine with 2 cores.

`--rounds` (default 3) repeats them, interleaved (pika, source, pika, source, ...),
and keeps each one's best round: on a shared 2-core machine other work slows one
measurement or the other by tens of percent, and each round's ratio is printed
too, with their median and spread (each round pairs pika with the source run(s)
after it). Prints the rates and source / pika per sink (target >= 0.8, goal >= 0.95;
issue 18 asks >= 1.0), plus where the source's time went: before its first trigger (Spark starting the Python
process that runs the reader, which imports PySpark from its zip, and the reader's
first calls), per step of Spark's micro-batches (progress reports: latestOffset,
planning, addBatch, commits) and after the last one. The source has a fixed cost
per query of about one second (any Python data source: Spark starts a Python
process for its reader), so the ratio grows with `--messages`. Besides the headline
(start() to the end), it prints the sustained rate: messages over the summed
durations of the query's micro-batches, Spark's own processedRowsPerSecond for the
whole run. And the CPU each run used, from /proc, which load moves less than wall time:
Spark's JVM by thread (the JIT compiler, the executors' task threads, garbage
collection, the rest: the driver's planning and commits), the Python processes
(the executors' readers and the reader's driver-side process) and the broker. Progress
goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pika

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.amqp_loadgen import LoadSettings, connect, declare_fresh_queue, publish_all  # noqa: E402
from bench.brokers import quorumqueue_broker  # noqa: E402
from bench.process_cpu import JVM_THREADS, stat_cpu  # noqa: E402
from quorumqueue.jobs.delta import SOURCE_STATS_COLUMNS  # noqa: E402

TARGET, GOAL = 0.8, 0.95
SINKS = ("delta", "noop")
# how the summary names the source's runs, per sink
LABELS = {"delta": "quorumqueue source -> Delta", "noop": "quorumqueue source -> noop"}
# The step of a progress report's durationMs that holds all the others.
_ENCLOSING_STEP = "triggerExecution"


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=256, help="body bytes (>= 8)")
    parser.add_argument("--per-trigger", type=int, default=100_000,
                        help="maxMessagesPerTrigger")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; best kept")
    parser.add_argument("--prefetch", type=int, default=1000, help="pika's basic.qos prefetch")
    parser.add_argument("--sink", choices=SINKS + ("both",), default="both",
                        help="where the source writes: a Delta table (a job's figure), "
                             "Spark's noop sink (the source's own throughput), or both, "
                             "each against the same pika rounds")
    parser.add_argument("--stats-columns", default=",".join(SOURCE_STATS_COLUMNS),
                        help="the Delta table's statistics columns, comma-separated, or "
                             "'all' (Delta's default)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="another option of the source (repeatable), e.g. "
                             "maxMessagesPerPartition=50000")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    arguments = parser.parse_args(argv)
    if min(arguments.messages, arguments.per_trigger, arguments.prefetch, arguments.rounds) < 1:
        parser.error("--messages, --per-trigger, --prefetch and --rounds must be at least 1")
    if arguments.size < 8:
        parser.error("--size must be at least 8 (bodies carry an 8-byte sequence number)")
    return arguments


def stats_columns(arguments: argparse.Namespace) -> tuple[str, ...] | None:
    """The table's statistics columns; None: Delta's default."""
    if arguments.stats_columns == "all":
        return None
    return tuple(name.strip() for name in arguments.stats_columns.split(",") if name.strip())


async def _fill(settings: LoadSettings, prefix: str) -> str:
    generator = await connect(settings)
    try:
        queue = await declare_fresh_queue(generator, prefix)
        await publish_all(generator, queue)
    finally:
        generator.transport.close()
    return queue


def fill_queue(host: str, port: int, messages: int, size: int, prefix: str) -> str:
    settings = LoadSettings(host=host, port=port, messages=messages, size=size,
                            queue_type="quorum")
    return asyncio.run(_fill(settings, prefix))


def drain_with_pika(uri: str, queue: str, messages: int, prefetch: int) -> float:
    """Seconds from basic.consume to the last of `messages` deliveries."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        seen: set[bytes] = set()
        every = max(1, prefetch // 2)
        began = time.perf_counter()
        for method, _properties, body in channel.consume(queue, inactivity_timeout=30):
            if method is None:
                raise RuntimeError(f"pika: no delivery for 30 s after {len(seen)} messages")
            if method.redelivered or body[:8] in seen:
                raise RuntimeError(f"pika: message {body[:8]!r} delivered twice")
            seen.add(body[:8])
            if len(seen) % every == 0 or len(seen) == messages:
                channel.basic_ack(method.delivery_tag, multiple=True)
            if len(seen) == messages:
                break
        elapsed = time.perf_counter() - began
        channel.cancel()
    finally:
        connection.close()
    return elapsed


# the source's options given with --option (main), on top of uri, queue and
# maxMessagesPerTrigger
EXTRA_OPTIONS: dict[str, str] = {}


def source_query(spark, uri: str, queue: str, per_trigger: int, workdir: Path, name: str,
                 sink: str = "delta"):
    stream = (spark.readStream.format("quorumqueue").option("uri", uri).option("queue", queue)
              .option("maxMessagesPerTrigger", str(per_trigger)).options(**EXTRA_OPTIONS)
              .load())
    writer = (stream.writeStream.format(sink).queryName(name)
              .option("checkpointLocation", str(workdir / f"{name}-checkpoint"))
              .trigger(availableNow=True))
    return writer.start(str(workdir / name)) if sink == "delta" else writer.start()


def cpu_snapshot() -> dict[str, float]:
    """CPU seconds so far of this bench's descendants: the JVM per thread group, Python
    processes (Spark's, alive or reaped by the JVM) and the broker."""
    parents, commands = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text()
                                          .rsplit(")", 1)[1].split()[1])
                commands[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes()
            except (OSError, IndexError, ValueError):
                continue
    mine, grown = {os.getpid()}, True
    while grown:
        found = {pid for pid, parent in parents.items() if parent in mine} - mine
        mine |= found
        grown = bool(found)
    totals = dict.fromkeys(("JVM JIT", "JVM tasks", "JVM GC", "JVM other", "Python",
                            "broker"), 0.0)
    for pid in mine - {os.getpid()}:
        command = commands[pid].split(b"\0")
        try:
            if command[0].endswith(b"java"):
                # Python processes the JVM started and reaped count as Python
                totals["Python"] += (stat_cpu(f"/proc/{pid}/stat", children=True)
                                     - stat_cpu(f"/proc/{pid}/stat"))
                for tid in os.listdir(f"/proc/{pid}/task"):
                    name = Path(f"/proc/{pid}/task/{tid}/comm").read_text()
                    group = next((g for g, pattern in JVM_THREADS if pattern.match(name)),
                                 "other")
                    totals[f"JVM {group}"] += stat_cpu(f"/proc/{pid}/task/{tid}/stat")
            elif b"pyspark" in commands[pid]:
                totals["Python"] += stat_cpu(f"/proc/{pid}/stat")
            elif b"quorumqueue.broker" in commands[pid]:
                totals["broker"] += stat_cpu(f"/proc/{pid}/stat")
        except OSError:  # gone meanwhile
            continue
    return totals


@dataclass(frozen=True, slots=True)
class SourceRun:
    seconds: float                 # start() to the end of the query
    progress: tuple[dict, ...]     # the progress reports of batches that read rows
    before_first_trigger: float    # start() to the first trigger's start
    after_last_trigger: float      # the last trigger's end to the end of the query
    cpu: dict[str, float]          # CPU seconds from start() to the end, per cpu_snapshot group

    @property
    def batch_seconds(self) -> float:
        """The summed durations of the micro-batches that read messages."""
        return sum(report["durationMs"][_ENCLOSING_STEP] for report in self.progress) / 1000


def drain_with_source(spark, uri: str, queue: str, messages: int, per_trigger: int,
                      workdir: Path, name: str,
                      statistics: tuple[str, ...] | None, sink: str = "delta") -> SourceRun:
    """An AvailableNow query from `queue` into a new Delta table (or Spark's noop sink),
    timed from start() to its end; checks the table holds every message once (noop:
    that the query read every message)."""
    from quorumqueue.jobs.delta import create_source_table

    if sink == "delta":
        create_source_table(spark, str(workdir / name), statistics)
    cpu_before = cpu_snapshot()
    began_at = time.time()
    began = time.perf_counter()
    query = source_query(spark, uri, queue, per_trigger, workdir, name, sink)
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    cpu = {group: seconds - cpu_before[group] for group, seconds in cpu_snapshot().items()}
    if query.exception() is not None:
        raise RuntimeError(f"the source query failed: {query.exception()}")
    reports = query.recentProgress
    if sink == "delta":
        table = spark.read.format("delta").load(str(workdir / name))
        rows, distinct = table.count(), table.select("body").distinct().count()
        if rows != messages or distinct != messages:
            raise RuntimeError(f"Delta holds {rows} rows ({distinct} distinct), not {messages}")
    else:
        # recentProgress keeps the last 100 reports (spark.sql.streaming.numRecentProgressUpdates)
        read = sum(report["numInputRows"] for report in reports)
        if read != messages:
            raise RuntimeError(f"the noop query read {read} rows, not {messages}")
    first = trigger_start(reports[0]) - began_at if reports else elapsed
    last = (trigger_start(reports[-1]) + reports[-1]["durationMs"][_ENCLOSING_STEP] / 1000
            - began_at) if reports else elapsed
    return SourceRun(elapsed, tuple(p for p in reports if p["numInputRows"]), first,
                     elapsed - last, cpu)


def trigger_start(report: dict) -> float:
    """A progress report's trigger start, as seconds since the epoch."""
    return dt.datetime.fromisoformat(report["timestamp"].replace("Z", "+00:00")).timestamp()


def time_split(progress: tuple[dict, ...]) -> dict[str, float]:
    """Seconds per step of Spark's micro-batch, summed over the batches."""
    totals: dict[str, float] = {}
    for report in progress:
        for step, ms in report["durationMs"].items():
            totals[step] = totals.get(step, 0.0) + ms / 1000
    return totals


def verdict(ratio: float) -> str:
    if ratio >= GOAL:
        return f"meets the >= {GOAL}x goal"
    if ratio >= TARGET:
        return f"meets the >= {TARGET}x target, not the >= {GOAL}x goal"
    return f"MISSES the >= {TARGET}x target"


def sinks(arguments: argparse.Namespace) -> tuple[str, ...]:
    return SINKS if arguments.sink == "both" else (arguments.sink,)


def measure(spark, uri: str, host: str, port: int, arguments: argparse.Namespace,
            workdir: Path) -> tuple[list[float], dict[str, list[SourceRun]]]:
    """Seconds of pika's runs, and of the source's per sink, round by round."""
    pika_runs: list[float] = []
    source_runs: dict[str, list[SourceRun]] = {sink: [] for sink in sinks(arguments)}
    for round_number in range(1, arguments.rounds + 1):
        for_pika = fill_queue(host, port, arguments.messages, arguments.size, "pika")
        for_source = {sink: fill_queue(host, port, arguments.messages, arguments.size,
                                       f"source-{sink}") for sink in source_runs}
        pika_runs.append(drain_with_pika(uri, for_pika, arguments.messages, arguments.prefetch))
        log(f"[round {round_number}] pika: {arguments.messages:,} in {pika_runs[-1]:.2f} s")
        for sink, runs in source_runs.items():
            runs.append(drain_with_source(
                spark, uri, for_source[sink], arguments.messages, arguments.per_trigger,
                workdir, f"orders_{sink}_{round_number}", stats_columns(arguments), sink))
            log(f"[round {round_number}] source -> {sink}: {arguments.messages:,} in "
                f"{runs[-1].seconds:.2f} s (round ratio "
                f"{pika_runs[-1] / runs[-1].seconds:.2f}x)")
    return pika_runs, source_runs


def breakdown(run: SourceRun) -> str:
    split = time_split(run.progress)
    steps = ", ".join(f"{step} {seconds:.2f}" for step, seconds in
                      sorted(split.items(), key=lambda item: -item[1])
                      if step != _ENCLOSING_STEP)
    return (f"source, seconds: {run.seconds:.2f} = before the first trigger "
            f"{run.before_first_trigger:.2f} + {len(run.progress)} batch(es) "
            f"{split.get(_ENCLOSING_STEP, 0.0):.2f} ({steps}) + the rest "
            f"{run.seconds - run.before_first_trigger - split.get(_ENCLOSING_STEP, 0.0):.2f} "
            f"(of which after the last trigger {run.after_last_trigger:.2f})")


def cpu_line(runs: list[SourceRun], messages: int) -> str:
    """Median CPU per group over `runs`, in seconds and microseconds per message."""
    groups = runs[0].cpu
    median = {group: statistics.median(run.cpu[group] for run in runs) for group in groups}
    jvm = sum(value for group, value in median.items() if group.startswith("JVM"))
    parts = ", ".join(f"{group} {median[group]:.2f}" for group in groups)
    return (f"CPU seconds per run (median of {len(runs)}): JVM {jvm:.2f} "
            f"({jvm / messages * 1e6:.1f} us/message); {parts}")


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    for option in arguments.option:
        key, equals, value = option.partition("=")
        if not equals:
            raise SystemExit(f"--option {option!r}: give KEY=VALUE, e.g. "
                             "maxMessagesPerPartition=50000")
        EXTRA_OPTIONS[key] = value
    from quorumqueue.jobs.delta import local_spark

    log(f"{arguments.messages:,} x {arguments.size} B messages per quorum queue; pika prefetch "
        f"{arguments.prefetch}; source maxMessagesPerTrigger {arguments.per_trigger:,} into "
        f"{' and '.join(sinks(arguments))} (Delta statistics on {arguments.stats_columns}); "
        f"{arguments.rounds} round(s)")
    with quorumqueue_broker() as broker, tempfile.TemporaryDirectory(prefix="qq-bench-") as tmp:
        uri = f"amqp://guest:guest@{broker.host}:{broker.port}/%2F"
        log(f"[broker] 127.0.0.1:{broker.port}; starting Spark (Delta) and a warm-up query "
            f"of {arguments.messages:,} messages per sink ...")
        spark = local_spark("bench-connector-source")
        try:
            for sink in sinks(arguments):
                warm = fill_queue(broker.host, broker.port, arguments.messages, arguments.size,
                                  f"warm-{sink}")
                warm_up = drain_with_source(spark, uri, warm, arguments.messages,
                                            arguments.per_trigger, Path(tmp), f"warm_up_{sink}",
                                            stats_columns(arguments), sink)
                log(f"[warm-up] source -> {sink}: {arguments.messages:,} in "
                    f"{warm_up.seconds:.2f} s (untimed)")
            pika_runs, source_runs = measure(spark, uri, broker.host, broker.port,
                                             arguments, Path(tmp))
        finally:
            spark.stop()
    results = summarise(arguments, pika_runs, source_runs)
    if arguments.json:
        arguments.json.write_text(json.dumps({
            "settings": vars(arguments) | {"json": str(arguments.json)},
            **results, "target": TARGET, "goal": GOAL}, indent=2) + "\n")
    return 0


def summarise(arguments: argparse.Namespace, pika_runs: list[float],
              source_runs: dict[str, list[SourceRun]]) -> dict:
    """Prints the summary; returns it for --json ("source": the Delta runs, as before
    there was a noop sink; "source_noop": the noop runs)."""
    messages = arguments.messages
    pika_s = min(pika_runs)
    pika_rate = messages / pika_s
    print(f"{'consumer (best round)':<28} {'messages':>9} {'seconds':>8} {'msg/s':>9}")
    print(f"{'pika (manual acks)':<28} {messages:>9,} {pika_s:>8.2f} {pika_rate:>9,.0f}")
    for sink, runs in source_runs.items():
        best = min(runs, key=lambda run: run.seconds)
        print(f"{LABELS[sink]:<28} {messages:>9,} {best.seconds:>8.2f} "
              f"{messages / best.seconds:>9,.0f}")
    results: dict = {"pika": {"seconds": pika_s, "msgs_per_s": pika_rate,
                              "rounds_s": pika_runs}}
    for sink, runs in source_runs.items():
        what = ("a job's figure: Parquet and a Delta commit per batch, which pika does not "
                "write" if sink == "delta" else
                "the source's own throughput: rows handed to Spark, written nowhere")
        best = min(runs, key=lambda run: run.seconds)
        ratio = (messages / best.seconds) / pika_rate
        paired = [p / s.seconds for p, s in zip(pika_runs, runs)]
        paired_sustained = [p / s.batch_seconds for p, s in zip(pika_runs, runs)]
        steady = min(runs, key=lambda run: run.batch_seconds)
        sustained = messages / steady.batch_seconds
        print(f"\n{LABELS[sink]} ({what}):")
        print(f"  source / pika, pair by pair (pika and the source of one round): median "
              f"{statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f}x; "
              f"{verdict(statistics.median(paired))}); sustained median "
              f"{statistics.median(paired_sustained):.2f}x ({min(paired_sustained):.2f}-"
              f"{max(paired_sustained):.2f}x)")
        print(f"  best rounds: {ratio:.2f}x; round by round: " + ", ".join(
            f"{x:.2f}x" for x in paired))
        print(f"  sustained (its micro-batches only, without the query's start): "
              f"{sustained:,.0f} msg/s, {sustained / pika_rate:.2f}x pika; round by round: "
              + ", ".join(f"{x:.2f}x" for x in paired_sustained))
        print("  " + breakdown(best))
        print("  " + cpu_line(runs, messages))
        results["source" if sink == "delta" else f"source_{sink}"] = {
            "sink": sink, "seconds": best.seconds, "msgs_per_s": messages / best.seconds,
            "rounds_s": [run.seconds for run in runs],
            "before_first_trigger_s": best.before_first_trigger,
            "after_last_trigger_s": best.after_last_trigger,
            "steps_s": time_split(best.progress),
            "sustained_msgs_per_s": sustained,
            "rounds_batch_s": [run.batch_seconds for run in runs],
            "rounds_cpu_s": [run.cpu for run in runs],
            "ratio": ratio, "paired_ratios": paired,
            "paired_sustained_ratios": paired_sustained,
            "sustained_ratio": sustained / pika_rate}
    return results


if __name__ == "__main__":
    sys.exit(main())
