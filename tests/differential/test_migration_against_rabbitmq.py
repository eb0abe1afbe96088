"""Blue-green migration from RabbitMQ 3.10.8's mirrored classic queues into quorumqueue.

On a RabbitMQ 3.10.8 node of this module's own (one for all its tests, with the
shovel plugin the side-by-side tests below need), mirroring policies are set with
rabbitmqctl (`ha-mode all` is allowed on a single node there) and classic queues
declared by a client; `rabbitmqctl export_definitions` writes the export. quorumqueue
refuses that file as it is (its ha-* keys, naming the deprecated-feature switch); after
`quorumqueue ctl transform_definitions --transformations
prepare_for_quorum_queue_migration,strip_cmq_keys_from_policies,drop_empty_policies`
it imports, and the mirrored queues are quorum queues, the policies hold no ha-* key.

Then the messages: a mirrored queue holding 10,000 messages is moved into a
3-node quorumqueue cluster's quorum queue by a dynamic shovel set on quorumqueue
(`quorumqueue ctl set_parameter shovel`, ack-mode on-confirm) while a publisher
keeps writing to the source; after it stopped and the shovel drained the source,
every message id is at the destination exactly once. 10,000 messages show that
as the 100,000 of earlier versions did, in a tenth of the time (the shovel moves
900 to 1,450 messages a second from RabbitMQ into the 3-node cluster's quorum
queue on the 2-core test machine, the lower rate with the publisher beside it).

A lost source connection, side by side: RabbitMQ 3.10.8's own shovel and
quorumqueue's each reach a mirrored queue through a TCP proxy that holds their acks
while the destination confirms a prefetch, then resets the connection; RabbitMQ's
publishes the requeued messages again, quorumqueue's does not.

And the shovel's definition checks: RabbitMQ 3.10.8 with its shovel plugin and
quorumqueue refuse the same bad definitions with the same reason lines, and list a
good one alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from tests.support.broker import BrokerProcess
from tests.support.cluster import LocalCluster, TcpProxy

from tests.support.rabbitmq import MARKER_VARIABLE, RabbitMQNode
from tests.support.waiting import wait_until

from .test_definitions_against_rabbitmq import RABBITMQCTL, qqctl, rabbitmqctl

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def rabbitmq_node():
    """The module's RabbitMQ 3.10.8 node, with its shovel plugin (one boot for
    every test here; each test uses vhosts, queues and shovels of its own)."""
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with RabbitMQNode(plugins=("rabbitmq_shovel",)) as node:
        yield node

CHAIN = "prepare_for_quorum_queue_migration,strip_cmq_keys_from_policies,drop_empty_policies"


def test_a_rabbitmq_3108_export_with_mirroring_migrates(rabbitmq_node, tmp_path):  # noqa: F811
    node = rabbitmq_node
    rabbitmqctl(node, "add_vhost", "mig")
    rabbitmqctl(node, "set_permissions", "-p", "mig", "guest", ".*", ".*", ".*")
    rabbitmqctl(node, "set_policy", "-p", "mig", "--apply-to", "queues", "ha-orders",
                "^orders", '{"ha-mode": "all", "ha-sync-mode": "automatic"}')
    rabbitmqctl(node, "set_policy", "-p", "mig", "--apply-to", "queues", "--priority", "1",
                "ha-audit", "^audit", '{"ha-mode": "exactly", "ha-params": 2, '
                '"max-length": 100}')
    connection = pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{node.port}/mig"))
    channel = connection.channel()
    channel.queue_declare("orders", durable=True,
                          arguments={"x-queue-mode": "lazy", "x-max-length": 50})
    channel.queue_declare("audit-log", durable=True, arguments={"x-max-priority": 3})
    channel.queue_declare("plain", durable=True)
    connection.close()
    listed = rabbitmqctl(node, "list_queues", "-p", "mig", "name", "policy")
    assert "ha-orders" in listed and "ha-audit" in listed  # mirroring applied there

    raw = tmp_path / "rabbitmq.json"
    rabbitmqctl(node, "export_definitions", str(raw))
    exported = json.loads(raw.read_text())
    assert any("ha-mode" in p["definition"] for p in exported["policies"])

    ready = tmp_path / "ready.json"
    result = CliRunner().invoke(main, ["ctl", "transform_definitions", "--transformations",
                                       CHAIN, str(raw), str(ready)])
    assert result.exit_code == 0, result.output

    with BrokerProcess(data_dir=str(tmp_path / "qq")) as broker:
        refused = CliRunner().invoke(main, ["ctl", "import_definitions", str(raw),
                                            "--base-uri", broker.management_url])
        assert refused.exit_code != 0
        assert "deprecated_features.permit.classic_queue_mirroring" in refused.output
        qqctl(broker, "import_definitions", str(ready))
        after = json.loads(qqctl(broker, "export_definitions", "-p", "mig", "-"))
        queues = {q["name"]: q for q in after["queues"]}
        assert queues["orders"]["type"] == "quorum"
        assert queues["orders"]["arguments"] == {"x-queue-type": "quorum",
                                                 "x-max-length": 50}
        assert queues["audit-log"]["type"] == "quorum"
        assert "x-max-priority" not in queues["audit-log"]["arguments"]
        assert queues["plain"]["type"] == "classic"
        assert [(p["name"], p["definition"]) for p in after["policies"]] == [
            ("ha-audit", {"max-length": 100})]


MESSAGES = 10_000       # in the mirrored queue when the migration starts
PUBLISHED_AT_MOST = 2_000   # written to it by a publisher while the shovel runs
UNDER_WAY = 2_000           # at the destination when the publisher is stopped


class _Publisher(threading.Thread):
    """Publishes (confirmed) ids from MESSAGES on to the source until stopped."""

    def __init__(self, uri: str) -> None:
        super().__init__()
        self.uri = uri
        self.published = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.uri))
        channel = connection.channel()
        channel.confirm_delivery()
        while not self.stopping.is_set() and self.published < PUBLISHED_AT_MOST:
            i = MESSAGES + self.published
            channel.basic_publish("", "orders", f"order {i}".encode(),
                                  pika.BasicProperties(message_id=str(i), delivery_mode=2))
            self.published += 1
        connection.close()


def _publish(uri: str, first: int, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    for i in range(first, first + count):
        channel.basic_publish("", "orders", f"order {i}".encode(),
                              pika.BasicProperties(message_id=str(i), delivery_mode=2))
    connection.close()


def _declared(uri: str, queue: str):
    """The queue's passive declare-ok: its message_count (ready) and consumer_count."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        return connection.channel().queue_declare(queue, passive=True).method
    finally:
        connection.close()


def _message_count(uri: str, queue: str) -> int:
    return _declared(uri, queue).message_count


def _wait(condition, timeout: float, what: str) -> None:
    wait_until(condition, what, timeout, interval=0.5)


def _consume_ids(uri: str, queue: str, expected: int) -> tuple[list[int], list[int]]:
    """Every message of `queue`, consumed and acknowledged: the ids of the first
    deliveries and of the redeliveries (this consumer's unacknowledged messages
    returned to the queue, e.g. when a node was suspected down under load: the
    queue held them once)."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=2000)
    ids: list[int] = []
    again: list[int] = []
    for method, properties, _body in channel.consume(queue, inactivity_timeout=10):
        if method is None:
            break
        (again if method.redelivered else ids).append(int(properties.message_id))
        if (len(ids) + len(again)) % 1000 == 0 or len(ids) >= expected:
            channel.basic_ack(method.delivery_tag, multiple=True)
    channel.cancel()
    connection.close()
    return ids, again


@pytest.mark.timeout(900)
def test_a_mirrored_queue_with_10000_messages_moves_into_a_quorum_queue_cluster(
        rabbitmq_node, tmp_path):  # noqa: F811
    """The blue-green migration end to end, as docs/behaviour/migrating-from-mirroring.md
    runs it: RabbitMQ 3.10.8's mirrored classic queue (ha-mode all) holds 10,000
    messages; its definitions are exported, transformed and imported into a
    3-node quorumqueue cluster (the queue is a quorum queue there); a dynamic
    shovel set on quorumqueue moves the messages while a publisher still writes
    more to RabbitMQ (until 2,000 moved); once the publisher stopped and the source is empty,
    every message id is at the destination exactly once: the queue holds as many
    messages as were published, and consuming them gives each id once (the test's
    own consumer may get a message again, flagged redelivered, when the cluster
    returns its unacknowledged messages: counted apart, as that is no duplicate in
    the queue)."""
    node = rabbitmq_node
    rabbitmqctl(node, "add_vhost", "shop")
    rabbitmqctl(node, "set_permissions", "-p", "shop", "guest", ".*", ".*", ".*")
    rabbitmqctl(node, "set_policy", "-p", "shop", "--apply-to", "queues", "ha-orders",
                "^orders$", '{"ha-mode": "all", "ha-sync-mode": "automatic"}')
    source = f"amqp://guest:guest@127.0.0.1:{node.port}/shop"
    connection = pika.BlockingConnection(pika.URLParameters(source))
    connection.channel().queue_declare("orders", durable=True)
    connection.close()
    _publish(source, 0, MESSAGES)
    _wait(lambda: _message_count(source, "orders") == MESSAGES, 120, "the 10,000 messages")
    assert "ha-orders" in rabbitmqctl(node, "list_queues", "-p", "shop", "name", "policy")

    raw, ready = tmp_path / "rabbitmq.json", tmp_path / "ready.json"
    rabbitmqctl(node, "export_definitions", str(raw))
    result = CliRunner().invoke(main, ["ctl", "transform_definitions", "--transformations",
                                       CHAIN, str(raw), str(ready)])
    assert result.exit_code == 0, result.output

    started = time.monotonic()
    with LocalCluster(3, proxied=False) as cluster:
        class Node:  # qqctl's view of the first node
            uri = cluster.uri(cluster.names[0])
            management_url = cluster.management_urls()[0]

        qqctl(Node, "import_definitions", str(ready))
        exported = json.loads(qqctl(Node, "export_definitions", "-p", "shop", "-"))
        (orders,) = [q for q in exported["queues"] if q["name"] == "orders"]
        assert orders["type"] == "quorum"
        destination = Node.uri.rpartition("/")[0] + "/shop"

        started = time.monotonic()
        publisher = _Publisher(source)
        publisher.start()
        # "amqp://" is the node running the shovel, in the shovel's vhost (shop)
        qqctl(Node, "set_parameter", "-p", "shop", "shovel", "orders-to-quorum", json.dumps(
            {"src-uri": source, "src-queue": "orders", "dest-uri": "amqp://",
             "dest-queue": "orders", "ack-mode": "on-confirm", "src-delete-after": "never",
             "reconnect-delay": 1}))
        # the publisher goes on while the shovel moves the first UNDER_WAY
        _wait(lambda: _message_count(destination, "orders") >= UNDER_WAY, 300,
              "the shovel under way")
        publisher.stopping.set()
        publisher.join()
        assert publisher.published > 0
        total = MESSAGES + publisher.published
        _wait(lambda: _message_count(destination, "orders") >= total, 600,
              "every message at the destination")
        moved = time.monotonic() - started
        # nothing ready there (a cheap AMQP question), then nothing unacknowledged
        # (rabbitmqctl: an Erlang VM started for each answer)
        _wait(lambda: _message_count(source, "orders") == 0 and "orders\t0\t0" in rabbitmqctl(
            node, "list_queues", "-p", "shop", "name", "messages_ready",
            "messages_unacknowledged"), 60, "the source drained and acknowledged")
        status = qqctl(Node, "shovel_status")
        assert "orders-to-quorum" in status and "running" in status, status
        qqctl(Node, "clear_parameter", "-p", "shop", "shovel", "orders-to-quorum")
        # every message acknowledged at the source was confirmed here first: the
        # queue holds what it ever will, each message once (a duplicate makes more)
        held = _message_count(destination, "orders")
        ids, again = _consume_ids(destination, "orders", total)
    print(f"shovel: {total} messages moved in {moved:.0f}s ({total / moved:.0f} msg/s); "
          f"destination held {held}; consumed {len(ids)} first deliveries of "
          f"{len(set(ids))} ids and {len(again)} redeliveries")
    assert held == total, (held, total)
    assert len(ids) == total and set(ids) == set(range(total)), (len(ids), len(set(ids)))
    assert set(again) <= set(ids)


# shovel definitions both refuse, with RabbitMQ 3.10.8's reason (quorumqueue refuses
# more: the keys it does not implement, tests/broker/shovel/test_shovel.py)
REFUSED = [
    {"src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"},
    {"src-uri": "amqp://", "dest-uri": "amqp://", "dest-queue": "b"},
    {"src-uri": "amqp://", "src-queue": "a", "src-exchange": "x", "dest-uri": "amqp://"},
    {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "later"},
    {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
     "src-delete-after": "soon"},
    {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "src-delete-after": 5,
     "ack-mode": "no-ack"},
    {"src-uri": "http://x", "src-queue": "a", "dest-uri": "amqp://"},
    {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "colour": 1},
    {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "reconnect-delay": "x"},
]


def _rabbitmqctl_refused(node, *arguments: str) -> str:
    """rabbitmqctl's error output for a command that must fail."""
    base = node.base_dir
    environment = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "TMPDIR")
                   if name in os.environ}
    environment.update(HOME=str(base / "home"), ERL_EPMD_PORT=str(node.epmd_port),
                       ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_USE_LONGNAME="false",
                       RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"))
    environment[MARKER_VARIABLE] = node.node_name
    done = subprocess.run([str(RABBITMQCTL), "-n", node.node_name, *arguments],
                          env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stdout
    return done.stdout + done.stderr


def test_shovel_definitions_are_refused_with_rabbitmqs_reasons(rabbitmq_node, tmp_path):
    """RabbitMQ 3.10.8 with its shovel plugin and quorumqueue refuse the same
    definitions with the same reasons (`Validation failed` and each reason line);
    a good one both list the same way."""
    node = rabbitmq_node
    with BrokerProcess(data_dir=str(tmp_path / "qq")) as broker:
        for value in REFUSED:
            text = json.dumps(value)
            theirs = _rabbitmqctl_refused(node, "set_parameter", "shovel", "bad", text)
            reasons = theirs.partition("Validation failed")[2].strip().splitlines()
            assert reasons, theirs
            ours = CliRunner().invoke(main, ["ctl", "set_parameter", "shovel", "bad", text,
                                             "--base-uri", broker.management_url])
            assert ours.exit_code != 0
            assert "Validation failed" in ours.output
            for reason in reasons:
                assert reason in ours.output, (value, theirs, ours.output)
        good = json.dumps({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                           "dest-queue": "b", "ack-mode": "on-confirm",
                           "src-delete-after": "never"})
        rabbitmqctl(node, "set_parameter", "shovel", "good", good)
        qqctl(broker, "set_parameter", "shovel", "good", good)
        theirs = rabbitmqctl(node, "list_parameters").splitlines()[-1].split("\t")
        ours = qqctl(broker, "list_parameters").splitlines()[-1].split()
        assert ours[:2] == theirs[:2] == ["shovel", "good"]
        assert json.loads(ours[2]) == json.loads(theirs[2])
        missing = _rabbitmqctl_refused(node, "clear_parameter", "shovel", "nope")
        assert "Parameter does not exist" in missing
        ours = CliRunner().invoke(main, ["ctl", "clear_parameter", "shovel", "nope",
                                         "--base-uri", broker.management_url])
        assert ours.exit_code != 0 and "Parameter does not exist" in ours.output
        rabbitmqctl(node, "clear_parameter", "shovel", "good")  # the node is shared


def _ready_and_unacked(node, queue: str) -> tuple[int, int] | None:
    for line in rabbitmqctl(node, "list_queues", "name", "messages_ready",
                            "messages_unacknowledged").splitlines():
        fields = line.split("\t")
        if fields[0] == queue and len(fields) == 3:
            return int(fields[1]), int(fields[2])
    return None


def _cut_between_confirm_and_ack(node, proxy: TcpProxy, queue: str, broker,
                                 destination_queue: str) -> None:
    """Hold what the shovel sends to RabbitMQ (its acks) while 300 messages are
    published there and the destination confirms the prefetch (100); then reset the
    shovel's source connection and wait until RabbitMQ has nothing left."""
    proxy.cut("stall", "forward")
    rabbitmq_uri = f"amqp://guest:guest@127.0.0.1:{node.port}/%2F"
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_uri))
    channel = connection.channel()
    channel.confirm_delivery()
    for i in range(300):
        channel.basic_publish("", queue, f"order {i}".encode(),
                              pika.BasicProperties(message_id=str(i), delivery_mode=2))
    connection.close()
    _wait(lambda: _message_count(broker.uri, destination_queue) == 100, 60,
          "the prefetch confirmed at the destination")
    proxy.cut("drop")
    proxy.heal()
    _wait(lambda: _message_count(rabbitmq_uri, queue) == 0
          and _ready_and_unacked(node, queue) == (0, 0), 120,
          "RabbitMQ's queue drained and acknowledged")


def test_a_lost_source_connection_duplicates_with_rabbitmqs_shovel_not_with_ours(
        rabbitmq_node, tmp_path):
    """RabbitMQ 3.10.8 is the source (a mirrored queue) and quorumqueue the
    destination; each shovel reaches RabbitMQ through a TCP proxy that holds its acks
    while the destination confirms a prefetch of 100, then resets the connection:
    RabbitMQ requeues the 100 (redelivered). RabbitMQ's own shovel (its plugin,
    ack-mode on-confirm) publishes them again: 400 at the destination for 300.
    quorumqueue's acknowledges them without publishing: 300, each once."""
    node = rabbitmq_node
    with BrokerProcess(data_dir=str(tmp_path / "qq")) as broker, \
            TcpProxy(node.port, name="ours->rabbitmq") as ours, \
            TcpProxy(node.port, name="theirs->rabbitmq") as theirs:
        rabbitmqctl(node, "set_policy", "--apply-to", "queues", "ha-all", "^orders",
                    '{"ha-mode": "all"}')
        for uri in (f"amqp://guest:guest@127.0.0.1:{node.port}/%2F", broker.uri):
            connection = pika.BlockingConnection(pika.URLParameters(uri))
            channel = connection.channel()
            for queue in ("orders-ours", "orders-theirs"):
                channel.queue_declare(queue, durable=True)
            connection.close()
        common = {"src-prefetch-count": 100, "reconnect-delay": 1,
                  "ack-mode": "on-confirm"}
        rabbitmqctl(node, "set_parameter", "shovel", "theirs", json.dumps({
            "src-uri": f"amqp://guest:guest@127.0.0.1:{theirs.port}",
            "src-queue": "orders-theirs", "dest-uri": broker.uri,
            "dest-queue": "orders-theirs", **common}))
        qqctl(broker, "set_parameter", "shovel", "ours", json.dumps({
            "src-uri": f"amqp://guest:guest@127.0.0.1:{ours.port}/%2F",
            "src-queue": "orders-ours", "dest-uri": "amqp://",
            "dest-queue": "orders-ours", **common}))
        for queue in ("orders-ours", "orders-theirs"):  # each shovel consuming
            _wait(lambda: _declared(f"amqp://guest:guest@127.0.0.1:{node.port}/%2F",
                                    queue).consumer_count == 1, 60, f"{queue}'s shovel")
        _cut_between_confirm_and_ack(node, theirs, "orders-theirs", broker, "orders-theirs")
        _cut_between_confirm_and_ack(node, ours, "orders-ours", broker, "orders-ours")
        rabbitmqctl(node, "clear_parameter", "shovel", "theirs")
        qqctl(broker, "clear_parameter", "shovel", "ours")
        held = {queue: _message_count(broker.uri, queue)
                for queue in ("orders-ours", "orders-theirs")}
        ids, again = _consume_ids(broker.uri, "orders-ours", 300)
    assert held == {"orders-ours": 300, "orders-theirs": 400}, held
    assert sorted(ids) == list(range(300)) and not again
