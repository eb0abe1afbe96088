"""Dynamic shovels between two quorumqueue brokers (real processes): set with
`quorumqueue ctl set_parameter shovel`, run inside the broker, status in
`ctl shovel_status`; the definition checks; at-least-once across a kill -9 of the
destination; src-delete-after queue-length clears the parameter. Most tests share
the module's source and destination brokers (`brokers`), emptied after each test;
restarts into other data directories and clusters have their own."""

from __future__ import annotations

import json

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from tests.broker.management.support import wait_for
from tests.support.broker import BrokerProcess
from tests.support.cluster import TcpProxy

pytestmark = pytest.mark.timeout(300)


def ctl(broker, *arguments: str, ok: bool = True) -> str:
    result = CliRunner().invoke(main, ["ctl", *arguments, "--base-uri", broker.management_url])
    if ok:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code != 0, result.output
    return result.output


def channel_of(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    return connection, connection.channel()


def declare(broker, queue: str, queue_type: str = "classic") -> None:
    """A durable queue of `queue_type` on `broker`."""
    connection, channel = channel_of(broker)
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
    connection.close()


def publish(broker, queue: str, ids, arguments=None) -> None:
    connection, channel = channel_of(broker)
    channel.queue_declare(queue, durable=True, arguments=arguments)
    ids = list(ids)
    for position, i in enumerate(ids):
        if position == len(ids) - 1:
            # the last one confirmed: the broker persists in order, so all are
            # (one confirm wait instead of one per message)
            channel.confirm_delivery()
        channel.basic_publish("", queue, f"body-{i}".encode(),
                              pika.BasicProperties(message_id=str(i), delivery_mode=2,
                                                   headers={"n": i}))
    connection.close()


def count(broker, queue: str) -> int:
    """The queue's messages; -1 while it does not exist."""
    connection, channel = channel_of(broker)
    try:
        return channel.queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return -1
    finally:
        if connection.is_open:
            connection.close()


def drain(broker, queue: str) -> list:
    """Every message of `queue`, consumed: (message id, body, headers)."""
    expected = count(broker, queue)
    connection, channel = channel_of(broker)
    channel.basic_qos(prefetch_count=1000)
    got = []
    for method, properties, body in channel.consume(queue, inactivity_timeout=10):
        if method is None:
            break
        got.append((properties.message_id, body, properties.headers))
        if len(got) % 500 == 0 or len(got) >= expected:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if len(got) >= expected:
            break
    channel.cancel()
    connection.close()
    return got


def shovel(broker, name: str, value: dict, vhost: str = "/") -> str:
    return ctl(broker, "set_parameter", "-p", vhost, "shovel", name, json.dumps(value))


@pytest.fixture(scope="module")
def broker_pair():
    with BrokerProcess() as source, BrokerProcess() as destination:
        yield source, destination


@pytest.fixture
def brokers(broker_pair):
    """The module's two brokers (source, destination), handed to each test as it
    would find brokers of its own: running, with no shovel and no queue (one start
    of the pair for the module instead of one per test)."""
    yield broker_pair
    for broker in broker_pair:
        _empty(broker)


def _empty(broker) -> None:
    """Run `broker` again if a test left it stopped, clear every shovel (and wait
    until none runs), delete every queue."""
    from urllib.parse import quote

    from quorumqueue.client.management import call

    if broker.process is None or broker.process.poll() is not None:
        broker.stop()
        broker.start()
    for row in _http(broker, "GET", "/api/parameters/shovel")[1]:
        _http(broker, "DELETE", f"/api/parameters/shovel/{quote(row['vhost'], safe='')}/"
                                f"{quote(row['name'], safe='')}")
    wait_for(lambda: _http(broker, "GET", "/api/shovels")[1] == [], what="every shovel gone")

    def deleted() -> bool:
        names = [row["name"] for row in call(broker.uri, "queues.list", vhost="/")]
        connection, channel = channel_of(broker)
        try:
            for name in names:
                channel.queue_delete(name)
        except pika.exceptions.ChannelClosedByBroker:
            return False  # e.g. an exclusive queue whose connection is closing
        finally:
            if connection.is_open:
                connection.close()
        return not names

    wait_for(deleted, what="every queue deleted")


def test_a_shovel_moves_every_message_once_and_deletes_itself(brokers):
    source, destination = brokers
    publish(source, "orders", range(500))
    connection, channel = channel_of(destination)
    channel.queue_declare("orders-qq", durable=True, arguments={"x-queue-type": "quorum"})
    connection.close()
    shovel(source, "move", {"src-uri": "amqp://", "src-queue": "orders",
                            "dest-uri": destination.uri, "dest-queue": "orders-qq",
                            "ack-mode": "on-confirm", "src-delete-after": "queue-length",
                            "dest-add-forward-headers": True})
    # the shovel deletes itself once the 500 messages it found moved
    wait_for(lambda: "move" not in ctl(source, "list_parameters"), what="the shovel's end")
    assert count(source, "orders") == 0
    moved = drain(destination, "orders-qq")
    assert sorted(int(m) for m, _b, _h in moved) == list(range(500))
    message_id, body, headers = moved[0]
    assert body == f"body-{message_id}".encode()
    assert headers["n"] == int(message_id)
    (record,) = headers["x-shovelled"]
    assert record["shovel-name"] == "move" and record["shovel-type"] == "dynamic"
    assert record["src-queue"] == "orders" and record["dest-queue"] == "orders-qq"
    assert "guest:guest" not in record["dest-uri"]  # the password is hidden
    # the node stops listing it at its next tick after the parameter went
    wait_for(lambda: "move" not in ctl(source, "shovel_status"), what="the status row gone")


def test_status_names_a_running_shovel_and_the_reason_it_stopped(brokers):
    source, destination = brokers
    publish(source, "q", range(3))
    shovel(source, "s1", {"src-uri": "amqp://", "src-queue": "q",
                          "dest-uri": destination.uri, "dest-queue": "q",
                          "reconnect-delay": 1})
    wait_for(lambda: count(destination, "q") == 3, what="3 messages at the destination")
    status = ctl(source, "shovel_status")
    header, row = status.splitlines()[1:3]
    assert header.split() == ["name", "vhost", "type", "node", "state", "source",
                              "destination", "termination_reason"]
    assert row.split()[:3] == ["s1", "/", "dynamic"] and "running" in row
    assert "guest:***@" in row  # the destination's password is hidden
    destination.stop()
    wait_for(lambda: "terminated" in ctl(source, "shovel_status"), what="terminated")
    destination.start()  # reconnect-delay 1: it runs again
    wait_for(lambda: "running" in ctl(source, "shovel_status"), what="running again")
    listed = ctl(source, "list_parameters")
    assert "shovel" in listed and '"src-queue":"q"' in listed
    ctl(source, "clear_parameter", "shovel", "s1")
    wait_for(lambda: "s1" not in ctl(source, "shovel_status"), what="the shovel stopped")
    assert "Parameter does not exist" in ctl(source, "clear_parameter", "shovel", "s1",
                                             ok=False)  # gone


@pytest.mark.parametrize("killed", ["destination", "source"])
def test_a_side_killed_mid_transfer_loses_nothing(brokers, killed):
    """kill -9 of the destination (the shovel runs on the source) or of the source
    (the shovel runs on the destination), then a restart: every message is at the
    destination at least once."""
    source, destination = brokers
    total = 10_000
    publish(source, "big", range(total))  # confirmed: on the source's disk
    connection, channel = channel_of(destination)
    channel.queue_declare("big", durable=True, arguments={"x-queue-type": "quorum"})
    connection.close()
    runner = source if killed == "destination" else destination
    shovel(runner, "big", {"src-uri": "amqp://" if runner is source else source.uri,
                           "src-queue": "big",
                           "dest-uri": "amqp://" if runner is destination else destination.uri,
                           "dest-queue": "big", "ack-mode": "on-confirm",
                           "reconnect-delay": 1, "src-prefetch-count": 200})
    wait_for(lambda: count(destination, "big") >= 1000, what="the transfer under way")
    victim = destination if killed == "destination" else source
    victim.stop(kill=True)  # kill -9 mid-transfer
    if victim is destination:
        assert count(source, "big") > 0  # killed mid-transfer
    else:
        assert 0 < count(destination, "big") < total
    victim.start()
    wait_for(lambda: count(source, "big") == 0, timeout=240, what="the source drained")
    # none ready at the source is not yet all at the destination: the last ones may
    # still be unacked there, on their way (on-confirm acks after the destination's
    # confirm); a message lost keeps this short of the total and fails here
    wait_for(lambda: count(destination, "big") >= total, timeout=240,
             what="every message at the destination")
    ids = [int(m) for m, _b, _h in drain(destination, "big")]
    assert set(ids) == set(range(total))  # every message at least once
    # duplicates only of what was in flight when the side died (the prefetch, and
    # acknowledgements the killed source had not yet written)
    assert len(ids) - total <= 2 * 200, len(ids) - total


BAD = [
    ('{"src-uri": "amqp://"', "JSON decoding error. Reason: "),
    ('{"src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}',
     'Validation failed\n\nKey "src-uri" not found in bad'),
    ('{"src-uri": "amqp://", "dest-uri": "amqp://", "dest-queue": "b"}',
     "Must specify 'src-exchange' or 'src-queue'"),
    ('{"src-uri": "amqp://", "src-queue": "a", "src-exchange": "x", "dest-uri": "amqp://"}',
     "Cannot specify 'src-exchange' and 'src-queue'"),
    ('{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "later"}',
     'ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
     'actually was <<"later">>'),
    ('{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", '
     '"src-delete-after": "soon"}', 'src-delete-after should be a number greater than or '
     'equal to 0, "never" or "queue-length", actually was <<"soon">>'),
    ('{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", '
     '"src-delete-after": 5, "ack-mode": "no-ack"}',
     "Cannot specify 'no-ack' and numerical 'delete-after'"),
    ('{"src-uri": "http://x", "src-queue": "a", "dest-uri": "amqp://"}',
     '"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}'),
    ('{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", '
     '"dest-queue-args": {"x-queue-type": "quorum"}}',
     "dest-queue-args: not supported by quorumqueue's shovel"),
    ('{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "colour": 1}',
     'Unrecognised terms [{<<"colour">>,1}] in bad'),
    ('{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", '
     '"reconnect-delay": "x"}', 'reconnect-delay should be a number, actually was <<"x">>'),
    ('{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", '
     '"src-protocol": "amqp10"}', "speaks amqp091 only"),
]


def test_bad_definitions_are_refused_with_the_reason(brokers):
    broker, _ = brokers
    for value, text in BAD:
        output = ctl(broker, "set_parameter", "shovel", "bad", value, ok=False)
        assert text in output, (value, output)
    output = ctl(broker, "set_parameter", "federation-upstream", "up",
                 '{"uri": "amqp://"}', ok=False)
    assert "component 'federation-upstream' not found" in output
    output = ctl(broker, "set_parameter", "-p", "nowhere", "shovel", "s",
                 '{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://"}',
                 ok=False)
    assert "no vhost 'nowhere'" in output
    assert "bad" not in ctl(broker, "list_parameters")


def test_shovel_parameters_survive_a_restart_and_travel_in_definitions(tmp_path):
    value = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
             "dest-queue": "b", "reconnect-delay": 1}
    with BrokerProcess(data_dir=str(tmp_path / "one")) as broker:
        shovel(broker, "a-to-b", value)
        publish(broker, "a", range(10))
        wait_for(lambda: count(broker, "b") == 10, what="a moved to b on the same node")
        broker.restart(kill=True)
        assert '"src-queue":"a"' in ctl(broker, "list_parameters")
        exported = json.loads(ctl(broker, "export_definitions", "-"))
        assert {"vhost": "/", "component": "shovel", "name": "a-to-b",
                "value": value} in exported["parameters"]
        (tmp_path / "defs.json").write_text(json.dumps(exported))
    with BrokerProcess(data_dir=str(tmp_path / "two")) as other:
        ctl(other, "import_definitions", str(tmp_path / "defs.json"))
        assert '"src-queue":"a"' in ctl(other, "list_parameters")
        publish(other, "a", range(5))
        wait_for(lambda: count(other, "b") == 5, what="the imported shovel at work")


def test_in_a_cluster_the_shovel_moves_to_another_node_when_its_node_dies():
    """The shovel runs on the node that leads the metadata group; killed (-9),
    another node leads and runs it; nothing is lost."""
    from tests.support.cluster import LocalCluster

    total = 10_000
    with BrokerProcess() as source, LocalCluster(3, proxied=False) as cluster:
        publish(source, "q", range(total))

        class Node:
            def __init__(self, name):
                self.uri = cluster.uri(name)
                self.management_url = cluster.management_url(name)  # the command line's

        nodes = {name: Node(name) for name in cluster.names}
        first = nodes[cluster.names[0]]
        connection, channel = channel_of(first)
        channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
        connection.close()
        shovel(first, "in", {"src-uri": source.uri, "src-queue": "q", "dest-uri": "amqp://",
                             "dest-queue": "q", "reconnect-delay": 1,
                             "src-prefetch-count": 200})

        def runner() -> str | None:
            for line in ctl(first, "shovel_status").splitlines()[2:]:
                if line.split()[0] == "in" and " running " in f" {line} ":
                    return line.split()[3]
            return None

        running_on = wait_for(runner, what="the shovel running")
        wait_for(lambda: count(first, "q") >= 1000, what="the transfer under way")
        others = [name for name in cluster.names if name != running_on]
        # asked on another node: the row comes from the node running it
        rows = ctl(nodes[others[0]], "shovel_status").splitlines()[2:]
        assert [r.split()[:5] for r in rows] == [["in", "/", "dynamic", running_on,
                                                  "running"]]
        cluster.kill(running_on)
        survivor = nodes[others[0]]
        assert count(source, "q") > 0  # killed mid-transfer
        wait_for(lambda: count(source, "q") == 0, timeout=240, what="the source drained")

        def moved_elsewhere() -> bool:
            for name in others:
                rows = ctl(nodes[name], "shovel_status").splitlines()[2:]
                if any(r.split()[0] == "in" and name in r and " running " in f" {r} "
                       for r in rows):
                    return True
            return False

        wait_for(moved_elsewhere, what="the shovel running on a surviving node")
        # the last ones may still be unacked at the source, on their way (see
        # test_a_side_killed_mid_transfer_loses_nothing); a loss fails here
        wait_for(lambda: count(survivor, "q") >= total, timeout=240,
                 what="every message at the destination")
        ids = [int(m) for m, _b, _h in drain(survivor, "q")]
        assert set(ids) == set(range(total))
        assert len(ids) - total <= 2 * 200


def _http(broker, method: str, path: str, body=None):
    import base64
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        broker.management_url + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def test_the_management_api_sets_lists_and_clears_a_shovel(brokers):
    source, destination = brokers
    publish(source, "h", range(20))
    value = {"src-uri": "amqp://", "src-queue": "h", "dest-uri": destination.uri,
             "dest-queue": "h"}
    assert _http(source, "PUT", "/api/parameters/shovel/%2F/web", {"value": value})[0] == 201
    wait_for(lambda: count(destination, "h") == 20, what="moved through the API's shovel")
    status, rows = _http(source, "GET", "/api/parameters/shovel/%2F")
    assert status == 200 and rows == [{"vhost": "/", "component": "shovel", "name": "web",
                                       "value": value}]
    assert _http(source, "GET", "/api/parameters/shovel/%2F/web")[1]["value"] == value
    status, shovels = _http(source, "GET", "/api/shovels")
    assert status == 200 and [(s["name"], s["state"], s["type"]) for s in shovels] == [
        ("web", "running", "dynamic")]
    status, refused = _http(source, "PUT", "/api/parameters/shovel/%2F/bad",
                            {"value": {"src-uri": "amqp://", "dest-uri": "amqp://"}})
    assert status == 400 and "Must specify 'src-exchange' or 'src-queue'" in refused["reason"]
    assert _http(source, "DELETE", "/api/parameters/shovel/%2F/web")[0] == 204
    assert _http(source, "DELETE", "/api/parameters/shovel/%2F/web")[0] == 404
    wait_for(lambda: _http(source, "GET", "/api/shovels")[1] == [], what="the shovel gone")


def test_an_exchange_to_exchange_shovel_moves_what_is_routed_while_it_runs(brokers):
    """src-exchange/src-exchange-key: a server-named queue bound at the source;
    dest-exchange/dest-exchange-key: published there with that key."""
    source, destination = brokers
    connection, channel = channel_of(destination)
    channel.queue_declare("routed", durable=True)
    channel.queue_bind("routed", "amq.direct", "moved")
    connection.close()
    shovel(source, "x2x", {"src-uri": "amqp://", "src-exchange": "amq.topic",
                           "src-exchange-key": "orders.#", "dest-uri": destination.uri,
                           "dest-exchange": "amq.direct", "dest-exchange-key": "moved"})
    wait_for(lambda: " running " in ctl(source, "shovel_status"), what="running")
    connection, channel = channel_of(source)
    channel.confirm_delivery()
    for i in range(10):
        key = "orders.new" if i % 2 == 0 else "audit.new"  # only orders.# is bound
        channel.basic_publish("amq.topic", key, f"body-{i}".encode(),
                              pika.BasicProperties(message_id=str(i)))
    connection.close()
    wait_for(lambda: count(destination, "routed") == 5, what="the 5 routed messages")
    assert sorted(int(m) for m, _b, _h in drain(destination, "routed")) == [0, 2, 4, 6, 8]


@pytest.mark.parametrize("mode", ["on-confirm", "on-publish", "no-ack"])
def test_each_ack_mode_moves_every_message_once_when_nothing_fails(brokers, mode):
    source, destination = brokers
    publish(source, "calm", range(2000))
    shovel(source, "calm", {"src-uri": "amqp://", "src-queue": "calm",
                            "dest-uri": destination.uri, "dest-queue": "calm",
                            "ack-mode": mode, "src-prefetch-count": 100})
    wait_for(lambda: count(destination, "calm") == 2000, what="2000 at the destination")
    wait_for(lambda: count(source, "calm") == 0, what="the source empty")
    ctl(source, "clear_parameter", "shovel", "calm")
    assert sorted(int(m) for m, _b, _h in drain(destination, "calm")) == list(range(2000))


@pytest.mark.parametrize("mode, loses", [("on-confirm", False), ("on-publish", True),
                                         ("no-ack", True)])
def test_what_each_ack_mode_loses_when_the_destination_refuses_the_messages(
        brokers, mode, loses):
    """RabbitMQ's shovel guide on ack-mode: on-confirm acknowledges at the source only
    after the destination confirmed, so a message the destination did not take
    stays at the source; on-publish acknowledges once it is published ("may lose
    messages in the event of broker failures") and no-ack never acknowledges (the
    source forgets a message once delivered: "may lose messages in the event of
    network or broker failures"). Here every publish fails: the destination
    exchange does not exist, and the destination closes the channel (404)."""
    source, destination = brokers
    publish(source, "doomed", range(5))
    shovel(source, "doomed", {"src-uri": "amqp://", "src-queue": "doomed",
                              "dest-uri": destination.uri, "dest-exchange": "nowhere",
                              "ack-mode": mode, "src-prefetch-count": 1,
                              "reconnect-delay": 1})

    def failed_attempt() -> bool:
        status = ctl(source, "shovel_status")
        return "terminated" in status and "NOT_FOUND" in status

    if loses:  # attempt after attempt, the messages leave the source and go nowhere
        # (no queue at the destination: the exchange is not there to route them)
        from quorumqueue.client.management import call

        def held_at_source() -> int:   # ready and unacknowledged
            (line,) = [r for r in call(source.uri, "queues.list", vhost="/")
                       if r["name"] == "doomed"]
            return line["ready"] + line["unacked"]

        wait_for(lambda: held_at_source() == 0, what="the source emptied by failed attempts")
    else:  # each failed attempt gives its delivery back: all 5 stay at the source
        wait_for(lambda: failed_attempt() and count(source, "doomed") == 5,
                 what="a failed attempt, every message still at the source")
        status, shovels = _http(source, "GET", "/api/shovels")
        assert [s["messages_shovelled"] for s in shovels] == [0]
    ctl(source, "clear_parameter", "shovel", "doomed")


def test_a_shovelled_message_keeps_its_properties_as_they_were(brokers):
    """No message-id added where there was none (aiormq would add one), the other
    properties and the headers unchanged."""
    source, destination = brokers
    properties = pika.BasicProperties(
        content_type="text/plain", content_encoding="utf-8", headers={"k": "v", "n": 1},
        delivery_mode=2, priority=3, correlation_id="c-1", reply_to="replies",
        expiration="600000", timestamp=1700000000, type="order", app_id="shop")
    connection, channel = channel_of(source)
    channel.queue_declare("props", durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", "props", b"without id", properties)
    channel.basic_publish("", "props", b"with id", pika.BasicProperties(message_id="m-7"))
    connection.close()
    shovel(source, "props", {"src-uri": "amqp://", "src-queue": "props",
                             "dest-uri": destination.uri, "dest-queue": "props"})
    wait_for(lambda: count(destination, "props") == 2, what="both moved")
    connection, channel = channel_of(destination)
    got = {}
    for _ in range(2):
        method, received, body = channel.basic_get("props", auto_ack=True)
        got[body] = received
    connection.close()
    without, with_id = got[b"without id"], got[b"with id"]
    assert without.message_id is None
    for name in ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                 "correlation_id", "reply_to", "expiration", "timestamp", "type", "app_id"):
        assert getattr(without, name) == getattr(properties, name), name
    assert with_id.message_id == "m-7" and with_id.headers is None


def test_an_integer_src_delete_after_counts_again_on_the_node_the_shovel_moves_to():
    """RabbitMQ counts an integer src-delete-after in the shovel's worker
    (rabbit_amqp091_shovel's `remaining`, set when the worker starts): a shovel
    started again on another node counts from zero there, so over the move more
    than the count may leave the source. The same here: killed (-9) mid-transfer,
    the shovel moves to another node, which moves the count again before it deletes
    itself (a reconnect on the same node keeps counting: broker/shovel/README.md)."""
    from quorumqueue.client.management import call
    from tests.support.cluster import LocalCluster

    total = 5_000
    with BrokerProcess() as source, LocalCluster(3, proxied=False) as cluster:
        publish(source, "q", range(total))

        class Node:
            def __init__(self, name):
                self.uri = cluster.uri(name)
                self.management_url = cluster.management_url(name)

        nodes = {name: Node(name) for name in cluster.names}
        first = nodes[cluster.names[0]]
        connection, channel = channel_of(first)
        channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
        connection.close()
        shovel(first, "counted", {"src-uri": source.uri, "src-queue": "q",
                                  "dest-uri": "amqp://", "dest-queue": "q",
                                  "src-delete-after": total, "reconnect-delay": 1,
                                  "src-prefetch-count": 200})

        def runner(asked) -> str | None:
            for line in ctl(asked, "shovel_status").splitlines()[2:]:
                if line.split()[0] == "counted" and " running " in f" {line} ":
                    return line.split()[3]
            return None

        first_runner = wait_for(lambda: runner(first), what="the shovel running")
        wait_for(lambda: count(first, "q") >= 1000, what="the transfer under way")
        cluster.kill(first_runner)
        survivor = nodes[[n for n in cluster.names if n != first_runner][0]]
        wait_for(lambda: runner(survivor) not in (None, first_runner), timeout=120,
                 what="the shovel running on another node")

        def source_counts() -> tuple[int, int]:
            (line,) = [r for r in call(source.uri, "queues.list", vhost="/")
                       if r["name"] == "q"]
            return line["ready"], line["unacked"]

        # everything left moved, every move acknowledged: short of the count there,
        # so the shovel is still there
        wait_for(lambda: source_counts() == (0, 0), timeout=240, what="the source drained")
        (row,) = _http(survivor, "GET", "/api/shovels")[1]
        moved_there = row["messages_shovelled"]
        assert 0 < moved_there < total and row["state"] == "running"
        assert "counted" in ctl(survivor, "list_parameters")
        # it deletes itself after exactly `total` moved there
        publish(source, "q", range(total, 2 * total - moved_there + 10))
        wait_for(lambda: "counted" not in ctl(survivor, "list_parameters"), timeout=240,
                 what="the shovel's end")
        wait_for(lambda: source_counts() == (10, 0), what="10 left at the source")


@pytest.mark.parametrize("source_type", ["classic", "quorum"])
def test_a_source_connection_lost_after_the_destinations_confirm_duplicates_nothing(
        brokers, source_type):
    """The shovel runs on the destination and reaches the source through a TCP proxy.
    The proxy holds everything the shovel sends to the source (its acks) while the
    source delivers a prefetch of messages; the destination confirms them all; then
    the proxy resets the connection, so the source requeues those messages
    (redelivered) although they are at the destination. The shovel's next attempt
    acknowledges them without publishing them again: every message is at the
    destination exactly once, nothing is left at the source. Three identical
    messages (same properties and body) among them arrive three times. A quorum
    queue source redelivers them with an x-delivery-count header, which the shovel
    leaves out of what it compares."""
    source, destination = brokers
    declare(source, "orders", source_type)
    declare(destination, "orders")
    with TcpProxy(source.port, name="shovel->source") as proxy:
        shovel(destination, "move", {
            "src-uri": f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F",
            "src-queue": "orders", "dest-uri": "amqp://", "dest-queue": "orders",
            "ack-mode": "on-confirm", "src-prefetch-count": 100, "reconnect-delay": 1})
        wait_for(lambda: "running" in ctl(destination, "shovel_status"), what="running")
        proxy.cut("stall", "forward")  # the shovel's acks no longer reach the source
        publish(source, "orders", range(300), arguments={"x-queue-type": source_type})
        connection, channel = channel_of(source)
        for _ in range(3):
            channel.basic_publish("", "orders", b"twin",
                                  pika.BasicProperties(message_id="twin", delivery_mode=2))
        connection.close()
        # the source delivered a prefetch (100) and got no ack: the destination
        # confirmed each (it holds them) and the shovel's acks wait in the proxy
        wait_for(lambda: count(destination, "orders") == 100,
                 what="the prefetch confirmed at the destination")
        proxy.cut("drop")  # the acks are lost with the connection: all 100 requeued
        proxy.heal()
        wait_for(lambda: count(source, "orders") == 0 and count(destination, "orders")
                 >= 303, timeout=60, what="the source drained")
        # nothing unacknowledged at the source either: every ack landed, so the
        # destination holds all it ever will
        wait_for(lambda: _source_settled(source), timeout=60,
                 what="no message unacknowledged at the source")
        ctl(destination, "clear_parameter", "shovel", "move")
    moved = drain(destination, "orders")
    ids = sorted(m for m, _b, _h in moved)
    assert len(ids) == 303, len(ids) - 303
    assert ids == sorted([str(i) for i in range(300)] + ["twin"] * 3)
    assert count(source, "orders") == 0


def test_an_integer_src_delete_after_counts_a_message_acknowledged_again_once(brokers):
    """As above, the shovel's acks of the first 100 messages (the prefetch) are lost
    with the source connection after the destination confirmed them; the source
    redelivers them and the next attempt acknowledges them without publishing them
    again. With `src-delete-after: 200` those 100 count once, not again when their
    redeliveries are acknowledged: the shovel ends with 200 messages at the
    destination and 100 left at the source."""
    source, destination = brokers
    declare(source, "orders")
    declare(destination, "orders")
    with TcpProxy(source.port, name="shovel->source") as proxy:
        shovel(destination, "move", {
            "src-uri": f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F",
            "src-queue": "orders", "dest-uri": "amqp://", "dest-queue": "orders",
            "ack-mode": "on-confirm", "src-prefetch-count": 100, "reconnect-delay": 1,
            "src-delete-after": 200})
        wait_for(lambda: "running" in ctl(destination, "shovel_status"), what="running")
        proxy.cut("stall", "forward")  # the shovel's acks no longer reach the source
        publish(source, "orders", range(300))
        wait_for(lambda: count(destination, "orders") == 100,
                 what="the prefetch confirmed at the destination")
        proxy.cut("drop")  # the acks are lost with the connection: all 100 requeued
        proxy.heal()
        _ended_with_200_moved(source, destination)


def test_a_message_confirmed_after_the_source_went_counts_once_for_src_delete_after(
        brokers):
    """The shovel's acks (to the source) and the destination's confirms (to the
    shovel) are both held in proxies while the prefetch of 100 reaches the
    destination; the source connection goes; then the confirms arrive. Those 100
    are at the destination, their acks cannot reach the source, which redelivers
    them to the next attempt: they count for `src-delete-after: 200` when the
    destination took them, not again when their redeliveries are acknowledged, so
    the shovel moves 100 more, not 200."""
    source, destination = brokers
    declare(source, "orders")
    declare(destination, "orders")
    with TcpProxy(source.port, name="shovel->source") as to_source, \
            TcpProxy(destination.port, name="shovel->destination") as to_destination:
        shovel(destination, "move", {
            "src-uri": f"amqp://guest:guest@127.0.0.1:{to_source.port}/%2F",
            "src-queue": "orders",
            "dest-uri": f"amqp://guest:guest@127.0.0.1:{to_destination.port}/%2F",
            "dest-queue": "orders", "ack-mode": "on-confirm", "src-prefetch-count": 100,
            "reconnect-delay": 1, "src-delete-after": 200})
        wait_for(lambda: "running" in ctl(destination, "shovel_status"), what="running")
        to_source.cut("stall", "forward")  # no ack reaches the source
        to_destination.cut("stall", "backward")  # no confirm reaches the shovel
        publish(source, "orders", range(300))
        wait_for(lambda: count(destination, "orders") == 100,
                 what="the prefetch at the destination, unconfirmed")
        to_source.cut("drop")  # the source connection goes, and the next attempt's too
        wait_for(lambda: _source_consumers(source) == 0, what="the source's consumer gone")
        to_destination.heal()  # the confirms arrive; the acks have nowhere to go
        wait_for(lambda: "terminated" in ctl(destination, "shovel_status"),
                 what="the first attempt settled")
        to_source.heal()
        _ended_with_200_moved(source, destination)


def _ended_with_200_moved(source, destination) -> None:
    """The shovel `move` cleared its own parameter with nothing unacknowledged at the
    source, 200 of `orders`' 300 at the destination and the other 100 at the source,
    each message once."""
    wait_for(lambda: "move" not in ctl(destination, "list_parameters"), timeout=60,
             what="the shovel's end")
    wait_for(lambda: _source_settled(source, ready=None), timeout=60,
             what="no message unacknowledged at the source")
    at_destination = [int(m) for m, _b, _h in drain(destination, "orders")]
    at_source = [int(m) for m, _b, _h in drain(source, "orders")]
    assert len(at_destination) == 200 and len(at_source) == 100, (
        len(at_destination), len(at_source))
    assert sorted(at_destination + at_source) == list(range(300))


def _source_consumers(broker) -> int:
    """`orders`' consumers."""
    name, consumers = ctl(broker, "list_queues", "name", "consumers").splitlines()[-1].split()
    assert name == "orders"
    return int(consumers)


def test_a_shovel_stopped_with_publishes_unconfirmed_settles_them_before_it_closes(
        brokers):
    """The shovel runs on the source and reaches the destination through a TCP proxy
    that holds the destination's confirms: 100 messages (the prefetch) are at the
    destination, unconfirmed, when the parameter is cleared. The stopping shovel
    publishes nothing new and waits for those confirms (the proxy lets them through
    a moment later), acknowledges the 100 at the source and closes: each message is
    at exactly one side, none at both."""
    source, destination = brokers
    declare(source, "orders")
    declare(destination, "orders")
    with TcpProxy(destination.port, name="shovel->destination") as proxy:
        shovel(source, "move", {
            "src-uri": "amqp://", "src-queue": "orders",
            "dest-uri": f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F",
            "dest-queue": "orders", "ack-mode": "on-confirm", "src-prefetch-count": 100,
            "reconnect-delay": 1})
        wait_for(lambda: "running" in ctl(source, "shovel_status"), what="running")
        proxy.cut("stall", "backward")  # the destination's confirms wait in the proxy
        publish(source, "orders", range(300))
        wait_for(lambda: count(destination, "orders") == 100,
                 what="the prefetch at the destination, unconfirmed")
        ctl(source, "clear_parameter", "shovel", "move")
        wait_for(lambda: "move" not in ctl(source, "shovel_status"), what="the stop begun")
        proxy.heal()
        wait_for(lambda: _source_settled(source, ready=None), timeout=60,
                 what="no message unacknowledged at the source")
    at_destination = [int(m) for m, _b, _h in drain(destination, "orders")]
    at_source = [int(m) for m, _b, _h in drain(source, "orders")]
    assert len(at_destination) == 100 and len(at_source) == 200, (
        len(at_destination), len(at_source))
    assert sorted(at_destination + at_source) == list(range(300))


def _source_settled(broker, ready: int | None = 0) -> bool:
    """`orders` has no unacknowledged message (and `ready` ready ones, unless None)."""
    name, ready_now, unacked = ctl(broker, "list_queues", "name", "messages_ready",
                                   "messages_unacknowledged").split()[-3:]
    return name == "orders" and unacked == "0" and ready in (None, int(ready_now))
