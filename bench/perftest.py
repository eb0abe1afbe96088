"""RabbitMQ's PerfTest as a neutral loader: quorumqueue against RabbitMQ 3.10.8, same run.

    python bench/perftest.py [--scenarios quick|all|NAME,...] [--nodes 1[,3]]
        [--time 10] [--repeats 3] [--target both|quorumqueue|rabbitmq]
        [--json PATH] [--plots DIR]
    python bench/perftest.py --replot RUN1.json [RUN2.json ...] [--plots DIR]

PerfTest (``com.rabbitmq:perf-test`` 2.22.1, its jar and dependencies fetched into
``bench/jars/`` by ``make bench-setup``, never at test time) runs as a Java
subprocess with RabbitMQ's own flags for a quorum-queue workload: durable quorum
queues (``x-queue-type=quorum``), persistent messages, publisher confirms with
1000 unconfirmed at most, consumers with prefetch 1000 (automatic acks off), one
producer and one consumer per queue, publishing and consuming at once (PerfTest's
default shape) for ``--time`` seconds. Many queues use PerfTest's queue pattern
(``perf-test-N``, one producer and one consumer each).

Both brokers (or both clusters of ``--nodes``) are started once per node count and
stay up together; the runs then alternate quorumqueue, RabbitMQ, quorumqueue,
RabbitMQ ... (A/B pairs, ``--repeats`` of each), each run on fresh queue names,
and a row reports the median over the repeats of: sending rate, receiving rate
(msg/s, PerfTest's own "rate avg" over the whole run) and consumer latency p50 and
p99 (PerfTest's whole-run figures, microseconds). PerfTest connects to node 1; the
queues are declared there, so their leaders are on node 1 (client-local placement).

Scenarios (``--scenarios``): ``1q-1kb`` (1 queue, 1 KB), ``10q-1kb``, ``100q-1kb``,
``1q-16b``, ``1q-64kb``, ``1q-1mib``; ``quick`` is 1q-1kb, 10q-1kb, 1q-16b, 1q-64kb
on 1 node (a few minutes with the default --time 10); ``all`` is all six.
With ``--plots`` (default bench/results/) two PNGs per node count: msg/s and
p99 latency against queue count (1 KB bodies) and against message size (1 queue),
quorumqueue beside RabbitMQ (medians, min-max bars), and their quorumqueue/RabbitMQ
ratio per A/B pair (``pair_ratios``). bench/perftest_curves.py sweeps the whole grid
on 1 and 3 nodes with these plots. Progress goes to stderr, the table to stdout.

Not here: PerfTest's output parsing is ``parse_summary`` (tested without Java in
tests/bench/test_perftest.py); brokers and clusters come from bench/brokers.py and
bench/clusters.py.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

JARS = REPO_ROOT / "bench" / "jars"
PERFTEST_MAIN = "com.rabbitmq.perf.PerfTest"
TARGETS = ("quorumqueue", "rabbitmq")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    queues: int
    size: int
    clients: int = 1  # producers and consumers per queue (that many of each)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("1q-1kb", 1, 1024),
        Scenario("10q-1kb", 10, 1024),
        Scenario("100q-1kb", 100, 1024),
        Scenario("1q-16b", 1, 16),
        Scenario("1q-64kb", 1, 65536),
        Scenario("1q-1mib", 1, 1048576),
    )
}
QUICK = ("1q-1kb", "10q-1kb", "1q-16b", "1q-64kb")


@dataclass(frozen=True, slots=True)
class Summary:
    """PerfTest's whole-run figures: rates in msg/s, consumer latency in microseconds."""

    sending: float
    receiving: float
    latency_us: dict[str, float]  # min, median, 75th, 95th, 99th


_RATE = re.compile(r"^id: \S+, (sending|receiving) rate avg: ([0-9.]+) msg/s$")
_LATENCY = re.compile(r"^id: \S+, consumer latency ([a-z0-9/]+) ([0-9/.]+) (µs|ms|ns|s)$")
_TO_US = {"ns": 0.001, "µs": 1.0, "ms": 1000.0, "s": 1_000_000.0}


def parse_summary(output: str) -> Summary:
    """The summary PerfTest prints after "test stopped": rates and consumer latency.

    Raises ValueError naming what is missing (PerfTest failed, or its format changed).
    """
    rates: dict[str, float] = {}
    latency: dict[str, float] | None = None
    for line in output.splitlines():
        line = line.strip()
        if match := _RATE.match(line):
            rates[match.group(1)] = float(match.group(2))
        elif match := _LATENCY.match(line):
            names = match.group(1).split("/")
            values = match.group(2).split("/")
            if len(names) != len(values):
                raise ValueError(f"consumer latency line with {len(names)} names and {len(values)} values: {line!r}")
            scale = _TO_US[match.group(3)]
            latency = {name: float(value) * scale for name, value in zip(names, values)}
    missing = [what for what in ("sending", "receiving") if what not in rates]
    if latency is None:
        missing.append("consumer latency")
    if missing:
        raise ValueError(f"PerfTest output has no summary {', '.join(missing)} line")
    return Summary(rates["sending"], rates["receiving"], latency)


def perftest_command(uri: str, scenario: Scenario, seconds: int, run_tag: str) -> list[str]:
    command = [
        "java", "-cp", f"{JARS}/*", PERFTEST_MAIN,
        "--uri", uri,
        "--queue-args", "x-queue-type=quorum",
        "--auto-delete", "false",
        "--flag", "persistent",
        "--confirm", "1000",
        "--qos", "1000",
        "--size", str(scenario.size),
        "--time", str(seconds),
        "--producers", str(scenario.queues * scenario.clients),
        "--consumers", str(scenario.queues * scenario.clients),
    ]
    if scenario.queues == 1:
        command += ["--queue", f"{run_tag}-1"]
    else:
        command += ["--queue-pattern", f"{run_tag}-%d",
                    "--queue-pattern-from", "1", "--queue-pattern-to", str(scenario.queues)]
    return command


def run_perftest(uri: str, scenario: Scenario, seconds: int, run_tag: str) -> Summary:
    command = perftest_command(uri, scenario, seconds, run_tag)
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300)
    try:
        return parse_summary(done.stdout)
    except ValueError as error:
        raise RuntimeError(f"PerfTest exited {done.returncode}: {error}\n"
                           f"stdout tail: {done.stdout[-1500:]}\nstderr tail: {done.stderr[-1500:]}") from None


def check_jars() -> None:
    if not list(JARS.glob("perf-test-*.jar")):
        sys.exit(f"error: no PerfTest jar in {JARS}; run `make bench-setup` first")


def start_brokers(stack: ExitStack, nodes: int, targets: list[str]) -> dict[str, str]:
    """AMQP URI of node 1 of each target, started on loopback; stopped by ``stack``."""
    from bench.brokers import quorumqueue_broker, rabbitmq_broker
    from bench.clusters import QuorumQueueCluster, RabbitMQCluster

    uris: dict[str, str] = {}
    for target in targets:
        print(f"==> starting {target} ({nodes} node{'s' if nodes > 1 else ''})", file=sys.stderr)
        if nodes == 1:
            broker = stack.enter_context(quorumqueue_broker() if target == "quorumqueue" else rabbitmq_broker())
            uris[target] = f"amqp://guest:guest@{broker.host}:{broker.port}/%2F"
        else:
            cluster = stack.enter_context(
                QuorumQueueCluster(nodes) if target == "quorumqueue" else RabbitMQCluster(nodes))
            uris[target] = cluster.uris()[0]
    return uris


def measure(scenarios: list[Scenario], nodes: int, targets: list[str], seconds: int,
            repeats: int) -> list[dict]:
    rows = []
    with ExitStack() as stack:
        uris = start_brokers(stack, nodes, targets)
        for scenario in scenarios:
            runs: dict[str, list[Summary]] = {target: [] for target in targets}
            for repeat in range(repeats):
                for target in targets:  # A/B pairs: quorumqueue then RabbitMQ, each repeat
                    tag = f"pt-{scenario.name}-{nodes}n-{repeat}-{int(time.time())}"
                    summary = run_perftest(uris[target], scenario, seconds, tag)
                    print(f"    {nodes}n {scenario.name:9} {target:11} run {repeat + 1}: "
                          f"sent {summary.sending:8.0f}  received {summary.receiving:8.0f} msg/s  "
                          f"latency p50 {summary.latency_us['median'] / 1000:7.1f} "
                          f"p99 {summary.latency_us['99th'] / 1000:7.1f} ms", file=sys.stderr)
                    runs[target].append(summary)
            for target in targets:
                got = runs[target]
                rows.append({
                    "nodes": nodes, "scenario": scenario.name, "queues": scenario.queues,
                    "size": scenario.size, "target": target, "seconds": seconds, "repeats": repeats,
                    "sending": statistics.median(s.sending for s in got),
                    "receiving": statistics.median(s.receiving for s in got),
                    "latency_p50_us": statistics.median(s.latency_us["median"] for s in got),
                    "latency_p99_us": statistics.median(s.latency_us["99th"] for s in got),
                    "runs": [asdict(s) for s in got],
                })
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'nodes':>5} {'scenario':9} {'target':11} {'sent/s':>9} {'recv/s':>9} "
             f"{'p50 ms':>8} {'p99 ms':>8} {'recv ratio':>10}"]
    by_key = {(r["nodes"], r["scenario"], r["target"]): r for r in rows}
    for r in rows:
        other = by_key.get((r["nodes"], r["scenario"], "rabbitmq"))
        ratio = (f"{r['receiving'] / other['receiving']:.2f}x"
                 if r["target"] == "quorumqueue" and other and other["receiving"] else "")
        lines.append(f"{r['nodes']:>5} {r['scenario']:9} {r['target']:11} {r['sending']:9.0f} "
                     f"{r['receiving']:9.0f} {r['latency_p50_us'] / 1000:8.1f} "
                     f"{r['latency_p99_us'] / 1000:8.1f} {ratio:>10}")
    return "\n".join(lines)


def pair_ratios(rows: list[dict], key: str) -> dict[tuple[int, str], list[float]]:
    """quorumqueue / RabbitMQ of ``key`` per A/B pair, per (nodes, scenario).

    A pair is the two runs of one repeat (the ``repeat`` field of a run, else its
    position); a repeat that one target lacks (a failed run) makes no ratio.
    """
    def by_repeat(row: dict) -> dict[int, float]:
        return {run.get("repeat", index): _run_value(run, key) for index, run in enumerate(row["runs"])}

    ours = {(r["nodes"], r["scenario"]): by_repeat(r) for r in rows if r["target"] == "quorumqueue"}
    theirs = {(r["nodes"], r["scenario"]): by_repeat(r) for r in rows if r["target"] == "rabbitmq"}
    ratios = {}
    for where, our_runs in ours.items():
        their_runs = theirs.get(where, {})
        ratios[where] = [our_runs[i] / their_runs[i] for i in sorted(our_runs)
                         if i in their_runs and their_runs[i]]
    return ratios


def _run_value(run: dict, key: str) -> float:
    return run["latency_us"]["99th"] if key == "latency_p99_us" else run[key]


def plot(rows: list[dict], out_dir: Path, prefix: str = "perftest",
         subtitle: Callable[[int], str] = lambda nodes: "") -> list[Path]:
    """Per node count: received msg/s, p99 consumer latency and the quorumqueue/RabbitMQ
    ratio of both, against queue count (1 KB bodies) and against size (1 queue).

    Points are medians over the repeats, bars the min-max of the runs; the ratio panel
    takes one ratio per A/B pair (same repeat), so load shared by both runs cancels.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator

    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    rate_ratios = pair_ratios(rows, "receiving")
    latency_ratios = pair_ratios(rows, "latency_p99_us")
    for nodes in sorted({r["nodes"] for r in rows}):
        for axis, label, keep in (
            ("queues", "queues (1 KB bodies)",
             lambda r: r["size"] == 1024 and r.get("clients", 1) == 1),
            ("size", "message size, bytes (1 queue)",
             lambda r: r["queues"] == 1 and r.get("clients", 1) == 1),
            ("clients", "producers and consumers of each (1 queue, 1 KB bodies)",
             lambda r: r["queues"] == 1 and r["size"] == 1024),
        ):
            chosen = [r for r in rows if r["nodes"] == nodes and keep(r) and r["runs"]]
            if len({r.get(axis, 1) for r in chosen}) < 2:
                continue
            figure, (rate_ax, latency_ax, ratio_ax) = plt.subplots(1, 3, figsize=(15, 4.4))
            for target in TARGETS:
                mine = sorted((r for r in chosen if r["target"] == target), key=lambda r: r.get(axis, 1))
                if not mine:
                    continue
                xs = [r.get(axis, 1) for r in mine]
                for ax, key, scale in ((rate_ax, "receiving", 1.0), (latency_ax, "latency_p99_us", 1000.0)):
                    values = [[_run_value(run, key) / scale for run in r["runs"]] for r in mine]
                    middle = [statistics.median(v) for v in values]
                    ax.errorbar(xs, middle, yerr=[[m - min(v) for m, v in zip(middle, values)],
                                                  [max(v) - m for m, v in zip(middle, values)]],
                                marker="o", capsize=3, label=target)
            for key, name in (("receiving", "received msg/s"), ("latency_p99_us", "p99 latency")):
                ratios = rate_ratios if key == "receiving" else latency_ratios
                points = sorted((r.get(axis, 1), ratios.get((nodes, r["scenario"]), []))
                                for r in chosen if r["target"] == "quorumqueue")
                points = [(x, v) for x, v in points if v]
                if not points:
                    continue
                xs = [x for x, _ in points]
                middle = [statistics.median(v) for _, v in points]
                ratio_ax.errorbar(xs, middle, yerr=[[m - min(v) for m, (_, v) in zip(middle, points)],
                                                    [max(v) - m for m, (_, v) in zip(middle, points)]],
                                  marker="o" if key == "receiving" else "s", capsize=3,
                                  label=f"{name} (higher is better)" if key == "receiving"
                                  else f"{name} (lower is better)")
            ratio_ax.axhline(1.0, color="grey", linewidth=1)
            ratio_ax.axhline(1.5, color="grey", linewidth=1, linestyle="--")
            ratio_ax.set_yscale("log")
            ratio_ax.yaxis.set_major_formatter(FormatStrFormatter("%.2g"))
            ratio_ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
            ratio_ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2g"))
            for ax, ylabel in ((rate_ax, "received msg/s"), (latency_ax, "consumer latency p99, ms"),
                               (ratio_ax, "quorumqueue / RabbitMQ, per A/B pair")):
                ax.set_xscale("log")
                ax.set_xlabel(label)
                ax.set_ylabel(ylabel)
                ax.grid(True, alpha=0.3, which="both")
                ax.legend(fontsize=8)
            rate_ax.set_yscale("log")
            latency_ax.set_yscale("log")
            shape = "N producers and N consumers on 1 queue" if axis == "clients" \
                else "PerfTest 1P/1C per queue"
            figure.suptitle(f"{shape}, quorum queues, {nodes} node{'s' if nodes > 1 else ''}: "
                            f"persistent, confirm 1000, qos 1000; median, bars min-max"
                            + (f"\n{subtitle(nodes)}" if subtitle(nodes) else ""), fontsize=10)
            figure.tight_layout()
            path = out_dir / f"{prefix}_{nodes}n_by_{axis}.png"
            figure.savefig(path, dpi=90)
            plt.close(figure)
            written.append(path)
    return written


def node_counts(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """`--nodes` ("1,3") as node counts; a usage error (exit 2) naming the value otherwise."""
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        parser.error(f"--nodes must be comma-separated integers, not {text!r}")
    if any(n < 1 for n in counts):
        parser.error("--nodes must be at least 1")
    return counts


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="quick",
                        help="quick, all, or comma-separated names: " + ", ".join(SCENARIOS))
    parser.add_argument("--nodes", default="1", help="comma-separated node counts, e.g. 1,3")
    parser.add_argument("--time", type=int, default=10, help="seconds per PerfTest run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per target and scenario (median)")
    parser.add_argument("--target", choices=("both", *TARGETS), default="both")
    parser.add_argument("--json", type=Path, help="write the rows (and every run) here")
    parser.add_argument("--plots", type=Path, default=REPO_ROOT / "bench" / "results",
                        help="directory for the PNGs")
    parser.add_argument("--replot", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: table and plots from the rows of earlier --json files")
    arguments = parser.parse_args(argv)
    if arguments.scenarios == "quick":
        names = list(QUICK)
    elif arguments.scenarios == "all":
        names = list(SCENARIOS)
    else:
        names = [name.strip() for name in arguments.scenarios.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown or not names:
        parser.error(f"unknown scenario(s) {unknown}; known: quick, all, {', '.join(SCENARIOS)}")
    arguments.scenario_list = [SCENARIOS[name] for name in names]
    arguments.node_list = node_counts(parser, arguments.nodes)
    if arguments.time < 1 or arguments.repeats < 1:
        parser.error("--time and --repeats must be at least 1")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    if arguments.replot:
        rows = [row for path in arguments.replot for row in json.loads(path.read_text())]
        print(table(rows))
        for path in plot(rows, arguments.plots):
            print(f"wrote {path}", file=sys.stderr)
        return
    check_jars()
    targets = list(TARGETS) if arguments.target == "both" else [arguments.target]
    rows: list[dict] = []
    for nodes in arguments.node_list:
        rows += measure(arguments.scenario_list, nodes, targets, arguments.time, arguments.repeats)
    print(table(rows))
    if arguments.json:
        arguments.json.write_text(json.dumps(rows, indent=2))
    for path in plot(rows, arguments.plots):
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
