"""Declare and delete server-named exclusive classic queues on a solo node, timed.

    python bench/classic_declare.py [--queues 1000] [--uri amqp://...]

Starts a fresh bundled broker (or measures the one at ``--uri``), then on one pika
blocking channel declares ``--queues`` exclusive server-named classic queues and
deletes each one after its declare-ok, and prints queues/s. Since classic queue
records go through the metadata log, each declare and each delete waits for one
metadata-log fsync; this shows what that costs. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import pika  # noqa: E402

from bench.brokers import BrokerAddress, quorumqueue_broker  # noqa: E402


def measure(port: int, host: str, count: int) -> float:
    connection = pika.BlockingConnection(pika.ConnectionParameters(host=host, port=port))
    try:
        channel = connection.channel()
        began = time.perf_counter()
        for _ in range(count):
            name = channel.queue_declare("", exclusive=True).method.queue
            channel.queue_delete(name)
        return time.perf_counter() - began
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--uri", help="host:port of a running broker instead of starting one")
    arguments = parser.parse_args(argv)
    if arguments.uri:
        host, _, port = arguments.uri.rpartition(":")
        broker = nullcontext(BrokerAddress(host, int(port), startup_s=0.0))
    else:
        broker = quorumqueue_broker()
    with broker as address:
        seconds = measure(address.port, address.host, arguments.queues)
    print(f"{arguments.queues} exclusive classic queues declared and deleted in "
          f"{seconds:.2f} s: {arguments.queues / seconds:.0f} queues/s, "
          f"{seconds / arguments.queues * 1000:.2f} ms per declare+delete")


if __name__ == "__main__":
    main()
