"""Issue 31's premise: does a second local process serving half the queues add throughput?

    python bench/workers_premise.py [--queues 100,10] [--messages 60000] [--rounds 3]
        [--layouts one,owner,forwarded[,workers]] [--loader loadgen|perftest]
        [--time 20] [--json PATH]

Layouts, each serving ``--queues`` durable quorum queues of one member each
(``x-quorum-initial-group-size=1``) with the same load from two loader processes,
each with half of the queues. The default loader (``loadgen``) is this script run
as ``--loader-child``: one bench.amqp_loadgen connection per queue, all in one uvloop
loop, publishing ``--messages`` (shared by the queues) persistent 1 KB messages with
confirms (1000 in flight per queue), then consuming them with prefetch 1000, checked
exactly once; the publish and consume rates are every message over the slower
loader's time for the phase. ``--loader perftest`` runs PerfTest instead
(bench/perftest.py's flags, publishing and consuming at once for ``--time`` s;
PerfTest's receiving rate), whose own CPU per message outweighs the brokers' on 2
cores.

- ``one``: a single node (no cluster configuration), every queue on it, both
  loaders connected to it.
- ``owner``: a 2-node cluster on loopback (``tests.support.cluster.LocalCluster``,
  unproxied), queue half A declared through node 1 and half B through node 2 (so
  each queue's one member is on the node that declared it: client-local); loader A
  connects to node 1, loader B to node 2: every client talks to its queues' owner.
- ``forwarded``: the same cluster and placement, both loaders connected to node 1:
  half B's publishes, settles and deliveries cross the inter-node link (what a
  single port without routing connections to their owner would do).
- ``workers`` (not in the default ``--layouts``): one node of ``broker.workers = 2``
  (broker/server/workers.py), both loaders on its one port, the queues placed on its
  workers by the node; the CPU is its two workers' (the supervisor only waits).

The queues are declared (and their placement checked through ``cluster.status``)
before each run, on fresh names (PerfTest redeclares them with the same arguments).
The brokers stay up for the whole run; the rounds go through the layouts in turn,
reversing the order every other round (A B C C B A A B C ...). Every broker node and
every loader runs in a process session of its own (setsid). Per run: the publish and
consume rates (msg/s), the CPU seconds of each broker process and of the loaders
during the run, and each one's CPU per message (microseconds), the figure that moves
least when other work shares the two cores; and the load average at the start. The
report gives medians and ranges over the rounds.

Not here: RabbitMQ (bench/perftest.py runs it beside quorumqueue).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import pika  # noqa: E402

from bench.brokers import quorumqueue_broker  # noqa: E402
from bench.cluster_throughput import process_cpu_seconds  # noqa: E402
from bench.clusters import QuorumQueueCluster, queue_status, wait_for  # noqa: E402
from bench.perftest import JARS, PERFTEST_MAIN, check_jars, parse_summary  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

LAYOUTS = ("one", "owner", "forwarded")
ALL_LAYOUTS = LAYOUTS + ("workers",)
QUEUE_ARGUMENTS = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 1}
SIZE = 1024


def perftest_loader_command(uri: str, tag: str, first: int, last: int, seconds: int) -> list[str]:
    """PerfTest on queues ``tag-first`` .. ``tag-last``, one producer and consumer each."""
    count = last - first + 1
    return ["java", "-cp", f"{JARS}/*", PERFTEST_MAIN, "--uri", uri,
            "--queue-args", "x-queue-type=quorum,x-quorum-initial-group-size=1",
            "--auto-delete", "false", "--flag", "persistent", "--confirm", "1000",
            "--qos", "1000", "--size", str(SIZE), "--time", str(seconds),
            "--producers", str(count), "--consumers", str(count),
            "--queue-pattern", f"{tag}-%d", "--queue-pattern-from", str(first),
            "--queue-pattern-to", str(last)]


def loadgen_command(uri: str, tag: str, first: int, last: int, messages: int) -> list[str]:
    """This script's --loader-child on queues ``tag-first`` .. ``tag-last``."""
    return [sys.executable, str(Path(__file__).resolve()), "--loader-child", uri, tag,
            str(first), str(last), str(messages)]


async def _child_load(uri: str, names: list[str], messages: int) -> dict:
    """One bench.amqp_loadgen generator (connection) per queue, all at once: publish
    ``messages`` to each with confirms, then consume them all, checked exactly once."""
    from bench import amqp_wire as wire
    from bench.amqp_loadgen import (PUBLISH_CHANNEL, LoadSettings, connect, consume_all,
                                    publish_all)
    from bench.brokers import BrokerAddress
    address = BrokerAddress.from_uri(uri)
    settings = LoadSettings(host=address.host, port=address.port, user=address.user,
                            password=address.password, vhost=address.vhost,
                            messages=messages, size=SIZE, inflight=1000, prefetch=1000,
                            queue_type="quorum")
    generators = [await connect(settings) for _ in names]
    for generator in generators:
        await generator.call(PUBLISH_CHANNEL, wire.confirm_select(PUBLISH_CHANNEL),
                             wire.CONFIRM_SELECT_OK)
    cpu, began = time.process_time(), time.perf_counter()
    await asyncio.gather(*(publish_all(g, name) for g, name in zip(generators, names)))
    published = time.perf_counter()
    await asyncio.gather(*(consume_all(g, name) for g, name in zip(generators, names)))
    consumed = time.perf_counter()
    for generator in generators:
        generator.close()
    return {"publish_s": published - began, "consume_s": consumed - published,
            "cpu_s": time.process_time() - cpu, "messages": messages * len(names)}


def loader_child(uri: str, tag: str, first: int, last: int, messages: int) -> None:
    import uvloop
    names = [f"{tag}-{i}" for i in range(first, last + 1)]
    print(json.dumps(uvloop.run(_child_load(uri, names, messages))))


def declare(uri: str, names: list[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        for name in names:
            channel.queue_declare(name, durable=True, arguments=QUEUE_ARGUMENTS)
    finally:
        connection.close()


def delete(uri: str, names: list[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        for name in names:
            channel.queue_delete(name)
    finally:
        connection.close()


class Topology:
    """The brokers of one layout: their URIs and process ids."""

    def __init__(self, uris: list[str], pids: list[int], names: list[str]) -> None:
        self.uris, self.pids, self.names = uris, pids, names


def start_one(stack: ExitStack) -> Topology:
    address = stack.enter_context(quorumqueue_broker(new_session=True))
    uri = f"amqp://guest:guest@127.0.0.1:{address.port}/%2F"
    return Topology([uri], [address.pid], ["single"])


def start_workers(stack: ExitStack) -> Topology:
    """A node of broker.workers = 2: its supervisor's two worker processes."""
    broker = BrokerProcess(extra_config="[broker]\nworkers = 2\n", new_session=True)
    stack.callback(broker.cleanup)
    broker.start(timeout=120)
    pid = broker.process.pid
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        workers = [int(child) for child in handle.read().split()]
    return Topology([broker.uri], workers, ["worker-0", "worker-1"])


def start_two(stack: ExitStack) -> Topology:
    cluster = stack.enter_context(QuorumQueueCluster(2))  # LocalCluster: setsid per node
    return Topology(cluster.uris(), [cluster.local.pid(name) for name in cluster.names],
                    cluster.names)


def run_layout(layout: str, topology: Topology, queues: int, seconds: int, tag: str,
               loader: str, messages: int) -> dict:
    half = queues // 2
    names_a = [f"{tag}-{i}" for i in range(1, half + 1)]
    names_b = [f"{tag}-{i}" for i in range(half + 1, queues + 1)]
    if layout in ("one", "workers"):
        declare(topology.uris[0], names_a + names_b)
        loader_uris = [topology.uris[0], topology.uris[0]]
    else:
        declare(topology.uris[0], names_a)
        declare(topology.uris[1], names_b)
        for names, uri, owner in ((names_a, topology.uris[0], topology.names[0]),
                                  (names_b, topology.uris[1], topology.names[1])):
            for name in names:
                leader = wait_for(f"{name}'s leader",
                                  lambda name=name, uri=uri: (queue_status(uri, name)
                                                              or {}).get("leader"))
                if leader != owner:
                    raise RuntimeError(f"{name} is led by {leader}, expected {owner}")
        loader_uris = ([topology.uris[0], topology.uris[1]] if layout == "owner"
                       else [topology.uris[0], topology.uris[0]])
    load = os.getloadavg()[0]
    broker_before = [process_cpu_seconds(pid) for pid in topology.pids]
    outputs, loaders = [], []
    began = time.monotonic()
    for uri, (first, last) in zip(loader_uris, ((1, half), (half + 1, queues))):
        output = tempfile.TemporaryFile()
        outputs.append(output)
        command = (perftest_loader_command(uri, tag, first, last, seconds) if loader == "perftest"
                   else loadgen_command(uri, tag, first, last, messages))
        loaders.append(subprocess.Popen(command,
                                        stdout=output, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True))
    for process in loaders:
        deadline = time.monotonic() + seconds + 300
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    elapsed = time.monotonic() - began
    broker_cpu = [process_cpu_seconds(pid) - before
                  for pid, before in zip(topology.pids, broker_before)]
    texts = []
    for output, process in zip(outputs, loaders):
        output.seek(0)
        texts.append(output.read().decode(errors="replace"))
        if process.returncode != 0:
            raise RuntimeError(f"{loader} exited {process.returncode}:\n{texts[-1][-2000:]}")
    delete(topology.uris[0], names_a + names_b)
    row = {"layout": layout, "queues": queues, "tag": tag, "load": load, "loader": loader,
           "elapsed_s": elapsed, "broker_cpu_s": broker_cpu}
    if loader == "perftest":
        summaries = [parse_summary(text) for text in texts]
        row["received_per_s"] = sum(summary.receiving for summary in summaries)
        row["sent_per_s"] = sum(summary.sending for summary in summaries)
        row["messages"] = row["received_per_s"] * seconds
    else:
        results = [json.loads(text.strip().splitlines()[-1]) for text in texts]
        row["messages"] = sum(result["messages"] for result in results)
        # both loaders' phases run side by side: a phase's rate is every message over
        # the slower loader's time for it
        row["sent_per_s"] = row["messages"] / max(result["publish_s"] for result in results)
        row["received_per_s"] = row["messages"] / max(result["consume_s"] for result in results)
        row["both_per_s"] = row["messages"] / max(result["publish_s"] + result["consume_s"]
                                                  for result in results)
    row["broker_us_per_msg"] = [cpu / row["messages"] * 1e6 for cpu in broker_cpu]
    row["broker_total_us_per_msg"] = sum(broker_cpu) / row["messages"] * 1e6
    return row


def children_cpu() -> float:
    """CPU seconds of this process's reaped children: the loaders of a run, once
    poll() reaped them (the brokers are reaped only when they stop)."""
    usage = os.times()
    return usage.children_user + usage.children_system


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", default="100,10")
    parser.add_argument("--time", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help=f"comma-separated, of {', '.join(ALL_LAYOUTS)}")
    parser.add_argument("--loader", choices=("loadgen", "perftest"), default="loadgen")
    parser.add_argument("--messages", type=int, default=60000,
                        help="loadgen: messages of a run, shared evenly by the queues "
                             "(published, then consumed)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--loader-child", nargs=5, metavar=("URI", "TAG", "FIRST", "LAST", "MESSAGES"),
                        help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.loader_child:
        uri, tag, first, last, messages = arguments.loader_child
        loader_child(uri, tag, int(first), int(last), int(messages))
        return
    if arguments.loader == "perftest":
        check_jars()
    layouts = arguments.layouts.split(",")
    if unknown := set(layouts) - set(ALL_LAYOUTS):
        parser.error(f"unknown layouts {sorted(unknown)}")
    counts = [int(text) for text in arguments.queues.split(",")]
    rows: list[dict] = []
    with ExitStack() as stack:
        topologies = {}
        if "one" in layouts:
            topologies["one"] = start_one(stack)
        if "workers" in layouts:
            topologies["workers"] = start_workers(stack)
        if {"owner", "forwarded"} & set(layouts):
            two = start_two(stack)
            topologies["owner"] = topologies["forwarded"] = two
        for queues in counts:
            for round_ in range(arguments.rounds):
                order = layouts if round_ % 2 == 0 else list(reversed(layouts))
                for layout in order:
                    tag = f"wp-{layout}-{queues}q-r{round_}-{os.urandom(2).hex()}"
                    before = children_cpu()
                    row = run_layout(layout, topologies[layout], queues, arguments.time, tag,
                                     arguments.loader, max(1, arguments.messages // queues))
                    row["loader_cpu_s"] = children_cpu() - before
                    row["loader_us_per_msg"] = row["loader_cpu_s"] / row["messages"] * 1e6
                    row["round"] = round_
                    rows.append(row)
                    print(f"{queues:4d}q {layout:9s} r{round_} load {row['load']:.1f}: "
                          f"{row['received_per_s']:8.0f} msg/s recv, {row['sent_per_s']:8.0f} sent; "
                          f"broker us/msg {[round(v, 1) for v in row['broker_us_per_msg']]} "
                          f"(sum {row['broker_total_us_per_msg']:.1f}), loaders "
                          f"{row['loader_us_per_msg']:.1f}", file=sys.stderr, flush=True)
    if arguments.json:
        arguments.json.write_text(json.dumps(rows, indent=1))
    print(report(rows))


def report(rows: list[dict]) -> str:
    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    lines = ["queues layout    sent msg/s           recv msg/s           broker us/msg (sum)   "
             "per process                      loaders us/msg     load"]
    for queues in dict.fromkeys(row["queues"] for row in rows):
        for layout in dict.fromkeys(row["layout"] for row in rows):
            mine = [row for row in rows if row["queues"] == queues and row["layout"] == layout]
            if not mine:
                continue
            per_process = [spread([row["broker_us_per_msg"][i] for row in mine])
                           for i in range(len(mine[0]["broker_us_per_msg"]))]
            lines.append(f"{queues:6d} {layout:9s} {spread([r['sent_per_s'] for r in mine]):20s} "
                         f"{spread([r['received_per_s'] for r in mine]):20s} "
                         f"{spread([r['broker_total_us_per_msg'] for r in mine]):21s} "
                         f"{' / '.join(per_process):32s} "
                         f"{spread([r['loader_us_per_msg'] for r in mine]):18s} "
                         f"{spread([r['load'] for r in mine])}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
