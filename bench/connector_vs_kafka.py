"""The quorumqueue source and sink against Apache Kafka's, in one Spark session, same bytes.

    python bench/connector_vs_kafka.py [--rounds 3] [--workloads all]
        [--messages 500000] [--messages-4k 100000] [--sink-messages 300000]
        [--per-trigger 100000] [--per-trigger-4k 25000] [--kafka-partitions 2]
        [--latency-rate 2000] [--latency-seconds 20] [--triggers 0,500]
        [--latency-write common|all|none]
        [--eo-messages 60000] [--eo-per-trigger 5000] [--eo-kills 2]
        [--sides kafka,quorumqueue] [--qq-option KEY=VALUE ...] [--out bench/results]

What a data engineer would pick instead of this connector: one Kafka 4.x broker in
KRaft mode (bench/kafka_broker.py; `make bench-kafka-setup` fetches its jars and Spark's
Kafka connector) and Spark's built-in Kafka source and sink, beside the bundled broker
and the quorumqueue source and sink, both read and written from one Spark session
(local[2], the same settings), each broker and each loader a process in a session of
its own (setsid: Linux shares the CPU between sessions, so an A/B where one side is in
its own session and the other not is biased whatever `nice` says). Workloads
(`--workloads`, comma-separated, default all), Kafka then quorumqueue, the order
swapped every round, `--rounds` rounds after an untimed warm-up round
(`--sides quorumqueue` or `--sides kafka` runs one side alone: no other broker is
started, and the report gives that side's figures without ratios):

- `source-noop`, `source-delta`: `--messages` x 256 B filled by a loader, then an
  AvailableNow query with `--per-trigger` messages per batch (maxOffsetsPerTrigger /
  maxMessagesPerTrigger) into Spark's `noop` sink or a new Delta table (created by the
  stream on both sides), timed from start() to the end of the query;
- `source-4k-noop`, `source-4k-delta`: the same with `--messages-4k` x 4 KB,
  `--per-trigger-4k` per batch;
- `sink`: `df.write` of a cached DataFrame of `--sink-messages` x 256 B in 2 partitions
  (Kafka: `kafka.acks=all`; quorumqueue: publisher confirms, idempotent keys);
- `latency`: a running query (no batch limit) into foreachBatch (collect the send
  times, append to Delta) at processing-time triggers `--triggers` (ms), while a loader
  publishes `--latency-rate` msg/s for `--latency-seconds`: p50/p99 of publish -> rows
  in foreachBatch and publish -> Delta commit. foreachBatch appends, by default, the
  columns both sources have under one set of names (the bytes, the queue or topic, the
  offset: the same bytes on both sides); `--latency-write all` appends every column of
  the source (quorumqueue's 20 against Kafka's 7), `none` nothing. The warm-up round
  runs each side's latency query once for a few seconds, untimed;
- `exactly-once`: `--eo-messages` into Delta in a driver process SIGKILLed `--eo-kills`
  times and restarted from its checkpoint: rows, distinct, published (once per run).

`--qq-option KEY=VALUE` (repeated) adds an option to the quorumqueue source's reader in
the source workloads (e.g. `maxMessagesPerPartition=50000`, an A/B of how a batch is cut
into partitions); Kafka's reader is left as it is. A source -> Delta run also reports
the table's data files (one per task that wrote rows).

Each run's CPU is read from /proc per process (the broker, Spark's JVM by thread group,
Spark's Python processes, this driver process, the loader) and printed per message.
The ratio of a workload is the median of the rounds' quorumqueue / Kafka ratios: of the
rates for throughput (higher is better), of the milliseconds for latency (lower is
better). Prints a Markdown summary and how to reproduce it; writes
`connector_vs_kafka.json` and `connector_vs_kafka.png` into `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.brokers import quorumqueue_broker  # noqa: E402
from bench.kafka_broker import KafkaBroker  # noqa: E402
from bench.process_cpu import jvm_total  # noqa: E402
from bench.vs_kafka_workloads import (LATENCY_WRITES, Bench, ExactlyOnceRun,  # noqa: E402
                                      LatencyRun, Run, log)

THROUGHPUT = ("source-noop", "source-delta", "source-4k-noop", "source-4k-delta", "sink")
WORKLOADS = THROUGHPUT + ("latency", "exactly-once")
SIDES = ("kafka", "quorumqueue")
TARGET = {"source-noop": 1.0, "source-delta": 1.0, "source-4k-noop": 1.0,
          "source-4k-delta": 1.0, "sink": 1.0}
LATENCY_TARGET = {"p50": 1.0, "p99": 1.5}   # quorumqueue / Kafka milliseconds, at most
LATENCY_WARMUP_S = 6.0   # the untimed latency run per side (its first 2 s are left out)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="all")
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--messages-4k", type=int, default=100_000)
    parser.add_argument("--sink-messages", type=int, default=300_000)
    parser.add_argument("--per-trigger", type=int, default=100_000)
    parser.add_argument("--per-trigger-4k", type=int, default=25_000)
    parser.add_argument("--kafka-partitions", type=int, default=2)
    parser.add_argument("--latency-rate", type=int, default=2000)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--triggers", default="0,500", help="processing-time triggers, ms")
    parser.add_argument("--latency-write", choices=LATENCY_WRITES, default="common",
                        help="what foreachBatch appends to Delta: the columns both sources "
                             "have (the default), every column of the source, or nothing")
    parser.add_argument("--eo-messages", type=int, default=60_000)
    parser.add_argument("--eo-per-trigger", type=int, default=5_000)
    parser.add_argument("--eo-kills", type=int, default=2)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed round")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="comma-separated: kafka, quorumqueue or both (the default)")
    parser.add_argument("--qq-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the quorumqueue source in the source workloads "
                             "(repeated; e.g. maxMessagesPerPartition=50000)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="after the warm-up, run each throughput workload once per side "
                             "under py-spy (Python processes) and JFR (JVMs), summaries in DIR")
    arguments = parser.parse_args(argv)
    chosen = (WORKLOADS if arguments.workloads == "all"
              else tuple(w.strip() for w in arguments.workloads.split(",") if w.strip()))
    unknown = set(chosen) - set(WORKLOADS)
    if unknown:
        parser.error(f"--workloads: unknown {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    arguments.chosen = chosen
    sides = tuple(side.strip() for side in arguments.sides.split(",") if side.strip())
    if not sides or set(sides) - set(SIDES):
        parser.error(f"--sides: {arguments.sides!r}; choose from {', '.join(SIDES)}")
    arguments.side_list = tuple(side for side in SIDES if side in sides)
    qq_options = {}
    for item in arguments.qq_option:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            parser.error(f"--qq-option: {item!r} is not KEY=VALUE")
        qq_options[key.strip()] = value
    arguments.qq_options = qq_options
    arguments.trigger_list = tuple(int(t) for t in arguments.triggers.split(","))
    if arguments.rounds < 1:
        parser.error("--rounds must be at least 1")
    return arguments


def run_throughput(bench: Bench, workload: str, kind: str, arguments, frame) -> Run:
    if workload == "sink":
        return bench.sink(kind, frame, arguments.sink_messages)
    four_k = "4k" in workload
    return bench.source(kind, arguments.messages_4k if four_k else arguments.messages,
                        4096 if four_k else 256,
                        arguments.per_trigger_4k if four_k else arguments.per_trigger,
                        workload.rsplit("-", 1)[1], arguments.qq_options)


def order(round_number: int, sides: tuple[str, ...] = SIDES) -> tuple[str, ...]:
    return sides if round_number % 2 else sides[::-1]


def load() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def measure(bench: Bench, arguments) -> dict:
    results: dict = {"throughput": {}, "latency": {}, "exactly_once": {}, "load": []}
    throughput = [w for w in arguments.chosen if w in THROUGHPUT]
    frame = None
    if "sink" in throughput:
        from bench.vs_kafka_spark import bodies

        frame = bodies(bench.spark, arguments.sink_messages, 256, 2)
    if throughput and not arguments.no_warmup:
        for workload in throughput:
            for kind in arguments.side_list:
                run = run_throughput(bench, workload, kind, arguments, frame)
                log(f"[warm-up] {workload} {kind}: {run.rate:,.0f} msg/s (untimed)")
    if throughput and arguments.profile:
        for workload in throughput:
            for kind in arguments.side_list:
                profiled(bench, workload, kind, arguments, frame)
    for round_number in range(1, arguments.rounds + 1 if throughput else 1):
        results["load"].append(load())
        for workload in throughput:
            for kind in order(round_number, arguments.side_list):
                run = run_throughput(bench, workload, kind, arguments, frame)
                results["throughput"].setdefault(workload, {}).setdefault(kind, []).append(run)
                log(f"[round {round_number}] {workload} {kind}: {run.messages:,} in "
                    f"{run.seconds:.2f} s = {run.rate:,.0f} msg/s"
                    + (f", {run.files} Delta files" if run.files else "")
                    + f" (load {load()}); CPU us/msg: "
                    + ", ".join(f"{group} {seconds / run.messages * 1e6:.2f}"
                                for group, seconds in sorted(run.cpu.items())))
    if "latency" in arguments.chosen and not arguments.no_warmup:
        for kind in arguments.side_list:  # else a latency run alone starts on a cold JVM
            run = bench.latency(kind, arguments.trigger_list[0], arguments.latency_rate,
                                LATENCY_WARMUP_S, write=arguments.latency_write)
            log(f"[warm-up] latency {kind}: arrival p50 {run.arrival_ms[0]:.0f} ms (untimed)")
    if "latency" in arguments.chosen:
        for trigger in arguments.trigger_list:
            for round_number in range(1, arguments.rounds + 1):
                results["load"].append(load())
                for kind in order(round_number, arguments.side_list):
                    run = bench.latency(kind, trigger, arguments.latency_rate,
                                        arguments.latency_seconds, write=arguments.latency_write)
                    results["latency"].setdefault(trigger, {}).setdefault(kind, []).append(run)
                    log(f"[latency {trigger} ms, round {round_number}] {kind}: arrival p50 "
                        f"{run.arrival_ms[0]:.0f} p99 {run.arrival_ms[1]:.0f} ms, commit p50 "
                        f"{run.commit_ms[0]:.0f} p99 {run.commit_ms[1]:.0f} ms "
                        f"({run.batches} batches, {run.rows_per_batch:.0f} rows per batch; "
                        f"load {load()}); per batch, ms: "
                        + ", ".join(f"{k} {v:.0f}" for k, v in run.phases_ms.items()))
    if "exactly-once" in arguments.chosen:
        for kind in arguments.side_list:
            run = bench.exactly_once(kind, arguments.eo_messages, arguments.eo_per_trigger,
                                     arguments.eo_kills)
            results["exactly_once"][kind] = run
            log(f"[exactly-once] {kind}: {run.rows:,} rows, {run.distinct:,} distinct of "
                f"{run.published:,} published, {run.kills} kill(s)")
    return results


def profiled(bench: Bench, workload: str, kind: str, arguments, frame) -> None:
    """One run of `workload` on `kind` under the samplers (bench/vs_kafka_profile.py)."""
    from bench.process_cpu import descendants
    from bench.vs_kafka_profile import Profile
    from bench.vs_kafka_spark import spark_jvm_pid

    jvm = spark_jvm_pid(bench.spark)
    daemons = [pid for pid in descendants(jvm) if b"pyspark.daemon" in _cmdline(pid)]
    python = {f"spark-python-{pid}": pid for pid in daemons}
    jvms = {"spark-jvm": jvm}
    if kind == "kafka":
        jvms["kafka-broker"] = bench.kafka.pid
    else:
        python["quorumqueue-broker"] = bench.qq_pid
    profile = Profile(arguments.profile, f"{workload}-{kind}", python, jvms)
    try:
        run = run_throughput(bench, workload, kind, arguments, frame)
    finally:
        summary = profile.stop()
    log(f"[profile] {workload} {kind}: {run.rate:,.0f} msg/s under the samplers -> {summary}")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.2f} ({min(values):,.2f}-{max(values):,.2f})"


def per_message(runs: list, group: str) -> float:
    """Median CPU microseconds per message of a process group over runs."""
    values = [(jvm_total(run.cpu) if group == "JVM" else run.cpu.get(group, 0.0))
              / run.messages * 1e6 for run in runs]
    return statistics.median(values)


CPU_GROUPS = ("broker", "JVM", "JVM tasks", "JVM JIT", "JVM GC", "JVM other",
              "Python workers", "driver")


def report(results: dict, arguments) -> list[str]:
    lines = ["| workload | Kafka msg/s, median (range) | quorumqueue msg/s | "
             "quorumqueue / Kafka, median of rounds (range) | target |",
             "|---|---|---|---|---|"]
    summary: dict = {}
    for workload, sides in results["throughput"].items():
        if len(sides) < 2:
            lines.append(_one_side(workload, sides))
            continue
        kafka, qq = sides["kafka"], sides["quorumqueue"]
        ratios = [q.rate / k.rate for k, q in zip(kafka, qq)]
        median = statistics.median(ratios)
        summary[workload] = {"ratio": median, "ratios": ratios}
        held = "held" if median >= TARGET[workload] else "NOT held"
        lines.append(f"| {workload} | {spread([r.rate for r in kafka])} | "
                     f"{spread([r.rate for r in qq])} | **{median:.2f}x** "
                     f"({min(ratios):.2f}-{max(ratios):.2f}) | >= {TARGET[workload]}x: {held} |")
    for trigger, sides in results["latency"].items():
        if len(sides) < 2:
            for what, index in (("p50", 0), ("p99", 1)):
                for stage, label in (("arrival_ms", "foreachBatch"), ("commit_ms", "Delta commit")):
                    lines.append(_one_side(
                        f"latency {what} -> {label}, trigger {trigger} ms (ms)", sides,
                        lambda run, stage=stage, index=index: getattr(run, stage)[index]))
            continue
        kafka, qq = sides["kafka"], sides["quorumqueue"]
        for what, index in (("p50", 0), ("p99", 1)):
            for stage in ("arrival_ms", "commit_ms"):
                k = [getattr(r, stage)[index] for r in kafka]
                q = [getattr(r, stage)[index] for r in qq]
                ratios = [b / a for a, b in zip(k, q)]
                median = statistics.median(ratios)
                limit = LATENCY_TARGET[what]
                verdict = ("" if stage == "commit_ms" else
                           f"<= {limit}x: {'held' if median <= limit else 'NOT held'}")
                label = "foreachBatch" if stage == "arrival_ms" else "Delta commit"
                lines.append(f"| latency {what} -> {label}, trigger {trigger} ms (ms) | "
                             f"{spread(k)} | {spread(q)} | **{median:.2f}x** "
                             f"({min(ratios):.2f}-{max(ratios):.2f}) | {verdict} |")
                summary[f"latency-{trigger}-{what}-{stage}"] = {"ratio": median, "ratios": ratios}
    for kind, run in results["exactly_once"].items():
        lines.append(f"| exactly-once, {kind}, {run.kills} driver SIGKILLs | | | "
                     f"{run.rows:,} rows, {run.distinct:,} distinct of {run.published:,} | "
                     f"100%: {'held' if run.held else 'NOT held'} |")
    lines += ["", "CPU per message, microseconds (median of rounds): "
              "broker | Spark JVM (tasks, JIT, GC, other) | Spark's Python processes | driver",
              "", "| run | side | broker | JVM | tasks | JIT | GC | other | Python | driver |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    groups = {**results["throughput"],
              **{f"latency {t} ms": s for t, s in results["latency"].items()}}
    for workload, sides in groups.items():
        for kind in (side for side in SIDES if side in sides):
            runs = sides[kind]
            lines.append(f"| {workload} | {kind} | " + " | ".join(
                f"{per_message(runs, group):.2f}" for group in CPU_GROUPS) + " |")
    results["summary"] = summary
    return lines


def _one_side(label: str, sides: dict, figure=lambda run: run.rate) -> str:
    """A report row for a run of one side alone: its figures, no ratio to a baseline."""
    cells = [spread([figure(run) for run in sides[kind]]) if kind in sides else "not run"
             for kind in SIDES]
    return f"| {label} | {cells[0]} | {cells[1]} | no ratio: one side run | |"


def to_json(results: dict, arguments) -> dict:
    def runs(runs_list):
        return [asdict(run) for run in runs_list]

    return {
        "settings": {key: (str(value) if isinstance(value, Path) else value)
                     for key, value in vars(arguments).items()},
        "load": results["load"],
        "throughput": {w: {k: runs(v) for k, v in s.items()}
                       for w, s in results["throughput"].items()},
        "latency": {str(t): {k: runs(v) for k, v in s.items()}
                    for t, s in results["latency"].items()},
        "exactly_once": {k: asdict(v) for k, v in results["exactly_once"].items()},
        "summary": results.get("summary", {}),
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = results["summary"]
    names = [name for name in summary if not name.startswith("latency")]
    latency = [name for name in summary if name.startswith("latency") and "arrival" in name]
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for axis, keys, title, line in ((axes[0], names, "throughput, quorumqueue / Kafka "
                                     "(higher is better)", 1.0),
                                    (axes[1], latency, "latency to foreachBatch, "
                                     "quorumqueue / Kafka (lower is better)", 1.0)):
        medians = [summary[k]["ratio"] for k in keys]
        low = [summary[k]["ratio"] - min(summary[k]["ratios"]) for k in keys]
        high = [max(summary[k]["ratios"]) - summary[k]["ratio"] for k in keys]
        axis.bar(range(len(keys)), medians, yerr=[low, high], capsize=4, color="#4477aa")
        axis.axhline(line, color="black", linewidth=0.8)
        axis.set_xticks(range(len(keys)))
        axis.set_xticklabels([k.replace("latency-", "").replace("-arrival_ms", "")
                              for k in keys], rotation=30, ha="right")
        axis.set_title(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _exit_on_signal(signum, _frame) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # so every broker and driver is stopped


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    command = "python bench/connector_vs_kafka.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    log(f"workloads {', '.join(arguments.chosen)}; {arguments.rounds} round(s); load {load()}")
    began = time.monotonic()
    sides = arguments.side_list
    with (quorumqueue_broker(new_session=True) if "quorumqueue" in sides
          else contextlib.nullcontext()) as qq, \
            (KafkaBroker() if "kafka" in sides else contextlib.nullcontext()) as kafka, \
            tempfile.TemporaryDirectory(prefix="qq-vs-kafka-") as tmp:
        from bench.vs_kafka_spark import session

        log("[brokers] " + "; ".join(
            ([f"quorumqueue 127.0.0.1:{qq.port} (pid {qq.pid})"] if qq else [])
            + ([f"Kafka {kafka.bootstrap} (pid {kafka.pid})"] if kafka else []))
            + "; starting Spark")
        spark = session("bench-connector-vs-kafka", kafka=kafka is not None)
        try:
            bench = Bench(spark, kafka,
                          f"amqp://guest:guest@127.0.0.1:{qq.port}/%2F" if qq else "",
                          qq.port if qq else 0, qq.pid if qq else 0, Path(tmp),
                          arguments.kafka_partitions)
            results = measure(bench, arguments)
        finally:
            spark.stop()
    lines = report(results, arguments)
    print("\n".join(lines))
    print(f"\nload average per round (1/5/15 min): {', '.join(results['load'])}; "
          f"{(time.monotonic() - began) / 60:.1f} minutes")
    print(f"reproduce: {command}")
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "connector_vs_kafka.json").write_text(
        json.dumps(to_json(results, arguments), indent=2) + "\n")
    if results["summary"]:
        plot(results, arguments.out / "connector_vs_kafka.png")
    failed = [kind for kind, run in results["exactly_once"].items() if not run.held]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
