"""Client CPU of one sink task's publishing, two connector versions A/B in one run.

    python bench/sink_client_cpu.py --a-path DIR [--messages 100000] [--size 1024]
        [--pairs 3] [--keyed | --plain]

What a sink task costs its Python worker, without Spark and without the machine's
load in the figure: a child process turns ``--messages`` rows of ``--size`` bytes
into messages with the sink's code (``to_messages``, idempotency headers included;
``--plain``: plain messages) and publishes them with the connector's
``ConfirmedPublisher`` (1,000 unconfirmed at most) to a fresh quorum queue of one
bundled broker, then prints its own CPU seconds (``time.process_time``) and the wall
rate. Version A is the connector importable from ``--a-path`` (a directory holding a
``quorumqueue`` package, e.g. an export of an older commit: see bench/README.md,
``connector_sink.py``), version B the working tree's; the pairs alternate A, B, A,
B ... on the same broker. CPU per message does not depend on what else runs on a
shared machine the way rates do (only through caches and frequency).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tests.support.broker import BrokerProcess  # noqa: E402

CHILD = """
import json, sys, time
sys.path.insert(1, {repo!r})
from bench.connector_sink import keyed_messages, quorum_queue, settle
import pika
from quorumqueue.connector import publisher as module
from quorumqueue.connector.options import parse_sink_options
from quorumqueue.connector.publisher import ConfirmedPublisher, Outgoing
uri, messages, size, keyed = {uri!r}, {messages}, {size}, {keyed}
queue = quorum_queue(uri, "bench-sink-cpu")
options = parse_sink_options({{"uri": uri, "routingKey": queue}})
body = b"x" * size
persistent = pika.BasicProperties(delivery_mode=2)
rows = (keyed_messages(options, body, messages) if keyed else
        (Outgoing(n, "", queue, body, persistent) for n in range(messages)))
cpu, wall = time.process_time(), time.perf_counter()
ConfirmedPublisher(options.addresses, False, 60.0, lambda _p: None).run(rows)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
settle(uri, queue, messages)
print(json.dumps({{"cpu_s": cpu, "rate": messages / wall, "module": module.__file__}}))
"""


def run_child(uri: str, arguments: argparse.Namespace, python_path: str | None) -> dict:
    environment = dict(os.environ)
    environment.pop("PYTHONPATH", None)
    if python_path:
        environment["PYTHONPATH"] = python_path
    code = CHILD.format(repo=str(REPO_ROOT), uri=uri, messages=arguments.messages,
                        size=arguments.size, keyed=not arguments.plain)
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the publishing child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a-path", required=True, help="PYTHONPATH of version A")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--plain", action="store_true", help="plain messages, no sink rows")
    arguments = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    with BrokerProcess() as broker:  # started by `with`
        for pair in range(1, arguments.pairs + 1):
            for side, path in (("A", arguments.a_path), ("B", None)):
                run = run_child(broker.uri, arguments, path)
                runs[side].append(run)
                print(f"pair {pair} {side}: {run['cpu_s']:.2f} CPU s, {run['rate']:,.0f} msg/s "
                      f"({run['module']})", file=sys.stderr)
    what = "plain messages" if arguments.plain else "sink rows (keys included)"
    print(f"{arguments.messages:,} x {arguments.size} B {what}, ConfirmedPublisher, "
          f"{arguments.pairs} A/B pairs; median (min-max)")
    for side in ("A", "B"):
        per_message = [run["cpu_s"] / arguments.messages * 1e6 for run in runs[side]]
        rates = [run["rate"] for run in runs[side]]
        print(f"{side}: client CPU {statistics.median(per_message):.1f} us/msg "
              f"({min(per_message):.1f}-{max(per_message):.1f}); {statistics.median(rates):,.0f} "
              f"msg/s ({min(rates):,.0f}-{max(rates):,.0f})")
    ratios = [b["cpu_s"] / a["cpu_s"] for a, b in zip(runs["A"], runs["B"])]
    print("B / A client CPU, pair by pair: " + ", ".join(f"{r:.2f}x" for r in ratios)
          + f" (median {statistics.median(ratios):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
