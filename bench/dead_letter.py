"""Expiry and dead lettering of many messages: quorumqueue against RabbitMQ 3.10.8.

    python bench/dead_letter.py [--messages 100000] [--size 256] [--inflight 1000]
        [--queue-type classic|quorum] [--ttl 0] [--target quorumqueue|rabbitmq|both]
        [--json PATH]

Per target, on a freshly started broker: a durable target queue and a durable
source queue of `--queue-type` whose x-message-ttl is `--ttl` ms and whose
dead-letter exchange (the default exchange, routing key: the target) sends expired
messages to the target. `--messages` persistent messages of `--size` bytes are
published to the source with confirms (`--inflight` at most unconfirmed), none
consumed: every one expires (with TTL 0 on reaching the queue, else on the
broker's timer) and is dead-lettered with an x-death header into the target.

Reported per broker: the publish phase (first publish to last confirm), the total
time from the first publish until the target holds every message and the source
none, the messages per second that makes, and the broker process's RSS growth
(after the run, against before it) per message. The table ends with the
quorumqueue / RabbitMQ ratio of the total time (below 1: quorumqueue is faster)
and of the RSS growth. Both brokers run one after the other in one invocation.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import amqp_wire as wire  # noqa: E402
from bench.amqp_loadgen import (PUBLISH_CHANNEL, QUEUE_TYPES, LoadError,  # noqa: E402
                                LoadSettings, connect, declare_arguments, queue_counts)
from bench.broker_memory import quorumqueue_probe, rabbitmq_probe, rss_bytes  # noqa: E402

WAIT_S = 600.0  # the bound for the target to fill (a failed run, not a slow one)


@dataclass(frozen=True, slots=True)
class Result:
    target: str
    messages: int
    publish_s: float
    total_s: float
    rss_growth_bytes: int

    @property
    def rate(self) -> float:
        return self.messages / self.total_s


async def _declare(generator, queue: str, arguments: dict) -> None:
    declared = await generator.call(PUBLISH_CHANNEL, wire.queue_declare(
        PUBLISH_CHANNEL, queue, durable=True, arguments=arguments), wire.QUEUE_DECLARE_OK)
    if wire.read_declare_ok(declared)[1:] != (0, 0):
        raise LoadError(f"queue {queue} is not fresh")


async def run(settings: LoadSettings, ttl: int, pid: int, label: str) -> Result:
    generator = await connect(settings)
    source, target = f"bench-dl-src-{label}", f"bench-dl-dst-{label}"
    kind = declare_arguments(settings.queue_type)
    await _declare(generator, target, kind)
    await _declare(generator, source, {**kind, "x-message-ttl": ttl,
                                       "x-dead-letter-exchange": "",
                                       "x-dead-letter-routing-key": target})
    await generator.call(PUBLISH_CHANNEL, wire.confirm_select(PUBLISH_CHANNEL),
                         wire.CONFIRM_SELECT_OK)
    rss_before = rss_bytes(pid)
    block = wire.PublishBlock.build(PUBLISH_CHANNEL, source, settings.size,
                                    generator.frame_max, settings.inflight)
    began = time.perf_counter()
    await generator.start_publishing(block)
    published = time.perf_counter()
    if generator.confirmed != settings.messages:
        raise LoadError(f"confirmed {generator.confirmed} of {settings.messages}")
    deadline = time.monotonic() + WAIT_S
    while True:
        moved, _ = await queue_counts(generator, target)
        left, _ = await queue_counts(generator, source)
        if moved == settings.messages and left == 0:
            break
        if moved > settings.messages or time.monotonic() > deadline:
            raise LoadError(f"{moved} of {settings.messages} dead-lettered, {left} left")
        await asyncio.sleep(0.02)
    done = time.perf_counter()
    growth = rss_bytes(pid) - rss_before
    generator.transport.close()
    return Result(label, settings.messages, published - began, done - began, growth)


def measure(target: str, arguments) -> Result:
    probe_of = quorumqueue_probe if target == "quorumqueue" else rabbitmq_probe
    with probe_of() as probe:
        address = probe.address
        settings = LoadSettings(address.host, address.port, messages=arguments.messages,
                                size=arguments.size, inflight=arguments.inflight,
                                queue_type=arguments.queue_type)
        print(f"{target}: {arguments.messages} messages, ttl {arguments.ttl} ms ...",
              file=sys.stderr)
        return asyncio.run(run(settings, arguments.ttl, probe.pid, target))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=256, help="body bytes (>= 8)")
    parser.add_argument("--inflight", type=int, default=1000)
    parser.add_argument("--queue-type", choices=QUEUE_TYPES, default="classic")
    parser.add_argument("--ttl", type=int, default=0, help="the source's x-message-ttl (ms)")
    parser.add_argument("--target", choices=("quorumqueue", "rabbitmq", "both"), default="both")
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    targets = ["quorumqueue", "rabbitmq"] if arguments.target == "both" else [arguments.target]
    results = [measure(target, arguments) for target in targets]
    print(f"{arguments.queue_type} queues, {arguments.messages} messages of "
          f"{arguments.size} B, x-message-ttl {arguments.ttl} ms, dead-lettered")
    print(f"{'target':<12} {'publish s':>10} {'total s':>9} {'msg/s':>9} {'RSS B/msg':>10}")
    for result in results:
        print(f"{result.target:<12} {result.publish_s:>10.2f} {result.total_s:>9.2f} "
              f"{result.rate:>9,.0f} {result.rss_growth_bytes / result.messages:>10.0f}")
    if len(results) == 2:
        ours, theirs = results
        print(f"quorumqueue / RabbitMQ: total time {ours.total_s / theirs.total_s:.2f}x, "
              f"RSS growth {ours.rss_growth_bytes / max(theirs.rss_growth_bytes, 1):.2f}x")
    if arguments.json:
        arguments.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
