"""PerfTest publishing, then consuming, one quorum queue: quorumqueue against RabbitMQ 3.10.8.

    python bench/perftest_phases.py [--nodes 1[,3]] [--messages 200000] [--size 1024]
        [--repeats 3] [--json PATH]

Issue 18 asks for its publish and consume figures with both loaders: the project's
own (bench/cluster_throughput.py, which publishes everything, then consumes it) and
RabbitMQ's PerfTest. bench/perftest.py runs PerfTest's default shape (a producer and
a consumer at once); this runs the same two phases as cluster_throughput.py with
PerfTest: per run, on a fresh durable quorum queue declared on node 1 (so its leader
is there, where PerfTest connects),

1. **publish**: one producer, `--messages` persistent messages of `--size` bytes,
   publisher confirms with 1000 unconfirmed at most (`--confirm 1000 --pmessages N
   --consumers 0`); PerfTest's "sending rate avg";
2. **consume**: one consumer draining them, prefetch 1000, an ack per message
   (PerfTest's default; `--qos 1000 --cmessages N --producers 0 --predeclared`);
   PerfTest's "receiving rate avg".

Both brokers (or both clusters of `--nodes`) stay up together; the runs alternate
quorumqueue, RabbitMQ (A/B pairs), `--repeats` of each. Printed per node count and
phase: each broker's median msg/s over the repeats and quorumqueue / RabbitMQ per
pair (median and range). Needs `make bench-setup` (PerfTest's jars); Java 11+.
Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.perftest import (JARS, PERFTEST_MAIN, TARGETS, check_jars, node_counts,  # noqa: E402
                            start_brokers)

PHASES = ("publish", "consume")
_RATE = re.compile(r"^id: \S+, (sending|receiving) rate avg: ([0-9.]+) msg/s$", re.M)


def phase_command(uri: str, queue: str, phase: str, messages: int, size: int) -> list[str]:
    command = ["java", "-cp", f"{JARS}/*", PERFTEST_MAIN, "--uri", uri, "--queue", queue,
               "--queue-args", "x-queue-type=quorum", "--auto-delete", "false",
               "--flag", "persistent", "--size", str(size)]
    if phase == "publish":
        return command + ["--confirm", "1000", "--producers", "1", "--consumers", "0",
                          "--pmessages", str(messages)]
    return command + ["--predeclared", "--qos", "1000", "--producers", "0", "--consumers", "1",
                      "--cmessages", str(messages)]


def phase_rate(output: str, phase: str) -> float:
    """PerfTest's whole-run average of the phase's direction (msg/s); ValueError
    when its summary has none (PerfTest failed)."""
    rates = {match.group(1): float(match.group(2)) for match in _RATE.finditer(output)}
    wanted = "sending" if phase == "publish" else "receiving"
    if "test stopped" not in output or not rates.get(wanted):
        raise ValueError(f"PerfTest output has no {wanted} rate")
    return rates[wanted]


def run_phase(uri: str, queue: str, phase: str, messages: int, size: int) -> float:
    done = subprocess.run(phase_command(uri, queue, phase, messages, size),
                          capture_output=True, text=True, timeout=900)
    try:
        return phase_rate(done.stdout, phase)
    except ValueError as error:
        raise RuntimeError(f"PerfTest ({phase}) exited {done.returncode}: {error}\n"
                           f"stdout tail: {done.stdout[-1500:]}\nstderr tail: {done.stderr[-1500:]}"
                           ) from None


def measure(nodes: int, messages: int, size: int, repeats: int) -> list[dict]:
    rows = []
    with ExitStack() as stack:
        uris = start_brokers(stack, nodes, list(TARGETS))
        runs: dict[tuple[str, str], list[float]] = {}
        for repeat in range(repeats):
            for target in TARGETS:  # an A/B pair per repeat
                queue = f"pt-phases-{nodes}n-{repeat}-{int(time.time() * 1000)}"
                for phase in PHASES:
                    rate = run_phase(uris[target], queue, phase, messages, size)
                    runs.setdefault((target, phase), []).append(rate)
                    print(f"    {nodes}n {target:11} run {repeat + 1} {phase:7}: {rate:9,.0f} msg/s",
                          file=sys.stderr)
        for (target, phase), rates in runs.items():
            rows.append({"nodes": nodes, "target": target, "phase": phase, "messages": messages,
                         "size": size, "median": statistics.median(rates), "runs": rates})
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'nodes':>5} {'phase':8} {'quorumqueue':>12} {'rabbitmq':>10}  "
             "quorumqueue / rabbitmq per pair: median (range)"]
    by_key = {(r["nodes"], r["target"], r["phase"]): r for r in rows}
    for nodes in sorted({r["nodes"] for r in rows}):
        for phase in PHASES:
            ours, theirs = by_key.get((nodes, "quorumqueue", phase)), by_key.get((nodes, "rabbitmq", phase))
            if ours is None or theirs is None:
                continue
            ratios = [a / b for a, b in zip(ours["runs"], theirs["runs"]) if b]
            spread = (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)"
                      if ratios else "")
            lines.append(f"{nodes:>5} {phase:8} {ours['median']:12,.0f} {theirs['median']:10,.0f}  {spread}")
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1", help="comma-separated node counts, e.g. 1,3")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--repeats", type=int, default=3, help="A/B pairs per node count")
    parser.add_argument("--json", type=Path, help="write the rows (every run too) here")
    arguments = parser.parse_args(argv)
    arguments.node_list = node_counts(parser, arguments.nodes)
    if arguments.messages < 1 or arguments.repeats < 1 or arguments.size < 0:
        parser.error("--messages and --repeats must be at least 1, --size at least 0")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    check_jars()
    rows: list[dict] = []
    for nodes in arguments.node_list:
        rows += measure(nodes, arguments.messages, arguments.size, arguments.repeats)
    print(table(rows))
    if arguments.json:
        arguments.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
