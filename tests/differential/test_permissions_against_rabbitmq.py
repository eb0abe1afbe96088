"""Differential tests of user permissions: RabbitMQ 3.10.8 and quorumqueue refuse alike.

Both brokers get the same two restricted users: perm-bob, whose patterns say what
he may do by name prefix (cfg- configure, w- write, r- read, all- everything;
write on amq.default too), and perm-eve, whose "" patterns grant nothing but opening
"/". RabbitMQ gets them from `rabbitmqctl add_user` / `set_permissions` against the
session's oracle node; quorumqueue from the metadata file its data directory starts
with (storage/metadata_store.py), which is where a node keeps its users. guest sets
each scenario's world up, the restricted user then acts; the transcripts (reply
codes, texts, class and method ids, as in test_against_rabbitmq.py) must be equal.

The operations and resources follow RabbitMQ's access-control table
(https://www.rabbitmq.com/docs/access-control, "How Permissions Work"). Names carry
a dp- tag so they meet nothing of the other differential scenarios on the shared
RabbitMQ node.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands as amqp

from quorumqueue.broker.auth.users import hash_password
from tests.differential.probe import Probe
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import MARKER_VARIABLE, RabbitMQNode

RABBITMQCTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
# user -> (configure, write, read), the same on both brokers
USERS = {"perm-bob": (r"^(cfg|all)-", r"^(w|all)-|^amq\.default$", r"^(r|all)-"),
         "perm-eve": ("", "", "")}


def rabbitmqctl(node: RabbitMQNode, *arguments: str) -> None:
    """Run rabbitmqctl against the oracle node: its Erlang cookie (under the node's
    HOME) and its private epmd, nothing of the system's."""
    base = node.base_dir
    environment = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "TMPDIR")
                   if name in os.environ}
    environment.update(HOME=str(base / "home"), ERL_EPMD_PORT=str(node.epmd_port),
                       ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_USE_LONGNAME="false",
                       RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"))
    environment[MARKER_VARIABLE] = node.node_name  # whatever outlives it dies with the node
    subprocess.run([str(RABBITMQCTL), "-n", node.node_name, *arguments], env=environment,
                   check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def rabbitmq_users(rabbitmq) -> RabbitMQNode:
    for user, (configure, write, read) in USERS.items():
        rabbitmqctl(rabbitmq, "add_user", user, user)
        rabbitmqctl(rabbitmq, "set_permissions", "-p", "/", user, configure, write, read)
    return rabbitmq


@pytest.fixture(scope="module")
def broker_users(tmp_path_factory) -> Iterator[BrokerProcess]:
    """A broker whose data directory starts with guest and the restricted users."""
    data_dir = tmp_path_factory.mktemp("qq-permissions")
    rights = {"guest": (".*", ".*", ".*"), **USERS}
    users = [{"name": user, "password_hash": hash_password(user), "vhosts": ["/"],
              "tags": ["administrator"] if user == "guest" else [],
              "permissions": {"/": list(patterns)}} for user, patterns in rights.items()]
    (data_dir / "metadata.json").write_text(json.dumps({
        "version": 1, "vhosts": ["/"], "users": users, "policies": [], "exchanges": [],
        "queues": [], "bindings": []}))
    with BrokerProcess(data_dir=str(data_dir)) as process:
        yield process


SCENARIOS: dict = {}


def scenario(function):
    """Register `function(guest, user)`: two probes on one transcript."""
    SCENARIOS[function.__name__] = function
    return function


def observe(function, uri: str) -> list:
    with Probe.open(uri, label="guest") as guest:
        users = {}
        try:
            for user in USERS:
                users[user] = Probe.open(uri.replace("guest:guest", f"{user}:{user}"),
                                         label=user, transcript=guest.transcript)
            function(guest, users)
        finally:
            for probe in users.values():
                probe.close()
        return guest.transcript


def channel(c: Probe, number: int = 1) -> None:
    """Open channel `number` unless it is open (a refusal closed it)."""
    if number not in c.open_channels:
        c.call(number, amqp.Channel.Open())


def each(c: Probe, *methods) -> None:
    """Call each method on channel 1, reopened after a refusal."""
    for method in methods:
        channel(c)
        c.call(1, method)


def exchanges(guest: Probe, *names: str) -> None:
    each(guest, *(amqp.Exchange.Declare(exchange=name) for name in names))


def queues(guest: Probe, *names: str) -> None:
    each(guest, *(amqp.Queue.Declare(queue=name) for name in names))


# ================================================================ scenarios


@scenario
def permission_declare_and_delete(guest: Probe, users: dict) -> None:
    """configure for declare (not passive, server-named and existing too) and delete;
    the amq. prefix is refused after the configure check for an exchange, before it
    for a queue; deleting what does not exist is still refused."""
    bob, eve = users["perm-bob"], users["perm-eve"]
    exchanges(guest, "other-dp-x")
    queues(guest, "other-dp-q")
    each(bob,
         amqp.Queue.Declare(queue="cfg-dp-q"), amqp.Queue.Declare(queue="w-dp-q"),
         amqp.Queue.Declare(queue="other-dp-q"),
         amqp.Queue.Declare(queue="other-dp-q", passive=True),
         amqp.Queue.Declare(queue="amq.dp-q"),
         amqp.Exchange.Declare(exchange="cfg-dp-x"), amqp.Exchange.Declare(exchange="w-dp-x"),
         amqp.Exchange.Declare(exchange="other-dp-x"),
         amqp.Exchange.Declare(exchange="other-dp-x", passive=True),
         amqp.Exchange.Declare(exchange="amq.dp-x"),
         amqp.Exchange.Delete(exchange="other-dp-x"), amqp.Exchange.Delete(exchange="w-dp-none"),
         amqp.Exchange.Delete(exchange="amq.direct"), amqp.Exchange.Delete(exchange="cfg-dp-x"),
         amqp.Queue.Delete(queue="other-dp-q"), amqp.Queue.Delete(queue="w-dp-none"),
         amqp.Queue.Delete(queue="cfg-dp-q"))
    each(eve, amqp.Queue.Declare(queue=""), amqp.Exchange.Declare(exchange=""))
    each(guest, amqp.Queue.Delete(queue="other-dp-q"), amqp.Exchange.Delete(exchange="other-dp-x"))


@scenario
def permission_alternate_and_dead_letter_exchanges(guest: Probe, users: dict) -> None:
    """A new exchange with an alternate exchange also needs read on itself and write on
    the alternate; a new queue with a dead-letter exchange read on itself and write on
    the DLX; with both, the queue is declared."""
    each(users["perm-bob"],
         amqp.Exchange.Declare(exchange="all-dp-ae1", arguments={"alternate-exchange": "r-dp-x"}),
         amqp.Exchange.Declare(exchange="cfg-dp-ae2", arguments={"alternate-exchange": "w-dp-x"}),
         amqp.Exchange.Declare(exchange="all-dp-ae3", arguments={"alternate-exchange": "w-dp-x"}),
         amqp.Exchange.Delete(exchange="all-dp-ae3"),
         amqp.Queue.Declare(queue="all-dp-dlq1", arguments={"x-dead-letter-exchange": "r-dp-x"}),
         amqp.Queue.Declare(queue="cfg-dp-dlq2", arguments={"x-dead-letter-exchange": "w-dp-x"}),
         amqp.Queue.Declare(queue="all-dp-dlq3", arguments={"x-dead-letter-exchange": "w-dp-x"}),
         amqp.Queue.Delete(queue="all-dp-dlq3"))


@scenario
def permission_bindings(guest: Probe, users: dict) -> None:
    """Bindings: write on the destination first, then the default exchange refusal,
    then read on the source; unbinding is checked the same way."""
    bob, eve = users["perm-bob"], users["perm-eve"]
    exchanges(guest, "r-dp-bx", "w-dp-bx")
    queues(guest, "r-dp-bq", "w-dp-bq")
    bind, unbind = amqp.Queue.Bind, amqp.Queue.Unbind
    each(bob,
         bind(queue="w-dp-bq", exchange="r-dp-bx", routing_key="k"),
         bind(queue="r-dp-bq", exchange="r-dp-bx", routing_key="k"),
         bind(queue="w-dp-bq", exchange="w-dp-bx", routing_key="k"),
         unbind(queue="w-dp-bq", exchange="w-dp-bx", routing_key="k"),
         unbind(queue="w-dp-bq", exchange="r-dp-bx", routing_key="k"),
         amqp.Exchange.Bind(destination="w-dp-bx", source="r-dp-bx", routing_key="k"),
         amqp.Exchange.Bind(destination="r-dp-bx", source="r-dp-bx", routing_key="k"),
         amqp.Exchange.Bind(destination="", source="r-dp-bx", routing_key="k"),
         amqp.Exchange.Bind(destination="w-dp-bx", source="", routing_key="k"),
         amqp.Exchange.Unbind(destination="w-dp-bx", source="other-dp-bx", routing_key="k"),
         amqp.Exchange.Unbind(destination="w-dp-bx", source="r-dp-bx", routing_key="k"))
    each(eve, amqp.Exchange.Bind(destination="", source="r-dp-bx", routing_key="k"))
    each(guest, *(amqp.Exchange.Delete(exchange=name) for name in ("r-dp-bx", "w-dp-bx")),
         *(amqp.Queue.Delete(queue=name) for name in ("r-dp-bq", "w-dp-bq")))


@scenario
def permission_publish(guest: Probe, users: dict) -> None:
    """basic.publish needs write on the exchange ("" checked as amq.default), before
    the exchange is looked up; a refusal closes the channel with (60, 40)."""
    bob, eve = users["perm-bob"], users["perm-eve"]
    exchanges(guest, "r-dp-px", "w-dp-px")
    queues(guest, "other-dp-pq")
    each(guest, amqp.Queue.Bind(queue="other-dp-pq", exchange="w-dp-px", routing_key="k"),
         amqp.Queue.Bind(queue="other-dp-pq", exchange="r-dp-px", routing_key="k"))
    channel(bob)
    bob.call(1, amqp.Confirm.Select())
    bob.publish(1, "w-dp-px", "k", "via w-dp-px")
    bob.publish(1, "", "other-dp-pq", "via the default exchange")
    bob.collect(2)
    for exchange in ("r-dp-px", "nope-dp-x", "w-dp-none"):
        channel(bob)
        bob.publish(1, exchange, "k", "refused")
        bob.barrier(1)
    channel(eve)
    eve.publish(1, "", "other-dp-pq", "refused")
    eve.barrier(1)
    each(guest, amqp.Queue.Declare(queue="other-dp-pq", passive=True),
         amqp.Queue.Delete(queue="other-dp-pq"),
         *(amqp.Exchange.Delete(exchange=name) for name in ("r-dp-px", "w-dp-px")))


@scenario
def permission_get_consume_purge(guest: Probe, users: dict) -> None:
    """basic.get, basic.consume and queue.purge need read on the queue, checked after
    the "" shortcut and before the queue is looked up."""
    queues(guest, "r-dp-gq", "other-dp-gq")
    bob = users["perm-bob"]
    each(bob,
         amqp.Basic.Get(queue=""),
         amqp.Basic.Get(queue="r-dp-gq"), amqp.Basic.Get(queue="other-dp-gq"),
         amqp.Basic.Get(queue="w-dp-none"), amqp.Basic.Get(queue="r-dp-none"),
         amqp.Queue.Purge(queue="r-dp-gq"), amqp.Queue.Purge(queue="other-dp-gq"),
         amqp.Queue.Purge(queue="w-dp-none"),
         amqp.Basic.Consume(queue="other-dp-gq", consumer_tag="t1"),
         amqp.Basic.Consume(queue="w-dp-none", consumer_tag="t2"),
         amqp.Basic.Consume(queue="r-dp-gq", consumer_tag="t3"))
    each(guest, *(amqp.Queue.Delete(queue=name) for name in ("r-dp-gq", "other-dp-gq")))


@pytest.mark.parametrize("name", SCENARIOS)
def test_quorumqueue_refuses_like_rabbitmq(name: str, rabbitmq_users, broker_users) -> None:
    expected = observe(SCENARIOS[name], rabbitmq_users.uri)
    actual = observe(SCENARIOS[name], broker_users.uri)
    assert actual == expected
