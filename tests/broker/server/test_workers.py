"""A node of two workers (broker.workers = 2, server/workers.py; docs/design/workers.md).

A client talks to the node's one AMQP port: it declares 4 quorum queues, publishes to
each with confirms and consumes them all, in order per queue, while the queues are
served by both worker processes. Killing a worker stops the node as a whole: the
node's process exits 70 and the other worker is gone with it; started again on its
data, the node has every confirmed message, in order. Stopped (SIGTERM), it stops its
workers and exits 0. A node of workers
refuses a data directory of a one-process node, a cluster configuration, and a name
whose host is not loopback (its workers dial each other by it).

Step 2 (node/handover.py): a connection whose first queue is on worker 1 is served by
worker 1 (the management API lists it once, there), with confirms and order across
the handover and channels opened before and after it; handed over, it still uses
worker 0's queues (forwarded); a connection owning an exclusive queue stays; a killed
worker 0 breaks the connections handed to worker 1 as the node stops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pika
import pytest

from quorumqueue.client.management import call
from tests.support.broker import ROOT, BrokerProcess
from tests.support.waiting import wait_until

from tests.broker.management.support import call as http

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


# ------------------------------------------------------------ step 2: the handover


def members(broker: BrokerProcess, queue: str) -> list[str]:
    status, row, _ = http(broker.management_url, "GET", f"/api/queues/%2F/{queue}")
    assert status == 200, (status, row)
    return row["members"]


def connection_rows(broker: BrokerProcess) -> list[dict]:
    status, rows, _ = http(broker.management_url, "GET", "/api/connections")
    assert status == 200, (status, rows)
    return rows


def declared_on_each_worker(broker: BrokerProcess) -> dict[str, str]:
    """{worker's node name: a queue whose one member it holds}, the queues declared
    by one connection (the node places each on the worker holding the fewest)."""
    def declare() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
        try:
            channel = connection.channel()
            for queue in QUEUES[:2]:
                channel.queue_declare(queue, durable=True,
                                      arguments={"x-queue-type": "quorum"})
        finally:
            connection.close()

    in_thread(declare)
    owners = {}
    for queue in QUEUES[:2]:
        [member] = members(broker, queue)
        owners[member] = queue
    assert len(owners) == 2, owners
    return owners


def test_a_connection_is_served_by_its_queues_worker(node):
    """Publish with confirms on a channel opened before the connection names its queue
    and consume on one opened after: the connection is listed once, first on the
    node's first worker, then on the worker holding the queue; every message arrives
    once, in order."""
    owners = declared_on_each_worker(node)
    other = next(name for name in owners if name != node_name(node))
    queue = owners[other]
    seen: dict[str, object] = {}

    def client() -> list[bytes]:
        connection = pika.BlockingConnection(pika.URLParameters(node.uri))
        try:
            publisher = connection.channel()
            publisher.confirm_delivery()
            publisher.basic_qos(prefetch_count=3)
            seen["before"] = connection_rows(node)
            for number in range(MESSAGES):
                publisher.basic_publish("", queue, f"m{number}".encode(), PERSISTENT,
                                        mandatory=True)
            seen["after"] = connection_rows(node)
            consumer = connection.channel()
            consumer.basic_qos(prefetch_count=10)
            return consume_bodies(consumer, queue, MESSAGES, timeout=60)
        finally:
            connection.close()

    assert in_thread(client) == [f"m{n}".encode() for n in range(MESSAGES)]
    assert [row["node"] for row in seen["before"]] == [node_name(node)]
    assert [row["node"] for row in seen["after"]] == [other], node.log()[-3000:]
    assert wait_until(lambda: connection_rows(node) == [], "the connection to be gone", 60)


def node_name(broker: BrokerProcess) -> str:
    status, overview, _ = http(broker.management_url, "GET", "/api/overview")
    assert status == 200, (status, overview)
    return overview["node"]


def test_a_connection_using_both_workers_queues_is_forwarded_in_order(node):
    """Handed to the worker of the first queue it names, a connection still publishes
    to and consumes from the other worker's queue (forwarded): everything confirmed
    arrives once, in order per queue."""
    owners = declared_on_each_worker(node)
    here = node_name(node)
    there = next(name for name in owners if name != here)
    order = [owners[there], owners[here]]  # handed over first, then forwarded

    def client() -> dict[str, list[bytes]]:
        connection = pika.BlockingConnection(pika.URLParameters(node.uri))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            for number in range(MESSAGES):
                for queue in order:
                    channel.basic_publish("", queue, f"{queue}-{number}".encode(),
                                          PERSISTENT, mandatory=True)
            rows = connection_rows(node)
            assert [row["node"] for row in rows] == [there], rows
            channel.basic_qos(prefetch_count=10)
            return {queue: consume_bodies(channel, queue, MESSAGES, timeout=60)
                    for queue in reversed(order)}
        finally:
            connection.close()

    received = in_thread(client)
    for queue in order:
        assert received[queue] == [f"{queue}-{n}".encode() for n in range(MESSAGES)]


def test_a_connection_owning_an_exclusive_queue_stays_and_keeps_it(node):
    """A connection with something on its first worker (here an exclusive queue, which
    lives and dies with the connection there) is not handed over: it publishes to the
    other worker's queue forwarded, its exclusive queue still there."""
    owners = declared_on_each_worker(node)
    here = node_name(node)
    queue = owners[next(name for name in owners if name != here)]

    def client() -> tuple[list, int]:
        connection = pika.BlockingConnection(pika.URLParameters(node.uri))
        try:
            channel = connection.channel()
            mine = channel.queue_declare("", exclusive=True).method.queue
            channel.confirm_delivery()
            for number in range(MESSAGES):
                channel.basic_publish("", queue, f"m{number}".encode(), PERSISTENT,
                                      mandatory=True)
            rows = [row["node"] for row in connection_rows(node)]
            channel.basic_publish("", mine, b"to my own queue", PERSISTENT, mandatory=True)
            return rows, channel.queue_declare(mine, passive=True).method.message_count
        finally:
            connection.close()

    rows, in_mine = in_thread(client)
    assert rows == [here]
    assert in_mine == 1
    assert in_thread(lambda: consume_one_queue(node, queue)) == [
        f"m{n}".encode() for n in range(MESSAGES)]


def consume_one_queue(broker: BrokerProcess, queue: str) -> list[bytes]:
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        return consume_bodies(channel, queue, MESSAGES, timeout=60)
    finally:
        connection.close()


def test_a_connection_on_its_queues_worker_breaks_when_a_worker_is_killed(node):
    """The node fails as a whole whichever worker ends: a client handed to worker 1
    loses its connection when worker 0 (the one holding the port) is killed."""
    owners = declared_on_each_worker(node)
    other = next(name for name in owners if name != node_name(node))
    queue = owners[other]

    def client() -> str:
        connection = pika.BlockingConnection(pika.URLParameters(node.uri))
        try:
            channel = connection.channel()
            channel.queue_declare(queue, passive=True)
            assert [row["node"] for row in connection_rows(node)] == [other]
            os.kill(workers_of(node)[0], signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    connection.process_data_events(time_limit=1)
                except pika.exceptions.AMQPError as error:
                    return type(error).__name__
            return "still open"
        finally:
            if connection.is_open:
                try:
                    connection.close()
                except pika.exceptions.AMQPError:
                    pass

    assert in_thread(client) != "still open"
    assert wait_until(lambda: node.process.poll(), "the node's process to exit", 60) == 70


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
