"""The broker's CPU per message as clients are added to one quorum queue.

    python bench/many_clients.py [--shapes 1x1,10x10] [--seconds 30] [--pairs 3]
        [--tree A=/path/to/checkout --tree B=/path/to/other] [--json PATH]

Issue 31 (Build 5): measured from outside, the broker's CPU per message rose 60% from
1 producer + 1 consumer to 10 + 10 on one quorum queue (RabbitMQ 3.10.8: +7%). Each
run starts a fresh node (default settings, its own data directory) in a process session
of its own (setsid) and runs one PerfTest in its own session:

    --quorum-queue --queue q -s 1000 -z SECONDS -x P -y C -c 1000 -q 1000

(1 KB persistent messages, publisher confirms with 1000 unconfirmed at most per
producer, prefetch 1000 per consumer, an ack per message.) The node's CPU is user +
system ticks of /proc/PID/stat from just before PerfTest starts to just after it ends,
divided by the messages consumed (PerfTest's receiving rate avg times SECONDS).

With ``--tree NAME=PATH`` (repeatable) the node runs from that checkout (a directory
holding the package, put first on PYTHONPATH as ``quorumqueue``), or with
``NAME=rabbitmq`` is RabbitMQ 3.10.8 (a private node, its CPU that of its processes);
the runs of one pair alternate the trees, the order swapped every other pair, each
shape in turn. Without it, the tree this file is in. Needs `make bench-setup` (PerfTest's jars) and Java 11+.
Progress to stderr, the table (medians and ranges per tree and shape) to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.loop_lag import rates  # noqa: E402
from bench.perftest import JARS, PERFTEST_MAIN, check_jars  # noqa: E402
from bench.process_cpu import process_cpu  # noqa: E402


RABBITMQ = Path("rabbitmq")  # --tree NAME=rabbitmq: RabbitMQ 3.10.8 (tests/support/rabbitmq.py)


def perftest_arguments(producers: int, consumers: int, seconds: int) -> list[str]:
    return ["--quorum-queue", "--queue", "q", "-s", "1000", "-z", str(seconds),
            "-x", str(producers), "-y", str(consumers), "-c", "1000", "-q", "1000"]


def python_path(tree: Path) -> str:
    """A directory whose ``quorumqueue`` is `tree` (the checkout's own name may differ)."""
    holder = Path(tempfile.gettempdir()) / f"many-clients-{zlib.crc32(str(tree).encode()):08x}"
    holder.mkdir(exist_ok=True)
    link = holder / "quorumqueue"
    if not link.is_symlink() or link.resolve() != tree.resolve():
        link.unlink(missing_ok=True)
        link.symlink_to(tree.resolve())
    return str(holder)


def one_run(tree: Path, producers: int, consumers: int, seconds: int) -> dict:
    """One PerfTest run against a fresh node of `tree` (RABBITMQ: RabbitMQ 3.10.8)."""
    if tree == RABBITMQ:
        from tests.support.rabbitmq import RabbitMQNode, processes_with_marker

        with RabbitMQNode() as node:  # in a session of its own (its launcher's)
            def cpu() -> float:  # beam.smp and its helpers, with what they reaped
                return sum(process_cpu(pid) for pid in processes_with_marker(node.node_name))
            return _measure(node.uri, cpu, producers, consumers, seconds)
    from tests.support.broker import BrokerProcess

    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = python_path(tree)
    broker = BrokerProcess(new_session=True)
    try:
        broker.start(timeout=120)
        pid = broker.process.pid
        return _measure(broker.uri, lambda: process_cpu(pid), producers, consumers, seconds)
    finally:
        broker.cleanup()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def _measure(uri: str, cpu, producers: int, consumers: int, seconds: int) -> dict:
    load = os.getloadavg()[0]
    command = ["java", "-cp", f"{JARS}/*", PERFTEST_MAIN, "--uri", uri,
               *perftest_arguments(producers, consumers, seconds)]
    cpu_before = cpu()
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300,
                          start_new_session=True)
    used = cpu() - cpu_before
    if "test stopped" not in done.stdout:
        raise RuntimeError(f"PerfTest exited {done.returncode}:\n{done.stdout[-1500:]}\n"
                           f"{done.stderr[-1500:]}")
    got = rates(done.stdout)
    messages = got["receiving"] * seconds
    return {"producers": producers, "consumers": consumers, "seconds": seconds,
            "sending": got["sending"], "receiving": got["receiving"],
            "node_cpu_s": used, "cpu_us_per_message": used / messages * 1e6,
            "load_1m": load}


def summary(rows: list[dict]) -> str:
    lines = [f"{'tree':6} {'shape':6} {'runs':>4} {'recv msg/s median (range)':>28} "
             f"{'node cpu us/msg median (range)':>32}"]
    keys = sorted({(r["tree"], r["producers"], r["consumers"]) for r in rows})
    for tree, producers, consumers in keys:
        got = [r for r in rows if (r["tree"], r["producers"], r["consumers"])
               == (tree, producers, consumers)]
        rate = [r["receiving"] for r in got]
        cpu = [r["cpu_us_per_message"] for r in got]
        lines.append(
            f"{tree:6} {producers}x{consumers:<4} {len(got):4} "
            f"{statistics.median(rate):>10,.0f} ({min(rate):,.0f}-{max(rate):,.0f})".ljust(49)
            + f"{statistics.median(cpu):>10.1f} ({min(cpu):.1f}-{max(cpu):.1f})")
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="1x1,10x10", help="PRODUCERSxCONSUMERS, comma-separated")
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args(argv)
    try:
        arguments.shape_list = [tuple(int(n) for n in shape.split("x"))
                                for shape in arguments.shapes.split(",")]
        arguments.trees = [(name, Path(path)) for name, path in
                           (tree.split("=", 1) for tree in arguments.tree)] or [("this", REPO_ROOT)]
    except ValueError:
        parser.error("--shapes is PxC,... and --tree NAME=PATH")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    check_jars()
    print("reproduce: .venv/bin/python bench/many_clients.py " + " ".join(sys.argv[1:]),
          file=sys.stderr)
    rows = []
    for pair in range(arguments.pairs):
        trees = arguments.trees if pair % 2 == 0 else arguments.trees[::-1]
        for producers, consumers in arguments.shape_list:
            for name, tree in trees:
                row = {"tree": name, "pair": pair,
                       **one_run(tree, producers, consumers, arguments.seconds)}
                rows.append(row)
                print(f"    pair {pair + 1} {name} {producers}x{consumers}: "
                      f"{row['receiving']:,.0f} msg/s, {row['cpu_us_per_message']:.1f} us/msg, "
                      f"load {row['load_1m']:.1f}, {time.strftime('%H:%M:%S')}", file=sys.stderr)
    print(summary(rows))
    if arguments.json:
        arguments.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
