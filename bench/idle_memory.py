"""RSS per idle connection and per idle quorum queue: quorumqueue against RabbitMQ 3.10.8.

    python bench/idle_memory.py [--connections 1000] [--queues 500] [--pairs 3]
        [--target quorumqueue|rabbitmq|both] [--settle-timeout 30] [--json PATH]

What one connection or one quorum queue costs a broker while it does nothing,
measured from outside as the growth of the broker process's RSS:

1. **connections**: read the settled RSS, open ``--connections`` AMQP 0-9-1
   connections (PLAIN login, heartbeats off) each with one open channel, read
   the settled RSS again: growth / connections. Then the connections close.
2. **queues**: read the settled RSS, declare ``--queues`` durable quorum queues
   (``x-queue-type: quorum``, no messages, no consumers) over one connection,
   read the settled RSS again: growth / queues.

Both steps run on a freshly started broker, quorumqueue's ``quorumqueue broker
start`` process and RabbitMQ's ``beam.smp`` (how both are started and their
RSS read: ``bench/broker_memory.py``). A pair is one fresh quorumqueue and one
fresh RabbitMQ, the order alternating pair by pair; ``--pairs`` (3) of them,
and the table shows each broker's median per object with the spread (min-max
over the pairs) and the ratio quorumqueue / RabbitMQ of the medians. RSS has
"settled" when four readings 0.5 s apart lie within 256 KiB (an idle broker's
RSS moves far less); connections are opened by the load generator's handshake
(``bench/amqp_loadgen.connect``), which costs the client nearly nothing.

RSS counts what the broker touched, so the figure includes the allocator's
slack (a Python object freed next to a live one keeps its page) and, for
RabbitMQ, the Erlang processes' heaps (a connection is ~6 processes; a quorum
queue is a ra server process plus its ETS entries). Numbers are only
comparable within one run on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import amqp_wire as wire  # noqa: E402
from bench.amqp_loadgen import LoadError, LoadSettings, connect  # noqa: E402
from bench.broker_memory import (  # noqa: E402
    ProbeError,
    QuorumqueueProbe,
    RabbitMQProbe,
    quorumqueue_probe,
    rabbitmq_probe,
)
from bench.quorum_memory import SettleRule, settled_rss  # noqa: E402
from tests.support.rabbitmq import RabbitMQNode, RabbitMQNodeError  # noqa: E402

KiB = 1024
DECLARE_CHANNEL = 1   # the channel connect() opens

Probe = QuorumqueueProbe | RabbitMQProbe
ProbeStarter = Callable[[], AbstractContextManager[Probe]]


@dataclass(frozen=True, slots=True)
class IdleResult:
    target: str
    pair: int
    connections: int
    queues: int
    rss_start: int         # settled, before the connections
    rss_connections: int   # settled, with the connections open
    rss_queues: int        # settled, with the queues declared
    declare_s: float

    @property
    def per_connection(self) -> float:
        return (self.rss_connections - self.rss_start) / self.connections

    @property
    def per_queue(self) -> float:
        return (self.rss_queues - self.rss_connections) / self.queues

    def as_json(self) -> dict:
        return asdict(self) | {"per_connection": self.per_connection, "per_queue": self.per_queue}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000, help="idle connections to open")
    parser.add_argument("--queues", type=int, default=500, help="idle quorum queues to declare")
    parser.add_argument("--pairs", type=int, default=3, help="fresh quorumqueue + fresh RabbitMQ, this many times")
    parser.add_argument("--target", choices=("quorumqueue", "rabbitmq", "both"), default="both")
    parser.add_argument("--settle-timeout", type=float, default=30.0, help="max seconds to wait for RSS to settle")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    arguments = parser.parse_args(argv)
    for name in ("connections", "queues", "pairs"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return arguments


def starters(target: str) -> list[tuple[str, ProbeStarter]]:
    plan: list[tuple[str, ProbeStarter]] = []
    if target in ("quorumqueue", "both"):
        plan.append(("quorumqueue", quorumqueue_probe))
    if target in ("rabbitmq", "both"):
        if RabbitMQNode.available():
            plan.append(("rabbitmq", rabbitmq_probe))
        elif target == "rabbitmq":
            sys.exit(f"cannot measure RabbitMQ: {RabbitMQNode.skip_reason}")
        else:
            print(f"note: no RabbitMQ baseline, so no ratio: {RabbitMQNode.skip_reason}", file=sys.stderr)
    return plan


async def settled(pid: int, rule: SettleRule, say: Callable[[str], None], what: str) -> int:
    return await settled_rss(pid, rule, say, what, digits=2)


def load_settings(probe: Probe) -> LoadSettings:
    address = probe.address
    return LoadSettings(host=address.host, port=address.port, user=address.user,
                        password=address.password, vhost=address.vhost, messages=1, size=16,
                        inflight=1, queue_type="quorum")


async def measure(probe: Probe, pair: int, arguments: argparse.Namespace,
                  say: Callable[[str], None]) -> IdleResult:
    rule = SettleRule(tolerance=256 * KiB, timeout_s=arguments.settle_timeout)
    settings = load_settings(probe)
    rss_start = await settled(probe.pid, rule, say, "fresh")
    opened = []
    try:
        for _ in range(arguments.connections):
            opened.append(await connect(settings))
        rss_connections = await settled(probe.pid, rule, say, f"{arguments.connections} idle connections")
        # the queues are declared with the connections still open: memory freed by
        # closing them would be reused by the queues and hide their cost
        declarer = opened[0]
        began = time.monotonic()
        prefix = f"bench-idle-{secrets.token_hex(3)}"
        for number in range(arguments.queues):
            frame = wire.queue_declare(DECLARE_CHANNEL, f"{prefix}-{number}", durable=True,
                                       arguments={"x-queue-type": "quorum"})
            await declarer.call(DECLARE_CHANNEL, frame, wire.QUEUE_DECLARE_OK)
        declare_s = time.monotonic() - began
        say(f"declared {arguments.queues} quorum queues in {declare_s:.1f} s")
        rss_queues = await settled(probe.pid, rule, say, f"{arguments.queues} idle quorum queues")
    finally:
        for generator in opened:
            if generator.transport is not None:
                generator.transport.close()
    return IdleResult(target=probe.label, pair=pair, connections=arguments.connections,
                      queues=arguments.queues, rss_start=rss_start, rss_connections=rss_connections,
                      rss_queues=rss_queues, declare_s=declare_s)


def run_one(label: str, start: ProbeStarter, pair: int, arguments: argparse.Namespace) -> IdleResult:
    def say(text: str) -> None:
        print(f"[{label} {pair}] {text}", file=sys.stderr)

    with start() as probe:
        say(f"{probe.address.host}:{probe.address.port} (pid {probe.pid})")
        result = asyncio.run(measure(probe, pair, arguments, say))
    say(f"{result.per_connection / KiB:,.1f} KiB per connection, {result.per_queue / KiB:,.1f} KiB per queue")
    return result


def summary(values: list[float]) -> str:
    kib = [value / KiB for value in values]
    return f"{statistics.median(kib):>8,.1f} ({min(kib):,.1f}-{max(kib):,.1f})"


def render(results: list[IdleResult]) -> list[str]:
    targets = list(dict.fromkeys(result.target for result in results))
    lines = [f"{'target':<12} {'pairs':>5} {'KiB per idle connection':>26} {'KiB per idle quorum queue':>26}",
             f"{'':<12} {'':>5} {'median (min-max)':>26} {'median (min-max)':>26}"]
    medians: dict[str, tuple[float, float]] = {}
    for target in targets:
        mine = [result for result in results if result.target == target]
        connections = [result.per_connection for result in mine]
        queues = [result.per_queue for result in mine]
        medians[target] = (statistics.median(connections), statistics.median(queues))
        lines.append(f"{target:<12} {len(mine):>5} {summary(connections):>26} {summary(queues):>26}")
    if "quorumqueue" in medians and "rabbitmq" in medians:
        ours, theirs = medians["quorumqueue"], medians["rabbitmq"]
        lines.append("")
        lines.append(f"quorumqueue / rabbitmq: per connection {ours[0] / theirs[0]:.2f}x, "
                     f"per quorum queue {ours[1] / theirs[1]:.2f}x (lower is less memory)")
        pairs = sorted({result.pair for result in results})
        by_pair = {(result.target, result.pair): result for result in results}
        connection_ratios = [by_pair["quorumqueue", pair].per_connection / by_pair["rabbitmq", pair].per_connection
                             for pair in pairs if ("quorumqueue", pair) in by_pair and ("rabbitmq", pair) in by_pair]
        queue_ratios = [by_pair["quorumqueue", pair].per_queue / by_pair["rabbitmq", pair].per_queue
                        for pair in pairs if ("quorumqueue", pair) in by_pair and ("rabbitmq", pair) in by_pair]
        lines.append("pair by pair: per connection " + ", ".join(f"{ratio:.2f}x" for ratio in connection_ratios)
                     + "; per queue " + ", ".join(f"{ratio:.2f}x" for ratio in queue_ratios))
    return lines


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    plan = starters(arguments.target)
    if not plan:
        sys.exit("nothing to measure")
    results: list[IdleResult] = []
    for pair in range(1, arguments.pairs + 1):
        order = plan if pair % 2 else list(reversed(plan))
        for label, start in order:
            try:
                results.append(run_one(label, start, pair, arguments))
            except (LoadError, ProbeError, RabbitMQNodeError, OSError, RuntimeError) as error:
                sys.exit(f"[{label} {pair}] FAILED: {error}")
    print()
    print(f"{arguments.connections} idle connections (one channel each), then {arguments.queues} idle "
          f"durable quorum queues; RSS growth per object, fresh broker per run")
    for line in render(results):
        print(line)
    if arguments.json:
        settings = {name: getattr(arguments, name) for name in ("connections", "queues", "pairs")}
        document = {"settings": settings, "results": [result.as_json() for result in results]}
        arguments.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"results written to {arguments.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
