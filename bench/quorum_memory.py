"""Bytes per queued message in a quorum queue: quorumqueue against RabbitMQ 3.10.8.

    python bench/quorum_memory.py [--messages 1000000] [--size 16]
        [--inflight 1000] [--target quorumqueue|rabbitmq|both]
        [--wal-max-size BYTES] [--settle-timeout 30] [--message-ttl MS] [--json PATH]

"Bytes per queued message" is the broker process's RSS growth while
``--messages`` messages are queued, minus the growth of the Raft log's own
memory tables (the entries that wait in memory for the WAL to roll over into
segment files), divided by the number of messages: what the queue itself costs
per message beyond the log. Target <= 64 B, goal <= 32 B (quorumqueue).

Per target, on a freshly started broker: declare a durable quorum queue, read
the log's memory and then the RSS (after it settles), publish ``--messages``
persistent messages of ``--size`` bytes with confirms (``--inflight`` at most
unconfirmed; the load generator of ``bench/amqp_loadgen.py``, which checks
with a passive declare that the queue holds them all), wait for the RSS to
settle, read the RSS and then the log's memory again. How each broker's
figures are read: ``bench/broker_memory.py``. The table also shows each
queue's own estimate of its memory (quorumqueue: the fifo machine's
``state_bytes``; RabbitMQ: the queue's ra server process memory, ``rabbitmqctl
list_queues memory``) as a cross-check. Progress goes to stderr.

With bodies larger than a few bytes (``--size 1024``) the report also says whether
the broker holds message bodies in memory: ``RSS growth / body bytes`` is the
broker's RSS growth over the bytes of the bodies queued. A broker that reads bodies
from its log (quorumqueue, RabbitMQ's quorum queues) keeps it well below 1 once the
bodies outgrow the WAL's memory tables (``--wal-max-size`` smaller than
``--messages`` x ``--size``); one that holds them is at 1 or above.

The figure is only as good as the memtable figure subtracted. ``--wal-max-size``
(``raft.wal_max_size_bytes`` for both brokers) makes the WAL roll over often,
so that most entries are in segment files and little is subtracted: a
cross-check that does not depend on the memtable figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.amqp_loadgen import (  # noqa: E402
    LoadError,
    LoadSettings,
    connect,
    declare_fresh_queue,
    publish_all,
    start_progress_reports,
)
from bench.broker_memory import (  # noqa: E402
    LogMemory,
    ProbeError,
    QuorumqueueProbe,
    RabbitMQProbe,
    quorumqueue_probe,
    rabbitmq_probe,
    rss_bytes,
)
from quorumqueue.client.management import ManagementError  # noqa: E402
from tests.support.rabbitmq import RabbitMQNode, RabbitMQNodeError  # noqa: E402

TARGET_BYTES = 64  # per queued message, quorumqueue
GOAL_BYTES = 32
MiB = 1 << 20

Probe = QuorumqueueProbe | RabbitMQProbe
ProbeStarter = Callable[[], AbstractContextManager[Probe]]


@dataclass(frozen=True, slots=True)
class SettleRule:
    """RSS has settled when ``window`` consecutive readings ``interval_s`` apart
    differ by at most ``tolerance`` bytes; give up waiting after ``timeout_s``."""

    interval_s: float = 0.5
    window: int = 4
    tolerance: int = 1 * MiB
    timeout_s: float = 30.0

    def settled(self, readings: list[int]) -> bool:
        recent = readings[-self.window :]
        return len(recent) == self.window and max(recent) - min(recent) <= self.tolerance


@dataclass(frozen=True, slots=True)
class MemoryResult:
    target: str
    messages: int
    size: int
    rss_before: int
    rss_after: int
    log_before: LogMemory
    log_after: LogMemory
    publish_s: float

    @property
    def rss_growth(self) -> int:
        return self.rss_after - self.rss_before

    @property
    def memtable_growth(self) -> int:
        return self.log_after.memtable_bytes - self.log_before.memtable_bytes

    @property
    def bytes_per_message(self) -> float:
        return (self.rss_growth - self.memtable_growth) / self.messages

    @property
    def body_fraction(self) -> float:
        """RSS growth over the bytes of the bodies queued (>= 1: bodies held)."""
        return self.rss_growth / (self.messages * self.size)

    @property
    def queue_bytes_per_message(self) -> float:
        return (self.log_after.queue_bytes - self.log_before.queue_bytes) / self.messages

    def as_json(self) -> dict:
        return asdict(self) | {
            "rss_growth": self.rss_growth,
            "memtable_growth": self.memtable_growth,
            "bytes_per_message": self.bytes_per_message,
            "queue_bytes_per_message": self.queue_bytes_per_message,
            "body_fraction": self.body_fraction,
        }


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages to queue")
    parser.add_argument("--size", type=int, default=16, help="body bytes per message (>= 8)")
    parser.add_argument("--inflight", type=int, default=1000, help="max unconfirmed publishes")
    parser.add_argument("--target", choices=("quorumqueue", "rabbitmq", "both"), default="both")
    parser.add_argument(
        "--wal-max-size",
        type=int,
        help="raft.wal_max_size_bytes for both brokers (default: theirs, 512 MiB): a small WAL rolls over "
        "often, which moves the entries from memory tables to segments",
    )
    parser.add_argument("--message-ttl", type=int, default=None,
                        help="declare the queue with this x-message-ttl (ms): what a TTL costs")
    parser.add_argument("--settle-timeout", type=float, default=30.0, help="max seconds to wait for RSS to settle")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    arguments = parser.parse_args(argv)
    for name in ("messages", "inflight"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if arguments.size < 8:
        parser.error("--size must be at least 8 (bodies carry an 8-byte sequence number)")
    if arguments.wal_max_size is not None and arguments.wal_max_size < 1:
        parser.error("--wal-max-size must be at least 1 byte")
    if arguments.settle_timeout < 0:
        parser.error("--settle-timeout must not be negative")
    return arguments


def probes_to_run(target: str, wal_max_size: int | None) -> list[tuple[str, ProbeStarter]]:
    plan: list[tuple[str, ProbeStarter]] = []
    if target in ("quorumqueue", "both"):
        plan.append(("quorumqueue", lambda: quorumqueue_probe(wal_max_size)))
    if target in ("rabbitmq", "both"):
        if RabbitMQNode.available():
            plan.append(("rabbitmq", lambda: rabbitmq_probe(wal_max_size)))
        elif target == "rabbitmq":
            sys.exit(f"cannot measure RabbitMQ: {RabbitMQNode.skip_reason}")
        else:
            print(f"note: no RabbitMQ baseline, so no ratio: {RabbitMQNode.skip_reason}", file=sys.stderr)
    return plan


async def settled_rss(pid: int, rule: SettleRule, say: Callable[[str], None],
                      what: str = "", digits: int = 1) -> int:
    """The RSS once it stops moving (or the last reading at the timeout); `what` names
    the state measured in the progress lines."""
    label = f"{what}: " if what else ""
    began = time.monotonic()
    readings = [rss_bytes(pid)]
    while not rule.settled(readings):
        if time.monotonic() - began > rule.timeout_s:
            say(f"{label}RSS still moving after {rule.timeout_s:.0f} s; taking the last reading")
            break
        await asyncio.sleep(rule.interval_s)
        readings.append(rss_bytes(pid))
    say(f"{label}RSS {readings[-1] / MiB:,.{digits}f} MiB "
        f"(settled after {time.monotonic() - began:.1f} s)")
    return readings[-1]


async def measure(probe: Probe, arguments: argparse.Namespace, say: Callable[[str], None]) -> MemoryResult:
    address = probe.address
    settings = LoadSettings(
        host=address.host,
        port=address.port,
        user=address.user,
        password=address.password,
        vhost=address.vhost,
        messages=arguments.messages,
        size=arguments.size,
        inflight=arguments.inflight,
        queue_type="quorum",
        message_ttl=arguments.message_ttl,
    )
    rule = SettleRule(timeout_s=arguments.settle_timeout)
    generator = await connect(settings)
    reporter = start_progress_reports(generator, _progress_printer(probe.label))
    try:
        queue = await declare_fresh_queue(generator, prefix="bench-memory")
        # the probes' own connections come before the baseline and after the last RSS
        log_before = await asyncio.to_thread(probe.log_memory, queue)
        rss_before = await settled_rss(probe.pid, rule, say)
        publish = await publish_all(generator, queue)
        say(f"published {arguments.messages:,} in {publish.wall_s:.1f} s ({publish.rate:,.0f} msg/s); settling")
        rss_after = await settled_rss(probe.pid, rule, say)
        log_after = await asyncio.to_thread(probe.log_memory, queue)
    finally:
        if reporter:
            reporter.cancel()
        generator.close()
    return MemoryResult(
        target=probe.label,
        messages=arguments.messages,
        size=arguments.size,
        rss_before=rss_before,
        rss_after=rss_after,
        log_before=log_before,
        log_after=log_after,
        publish_s=publish.wall_s,
    )


def _progress_printer(label: str) -> Callable[[str, int, int, float], None]:
    def report(phase: str, done: int, total: int, elapsed: float) -> None:
        rate = done / elapsed if elapsed > 0 else 0.0
        print(f"[{label}] {phase:7} {done:>9,}/{total:,}  {rate:>9,.0f} msg/s so far", file=sys.stderr)

    return report


def run_one(label: str, start_probe: ProbeStarter, arguments: argparse.Namespace) -> MemoryResult:
    def say(text: str) -> None:
        print(f"[{label}] {text}", file=sys.stderr)

    say("starting broker ...")
    with start_probe() as probe:
        say(f"{probe.address.host}:{probe.address.port} (pid {probe.pid}), up after {probe.address.startup_s:.1f} s")
        result = asyncio.run(measure(probe, arguments, say))
    say(
        f"RSS +{result.rss_growth / MiB:,.1f} MiB, memtables +{result.memtable_growth / MiB:,.1f} MiB: "
        f"{result.bytes_per_message:,.1f} B/message"
    )
    return result


def render_table(results: list[MemoryResult]) -> str:
    header = (
        f"{'target':<12} {'messages':>10} {'RSS before':>11} {'RSS after':>10} {'RSS growth':>11} "
        f"{'memtables':>10} {'RSS growth':>11} {'bytes/msg':>10} {'queue est.':>11}"
    )
    units = (
        f"{'':<12} {'':>10} {'MiB':>11} {'MiB':>10} {'MiB':>11} "
        f"{'MiB (-)':>10} {'B/msg':>11} {'':>10} {'B/msg':>11}"
    )
    lines = [header, units]
    for result in results:
        lines.append(
            f"{result.target:<12} {result.messages:>10,} {result.rss_before / MiB:>11,.1f} "
            f"{result.rss_after / MiB:>10,.1f} {result.rss_growth / MiB:>11,.1f} "
            f"{result.memtable_growth / MiB:>10,.1f} {result.rss_growth / result.messages:>11,.1f} "
            f"{result.bytes_per_message:>10,.1f} {result.queue_bytes_per_message:>11,.1f}"
        )
    return "\n".join(lines)


def render_bodies(results: list[MemoryResult], wal_max_size: int | None) -> list[str]:
    """Whether message bodies are held in memory: RSS growth against the body bytes.
    Only judged when the bodies outgrow the WAL's memory tables (which hold the
    entries, bodies included, until the WAL rolls over into segments)."""
    lines = []
    for result in results:
        bodies = result.messages * result.size
        line = (f"{result.target}: RSS grew {result.rss_growth / MiB:,.1f} MiB for "
                f"{bodies / MiB:,.1f} MiB of bodies ({result.body_fraction:.2f} of them)")
        if wal_max_size is not None and bodies > 2 * wal_max_size:
            line += ("; bodies are read from the log, not held" if result.body_fraction < 0.5
                     else "; BODIES HELD in memory")
        lines.append(line)
    return lines


def render_verdict(results: list[MemoryResult]) -> list[str]:
    """The ratio (when both ran) and quorumqueue against the target and goal. A
    negative figure means the subtracted memtable figure is larger than the memory
    the entries really hold: then there is nothing to judge, and it says so."""
    by_target = {result.target: result for result in results}
    lines = []
    for result in results:
        if result.bytes_per_message < 0:
            lines.append(
                f"{result.target}: NO FIGURE - its memtables grew by more than its RSS (by "
                f"{-result.bytes_per_message:,.1f} B per message), so the memtable figure overstates the "
                "memory the log's entries hold; --wal-max-size 8388608 leaves little to subtract"
            )
    ours, theirs = by_target.get("quorumqueue"), by_target.get("rabbitmq")
    if ours and theirs and ours.bytes_per_message >= 0 and theirs.bytes_per_message > 0:
        ratio = ours.bytes_per_message / theirs.bytes_per_message
        lines.append(f"quorumqueue / rabbitmq bytes per message: {ratio:.2f}x")
    if ours and ours.bytes_per_message >= 0:
        figure = ours.bytes_per_message
        if figure <= GOAL_BYTES:
            verdict = f"meets the <= {GOAL_BYTES} B goal"
        elif figure <= TARGET_BYTES:
            verdict = f"meets the <= {TARGET_BYTES} B target, not the <= {GOAL_BYTES} B goal"
        else:
            verdict = f"MISSES the <= {TARGET_BYTES} B target"
        lines.append(f"quorumqueue: {figure:,.1f} B per queued message ({verdict})")
    return lines


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    plan = probes_to_run(arguments.target, arguments.wal_max_size)
    if not plan:
        sys.exit("nothing to measure")
    print(
        f"{arguments.messages:,} x {arguments.size} B persistent messages into one durable quorum queue, "
        f"confirms <= {arguments.inflight} in flight, no consumer"
        + (f", raft.wal_max_size_bytes = {arguments.wal_max_size:,}" if arguments.wal_max_size else ""),
        file=sys.stderr,
    )
    results = []
    for label, start_probe in plan:
        try:
            results.append(run_one(label, start_probe, arguments))
        except (LoadError, ProbeError, ManagementError, RabbitMQNodeError, OSError, RuntimeError) as error:
            sys.exit(f"[{label}] FAILED: {error}")
    print()
    print(render_table(results))
    print()
    for line in render_verdict(results):
        print(line)
    if arguments.size >= 256:
        for line in render_bodies(results, arguments.wal_max_size):
            print(line)
    print(
        "bytes/msg = (RSS growth - memtable growth) / messages; queue est. = the queue's own figure "
        "(quorumqueue: fifo state_bytes; RabbitMQ: ra server process memory)"
    )
    if arguments.json:
        names = ("messages", "size", "inflight", "wal_max_size", "settle_timeout")
        settings = {name: getattr(arguments, name) for name in names}
        document = {
            "settings": settings,
            "results": [result.as_json() for result in results],
            "target_bytes": TARGET_BYTES,
            "goal_bytes": GOAL_BYTES,
        }
        arguments.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"results written to {arguments.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
