"""The bundled broker's CPU per confirmed publish, by the shape of what publishes.

    python bench/publish_cpu.py [--messages 300000] [--size 256] [--rounds 3]
        [--shapes plain-1,keyed-1,keyed-2] [--json PATH]

What the broker spends per message the sink publishes, without Spark: one bundled
broker (a process of its own, in its own session), a fresh quorum queue per run, and
`--messages` persistent messages of `--size` bytes published into it with publisher
confirms by child processes, each the connector's `ConfirmedPublisher` on a
connection of its own (1,000 unconfirmed messages at most; the keyed shapes' rows go
to the bundled broker as batch publishes, 4,000 rows unconfirmed at most:
`connector/publisher.py`, MAX_IN_FLIGHT_BATCHED). Shapes (`--shapes`):

- `plain-N`: N publishers of plain messages (no idempotency key), each
  `--messages` / N of them;
- `keyed-N`: N publishers of what one sink task publishes (the sink's rows with their
  idempotency keys, `bench/connector_sink.py` `keyed_messages`); `keyed-2` is the
  bench's sink (`connector_vs_kafka.py`, 2 partitions) without Spark.

Per run it reads the broker's CPU seconds (/proc/PID/stat, user + system, every
thread) and its read and write system calls (/proc/PID/io `syscr`, `syscw`) before
the first child starts and after the last one ends, checks that the queue holds
every message, and prints per message: broker CPU microseconds, system calls, the
wall rate. The shapes are interleaved, the order rotated every round; the figures are
the medians over the rounds. CPU per message moves less with the machine's load than
the rates do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.brokers import quorumqueue_broker  # noqa: E402
from bench.process_cpu import process_cpu  # noqa: E402

CHILD = """
import json, sys, time
sys.path.insert(1, {repo!r})
from bench.connector_sink import keyed_messages
import pika
from quorumqueue.connector.options import parse_sink_options
from quorumqueue.connector.publisher import ConfirmedPublisher, Outgoing
uri, queue, messages, size, keyed = {uri!r}, {queue!r}, {messages}, {size}, {keyed}
options = parse_sink_options({{"uri": uri, "routingKey": queue}})
body = b"x" * size
persistent = pika.BasicProperties(delivery_mode=2)
rows = (keyed_messages(options, body, messages) if keyed else
        (Outgoing(n, "", queue, body, persistent) for n in range(messages)))
print("ready", flush=True)
sys.stdin.readline()
wall = time.perf_counter()
ConfirmedPublisher(options.addresses, False, 120.0, lambda _p: None).run(rows)
print(json.dumps({{"seconds": time.perf_counter() - wall}}), flush=True)
"""


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default="plain-1,keyed-1,keyed-2")
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args(argv)
    shapes = []
    for shape in arguments.shapes.split(","):
        kind, _, count = shape.strip().partition("-")
        if kind not in ("plain", "keyed") or not count.isdigit() or int(count) < 1:
            parser.error(f"--shapes: {shape!r} is not plain-N or keyed-N (N >= 1)")
        shapes.append((shape.strip(), kind == "keyed", int(count)))
    arguments.shape_list = shapes
    return arguments


def io_calls(pid: int) -> tuple[int, int]:
    """(read, write) system calls of `pid` so far (/proc/PID/io)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def one_run(broker, keyed: bool, publishers: int, arguments) -> dict:
    import pika

    queue = f"bench-publish-cpu-{os.urandom(4).hex()}"
    uri = f"amqp://guest:guest@127.0.0.1:{broker.port}/%2F"
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        connection.channel().queue_declare(queue, durable=True,
                                           arguments={"x-queue-type": "quorum"})
    each = arguments.messages // publishers
    children = [subprocess.Popen(
        [sys.executable, "-c", CHILD.format(repo=str(REPO_ROOT), uri=uri, queue=queue,
                                            messages=each, size=arguments.size, keyed=keyed)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        for _ in range(publishers)]
    for child in children:  # the rows are built before the clock starts
        if child.stdout.readline().strip() != "ready":
            raise SystemExit("a publishing child failed before publishing")
    pid = broker.pid
    cpu, calls, wall = process_cpu(pid), io_calls(pid), time.perf_counter()
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        out, _ = child.communicate(timeout=900)
        if child.returncode != 0:
            raise SystemExit(f"a publishing child failed (exit {child.returncode})")
    wall = time.perf_counter() - wall
    cpu, after = process_cpu(pid) - cpu, io_calls(pid)
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        channel = connection.channel()
        held = channel.queue_declare(queue, passive=True).method.message_count
        channel.queue_delete(queue)
    total = each * publishers
    if held != total:
        raise SystemExit(f"{queue} holds {held} messages, not {total}")
    return {"messages": total, "seconds": wall, "broker_cpu_s": cpu,
            "reads": after[0] - calls[0], "writes": after[1] - calls[1]}


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    runs: dict[str, list[dict]] = {name: [] for name, _keyed, _n in arguments.shape_list}
    with quorumqueue_broker(new_session=True) as broker:
        for round_number in range(arguments.rounds):
            shapes = arguments.shape_list[round_number % len(arguments.shape_list):] + \
                arguments.shape_list[:round_number % len(arguments.shape_list)]
            for name, keyed, publishers in shapes:
                run = one_run(broker, keyed, publishers, arguments)
                runs[name].append(run)
                print(f"[round {round_number + 1}] {name}: {run['messages']:,} in "
                      f"{run['seconds']:.2f} s, broker {run['broker_cpu_s']:.2f} CPU s "
                      f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    print(f"{arguments.messages:,} x {arguments.size} B confirmed publishes into a quorum "
          f"queue, {arguments.rounds} round(s); medians (min-max)\n")
    print("| shape | broker CPU us/msg | read syscalls/msg | write syscalls/msg | msg/s |")
    print("|---|---|---|---|---|")
    for name, shape_runs in runs.items():
        def spread(values, form):
            return (f"{format(statistics.median(values), form)} "
                    f"({format(min(values), form)}-{format(max(values), form)})")
        print(f"| {name} | "
              f"{spread([r['broker_cpu_s'] / r['messages'] * 1e6 for r in shape_runs], '.1f')} | "
              f"{spread([r['reads'] / r['messages'] for r in shape_runs], '.3f')} | "
              f"{spread([r['writes'] / r['messages'] for r in shape_runs], '.3f')} | "
              f"{spread([r['messages'] / r['seconds'] for r in shape_runs], ',.0f')} |")
    print(f"\nreproduce: python bench/publish_cpu.py " + " ".join(sys.argv[1:] if argv is None
                                                                 else argv))
    if arguments.json:
        arguments.json.write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
