"""Metadata operations, quorumqueue beside RabbitMQ 3.10.8: exchange cycles, declares, deletes.

    python bench/metadata_ops.py [--pairs 3] [--cycles 200] [--queues 500] [--block 100]
        [--json PATH]

What a client loop of metadata operations costs (issue 32 item 10, issue 31 Build 2),
one blocking pika channel, each operation waiting for its -ok:

- **exchange**: `--cycles` times exchange.declare (durable direct), queue.bind of a
  durable classic queue to it, queue.unbind, exchange.delete: milliseconds per
  operation (four per cycle);
- **declare**: `--queues` durable quorum queues, one after the other: milliseconds
  per declare for each block of `--block` (the first 100, the 101st-200th, ...),
  so a cost that grows with the number of queues shows as a rising row;
- **delete**: the same queues deleted, milliseconds per delete.

Beside each figure, the broker's CPU per operation (its process's user + system
time from /proc, with its children's: beam.smp for RabbitMQ).

A pair is one fresh broker of each kind, measured one after the other; the order
alternates from pair to pair. Each broker and each loader runs in a process session
of its own (setsid), so Linux shares the CPU between them as between the other
sessions of a shared machine. The table gives the median of the pairs and their
range, and quorumqueue / RabbitMQ of the medians (below 1: quorumqueue is faster).
The 1-minute load average before each pair is printed: figures taken on a loaded
machine say how the two compare there, not what either does on a quiet one.
Progress goes to stderr, the table to stdout.
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

from bench.process_cpu import process_cpu  # noqa: E402

TARGETS = ("quorumqueue", "rabbitmq")


def load_average() -> float:
    return os.getloadavg()[0]


# ---------------------------------------------------------------- the loader

def run_loader(port: int, broker_pid: int, cycles: int, queues: int, block: int) -> dict:
    """The operations against the broker at `port` (this process is the loader, in a
    session of its own); seconds and broker CPU seconds of each phase."""
    import pika

    connection = pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=port, heartbeat=0, blocked_connection_timeout=600))
    channel = connection.channel()
    result: dict = {}

    def timed(action) -> tuple[float, float]:
        cpu, began = process_cpu(broker_pid), time.perf_counter()
        action()
        return time.perf_counter() - began, process_cpu(broker_pid) - cpu

    channel.queue_declare("bench-target", durable=True)

    def exchange_cycles() -> None:
        for number in range(cycles):
            name = f"bench-x-{number}"
            channel.exchange_declare(name, "direct", durable=True)
            channel.queue_bind("bench-target", name, routing_key="k")
            channel.queue_unbind("bench-target", name, routing_key="k")
            channel.exchange_delete(name)

    seconds, cpu = timed(exchange_cycles)
    result["exchange"] = {"operations": 4 * cycles, "seconds": seconds, "cpu": cpu}

    names = [f"bench-q-{number}" for number in range(queues)]
    blocks = []
    for start in range(0, queues, block):
        chunk = names[start:start + block]

        def declare(chunk=chunk) -> None:
            for name in chunk:
                channel.queue_declare(name, durable=True,
                                      arguments={"x-queue-type": "quorum"})

        seconds, cpu = timed(declare)
        blocks.append({"first": start + 1, "last": start + len(chunk),
                       "operations": len(chunk), "seconds": seconds, "cpu": cpu})
        print(f"  declared {start + len(chunk)}: {seconds / len(chunk) * 1000:.2f} ms each",
              file=sys.stderr, flush=True)
    result["declare"] = blocks

    def delete() -> None:
        for name in names:
            channel.queue_delete(name)

    seconds, cpu = timed(delete)
    result["delete"] = {"operations": queues, "seconds": seconds, "cpu": cpu}
    channel.queue_delete("bench-target")
    connection.close()
    return result


# ---------------------------------------------------------------- the driver

def measure(target: str, arguments) -> dict:
    """One fresh broker of `target` and one loader against it, each in its own session."""
    return measure_with(target, __file__, [
        "--cycles", str(arguments.cycles), "--queues", str(arguments.queues),
        "--block", str(arguments.block)])


def measure_with(target: str, script: str, options: list[str], timeout: float = 3600) -> dict:
    """One fresh broker of `target`, and `script --loader --port P --broker-pid PID
    *options` against it, each in a process session of its own; the JSON the loader
    printed (bench/queue_count.py uses it too)."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        if target == "quorumqueue":
            from bench.brokers import quorumqueue_broker

            address = stack.enter_context(quorumqueue_broker(new_session=True))
            port, pid = address.port, address.pid
        else:
            from bench.broker_memory import beam_pid
            from tests.support.rabbitmq import RabbitMQNode

            node = stack.enter_context(RabbitMQNode())
            port, pid = node.port, beam_pid(node)
        command = [sys.executable, script, "--loader", "--port", str(port),
                   "--broker-pid", str(pid), *options]
        done = subprocess.run(command, stdout=subprocess.PIPE, start_new_session=True,
                              timeout=timeout, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{target}: the loader failed (exit {done.returncode})")
        return json.loads(done.stdout)


def per_operation(phase: dict) -> tuple[float, float]:
    """(ms per operation, broker CPU ms per operation)."""
    return (phase["seconds"] / phase["operations"] * 1000,
            phase["cpu"] / phase["operations"] * 1000)


def rows(result: dict) -> dict[str, tuple[float, float]]:
    found = {"exchange op": per_operation(result["exchange"])}
    for block in result["declare"]:
        found[f"declare {block['first']}-{block['last']}"] = per_operation(block)
    found["delete"] = per_operation(result["delete"])
    return found


def report(pairs: list[dict], loads: list[float]) -> str:
    lines = [f"{len(pairs)} pairs, 1-minute load before each: "
             + ", ".join(f"{load:.1f}" for load in loads), ""]
    header = (f"{'operation':<18}{'quorumqueue ms':>16}{'(range)':>16}{'RabbitMQ ms':>14}"
              f"{'(range)':>16}{'qq/RMQ':>8}   {'CPU ms qq / RMQ':>16}")
    lines.append(header)
    names = list(rows(pairs[0]["quorumqueue"]))
    for name in names:
        cells = []
        medians = {}
        for target in TARGETS:
            values = [rows(pair[target])[name] for pair in pairs]
            wall = [v[0] for v in values]
            medians[target] = (statistics.median(wall), statistics.median(v[1] for v in values))
            cells.append(f"{medians[target][0]:>{16 if target == 'quorumqueue' else 14}.2f}"
                         f"{f'({min(wall):.2f}-{max(wall):.2f})':>16}")
        ratio = medians["quorumqueue"][0] / medians["rabbitmq"][0]
        lines.append(f"{name:<18}{cells[0]}{cells[1]}{ratio:>7.2f}x   "
                     f"{medians['quorumqueue'][1]:>7.2f} / {medians['rabbitmq'][1]:.2f}")
    return "\n".join(lines)


def pair_parser(doc: str, pairs: int, queues: int, block: int) -> argparse.ArgumentParser:
    """The options of a bench that measures pairs of fresh brokers with `measure_with`
    (bench/queue_count.py uses it too). They are how many pairs, queues and declares
    per row, which brokers, and where the JSON goes. The loader's own options
    (--loader, --port, --broker-pid) are hidden. The description is `doc`'s first
    paragraph."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=pairs)
    parser.add_argument("--queues", type=int, default=queues, help="quorum queues declared")
    parser.add_argument("--block", type=int, default=block, help="declares per row")
    parser.add_argument("--target", choices=TARGETS, action="append",
                        help="measure only this broker (repeatable; default both)")
    parser.add_argument("--json", help="write every pair's figures here")
    parser.add_argument("--loader", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    # one pid, or a cluster's, comma-separated (queue_count.py --nodes 3)
    parser.add_argument("--broker-pid", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = pair_parser(__doc__, pairs=3, queues=500, block=100)
    parser.add_argument("--cycles", type=int, default=200,
                        help="exchange declare/bind/unbind/delete cycles")
    arguments = parser.parse_args(argv)
    if arguments.loader:
        print(json.dumps(run_loader(arguments.port, int(arguments.broker_pid), arguments.cycles,
                                    arguments.queues, arguments.block)))
        return
    targets = tuple(arguments.target or TARGETS)
    pairs, loads = [], []
    for number in range(arguments.pairs):
        loads.append(load_average())
        order = targets if number % 2 == 0 else tuple(reversed(targets))
        pair = {}
        for target in order:
            print(f"pair {number + 1}: {target} (load {load_average():.1f})", file=sys.stderr,
                  flush=True)
            pair[target] = measure(target, arguments)
        pairs.append(pair)
    if arguments.json:
        Path(arguments.json).write_text(json.dumps({"loads": loads, "pairs": pairs}, indent=1))
    if set(targets) == set(TARGETS):
        print(report(pairs, loads))
    else:
        for pair in pairs:
            for target, result in pair.items():
                for name, (wall, cpu) in rows(result).items():
                    print(f"{target:<12} {name:<18} {wall:8.2f} ms  CPU {cpu:6.2f} ms")


if __name__ == "__main__":
    main()
