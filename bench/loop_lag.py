"""The node's worst event-loop lag through a big backlog and through 256 KB messages.

    python bench/loop_lag.py [--runs backlog,big] [--messages 1000000] [--size 1024]
        [--big-size 262144] [--seconds 60] [--json PATH]

Issue 31 asks that nothing holds the broker's event loop for long: every client,
Raft heartbeat and fsync result of a node waits on it, and a Raft election timeout
is 1 s. This bench loads one quorum queue on a fresh node and reads the lag from the
node's own Prometheus histogram (`quorumqueue_event_loop_lag_seconds`, a sample
every 10 ms of how late a timer ran; broker/metrics/README.md), scraped before and
after each phase:

- **backlog**: PerfTest publishes `--messages` persistent messages of `--size` bytes
  with confirms (1000 unconfirmed at most), nothing consuming (1M x 1 KB is 1 GB:
  two rollovers of the default 512 MiB write-ahead log into segment files); then one
  PerfTest consumer drains them (prefetch 1000, an ack per message);
- **big**: PerfTest's default shape, one producer and one consumer at once, for
  `--seconds`, bodies of `--big-size` bytes (256 KB: a rollover every ~2,000
  messages), confirms 1000, prefetch 1000.

Each run starts its own node (default settings, a fresh data directory, removed
after) in a process session of its own (setsid), and every PerfTest in its own
too. Per phase: the messages and rate PerfTest reports, the node's CPU per message,
the lag samples taken, how many were above 10, 50 and 100 ms, the highest bucket a
sample reached, and the node's largest lag so far (its max gauge); the 1-minute load
average before the phase. Needs `make bench-setup` (PerfTest's jars) and Java 11+.
Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.perftest import JARS, PERFTEST_MAIN, check_jars  # noqa: E402
from bench.process_cpu import process_cpu  # noqa: E402

RUNS = ("backlog", "big")
LAG = "quorumqueue_event_loop_lag_seconds"
LAG_MAX = "quorumqueue_event_loop_lag_max_seconds"
_RATE = re.compile(r"^id: \S+, (sending|receiving) rate avg: ([0-9.]+) msg/s$", re.M)
_SAMPLE = re.compile(r'^(\w+)(?:\{le="([^"]+)"\})? ([0-9.eE+-]+)$', re.M)


def scrape_lag(port: int) -> dict:
    """{"buckets": {le: cumulative count}, "count": n, "max": s} from the node's /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    buckets, found = {}, {}
    for name, le, number in _SAMPLE.findall(text):
        if name == LAG + "_bucket":
            buckets[le] = float(number)
        elif name in (LAG + "_count", LAG_MAX):
            found[name] = float(number)
    if not buckets:
        raise RuntimeError(f"the node at port {port} exports no {LAG}")
    return {"buckets": buckets, "count": found[LAG + "_count"], "max": found[LAG_MAX]}


def lag_between(before: dict, after: dict) -> dict:
    """The samples of a phase: how many, above 10/50/100 ms, the highest bucket reached."""
    def above(bound: str) -> int:
        total = after["count"] - before["count"]
        return int(total - (after["buckets"][bound] - before["buckets"][bound]))

    reached = "0"
    for bound in sorted(after["buckets"], key=lambda b: float(b)):
        if after["buckets"][bound] - before["buckets"][bound] < after["count"] - before["count"]:
            continue
        reached = bound  # every sample of the phase at or below it
        break
    return {"samples": int(after["count"] - before["count"]), "over_10ms": above("0.01"),
            "over_50ms": above("0.05"), "over_100ms": above("0.1"), "worst_le_s": reached,
            "max_so_far_s": after["max"]}


def perftest(uri: str, queue: str, arguments: list[str], timeout: float) -> tuple[str, float]:
    """Run PerfTest in its own session; (its output, wall seconds)."""
    command = ["java", "-cp", f"{JARS}/*", PERFTEST_MAIN, "--uri", uri, "--queue", queue,
               "--queue-args", "x-queue-type=quorum", "--auto-delete", "false",
               "--flag", "persistent", *arguments]
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)
    if "test stopped" not in done.stdout:
        raise RuntimeError(f"PerfTest exited {done.returncode}:\n{done.stdout[-1500:]}\n"
                           f"{done.stderr[-1500:]}")
    return done.stdout, time.monotonic() - began


def rates(output: str) -> dict[str, float]:
    return {match.group(1): float(match.group(2)) for match in _RATE.finditer(output)}


def run_phases(kind: str, arguments: argparse.Namespace) -> list[dict]:
    from tests.support.broker import BrokerProcess, free_port

    metrics_port = free_port()
    broker = BrokerProcess(new_session=True,
                           extra_config=f"prometheus.tcp.port = {metrics_port}\n")
    rows = []
    try:
        broker.start(timeout=120)
        deadline = time.monotonic() + 30
        while scrape_lag(metrics_port)["count"] < 10 and time.monotonic() < deadline:
            time.sleep(0.2)
        queue = f"loop-lag-{kind}-{int(time.time())}"
        if kind == "backlog":
            n = str(arguments.messages)
            phases = [("publish", ["--size", str(arguments.size), "--confirm", "1000",
                                   "--producers", "1", "--consumers", "0", "--pmessages", n],
                       "sending", arguments.messages),
                      ("consume", ["--size", str(arguments.size), "--predeclared",
                                   "--qos", "1000", "--producers", "0", "--consumers", "1",
                                   "--cmessages", n], "receiving", arguments.messages)]
        else:
            phases = [("1P+1C", ["--size", str(arguments.big_size), "--confirm", "1000",
                                 "--qos", "1000", "--producers", "1", "--consumers", "1",
                                 "--time", str(arguments.seconds)], "receiving", None)]
        for phase, perftest_arguments, direction, count in phases:
            load = os.getloadavg()[0]
            before, cpu_before = scrape_lag(metrics_port), process_cpu(broker.process.pid)
            output, seconds = perftest(broker.uri, queue, perftest_arguments,
                                       timeout=arguments.seconds + 3600)
            cpu = process_cpu(broker.process.pid) - cpu_before
            after = scrape_lag(metrics_port)
            rate = rates(output).get(direction, 0.0)
            messages = count if count is not None else rate * arguments.seconds
            size = arguments.size if kind == "backlog" else arguments.big_size
            row = {"run": kind, "phase": phase, "size": size, "messages": int(messages),
                   "rate": rate, "seconds": seconds, "load_1m": load,
                   "node_cpu_s": cpu,
                   "cpu_us_per_message": cpu / messages * 1e6 if messages else None,
                   **lag_between(before, after)}
            rows.append(row)
            print(f"    {kind} {phase}: {rate:,.0f} msg/s, worst lag <= {row['worst_le_s']} s "
                  f"(max so far {row['max_so_far_s'] * 1000:.0f} ms), "
                  f"{row['over_100ms']} samples over 100 ms, load {load:.1f}", file=sys.stderr)
    finally:
        broker.cleanup()
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'run':8} {'phase':8} {'size':>7} {'messages':>9} {'msg/s':>8} {'MB/s':>6} "
             f"{'cpu us/msg':>10} {'samples':>7} {'>10ms':>5} {'>50ms':>5} {'>100ms':>6} "
             f"{'worst<=s':>8} {'max ms':>7} {'load':>5}"]
    for r in rows:
        lines.append(f"{r['run']:8} {r['phase']:8} {r['size']:7} {r['messages']:9,} "
                     f"{r['rate']:8,.0f} {r['rate'] * r['size'] / 1e6:6.0f} "
                     f"{r['cpu_us_per_message'] or 0:10.1f} {r['samples']:7} "
                     f"{r['over_10ms']:5} {r['over_50ms']:5} {r['over_100ms']:6} "
                     f"{r['worst_le_s']:>8} {r['max_so_far_s'] * 1000:7.1f} {r['load_1m']:5.1f}")
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("--messages", type=int, default=1_000_000, help="backlog messages")
    parser.add_argument("--size", type=int, default=1024, help="backlog body bytes")
    parser.add_argument("--big-size", type=int, default=262_144, help="big run body bytes")
    parser.add_argument("--seconds", type=int, default=60, help="big run duration")
    parser.add_argument("--json", type=Path, help="write the rows here")
    arguments = parser.parse_args(argv)
    arguments.run_list = [run for run in arguments.runs.split(",") if run]
    unknown = sorted(set(arguments.run_list) - set(RUNS))
    if unknown or not arguments.run_list:
        parser.error(f"--runs: unknown {', '.join(unknown) or '(none given)'}; "
                     f"known: {', '.join(RUNS)}")
    if arguments.messages < 1 or arguments.seconds < 1:
        parser.error("--messages and --seconds must be at least 1")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    check_jars()
    print("reproduce: .venv/bin/python bench/loop_lag.py " + " ".join(sys.argv[1:]),
          file=sys.stderr)
    rows = []
    for kind in arguments.run_list:
        rows += run_phases(kind, arguments)
    print(table(rows))
    if arguments.json:
        arguments.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
