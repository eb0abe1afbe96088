"""Who a connection is, against RabbitMQ 3.10.8: the server's capabilities table and
the user_id a publisher may claim.

- connection.start's server properties carry a `capabilities` table naming the
  protocol extensions the server implements (rabbit_reader's server_capabilities);
  clients read it to decide what they may use. It must name what RabbitMQ names, each
  true, with the same keys beside it (their values, product and version, are
  quorumqueue's own).
- A message's user_id must be the publishing user's name (the validated user-ID
  extension); a user tagged `impersonator` may publish any user_id
  (rabbit_channel's check_user_id_header). Anything else, the empty string
  included, is 406 PRECONDITION_FAILED naming both names.

The same pika client runs on both brokers and what it sees is compared. The users
come from `rabbitmqctl` on RabbitMQ and from the metadata file the broker's data
directory starts with, as in test_permissions_against_rabbitmq.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pika
import pytest

from quorumqueue.broker.auth.users import hash_password
from tests.differential.probe import Probe
from tests.differential.test_permissions_against_rabbitmq import rabbitmqctl
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode

USERS = {"id-ivy": ["impersonator"], "id-joe": [], "id-ada": ["administrator"]}
CLAIMS = ("id-someone-else", "id-joe", None, "", "guest")


@pytest.fixture(scope="module")
def rabbitmq_users(rabbitmq) -> RabbitMQNode:
    for user, tags in USERS.items():
        rabbitmqctl(rabbitmq, "add_user", user, user)
        rabbitmqctl(rabbitmq, "set_user_tags", user, *tags)
        rabbitmqctl(rabbitmq, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
    return rabbitmq


@pytest.fixture(scope="module")
def broker_users(tmp_path_factory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("qq-identity")
    tags = {"guest": ["administrator"], **USERS}
    users = [{"name": user, "password_hash": hash_password(user), "vhosts": ["/"],
              "tags": user_tags, "permissions": {"/": [".*", ".*", ".*"]}}
             for user, user_tags in tags.items()]
    (data_dir / "metadata.json").write_text(json.dumps({
        "version": 1, "vhosts": ["/"], "users": users, "policies": [], "exchanges": [],
        "queues": [], "bindings": []}))
    with BrokerProcess(data_dir=str(data_dir)) as process:
        yield process


def _server_properties(uri: str) -> dict:
    probe = Probe(uri)
    try:
        return probe.handshake()["start"]
    finally:
        probe.close()


def test_the_capabilities_table_names_what_rabbitmq_names(rabbitmq, broker) -> None:
    expected = _server_properties(rabbitmq.uri)
    actual = _server_properties(broker.uri)
    assert actual["capabilities"] == expected["capabilities"]
    assert set(expected["capabilities"]) >= {"publisher_confirms", "basic.nack",
                                             "direct_reply_to", "per_consumer_qos"}
    assert sorted(actual["server_properties"]) == sorted(expected["server_properties"])


def _claims(uri: str) -> list:
    """Each user publishes a message claiming each user_id: what a basic.get then
    returns (the user_id delivered) or how the channel was closed."""
    seen = []
    for user in USERS:
        queue = f"id-q-{user}"
        connection = pika.BlockingConnection(pika.URLParameters(
            uri.replace("guest:guest", f"{user}:{user}")))
        try:
            channel = connection.channel()
            channel.queue_declare(queue, arguments={"x-expires": 60_000})
            channel.queue_purge(queue)
            for claim in CLAIMS:
                if not channel.is_open:
                    channel = connection.channel()
                try:
                    channel.basic_publish("", queue, b"m", pika.BasicProperties(user_id=claim))
                    channel.queue_declare(queue, passive=True)  # refused by now
                    method, properties, _body = channel.basic_get(queue, auto_ack=True)
                    seen.append((user, claim, "delivered", method is not None
                                 and properties.user_id))
                except pika.exceptions.ChannelClosedByBroker as error:
                    seen.append((user, claim, error.reply_code, error.reply_text))
        finally:
            if connection.is_open:
                connection.close()
    return seen


def test_an_impersonator_may_publish_another_users_user_id(rabbitmq_users,
                                                           broker_users) -> None:
    expected = _claims(rabbitmq_users.uri)
    assert ("id-ivy", "id-someone-else", "delivered", "id-someone-else") in expected
    assert ("id-joe", "id-someone-else", 406, "PRECONDITION_FAILED - user_id property "
            "set to 'id-someone-else' but authenticated user was 'id-joe'") in expected
    assert _claims(broker_users.uri) == expected
