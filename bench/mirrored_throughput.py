"""Mirrored against unmirrored classic queues on a 3-node cluster, one run.

    python bench/mirrored_throughput.py [--messages 2000] [--size 1024] [--pairs 3]

A 3-node quorumqueue cluster (tests/support/cluster.py, with
deprecated_features.permit.classic_queue_mirroring = true) and, per pair, two fresh
durable classic queues declared on node 1: one no policy mirrors, one an ha-mode
"all" policy mirrors to the two other nodes. A pika client on node 1 publishes
``--messages`` persistent messages of ``--size`` bytes to each, one confirm awaited
at a time (so the figure is the confirm latency: the leader's fsync, plus for the
mirrored queue the round trip to both mirrors), then drains each with basic.get
and acks. Prints msgs/s per queue and per phase, and the median ratio mirrored /
unmirrored over the pairs (queues alternate, so a busy machine slows both alike).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import pika  # noqa: E402

from quorumqueue.client.management import call  # noqa: E402
from tests.support.cluster import LocalCluster, wait_for  # noqa: E402

CONFIG = "deprecated_features.permit.classic_queue_mirroring = true\n"


def publish(uri: str, queue: str, count: int, body: bytes) -> float:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    channel.confirm_delivery()
    began = time.perf_counter()
    for _ in range(count):
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    elapsed = time.perf_counter() - began
    connection.close()
    return count / elapsed


def drain(uri: str, queue: str, count: int) -> float:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    began = time.perf_counter()
    got = 0
    while got < count:
        method, _properties, _body = channel.basic_get(queue)
        if method is None:
            continue
        channel.basic_ack(method.delivery_tag)
        got += 1
    elapsed = time.perf_counter() - began
    connection.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--pairs", type=int, default=3)
    options = parser.parse_args()
    body = b"x" * options.size
    ratios = {"publish": [], "drain": []}
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        uri = cluster.uris()[0]
        wait_for("a metadata leader", lambda: call(uri, "cluster.status")["metadata_leader"])
        call(uri, "policies.set", vhost="/", name="ha-all", pattern=r"^ha\.",
             definition={"ha-mode": "all"}, apply_to="queues")
        print(f"{'pair':>4} {'queue':>10} {'publish/s':>10} {'drain/s':>10}")
        for pair in range(options.pairs):
            rates = {}
            for kind, name in (("unmirrored", f"plain.{pair}"), ("mirrored", f"ha.{pair}")):
                connection = pika.BlockingConnection(pika.URLParameters(uri))
                connection.channel().queue_declare(name, durable=True)
                connection.close()
                if kind == "mirrored":
                    wait_for("two mirrors", lambda: any(
                        r["name"] == name and len(r.get("synchronised_mirrors", [])) == 2
                        for r in call(uri, "queues.list", vhost="/")))
                rates[kind] = (publish(uri, name, options.messages, body),
                               drain(uri, name, options.messages))
                print(f"{pair:>4} {kind:>10} {rates[kind][0]:>10.0f} {rates[kind][1]:>10.0f}")
            ratios["publish"].append(rates["mirrored"][0] / rates["unmirrored"][0])
            ratios["drain"].append(rates["mirrored"][1] / rates["unmirrored"][1])
    for phase, values in ratios.items():
        print(f"median mirrored/unmirrored {phase}: {statistics.median(values):.2f} "
              f"({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
