"""`quorumqueue ctl list_connections|list_channels|list_consumers|list_exchanges|
list_bindings|close_connection|status` and `quorumqueue diagnostics check_running|
check_local_alarms|listeners|check_port_connectivity` against RabbitMQ 3.10.8's own
rabbitmqctl and rabbitmq-diagnostics (RabbitMQNode.ctl), the same clients on both
brokers: one connection with two channels, a consumer, a topic exchange bound to a
queue. Compared: exit codes, banners, the header line of the default and of the given
columns (list_consumers reorders what it is given), -q/--silent, the JSON formatter's
keys, the rows' values where they do not name a process or an ephemeral port, an
unknown column (64), a connection not there (69), a memory alarm (69, its text and
JSON), the status sections and JSON keys (ours a subset); check_port_connectivity's
failure: test_port_connectivity_against_rabbitmq.py.

Deliberate differences, not compared: a `pid` is the connection's or channel's name in
angle brackets (no Erlang processes), which close_connection takes where rabbitmqctl
takes a pid; RabbitMQ's table lists exchanges in hash order (compared as sets);
RabbitMQ's AMQP listener's purpose says "AMQP 0-9-1 and AMQP 1.0" (quorumqueue
speaks 0-9-1 only) and a lone node has no clustering listener; check_running's
failure text names the API's URL (the node's name is not known without it);
check_port_connectivity connects at each listener's interface, RabbitMQ's at the
node's host name (docs/behaviour/command-line.md says why);
rabbitmqctl's -s is --silent only here (-s is rabbitmqadmin's --ssl).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pika
import pytest

from tests.differential.test_management_against_rabbitmq import _get, wait_for
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode, management_node

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def rabbitmq():
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with management_node() as node:
        yield node


@pytest.fixture(scope="module")
def quorumqueue():
    with BrokerProcess() as process:
        yield process


def make_clients(uri: str) -> pika.BlockingConnection:
    # heartbeat 0: the connection sits idle for the whole module (a BlockingConnection
    # sends heartbeats only while called), and a broker closes one that misses two
    connection = pika.BlockingConnection(pika.URLParameters(uri + "?heartbeat=0"))
    channel = connection.channel()
    channel.queue_declare("ctl-q", durable=True)
    channel.exchange_declare("ctl-x", "topic", durable=True)
    channel.queue_bind("ctl-q", "ctl-x", "a.#")
    channel.basic_consume("ctl-q", lambda *_: None, consumer_tag="ctl-tag")
    connection.channel()
    return connection


@pytest.fixture(scope="module")
def both(rabbitmq, quorumqueue):
    clients = [make_clients(rabbitmq.uri), make_clients(quorumqueue.uri)]
    yield rabbitmq, quorumqueue
    for connection in clients:
        if connection.is_open:
            connection.close()


def ours(broker: BrokerProcess, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quorumqueue.cli", *arguments, "--base-uri",
         f"http://guest:guest@127.0.0.1:{broker.management_port}"],
        capture_output=True, text=True, timeout=120)


def theirs(node: RabbitMQNode, *arguments: str) -> subprocess.CompletedProcess:
    tool, *rest = arguments
    return node.ctl(*rest, tool={"ctl": "rabbitmqctl",
                                 "diagnostics": "rabbitmq-diagnostics"}[tool])


def run_both(both, *arguments: str):
    rabbitmq, quorumqueue = both
    return theirs(rabbitmq, *arguments), ours(quorumqueue, *arguments)


def table(output: str) -> tuple[str, list[str], list[list[str]]]:
    """(banner, header, rows) of a listing with its banner."""
    banner, header, *rows = output.rstrip("\n").split("\n")
    return banner, header.split("\t"), [row.split("\t") for row in rows]


# (command, given columns, the columns whose values both brokers share)
LISTINGS = [
    (("ctl", "list_connections"), (), ("user", "peer_host", "state")),
    (("ctl", "list_connections"), ("name", "user", "state", "channels", "vhost", "protocol",
                                   "ssl", "auth_mechanism", "frame_max"),
     ("user", "state", "channels", "vhost", "ssl", "auth_mechanism")),
    (("ctl", "list_channels"), (), ("user", "consumer_count", "messages_unacknowledged")),
    (("ctl", "list_channels"), ("number", "user", "vhost", "transactional", "confirm",
                                "consumer_count", "prefetch_count", "global_prefetch_count"),
     ("number", "user", "vhost", "transactional", "confirm", "consumer_count",
      "prefetch_count", "global_prefetch_count")),
    (("ctl", "list_consumers"), (), ("queue_name", "consumer_tag", "ack_required",
                                     "prefetch_count", "active", "arguments")),
    (("ctl", "list_consumers"), ("arguments", "activity_status", "consumer_tag",
                                 "queue_name"),
     ("queue_name", "consumer_tag", "activity_status", "arguments")),
    (("ctl", "list_exchanges"), (), ("name", "type")),
    (("ctl", "list_exchanges"), ("name", "type", "durable", "auto_delete", "internal",
                                 "arguments", "policy"),
     ("name", "type", "durable", "auto_delete", "internal", "arguments", "policy")),
    (("ctl", "list_bindings"), (), ("source_name", "source_kind", "destination_name",
                                    "destination_kind", "routing_key", "arguments")),
]


def shared(header: list[str], rows: list[list[str]], columns) -> set[tuple]:
    rows = [dict(zip(header, row)) for row in rows]
    # RabbitMQ's internal amq.rabbitmq.trace exchange is not quorumqueue's
    return {tuple(row[c] for c in columns) for row in rows
            if row.get("name") != "amq.rabbitmq.trace"}


@pytest.mark.parametrize("command, columns, compared", LISTINGS,
                         ids=[" ".join(c[0][1:] + c[1]) or "default"
                              for c in LISTINGS])
def test_listings_match_rabbitmqctl(both, command, columns, compared):
    their, our = run_both(both, *command, *columns)
    assert (our.returncode, our.stderr) == (their.returncode, "") == (0, "")
    their_banner, their_header, their_rows = table(their.stdout)
    our_banner, our_header, our_rows = table(our.stdout)
    assert (our_banner, our_header) == (their_banner, their_header)
    assert shared(our_header, our_rows, compared) == shared(their_header, their_rows,
                                                            compared)
    # -q: no banner; --silent: no header either
    their, our = run_both(both, *command, *columns, "-q")
    assert our.stdout.split("\n")[0] == their.stdout.split("\n")[0] == "\t".join(our_header)
    their, our = run_both(both, *command, *columns, "--silent")
    assert len(our.stdout.splitlines()) == len(our_rows)
    assert len(their.stdout.splitlines()) == len(their_rows)


@pytest.mark.parametrize("command", [("ctl", "list_connections"), ("ctl", "list_channels"),
                                     ("ctl", "list_consumers"), ("ctl", "list_exchanges"),
                                     ("ctl", "list_bindings")])
def test_the_json_formatter_gives_the_same_keys(both, command):
    their, our = run_both(both, *command, "--formatter", "json")
    assert our.returncode == their.returncode == 0
    their_rows, our_rows = json.loads(their.stdout), json.loads(our.stdout)
    assert [list(row) for row in our_rows][:1] == [list(row) for row in their_rows][:1]
    lines = our.stdout.splitlines()  # RabbitMQ's layout: one object a line
    assert lines[0] == "[" and lines[-1] == "]" and all(
        line.startswith(",{") for line in lines[2:-1])
    if command[1] == "list_connections":
        assert our_rows[0]["peer_host"] == their_rows[0]["peer_host"] == [127, 0, 0, 1]


def test_an_unknown_column_is_refused_with_64(both):
    their, our = run_both(both, "ctl", "list_connections", "bogus")
    assert our.returncode == their.returncode == 64
    first = "Error (argument validation): Info key(s) bogus are not supported"
    assert our.stderr.splitlines()[0] == their.stderr.splitlines()[0] == first


def test_closing_a_connection_not_there_is_69(both):
    their, our = run_both(both, "ctl", "close_connection", "nope", "bye")
    assert our.returncode == their.returncode == 69
    assert our.stdout == their.stdout == "Closing connection nope, reason: bye...\n"
    assert our.stderr.startswith("Error:\n") and their.stderr.startswith("Error:\n")


def test_close_connection_closes_what_list_connections_names(quorumqueue):
    def listed() -> set[str]:
        result = ours(quorumqueue, "ctl", "list_connections", "pid", "--silent")
        return set(result.stdout.splitlines())

    before = listed()
    connection = pika.BlockingConnection(pika.URLParameters(quorumqueue.uri))
    pids = sorted(listed() - before)  # this test's connection only
    assert len(pids) == 1 and pids[0].startswith("<") and pids[0].endswith(">")
    closed = []
    for pid in pids:
        result = ours(quorumqueue, "ctl", "close_connection", pid, "go away")
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"Closing connection {pid}, reason: go away...\n"
    deadline = time.monotonic() + 30
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.2)
        closed.append("not closed")
    assert raised.value.reply_code == 320 and "go away" in raised.value.reply_text
    assert not closed


def test_status_has_rabbitmqs_sections_and_json_keys(both):
    their, our = run_both(both, "ctl", "status")
    assert our.returncode == their.returncode == 0
    node = ours_node_name(both[1])
    assert our.stdout.splitlines()[0] == f"Status of node {node} ..."
    sections = [line for line in our.stdout.splitlines() if line.startswith("\x1b[1m")]
    their_sections = [line for line in their.stdout.splitlines() if line.startswith("\x1b[1m")]
    assert sections and set(sections) <= set(their_sections)
    for line in ("OS: Linux", "Is under maintenance?: false", "Calculation strategy: rss",
                 "(none)", "Virtual host count: 1", "Queue count: 1", "Connection count: 1"):
        assert line in our.stdout.splitlines() and line in their.stdout.splitlines()
    their, our = run_both(both, "ctl", "status", "--formatter", "json")
    their_keys, our_status = set(json.loads(their.stdout)), json.loads(our.stdout)
    assert set(our_status) - {"product_name", "product_version"} <= their_keys
    assert our_status["totals"] == json.loads(their.stdout)["totals"]


def ours_node_name(broker: BrokerProcess) -> str:
    return _get(f"http://127.0.0.1:{broker.management_port}", "/api/overview")["node"]


def test_diagnostics_checks_pass_as_rabbitmqs(both):
    rabbitmq, quorumqueue = both
    names = (rabbitmq.node_name, ours_node_name(quorumqueue))
    for command, texts in [
            ("check_running", ["Checking if RabbitMQ is running on node {} ...",
                               "RabbitMQ on node {} is fully booted and running"]),
            ("check_local_alarms", ["Asking node {} to report any local resource alarms ...",
                                    "Node {} reported no local alarms"]),
            ("check_port_connectivity",
             ["Testing TCP connections to all active listeners on node {} ..."])]:
        their, our = run_both(both, "diagnostics", command)
        assert our.returncode == their.returncode == 0
        for output, name in zip((their.stdout, our.stdout), names):
            assert output.splitlines()[:len(texts)] == [t.format(name) for t in texts]
        their, our = run_both(both, "diagnostics", command, "-q")
        assert len(our.stdout.splitlines()) == len(their.stdout.splitlines())
    their, our = run_both(both, "diagnostics", "check_local_alarms", "--formatter", "json")
    assert json.loads(our.stdout) == json.loads(their.stdout) == {"result": "ok"}
    their, our = run_both(both, "diagnostics", "check_running", "--formatter", "json")
    assert json.loads(our.stdout) == {"message": f"RabbitMQ on node {names[1]} is fully "
                                                 "booted and running"}
    assert set(json.loads(their.stdout)) == {"message"}
    their, our = run_both(both, "diagnostics", "check_port_connectivity", "--formatter", "json")
    assert set(json.loads(our.stdout)) == set(json.loads(their.stdout))


def test_listeners_as_rabbitmq_diagnostics_lists_them(both):
    rabbitmq, quorumqueue = both
    their, our = run_both(both, "diagnostics", "listeners")
    assert our.returncode == their.returncode == 0
    assert our.stdout.splitlines()[0] == (f"Asking node {ours_node_name(quorumqueue)} to "
                                          "report its protocol listeners ...")

    def by_protocol(output):
        found = {}
        for line in output.splitlines()[1:]:
            fields = dict(part.split(": ", 1) for part in line.split(", "))
            found[fields["protocol"]] = fields
        return found

    theirs_, ours_ = by_protocol(their.stdout), by_protocol(our.stdout)
    assert ours_["http"]["purpose"] == theirs_["http"]["purpose"] == "HTTP API"
    assert ours_["amqp"]["port"] == str(quorumqueue.port)
    their, our = run_both(both, "diagnostics", "listeners", "--formatter", "json")
    their_json, our_json = json.loads(their.stdout), json.loads(our.stdout)
    assert set(our_json) == set(their_json)
    assert set(our_json["listeners"][0]) == set(their_json["listeners"][0])


def test_a_memory_alarm_fails_check_local_alarms_with_69(rabbitmq):
    """Both brokers with a memory high watermark below what they use."""
    config = 'vm_memory_high_watermark.absolute = "1MB"\n'
    with BrokerProcess(extra_config=config) as quorumqueue:
        rabbitmq.ctl("set_vm_memory_high_watermark", "absolute", "1000000")
        try:
            wait_for(lambda: theirs(rabbitmq, "diagnostics",
                                    "check_local_alarms").returncode == 69 or None,
                     "RabbitMQ's memory alarm")
            ours_name = ours_node_name(quorumqueue)
            for broker_name, result in (
                    (rabbitmq.node_name, theirs(rabbitmq, "diagnostics", "check_local_alarms")),
                    (ours_name, ours(quorumqueue, "diagnostics", "check_local_alarms"))):
                assert result.returncode == 69
                assert result.stdout == (f"Asking node {broker_name} to report any local "
                                         "resource alarms ...\n")
                assert result.stderr == f"Error:\nMemory alarm on node {broker_name}\n"
            their = theirs(rabbitmq, "diagnostics", "check_local_alarms", "--formatter", "json")
            our = ours(quorumqueue, "diagnostics", "check_local_alarms", "--formatter", "json")
            assert our.returncode == their.returncode == 69
            assert json.loads(our.stderr) == {
                "local": [f"Memory alarm on node {ours_name}"], "result": "error",
                "message": f"Node {ours_name} reported local alarms"}
            assert set(json.loads(their.stderr)) == set(json.loads(our.stderr))
        finally:
            rabbitmq.ctl("set_vm_memory_high_watermark", "0.4")
