"""AMQP throughput: quorumqueue against RabbitMQ 3.10.8, side by side, one run.

    python bench/amqp_throughput.py [--queue-type classic|quorum]
        [--messages 100000] [--size 1024] [--inflight 1000] [--prefetch 1000]
        [--target quorumqueue|rabbitmq|both]
        [--uri amqp://guest:guest@127.0.0.1:5672/%2F] [--json PATH]

Each target gets a freshly started broker and a fresh durable queue of
``--queue-type`` (classic by default; quorum declares ``x-queue-type: quorum``):
publish ``--messages`` persistent messages of ``--size`` bytes with confirms
(``--inflight`` unconfirmed at most), then consume them with manual acks
(prefetch ``--prefetch``, ``multiple=true`` acks every half prefetch). The load
generator is ``bench/amqp_loadgen.py``; it checks that every message was
confirmed and consumed exactly once and fails loudly otherwise. The table
shows msgs/s per phase, the generator's own CPU time, and quorumqueue/RabbitMQ
ratios (target: >= 0.5 on both phases; for quorum queues the goal is >= 1).
Progress goes to stderr.

With ``--uri`` nothing is started: the broker at that address is measured and
labelled with ``--target`` (quorumqueue or rabbitmq).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.amqp_loadgen import QUEUE_TYPES, LoadError, LoadResult, LoadSettings, run_load  # noqa: E402
from bench.brokers import BrokerAddress, quorumqueue_broker, rabbitmq_broker  # noqa: E402
from tests.support.rabbitmq import RabbitMQNode, RabbitMQNodeError  # noqa: E402

TARGET_RATIO = 0.5  # quorumqueue / RabbitMQ, both phases
GOAL_RATIOS = {"quorum": 1.0}  # quorum queues: at least as fast as RabbitMQ (bench/README.md)
BrokerStarter = Callable[[], AbstractContextManager[BrokerAddress]]


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue-type", choices=QUEUE_TYPES, default="classic", help="durable queue to measure")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message (>= 8)")
    parser.add_argument("--inflight", type=int, default=1000, help="max unconfirmed publishes")
    parser.add_argument("--prefetch", type=int, default=1000, help="basic.qos prefetch count")
    parser.add_argument("--target", choices=("quorumqueue", "rabbitmq", "both"), default="both")
    parser.add_argument("--uri", help="measure an already running broker instead of starting one")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="generator's event loop")
    arguments = parser.parse_args(argv)
    for name in ("messages", "inflight", "prefetch"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if arguments.size < 8:
        parser.error("--size must be at least 8 (bodies carry an 8-byte sequence number)")
    if arguments.prefetch > 65535:
        parser.error("--prefetch must fit basic.qos's 16-bit prefetch-count (<= 65535)")
    if arguments.uri and arguments.target == "both":
        parser.error("with --uri, say which broker it is: --target quorumqueue or --target rabbitmq")
    return arguments


def brokers_to_run(arguments: argparse.Namespace) -> list[tuple[str, BrokerStarter]]:
    if arguments.uri:
        address = BrokerAddress.from_uri(arguments.uri)
        return [(arguments.target, lambda: nullcontext(address))]
    plan: list[tuple[str, BrokerStarter]] = []
    if arguments.target in ("quorumqueue", "both"):
        plan.append(("quorumqueue", quorumqueue_broker))
    if arguments.target in ("rabbitmq", "both"):
        if RabbitMQNode.available():
            plan.append(("rabbitmq", rabbitmq_broker))
        elif arguments.target == "rabbitmq":
            sys.exit(f"cannot benchmark RabbitMQ: {RabbitMQNode.skip_reason}")
        else:
            print(f"note: no RabbitMQ baseline, so no ratios: {RabbitMQNode.skip_reason}", file=sys.stderr)
    return plan


def run_one(label: str, start_broker: BrokerStarter, arguments: argparse.Namespace) -> dict:
    if not arguments.uri:
        print(f"[{label}] starting broker ...", file=sys.stderr)
    with start_broker() as address:
        started = f"up after {address.startup_s:.1f} s" if address.startup_s is not None else "already running"
        print(f"[{label}] {address.host}:{address.port}, {started}", file=sys.stderr)
        settings = LoadSettings(
            host=address.host,
            port=address.port,
            user=address.user,
            password=address.password,
            vhost=address.vhost,
            messages=arguments.messages,
            size=arguments.size,
            inflight=arguments.inflight,
            prefetch=arguments.prefetch,
            queue_type=arguments.queue_type,
        )
        result = _run_event_loop(run_load(settings, report=_progress_printer(label)), arguments.loop)
    _print_phase_lines(label, result)
    return {
        "target": label,
        "queue_type": arguments.queue_type,
        "broker_startup_s": address.startup_s,
        "publish": asdict(result.publish) | {"msgs_per_s": result.publish.rate},
        "consume": asdict(result.consume) | {"msgs_per_s": result.consume.rate},
    }


def _run_event_loop(coroutine, loop_name: str) -> LoadResult:
    if loop_name == "uvloop":
        try:
            import uvloop
        except ImportError:
            print("uvloop not installed; using asyncio's default loop", file=sys.stderr)
        else:
            return uvloop.run(coroutine)  # uvloop >= 0.18
    return asyncio.run(coroutine)


def _progress_printer(label: str) -> Callable[[str, int, int, float], None]:
    def report(phase: str, done: int, total: int, elapsed: float) -> None:
        rate = done / elapsed if elapsed > 0 else 0.0
        print(f"[{label}] {phase:7} {done:>9,}/{total:,}  {rate:>9,.0f} msg/s so far", file=sys.stderr)

    return report


def _print_phase_lines(label: str, result: LoadResult) -> None:
    for name, phase in (("publish", result.publish), ("consume", result.consume)):
        print(
            f"[{label}] {name:7} done: {phase.messages:,} in {phase.wall_s:.2f} s = {phase.rate:,.0f} msg/s; "
            f"generator CPU {phase.generator_cpu_s:.2f} s ({phase.generator_cpu_share:.0%} busy, "
            f"ceiling ~{phase.messages / max(phase.generator_cpu_s, 1e-9):,.0f} msg/s)",
            file=sys.stderr,
        )


def render_table(rows: list[dict]) -> str:
    queue_types = sorted({row.get("queue_type", "classic") for row in rows})
    lines = [
        f"{' / '.join(queue_types)} queues",
        f"{'target':<12} {'publish msg/s':>14} {'consume msg/s':>14} {'generator CPU s':>16} {'generator busy':>15}",
        f"{'':<12} {'':>14} {'':>14} {'(pub / con)':>16} {'(pub / con)':>15}",
    ]
    for row in rows:
        publish, consume = row["publish"], row["consume"]
        cpu = f"{publish['generator_cpu_s']:.2f} / {consume['generator_cpu_s']:.2f}"
        share = f"{publish['generator_cpu_s'] / publish['wall_s']:.0%} / {consume['generator_cpu_s'] / consume['wall_s']:.0%}"
        lines.append(
            f"{row['target']:<12} {publish['msgs_per_s']:>14,.0f} {consume['msgs_per_s']:>14,.0f} {cpu:>16} {share:>15}"
        )
    return "\n".join(lines)


def ratios(rows: list[dict]) -> dict[str, float] | None:
    by_target = {row["target"]: row for row in rows}
    if not {"quorumqueue", "rabbitmq"} <= by_target.keys():
        return None
    ours, theirs = by_target["quorumqueue"], by_target["rabbitmq"]
    return {phase: ours[phase]["msgs_per_s"] / theirs[phase]["msgs_per_s"] for phase in ("publish", "consume")}


def render_ratios(phase_ratios: dict[str, float], queue_type: str) -> str:
    """The ratio line, judged against the target and, for quorum queues, the goal."""
    worst = min(phase_ratios.values())
    goal = GOAL_RATIOS.get(queue_type)
    if goal is not None and worst >= goal:
        verdict = f"meets the >= {goal}x goal"
    elif worst >= TARGET_RATIO:
        verdict = f"meets the >= {TARGET_RATIO}x target" + (f", not the >= {goal}x goal" if goal else "")
    else:
        verdict = f"MISSES the >= {TARGET_RATIO}x target"
    return (
        f"quorumqueue / rabbitmq ({queue_type} queues): publish {phase_ratios['publish']:.2f}x, "
        f"consume {phase_ratios['consume']:.2f}x ({verdict})"
    )


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    plan = brokers_to_run(arguments)
    if not plan:
        sys.exit("nothing to benchmark")
    print(
        f"{arguments.messages:,} x {arguments.size} B persistent messages, durable {arguments.queue_type} queue, "
        f"confirms <= {arguments.inflight} in flight, prefetch {arguments.prefetch}, manual multiple acks",
        file=sys.stderr,
    )
    rows = []
    for label, start_broker in plan:
        try:
            rows.append(run_one(label, start_broker, arguments))
        except (LoadError, RabbitMQNodeError, OSError, RuntimeError) as error:
            sys.exit(f"[{label}] FAILED: {error}")
    print()
    print(render_table(rows))
    phase_ratios = ratios(rows)
    if phase_ratios:
        print("\n" + render_ratios(phase_ratios, arguments.queue_type))
    if arguments.json:
        names = ("queue_type", "messages", "size", "inflight", "prefetch", "loop")
        settings = {name: getattr(arguments, name) for name in names}
        document = {
            "settings": settings,
            "results": rows,
            "ratios": phase_ratios,
            "target_ratio": TARGET_RATIO,
            "goal_ratio": GOAL_RATIOS.get(arguments.queue_type),
        }
        arguments.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"results written to {arguments.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
