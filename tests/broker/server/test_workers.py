"""A node of two workers (broker.workers = 2, server/workers.py; docs/design/workers.md).

A client talks to the node's one AMQP port: it declares 4 quorum queues, publishes to
each with confirms and consumes them all, in order per queue, while the queues are
served by both worker processes. Killing a worker stops the node as a whole: the
node's process exits 70 and the other worker is gone with it; started again on its
data, the node has every confirmed message, in order. Stopped (SIGTERM), it stops its
workers and exits 0. A node of workers
refuses a data directory of a one-process node, a cluster configuration, and a name
whose host is not loopback (its workers dial each other by it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pika
import pytest

from quorumqueue.client.management import call
from tests.support.broker import ROOT, BrokerProcess
from tests.support.waiting import wait_until

from .pika_support import consume_bodies

pytestmark = pytest.mark.timeout(300)

QUEUES = [f"workers-q{i}" for i in range(4)]
MESSAGES = 50
PERSISTENT = pika.BasicProperties(delivery_mode=2)
CLIENT_TIMEOUT_S = 120.0  # a bound for the client thread on a loaded machine


@pytest.fixture
def node(tmp_path):
    config = tmp_path / "workers.toml"
    config.write_text("[broker]\nworkers = 2\n")
    broker = BrokerProcess(data_dir=str(tmp_path / "data"), config=str(config))
    broker.start(timeout=120)
    try:
        yield broker
    finally:
        broker.cleanup()


def workers_of(broker: BrokerProcess) -> list[int]:
    pid = broker.process.pid
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def in_thread(action, timeout: float = CLIENT_TIMEOUT_S):
    """action()'s result, run on a thread joined with a timeout (pika blocks)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(("ok", action()))
        except BaseException as error:  # noqa: BLE001 - re-raised below
            outcome.append(("error", error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert outcome, f"the client did not finish within {timeout} s"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def publish(broker: BrokerProcess) -> None:
    """MESSAGES confirmed publishes to each of QUEUES (declared here), interleaved."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    try:
        channel = connection.channel()
        channel.confirm_delivery()  # a nack or an unroutable message raises
        for queue in QUEUES:
            channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        for number in range(MESSAGES):
            for queue in QUEUES:
                channel.basic_publish("", queue, f"{queue}-{number}".encode(), PERSISTENT,
                                      mandatory=True)
    finally:
        connection.close()


def consume(broker: BrokerProcess) -> dict[str, list[bytes]]:
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        return {queue: consume_bodies(channel, queue, MESSAGES, timeout=60) for queue in QUEUES}
    finally:
        connection.close()


def test_one_port_serves_queues_of_both_workers_with_confirms_and_order(node):
    assert len(workers_of(node)) == 2
    in_thread(lambda: publish(node))
    received = in_thread(lambda: consume(node))
    for queue in QUEUES:
        assert received[queue] == [f"{queue}-{n}".encode() for n in range(MESSAGES)]
    status = in_thread(lambda: call(node.uri, "cluster.status"))
    leaders = {row["name"]: row["leader"] for row in status["queues"] if row["name"] in QUEUES}
    assert len(leaders) == len(QUEUES)
    assert len(set(leaders.values())) == 2, leaders  # each worker serves queues


def test_a_killed_worker_stops_the_node_as_a_whole(node):
    workers = workers_of(node)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    status = wait_until(lambda: node.process.poll(), "the node's process to exit", 60)
    assert status == 70
    assert "worker 1" in node.log() and "the node stops as a whole" in node.log()
    with pytest.raises(ProcessLookupError):
        os.kill(workers[0], 0)


def test_a_stopped_node_stops_its_workers_and_exits_0(node):
    workers = workers_of(node)
    node.process.send_signal(signal.SIGTERM)
    assert wait_until(lambda: node.process.poll() is not None, "the node's process to exit",
                      60)
    assert node.process.returncode == 0, node.log()
    for pid in workers:  # reaped by the supervisor before it exited
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_what_was_confirmed_is_there_after_a_killed_worker_and_a_restart(node):
    in_thread(lambda: publish(node))
    os.kill(workers_of(node)[1], signal.SIGKILL)
    assert wait_until(lambda: node.process.poll(), "the node's process to exit", 60) == 70
    node.start(timeout=120)  # same data directory and port
    assert len(workers_of(node)) == 2
    received = in_thread(lambda: consume(node))
    for queue in QUEUES:
        assert received[queue] == [f"{queue}-{n}".encode() for n in range(MESSAGES)]


def start_refused(tmp_path, workers: str = "2", *options: str) -> subprocess.CompletedProcess:
    """`broker start` of a node of `workers` workers with `options`, which must exit
    before it serves: its exit status and output."""
    config = tmp_path / "workers.toml"
    config.write_text(f"[broker]\nworkers = {workers}\n")
    return subprocess.run([sys.executable, "-m", "quorumqueue.cli", "broker", "start",
                           "--port", "0", "--data-dir", str(tmp_path / "data"),
                           "--config", str(config), *options],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_a_node_of_workers_refuses_a_one_process_nodes_data(tmp_path):
    single = BrokerProcess(data_dir=str(tmp_path / "data"))
    single.start(timeout=120)
    single.cleanup()
    done = start_refused(tmp_path)
    assert done.returncode == 1, done.stderr
    assert "holds the data of a node of one process" in done.stderr


def test_a_node_of_workers_is_not_a_cluster_member_yet(tmp_path):
    done = start_refused(tmp_path, "2", "--node-name", "a@localhost",
                         "--cluster-nodes", "a@localhost:25672,b@localhost:25673")
    assert done.returncode != 0
    assert "broker.workers > 1 on a node of a cluster" in done.stderr


def test_broker_workers_must_be_a_positive_number(tmp_path):
    done = start_refused(tmp_path, "0")
    assert done.returncode != 0
    assert "broker.workers: expected a number of worker processes, at least 1" in done.stderr


def test_a_node_of_workers_needs_a_name_whose_host_is_loopback(tmp_path):
    done = start_refused(tmp_path, "2", "--node-name", "qq@no-such-host.invalid")
    assert done.returncode == 1, done.stderr
    assert "no-such-host.invalid resolves to nothing" in done.stderr
    assert "name the node NAME@localhost" in done.stderr
