"""How cost grows: PerfTest's msg/s and p99 latency against queue count, body size and
clients per queue, quorumqueue beside RabbitMQ 3.10.8, on 1 and 3 nodes, in one run.

    python bench/perftest_curves.py [--nodes 1,3] [--queues 1,10,100]
        [--sizes 16,1024,65536,1048576] [--clients 1,10,50] [--time 10] [--repeats 3]
        [--out bench/results]
    python bench/perftest_curves.py --replot RUN1.json [RUN2.json ...]

The sweep of issue 18's item 1, built on ``bench/perftest.py`` (its PerfTest command,
summary parser, broker start and plots): per node count, both brokers (or both
clusters) are started once and stay up together; then for every point of the grid --
body size on 1 queue (``--sizes``), then producers and consumers on 1 queue at 1 KB
(``--clients``), then queue count at 1 KB bodies (``--queues``) --
``--repeats`` A/B pairs run, one PerfTest run per broker each, the order swapped every
other pair (A B, B A, A B ...) so neither broker always runs second. Each run is
PerfTest's default shape per queue, 1 producer and 1 consumer (N of each on the
``--clients`` axis) publishing and consuming at once for ``--time`` seconds, with
perftest.py's quorum-queue flags.

Output, in ``--out``: ``perftest_curves.json`` (one row per node count, scenario and
broker with the medians, and every run with its pair number and the 1-minute load
average before it), ``perftest_curves.csv`` (one line per run, plus the pair's
quorumqueue/RabbitMQ ratios on quorumqueue's lines), three PNGs per node count,
``perftest_curves_<N>n_by_queues.png``, ``..._by_size.png`` and ``..._by_clients.png``
(perftest.plot: medians
with min-max bars, and the per-pair ratio), and ``perftest_curves_ratio_vs_load.png``:
each pair's ratio against the machine's load average when it ran (with ``--replot``,
the pairs of every file given, also the rows a later file replaced). A failed PerfTest run is reported and
recorded (``failures``) and the sweep goes on; its pair makes no ratio.

Progress (each run, with elapsed time and an estimate of what is left) goes to stderr,
the table to stdout.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import perftest  # noqa: E402 - after the path is set
from bench.perftest import TARGETS, Scenario  # noqa: E402

SIZE_NAMES = {16: "16b", 1024: "1kb", 65536: "64kb", 1048576: "1mib"}
RUN_OVERHEAD_S = 6.0  # JVM start, connections, queue declarations: for the estimate only


def size_name(size: int) -> str:
    return SIZE_NAMES.get(size, f"{size}b")


def grid(queue_counts: list[int], sizes: list[int],
         client_counts: list[int] = (1,)) -> list[Scenario]:
    """Sizes on 1 queue, then clients per queue on 1 queue at 1 KB, then queue counts at
    1 KB, fewest first; a point on several axes once. The most queues come last: a
    broker that a point overwhelms (3 nodes, 100 queues, 2026-11-27: node 1 stopped
    answering handshakes) then costs no other point."""
    points = ([(1, size, 1) for size in sizes]
              + [(1, 1024, clients) for clients in sorted(client_counts)]
              + [(queues, 1024, 1) for queues in sorted(queue_counts)])
    unique = list(dict.fromkeys(points))
    return [Scenario(scenario_name(queues, size, clients), queues, size, clients)
            for queues, size, clients in unique]


def scenario_name(queues: int, size: int, clients: int) -> str:
    """"10q-1kb"; with more than one producer and consumer per queue, "1q-1kb-10c"."""
    name = f"{queues}q-{size_name(size)}"
    return name if clients == 1 else f"{name}-{clients}c"


def pair_order(repeat: int, targets: list[str]) -> list[str]:
    """A B for even pairs, B A for odd ones."""
    return list(targets) if repeat % 2 == 0 else list(reversed(targets))


class Progress:
    def __init__(self, total_runs: int, seconds: int) -> None:
        self.total = total_runs
        self.done = 0
        self.began = time.monotonic()
        self.guess = seconds + RUN_OVERHEAD_S

    def step(self, text: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.began
        per_run = elapsed / self.done if self.done else self.guess
        left = (self.total - self.done) * per_run
        print(f"[{self.done:3}/{self.total}] {elapsed / 60:5.1f} min, ~{left / 60:4.1f} min left  {text}",
              file=sys.stderr, flush=True)


def sweep(node_counts: list[int], scenarios: list[Scenario], targets: list[str], seconds: int,
          repeats: int) -> list[dict]:
    progress = Progress(len(node_counts) * len(scenarios) * repeats * len(targets), seconds)
    rows: list[dict] = []
    for nodes in node_counts:
        with ExitStack() as stack:
            uris = perftest.start_brokers(stack, nodes, targets)
            for scenario in scenarios:
                runs: dict[str, list[dict]] = {target: [] for target in targets}
                failures: dict[str, list[str]] = {target: [] for target in targets}
                for repeat in range(repeats):
                    for target in pair_order(repeat, targets):
                        tag = f"pc-{scenario.name}-{nodes}n-{repeat}-{target[0]}-{int(time.time())}"
                        load = os.getloadavg()[0]
                        try:
                            summary = perftest.run_perftest(uris[target], scenario, seconds, tag)
                        except (RuntimeError, OSError, TimeoutError) as error:
                            failures[target].append(f"pair {repeat}: {error}")
                            progress.step(f"{nodes}n {scenario.name:9} {target:11} pair {repeat + 1}: "
                                          f"FAILED {str(error).splitlines()[0]}")
                            continue
                        except Exception as error:  # subprocess.TimeoutExpired and the like
                            failures[target].append(f"pair {repeat}: {type(error).__name__}: {error}")
                            progress.step(f"{nodes}n {scenario.name:9} {target:11} pair {repeat + 1}: "
                                          f"FAILED {type(error).__name__}")
                            continue
                        runs[target].append({**asdict(summary), "repeat": repeat, "load1": load})
                        progress.step(f"{nodes}n {scenario.name:9} {target:11} pair {repeat + 1}: "
                                      f"recv {summary.receiving:8.0f} msg/s  p99 "
                                      f"{summary.latency_us['99th'] / 1000:8.1f} ms  (load {load:.1f})")
                for target in targets:
                    rows.append(summary_row(nodes, scenario, target, seconds, repeats,
                                            runs[target], failures[target]))
    return rows


def summary_row(nodes: int, scenario: Scenario, target: str, seconds: int, repeats: int,
                runs: list[dict], failures: list[str]) -> dict:
    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    return {
        "nodes": nodes, "scenario": scenario.name, "queues": scenario.queues, "size": scenario.size,
        "clients": scenario.clients,
        "target": target, "seconds": seconds, "repeats": repeats,
        "sending": median([r["sending"] for r in runs]),
        "receiving": median([r["receiving"] for r in runs]),
        "latency_p50_us": median([r["latency_us"]["median"] for r in runs]),
        "latency_p99_us": median([r["latency_us"]["99th"] for r in runs]),
        "runs": runs, "failures": failures,
    }


CSV_FIELDS = ("nodes", "queues", "size", "clients", "target", "pair", "load1", "sending", "receiving",
              "latency_p50_us", "latency_p99_us", "recv_ratio_pair", "p99_ratio_pair")


def csv_lines(rows: list[dict]) -> list[dict]:
    """One line per run; quorumqueue's lines carry their pair's ratios to RabbitMQ."""
    rabbit = {(r["nodes"], r["scenario"]): {run.get("repeat", i): run for i, run in enumerate(r["runs"])}
              for r in rows if r["target"] == "rabbitmq"}
    lines = []
    for row in rows:
        for index, run in enumerate(row["runs"]):
            pair = run.get("repeat", index)
            other = rabbit.get((row["nodes"], row["scenario"]), {}).get(pair) \
                if row["target"] == "quorumqueue" else None
            lines.append({
                "nodes": row["nodes"], "queues": row["queues"], "size": row["size"],
                "clients": row.get("clients", 1), "target": row["target"], "pair": pair, "load1": run.get("load1", ""),
                "sending": run["sending"], "receiving": run["receiving"],
                "latency_p50_us": run["latency_us"]["median"], "latency_p99_us": run["latency_us"]["99th"],
                "recv_ratio_pair": round(run["receiving"] / other["receiving"], 3)
                if other and other["receiving"] else "",
                "p99_ratio_pair": round(run["latency_us"]["99th"] / other["latency_us"]["99th"], 3)
                if other and other["latency_us"]["99th"] else "",
            })
    return lines


def table(rows: list[dict]) -> str:
    """Medians with min-max, and the median of the per-pair ratios."""
    rate_ratios = perftest.pair_ratios(rows, "receiving")
    latency_ratios = perftest.pair_ratios(rows, "latency_p99_us")
    lines = [f"{'nodes':>5} {'scenario':10} {'target':11} {'recv/s (min-max)':>24} "
             f"{'p99 ms (min-max)':>24} {'recv ratio':>10} {'p99 ratio':>9} {'failed':>6}"]
    for r in rows:
        received = [run["receiving"] for run in r["runs"]]
        p99 = [run["latency_us"]["99th"] / 1000 for run in r["runs"]]
        rate = f"{statistics.median(received):8.0f} ({min(received):.0f}-{max(received):.0f})" if received else "-"
        latency = f"{statistics.median(p99):8.1f} ({min(p99):.0f}-{max(p99):.0f})" if p99 else "-"
        where = (r["nodes"], r["scenario"])
        ratio = p99_ratio = ""
        if r["target"] == "quorumqueue" and rate_ratios.get(where):
            ratio = f"{statistics.median(rate_ratios[where]):.2f}x"
            p99_ratio = f"{statistics.median(latency_ratios[where]):.2f}x" if latency_ratios.get(where) else ""
        lines.append(f"{r['nodes']:>5} {r['scenario']:10} {r['target']:11} {rate:>24} {latency:>24} "
                     f"{ratio:>10} {p99_ratio:>9} {len(r.get('failures', [])):>6}")
    return "\n".join(lines)


def load_subtitle(rows: list[dict], nodes: int) -> str:
    loads = [run["load1"] for r in rows if r["nodes"] == nodes for run in r["runs"] if "load1" in run]
    if not loads:
        return ""
    return (f"2 vCPUs shared with other work: 1-min load average {min(loads):.1f}-{max(loads):.1f} "
            f"(median {statistics.median(loads):.1f}) before the runs; {rows[0]['seconds']} s per run")


def pair_points(rows: list[dict]) -> list[tuple[int, str, float, float]]:
    """(nodes, scenario, load, received ratio) per complete A/B pair; load is the mean of
    the two runs' 1-minute load averages."""
    rabbit = {(r["nodes"], r["scenario"]): {run["repeat"]: run for run in r["runs"] if "load1" in run}
              for r in rows if r["target"] == "rabbitmq"}
    points = []
    for row in rows:
        if row["target"] != "quorumqueue":
            continue
        for run in row["runs"]:
            other = rabbit.get((row["nodes"], row["scenario"]), {}).get(run.get("repeat"))
            if other and other["receiving"] and "load1" in run:
                points.append((row["nodes"], row["scenario"], (run["load1"] + other["load1"]) / 2,
                               run["receiving"] / other["receiving"]))
    return points


def plot_ratio_against_load(sweeps: list[list[dict]], path: Path) -> Path | None:
    """Every pair's received ratio against the machine's load when it ran: how much of a
    point's ratio is the broker and how much the shared cores. Pairs are taken within
    each sweep (a pair's two runs are from one sweep)."""
    points = [point for rows in sweeps for point in pair_points(rows)]
    if not points:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(8, 5))
    scenarios = list(dict.fromkeys(p[1] for p in sorted(points, key=lambda p: (p[1][-3:], p[1]))))
    for nodes, marker in ((1, "o"), (3, "^")):
        for index, scenario in enumerate(scenarios):
            mine = [p for p in points if p[0] == nodes and p[1] == scenario]
            if mine:
                ax.scatter([p[2] for p in mine], [p[3] for p in mine], marker=marker, color=f"C{index}",
                           label=f"{nodes}n {scenario}", alpha=0.8)
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.axhline(1.5, color="grey", linewidth=1, linestyle="--")
    ax.set_yscale("log")
    ax.set_xlabel("1-minute load average of the 2 vCPUs (mean of the pair's two runs)")
    ax.set_ylabel("quorumqueue / RabbitMQ received msg/s, per A/B pair")
    ax.set_title("PerfTest 1P/1C per queue: each pair's ratio against the machine's load", fontsize=10)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def write_outputs(rows: list[dict], out_dir: Path, sweeps: list[list[dict]] | None = None) -> list[Path]:
    """JSON, CSV and the plots of ``rows``; the ratio-against-load plot takes every
    sweep's pairs (``sweeps``, default ``[rows]``), also those a later sweep replaced."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "perftest_curves.json"
    json_path.write_text(json.dumps(rows, indent=1))
    csv_path = out_dir / "perftest_curves.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_lines(rows))
    written = [json_path, csv_path, *perftest.plot(rows, out_dir, prefix="perftest_curves",
                                                     subtitle=lambda nodes: load_subtitle(rows, nodes))]
    load_plot = plot_ratio_against_load(sweeps or [rows], out_dir / "perftest_curves_ratio_vs_load.png")
    return written + ([load_plot] if load_plot else [])


def merge_runs(runs: list[list[dict]]) -> list[dict]:
    """The rows of several sweeps; each node count from the last sweep that measured it."""
    newest: dict[int, list[dict]] = {}
    for rows in runs:
        for nodes in {row["nodes"] for row in rows}:
            newest[nodes] = [row for row in rows if row["nodes"] == nodes]
    return [row for nodes in sorted(newest) for row in newest[nodes]]


def integers(text: str, what: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        parser.error(f"{what} must be comma-separated integers, not {text!r}")
    if not values or any(v < 1 for v in values):
        parser.error(f"{what} must list integers of at least 1, not {text!r}")
    return values


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,3", help="comma-separated node counts")
    parser.add_argument("--queues", default="1,10,100", help="queue counts (1 KB bodies)")
    parser.add_argument("--sizes", default="16,1024,65536,1048576", help="body sizes in bytes (1 queue)")
    parser.add_argument("--clients", default="1,10,50",
                        help="producers and consumers, that many of each, on 1 queue (1 KB bodies)")
    parser.add_argument("--time", type=int, default=10, help="seconds per PerfTest run")
    parser.add_argument("--repeats", type=int, default=3, help="A/B pairs per point")
    parser.add_argument("--target", choices=("both", *TARGETS), default="both")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results",
                        help="directory for the JSON, CSV and PNGs")
    parser.add_argument("--replot", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: table, CSV and plots from earlier perftest_curves.json "
                             "files; a later file's node counts replace an earlier one's")
    arguments = parser.parse_args(argv)
    arguments.node_list = integers(arguments.nodes, "--nodes", parser)
    arguments.queue_list = integers(arguments.queues, "--queues", parser)
    arguments.size_list = integers(arguments.sizes, "--sizes", parser)
    arguments.client_list = integers(arguments.clients, "--clients", parser)
    if arguments.time < 1 or arguments.repeats < 1:
        parser.error("--time and --repeats must be at least 1")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    sweeps = None
    if arguments.replot:
        sweeps = [json.loads(path.read_text()) for path in arguments.replot]
        rows = merge_runs(sweeps)
    else:
        perftest.check_jars()
        targets = list(TARGETS) if arguments.target == "both" else [arguments.target]
        scenarios = grid(arguments.queue_list, arguments.size_list, arguments.client_list)
        print(f"==> {len(arguments.node_list)} node count(s) x {len(scenarios)} points x "
              f"{arguments.repeats} pairs, {arguments.time} s per run", file=sys.stderr)
        rows = sweep(arguments.node_list, scenarios, targets, arguments.time, arguments.repeats)
    print(table(rows))
    for path in write_outputs(rows, arguments.out, sweeps):
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
