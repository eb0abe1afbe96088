"""Quorum-queue throughput on a 3-node cluster against a 1-node cluster, one run.

    python bench/cluster_throughput.py [--messages 50000] [--size 1024]
        [--inflight 1000] [--prefetch 1000] [--nodes 3]
        [--target quorumqueue|rabbitmq|both] [--json PATH]

Per broker, a 1-node cluster and then a ``--nodes``-node cluster, each freshly
started on loopback (``bench/clusters.py``). Per row a fresh durable quorum queue
is declared through node 1 (so with the default client-local leader placement its
leader is node 1); the load generator (``bench/amqp_loadgen.py``) then connects to
one node -- the queue's leader, or, on the bigger cluster, also a follower (which
forwards the commands to the leader and delivers from its own replica) -- and
publishes ``--messages`` persistent messages of ``--size`` bytes with confirms
(``--inflight`` unconfirmed at most), then consumes them with manual acks
(prefetch ``--prefetch``, ``multiple=true`` every half prefetch), checking that
every message was confirmed, then counted in the queue, then delivered exactly
once, and that the queue ends empty. The table gives msgs/s per phase; the
ratios are N-node / 1-node of the same broker, and quorumqueue / RabbitMQ on
the same cluster size. For quorumqueue a second table gives each node's CPU
time (user + system, from /proc, all the threads of the node's process) per message
of each phase, in microseconds, leader first. It moves far less than msgs/s when
other work shares the machine's cores (about +10% at a load average of 7 on 2 cores,
where msgs/s varied up to 2x between runs): compare commits by it on a busy machine.
Progress goes to stderr, the tables to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import amqp_wire as wire  # noqa: E402
from bench.amqp_loadgen import (PUBLISH_CHANNEL, QUORUM_SETTLE_TIMEOUT_S, LoadError,  # noqa: E402
                                LoadSettings, PhaseResult, connect, consume_all,
                                declare_fresh_queue, delete_and_close, queue_counts,
                                start_progress_reports)
from bench.brokers import BrokerAddress  # noqa: E402
from bench.clusters import QuorumQueueCluster, RabbitMQCluster  # noqa: E402
from tests.support.rabbitmq import RabbitMQNodeError  # noqa: E402

ROLES = ("leader", "follower")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()  # after the command's name
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass(frozen=True, slots=True)
class Row:
    target: str  # quorumqueue | rabbitmq
    nodes: int
    client_on: str  # leader | follower: where the generator's connection goes
    node: str  # that node's name
    publish: PhaseResult
    consume: PhaseResult
    # per phase, each node's CPU seconds during it, the queue's leader first (empty:
    # not measured, RabbitMQ)
    node_cpu: dict[str, tuple[float, ...]]

    def to_json(self) -> dict:
        return {"target": self.target, "nodes": self.nodes, "client_on": self.client_on,
                "node": self.node,
                "publish": asdict(self.publish) | {"msgs_per_s": self.publish.rate},
                "consume": asdict(self.consume) | {"msgs_per_s": self.consume.rate},
                "node_cpu_s": self.node_cpu}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message (>= 8)")
    parser.add_argument("--inflight", type=int, default=1000, help="max unconfirmed publishes")
    parser.add_argument("--prefetch", type=int, default=1000, help="basic.qos prefetch count")
    parser.add_argument("--nodes", type=int, default=3, help="size of the bigger cluster")
    parser.add_argument("--target", choices=("quorumqueue", "rabbitmq", "both"), default="both")
    parser.add_argument("--rabbitmq-busy-wait", default="none",
                        help="RabbitMQ schedulers' busy-wait threshold (+sbwt); 'none' is what "
                             "RabbitMQ's packaged scripts use and suits nodes sharing cores")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="generator's event loop")
    arguments = parser.parse_args(argv)
    for name in ("messages", "inflight", "prefetch"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if arguments.size < 8:
        parser.error("--size must be at least 8 (bodies carry an 8-byte sequence number)")
    if arguments.prefetch > 65535:
        parser.error("--prefetch must fit basic.qos's 16-bit prefetch-count (<= 65535)")
    if arguments.nodes < 2:
        parser.error("--nodes must be at least 2 (the baseline is a 1-node cluster)")
    return arguments


# -- one row: declare through node 1, load through the leader or a follower ------------------


def settings_for(uri: str, arguments: argparse.Namespace) -> LoadSettings:
    address = BrokerAddress.from_uri(uri)
    return LoadSettings(host=address.host, port=address.port, user=address.user,
                        password=address.password, vhost=address.vhost,
                        messages=arguments.messages, size=arguments.size,
                        inflight=arguments.inflight, prefetch=arguments.prefetch,
                        queue_type="quorum")


async def declare_through(settings: LoadSettings) -> str:
    """A fresh durable quorum queue declared on the node of ``settings``."""
    declarer = await connect(settings)
    try:
        queue = await declare_fresh_queue(declarer, prefix="bench-cluster")
        await declarer.call(0, wire.connection_close(), wire.CONNECTION_CLOSE_OK)
        return queue
    finally:
        declarer.close()


async def publish_confirmed(generator, queue: str) -> PhaseResult:
    """Like amqp_loadgen.publish_all, but the count check polls: a follower answers a
    passive declare from its own applied state, which may trail the leader's confirms."""
    settings = generator.settings
    block = wire.PublishBlock.build(PUBLISH_CHANNEL, queue, settings.size, generator.frame_max,
                                    settings.inflight)
    cpu, wall = time.process_time(), time.perf_counter()
    await generator.start_publishing(block)
    result = PhaseResult(settings.messages, time.perf_counter() - wall, time.process_time() - cpu)
    if generator.published != settings.messages or generator.confirmed != settings.messages:
        raise LoadError(f"published {generator.published}, confirmed {generator.confirmed}")
    deadline = time.monotonic() + QUORUM_SETTLE_TIMEOUT_S
    while (ready := (await queue_counts(generator, queue))[0]) != settings.messages:
        if time.monotonic() >= deadline:
            raise LoadError(f"after {settings.messages} confirms the queue holds {ready} messages")
        await asyncio.sleep(0.05)
    return result


async def load_through(settings: LoadSettings, queue: str, report, pids: list[int]
                       ) -> tuple[PhaseResult, PhaseResult, dict[str, tuple[float, ...]]]:
    """Both phases through the node of `settings`; the CPU seconds the processes
    `pids` used during each phase (read before it starts and once it is checked)."""
    generator = await connect(settings)
    reporter = start_progress_reports(generator, report)
    node_cpu = {}
    try:
        await generator.call(PUBLISH_CHANNEL, wire.confirm_select(PUBLISH_CHANNEL),
                             wire.CONFIRM_SELECT_OK)
        results = []
        for phase, run in (("publish", publish_confirmed), ("consume", consume_all)):
            before = [process_cpu_seconds(pid) for pid in pids]
            results.append(await run(generator, queue))
            node_cpu[phase] = tuple(process_cpu_seconds(pid) - seconds
                                    for pid, seconds in zip(pids, before))
        await delete_and_close(generator, queue)
        return results[0], results[1], node_cpu
    finally:
        if reporter:
            reporter.cancel()
        generator.close()


def measure_cluster(cluster, arguments: argparse.Namespace, roles: tuple[str, ...]) -> list[Row]:
    uris = cluster.uris()
    rows = []
    for role in roles:
        label = f"{cluster.kind} {len(uris)}-node, client on {role}"
        queue = run_loop(declare_through(settings_for(uris[0], arguments)), arguments.loop)
        leader = cluster.leader_index(queue)
        cluster.wait_queue_known(queue)
        index = leader if role == "leader" else next(i for i in range(len(uris)) if i != leader)
        print(f"[{label}] queue {queue}: leader {cluster.names[leader]}, "
              f"generator on {cluster.names[index]}", file=sys.stderr)
        # the leader first, then the others in order (RabbitMQ: not measured)
        pids = [cluster.local.pid(cluster.names[i]) for i in
                [leader] + [i for i in range(len(uris)) if i != leader]] \
            if cluster.kind == "quorumqueue" else []
        publish, consume, node_cpu = run_loop(
            load_through(settings_for(uris[index], arguments), queue, progress_printer(label),
                         pids), arguments.loop)
        for name, phase in (("publish", publish), ("consume", consume)):
            print(f"[{label}] {name} done: {phase.messages:,} in {phase.wall_s:.2f} s = "
                  f"{phase.rate:,.0f} msg/s", file=sys.stderr)
        rows.append(Row(cluster.kind, len(uris), role, cluster.names[index], publish, consume,
                        node_cpu))
    return rows


def run_loop(coroutine, loop_name: str):
    if loop_name == "uvloop":
        try:
            import uvloop
        except ImportError:
            print("uvloop not installed; using asyncio's default loop", file=sys.stderr)
        else:
            return uvloop.run(coroutine)
    return asyncio.run(coroutine)


def progress_printer(label: str) -> Callable[[str, int, int, float], None]:
    def report(phase: str, done: int, total: int, elapsed: float) -> None:
        rate = done / elapsed if elapsed > 0 else 0.0
        print(f"[{label}] {phase:7} {done:>9,}/{total:,}  {rate:>9,.0f} msg/s so far",
              file=sys.stderr)

    return report


# -- the plan and the report ------------------------------------------------------------------


def plan(arguments: argparse.Namespace) -> list[tuple[Callable[[int], object], int, tuple[str, ...]]]:
    """(cluster factory, nodes, roles) in run order."""
    kinds: list[Callable[[int], object]] = []
    if arguments.target in ("quorumqueue", "both"):
        kinds.append(QuorumQueueCluster)
    if arguments.target in ("rabbitmq", "both"):
        if RabbitMQCluster.available():
            kinds.append(lambda n: RabbitMQCluster(n, scheduler_busy_wait=arguments.rabbitmq_busy_wait))
        elif arguments.target == "rabbitmq":
            sys.exit("cannot benchmark RabbitMQ: it is not installed (.ci/install-rabbitmq)")
        else:
            print("note: RabbitMQ is not installed: no RabbitMQ rows", file=sys.stderr)
    return [step for kind in kinds for step in ((kind, 1, ("leader",)), (kind, arguments.nodes, ROLES))]


def render_table(rows: list[Row]) -> str:
    lines = [f"{'target':<12} {'nodes':>5}  {'client on':<9} {'publish msg/s':>14} {'consume msg/s':>14}"]
    for row in rows:
        lines.append(f"{row.target:<12} {row.nodes:>5}  {row.client_on:<9} "
                     f"{row.publish.rate:>14,.0f} {row.consume.rate:>14,.0f}")
    return "\n".join(lines)


def render_node_cpu(rows: list[Row]) -> str:
    """Each node's CPU microseconds per message of each phase, leader first."""
    lines = [f"{'target':<12} {'nodes':>5}  {'client on':<9} "
             f"{'node CPU µs/msg: publish (leader, others)':<42} consume"]
    for row in rows:
        if not row.node_cpu:
            continue
        cells = []
        for phase, messages in (("publish", row.publish.messages),
                                ("consume", row.consume.messages)):
            cells.append(", ".join(f"{1e6 * seconds / messages:.1f}"
                                   for seconds in row.node_cpu[phase]))
        lines.append(f"{row.target:<12} {row.nodes:>5}  {row.client_on:<9} "
                     f"{cells[0]:<42} {cells[1]}")
    return "\n".join(lines) if len(lines) > 1 else ""


def ratios(rows: list[Row]) -> list[dict]:
    """N-node / 1-node per broker and role; quorumqueue / RabbitMQ per size and role."""
    by_key = {(row.target, row.nodes, row.client_on): row for row in rows}
    found = []
    for row in rows:
        if row.nodes > 1 and (single := by_key.get((row.target, 1, "leader"))):
            found.append({"what": f"{row.target} {row.nodes}-node ({row.client_on}) / 1-node",
                          "publish": row.publish.rate / single.publish.rate,
                          "consume": row.consume.rate / single.consume.rate})
    for row in rows:
        if row.target == "quorumqueue" and (theirs := by_key.get(("rabbitmq", row.nodes, row.client_on))):
            found.append({"what": f"quorumqueue / rabbitmq, {row.nodes}-node ({row.client_on})",
                          "publish": row.publish.rate / theirs.publish.rate,
                          "consume": row.consume.rate / theirs.consume.rate})
    return found


def render_ratios(found: list[dict]) -> str:
    width = max(len(entry["what"]) for entry in found)
    return "\n".join(f"{entry['what']:<{width}}  publish {entry['publish']:.2f}x, "
                     f"consume {entry['consume']:.2f}x" for entry in found)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    steps = plan(arguments)
    print(f"{arguments.messages:,} x {arguments.size} B persistent messages, quorum queue, "
          f"confirms <= {arguments.inflight} in flight, prefetch {arguments.prefetch}, "
          "manual multiple acks", file=sys.stderr)
    rows: list[Row] = []
    startups = []
    for kind, nodes, roles in steps:
        cluster = kind(nodes)
        print(f"[{cluster.kind} {nodes}-node] starting ...", file=sys.stderr)
        try:
            with cluster:
                print(f"[{cluster.kind} {nodes}-node] up after {cluster.startup_s:.1f} s",
                      file=sys.stderr)
                startups.append({"target": cluster.kind, "nodes": nodes, "startup_s": cluster.startup_s})
                rows += measure_cluster(cluster, arguments, roles)
        except (LoadError, RabbitMQNodeError, OSError, RuntimeError, TimeoutError) as error:
            sys.exit(f"[{cluster.kind} {nodes}-node] FAILED: {error}")
    found = ratios(rows)
    print()
    print(render_table(rows))
    if cpu_table := render_node_cpu(rows):
        print()
        print(cpu_table)
    if found:
        print()
        print(render_ratios(found))
    if arguments.json:
        names = ("messages", "size", "inflight", "prefetch", "nodes", "loop", "rabbitmq_busy_wait")
        document = {"settings": {name: getattr(arguments, name) for name in names},
                    "startups": startups, "results": [row.to_json() for row in rows],
                    "ratios": found}
        arguments.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"results written to {arguments.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
