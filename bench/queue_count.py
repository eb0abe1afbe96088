"""Many quorum queues, quorumqueue beside RabbitMQ 3.10.8: declare cost, idle CPU, latency.

    python bench/queue_count.py [--queues 10000] [--block 1000] [--idle 30] [--pairs 1]
        [--nodes 3] [--target quorumqueue] [--json PATH]

What a node's cost does with the number of quorum queues it holds (issue 31 Build 2,
"costs that follow the work"), one blocking pika channel in a loader process:

- **declare**: `--queues` durable quorum queues, one after the other, each waiting
  for its declare-ok: milliseconds and broker CPU milliseconds per declare for each
  block of `--block` (the first 1,000, the 1,001st-2,000th, ...), so a cost that
  grows with the number of queues shows as a rising row;
- **idle**: then nothing for `--idle` seconds (the loader's connection open, no
  heartbeats): the broker's CPU over that time, as a share of one core;
- **publish+get**: one persistent message published with confirms to a queue in
  the middle, then fetched with basic.get, `--probes` times: the median round trip
  of each, milliseconds;
- **delete**: every queue deleted, milliseconds and broker CPU per delete for the
  first and the last block.

Broker CPU is its process's user + system time from /proc (with its reaped
children's: beam.smp for RabbitMQ). With `--nodes 3` each kind is a 3-node cluster on
loopback (bench/clusters.py), the loader declares through the first node, the CPU
figures are the sum over the nodes, and the idle phase also gives each node's share
of a core (`idle node N %`); bench/clusters.py starts the nodes, not in sessions of
their own. On one node each broker and the loader run in a process session of their
own (setsid), as bench/metadata_ops.py does (the loader always does). A pair is one
fresh broker (or cluster) of each kind, one after the other, the order alternating
from pair to pair.
The 1-minute load average before each broker is printed: on a loaded machine wall
times say how the two compare there; broker CPU is the steadier figure. Progress goes
to stderr, the table to stdout.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.metadata_ops import measure_with, pair_parser  # noqa: E402
from bench.process_cpu import process_cpu  # noqa: E402

TARGETS = ("quorumqueue", "rabbitmq")


# ---------------------------------------------------------------- the loader

def run_loader(port: int, broker_pids: list[int], queues: int, block: int, idle: float,
               probes: int) -> dict:
    """The phases against the broker at `port` (this process is the loader, in a
    session of its own): seconds and broker CPU seconds of each, summed over
    `broker_pids` (a cluster's nodes; the idle phase also per node)."""
    import pika

    def broker_cpu() -> float:
        return sum(process_cpu(pid) for pid in broker_pids)

    def connect():
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=port, heartbeat=0, blocked_connection_timeout=3600))
        return connection, connection.channel()

    connection, channel = connect()

    def timed(action) -> tuple[float, float]:
        cpu, began = broker_cpu(), time.perf_counter()
        action()
        return time.perf_counter() - began, broker_cpu() - cpu

    names = [f"bench-qc-{number}" for number in range(queues)]
    result: dict = {"declare": [], "delete": []}
    declared: list[str] = []
    for first in range(1, queues + 1, block):
        chunk = names[first - 1:first - 1 + block]

        def declare(chunk=chunk) -> None:
            for name in chunk:
                channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
                declared.append(name)

        try:
            seconds, cpu = timed(declare)
        except pika.exceptions.AMQPError as error:  # the broker refused one: say so, go on
            result["failed"] = {"declared": len(declared), "error": repr(error)}
            print(f"  declare {len(declared) + 1} failed: {error!r}", file=sys.stderr,
                  flush=True)
            connection, channel = connect()
            break
        result["declare"].append({"first": first, "last": first + len(chunk) - 1,
                                  "operations": len(chunk), "seconds": seconds, "cpu": cpu})
        print(f"  declared {first + len(chunk) - 1}: {seconds / len(chunk) * 1000:.2f} ms, "
              f"CPU {cpu / len(chunk) * 1000:.2f} ms each", file=sys.stderr, flush=True)
    names = declared
    result["queues"] = len(names)
    chunks = [names[start:start + block] for start in range(0, len(names), block)]

    nodes_before = [process_cpu(pid) for pid in broker_pids]
    seconds, cpu = timed(lambda: time.sleep(idle))
    per_node = [process_cpu(pid) - before for pid, before in zip(broker_pids, nodes_before)]
    result["idle"] = {"seconds": seconds, "cpu": cpu, "per_node": per_node}
    print(f"  idle with {len(names)}: {cpu / seconds * 100:.1f}% of a core"
          + (" (" + ", ".join(f"{node / seconds * 100:.1f}%" for node in per_node) + ")"
             if len(per_node) > 1 else ""), file=sys.stderr, flush=True)

    channel.confirm_delivery()
    target = names[len(names) // 2]
    publishes, gets = [], []
    for number in range(probes):
        began = time.perf_counter()
        channel.basic_publish("", target, b"probe %d" % number,
                              pika.BasicProperties(delivery_mode=2))
        publishes.append(time.perf_counter() - began)
        began = time.perf_counter()
        method, _properties, body = channel.basic_get(target, auto_ack=True)
        gets.append(time.perf_counter() - began)
        if method is None or body != b"probe %d" % number:
            raise SystemExit(f"basic.get on {target} returned {method!r} {body!r}")
    result["publish"] = publishes
    result["get"] = gets

    for first, chunk in zip(range(1, len(names) + 1, block), chunks):
        def delete(chunk=chunk) -> None:
            for name in chunk:
                channel.queue_delete(name)

        seconds, cpu = timed(delete)
        result["delete"].append({"first": first, "last": first + len(chunk) - 1,
                                 "operations": len(chunk), "seconds": seconds, "cpu": cpu})
    connection.close()
    return result


# ---------------------------------------------------------------- the driver

def measure(target: str, arguments) -> dict:
    """One fresh broker (or cluster, `--nodes`) of `target` and one loader against it,
    the loader in its own session (and a lone broker too)."""
    options = ["--queues", str(arguments.queues), "--block", str(arguments.block),
               "--idle", str(arguments.idle), "--probes", str(arguments.probes)]
    if arguments.nodes == 1:
        return measure_with(target, __file__, options, timeout=4 * 3600)
    from urllib.parse import urlparse

    from bench.broker_memory import beam_pid
    from bench.clusters import QuorumQueueCluster, RabbitMQCluster

    kind = QuorumQueueCluster if target == "quorumqueue" else RabbitMQCluster
    with kind(arguments.nodes) as cluster:
        if target == "quorumqueue":
            pids = [cluster.local.pid(name) for name in cluster.names]
        else:
            pids = [beam_pid(member) for member in cluster.members]
        port = urlparse(cluster.uris()[0]).port
        command = [sys.executable, __file__, "--loader", "--port", str(port),
                   "--broker-pid", ",".join(map(str, pids)), *options]
        done = subprocess.run(command, stdout=subprocess.PIPE, start_new_session=True,
                              timeout=4 * 3600, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{target}: the loader failed (exit {done.returncode})")
        return json.loads(done.stdout)


def rows(result: dict) -> dict[str, tuple[float, float]]:
    """name -> (wall ms, broker CPU ms) per operation; idle: (seconds, % of a core)."""
    found = {}
    for block in result["declare"]:
        found[f"declare {block['first']}-{block['last']}"] = (
            block["seconds"] / block["operations"] * 1000,
            block["cpu"] / block["operations"] * 1000)
    idle = result["idle"]
    found["idle CPU %"] = (idle["seconds"], idle["cpu"] / idle["seconds"] * 100)
    if len(idle.get("per_node", ())) > 1:
        for number, cpu in enumerate(idle["per_node"], 1):
            found[f"idle node {number} %"] = (idle["seconds"], cpu / idle["seconds"] * 100)
    found["publish+confirm"] = (statistics.median(result["publish"]) * 1000, 0.0)
    found["basic.get"] = (statistics.median(result["get"]) * 1000, 0.0)
    for block in (result["delete"][0], result["delete"][-1]):
        found[f"delete {block['first']}-{block['last']}"] = (
            block["seconds"] / block["operations"] * 1000,
            block["cpu"] / block["operations"] * 1000)
    return found


def report(pairs: list[dict], loads: list[float], targets: tuple[str, ...]) -> str:
    lines = [f"{len(pairs)} pair(s), 1-minute load before each broker: "
             + ", ".join(f"{load:.1f}" for load in loads),
             "wall ms / broker CPU ms per operation (medians of the pairs; idle: seconds / "
             "% of one core; latencies: median of the probes)", ""]
    lines.append(f"{'':<22}" + "".join(f"{target:>26}" for target in targets)
                 + ("   wall qq/RMQ  CPU qq/RMQ" if len(targets) == 2 else ""))
    names = list(dict.fromkeys(name for pair in pairs for target in targets
                               for name in rows(pair[target])))
    for name in names:
        medians = {}
        for target in targets:
            values = [found[name] for pair in pairs
                      if name in (found := rows(pair[target]))]
            medians[target] = ((statistics.median(v[0] for v in values),
                                statistics.median(v[1] for v in values)) if values else None)
        line = f"{name:<22}" + "".join(
            f"{medians[t][0]:>14.2f} / {medians[t][1]:>8.2f}" if medians[t] else f"{'-':>25}"
            for t in targets)
        if len(targets) == 2 and all(medians.values()):
            qq, rmq = medians["quorumqueue"], medians["rabbitmq"]
            line += f"{qq[0] / rmq[0]:>13.2f}x"
            line += f"{qq[1] / rmq[1]:>11.2f}x" if rmq[1] else ""
        lines.append(line)
    for number, pair in enumerate(pairs, 1):
        for target in targets:
            failed = pair[target].get("failed")
            if failed:
                lines.append(f"pair {number} {target}: declare {failed['declared'] + 1} "
                             f"failed ({failed['error']}); the later phases ran with "
                             f"{failed['declared']} queues")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = pair_parser(__doc__, pairs=1, queues=10000, block=1000)
    parser.add_argument("--idle", type=float, default=30.0,
                        help="seconds of idle CPU measured with the queues declared")
    parser.add_argument("--probes", type=int, default=5, help="publish+get round trips")
    parser.add_argument("--nodes", type=int, choices=(1, 3), default=1,
                        help="1 (default) or 3: a cluster of each kind, declares through "
                             "its first node, CPU summed over its nodes")
    arguments = parser.parse_args(argv)
    if arguments.loader:
        pids = [int(pid) for pid in str(arguments.broker_pid).split(",")]
        print(json.dumps(run_loader(arguments.port, pids, arguments.queues,
                                    arguments.block, arguments.idle, arguments.probes)))
        return
    targets = tuple(arguments.target or TARGETS)
    pairs, loads = [], []
    for number in range(arguments.pairs):
        order = targets if number % 2 == 0 else tuple(reversed(targets))
        pair = {}
        for target in order:
            loads.append(os.getloadavg()[0])
            print(f"pair {number + 1}: {target} (load {loads[-1]:.1f})", file=sys.stderr,
                  flush=True)
            pair[target] = measure(target, arguments)
            if arguments.json:  # after each broker: a later failure keeps what was measured
                Path(arguments.json).write_text(json.dumps(
                    {"loads": loads, "pairs": [*pairs, pair]}, indent=1))
        pairs.append(pair)
    print(report(pairs, loads, targets))


if __name__ == "__main__":
    main()
