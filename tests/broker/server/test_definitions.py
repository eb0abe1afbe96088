"""Users, vhosts, permissions and policies on a running node, managed as with
rabbitmqctl (`quorumqueue ctl ...`, cli/ctl.py): what a client then sees, and that
all of it survives a restart."""

from __future__ import annotations

import json
import re
import time

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.client.management import ManagementError, call
from quorumqueue.cli.main import main

from .pika_support import channel_error, connect, get_bodies, publish_bodies, unique

pytestmark = pytest.mark.timeout(120)


def ctl(broker, *args: str) -> str:
    result = CliRunner().invoke(main, ["ctl", *args, "--base-uri", broker.management_url])
    assert result.exit_code == 0, result.output
    return result.output


def ctl_error(broker, *args: str) -> str:
    result = CliRunner().invoke(main, ["ctl", *args, "--base-uri", broker.management_url])
    assert result.exit_code != 0, result.output
    return result.output


def rows(table: str) -> list[list[str]]:
    """A table the CLI printed, as its cells (header first)."""
    return [re.split(r"\s{2,}", line.strip()) for line in table.splitlines() if line.strip()]


def uri_for(broker, user: str, password: str, vhost: str = "%2F") -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{broker.port}/{vhost}"


def open_as(broker, user: str, password: str, vhost: str = "%2F") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(uri_for(broker, user, password, vhost)))


def test_a_user_logs_in_once_added_and_given_permissions(broker):
    name = unique("bob")
    assert f'Adding user "{name}"' in ctl(broker, "add_user", name, "s3cret")
    # no permissions in "/" yet: RabbitMQ refuses the vhost (530 NOT_ALLOWED)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        open_as(broker, name, "s3cret")
    ctl(broker, "set_permissions", name, ".*", ".*", ".*")
    open_as(broker, name, "s3cret").close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        open_as(broker, name, "wrong")
    ctl(broker, "change_password", name, "n3w")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        open_as(broker, name, "s3cret")
    open_as(broker, name, "n3w").close()
    users = rows(ctl(broker, "list_users"))
    assert [name, "[]"] in users and ["guest", "[administrator]"] in users
    assert [name, ".*", ".*", ".*"] in rows(ctl(broker, "list_permissions"))


def test_deleting_a_user_closes_its_connections(broker):
    name = unique("carol")
    ctl(broker, "add_user", name, "pw")
    ctl(broker, "set_permissions", name, ".*", ".*", ".*")
    connection = open_as(broker, name, "pw")
    ctl(broker, "delete_user", name)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.channel().queue_declare("", exclusive=True)
        connection.process_data_events(time_limit=1)
    assert closed.value.reply_code == 320
    assert f"user '{name}' was deleted" in closed.value.reply_text
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        open_as(broker, name, "pw")


def test_a_vhost_is_its_own_namespace_and_deleting_it_takes_its_queues(broker):
    vhost = unique("tenant")
    ctl(broker, "add_vhost", vhost)
    ctl(broker, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    connection = open_as(broker, "guest", "guest", vhost)
    channel = connection.channel()
    channel.queue_declare("jobs", durable=True, arguments={"x-queue-type": "quorum"})
    publish_bodies(channel, "jobs", [b"1", b"2"], delivery_mode=2)
    assert [row["name"] for row in call(broker.uri, "queues.list", vhost=vhost)] == ["jobs"]
    assert not [row for row in call(broker.uri, "queues.list", vhost="/")
                if row["name"] == "jobs"]
    ctl(broker, "delete_vhost", vhost)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        channel.queue_declare("jobs", passive=True)
    assert closed.value.reply_code == 320 and "is deleted" in closed.value.reply_text
    assert vhost not in ctl(broker, "list_vhosts")
    with pytest.raises(ManagementError, match=f"no vhost '{vhost}'"):
        call(broker.uri, "queues.list", vhost=vhost)
    # a vhost of the same name later is new and empty
    ctl(broker, "add_vhost", vhost)
    ctl(broker, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    assert call(broker.uri, "queues.list", vhost=vhost) == []


def test_refusals_name_what_is_wrong(broker):
    assert "user 'guest' already exists" in ctl_error(broker, "add_user", "guest", "x")
    assert "no user 'nobody'" in ctl_error(broker, "delete_user", "nobody")
    assert "no vhost 'nowhere'" in ctl_error(broker, "set_permissions", "-p", "nowhere",
                                              "guest", ".*", ".*", ".*")
    assert "is not a regular expression" in ctl_error(broker, "set_permissions", "guest",
                                                      "(", ".*", ".*")
    assert "vhost '/' already exists" in ctl_error(broker, "add_vhost", "/")
    assert "key 'queue-mode' is not supported by quorumqueue" in ctl_error(
        broker, "set_policy", "ttl", ".*", '{"queue-mode": "lazy"}')
    assert "key 'dead-letter-strategy' applies to quorum queues only" in ctl_error(
        broker, "set_policy", "dls", ".*", '{"dead-letter-strategy": "at-most-once"}')
    assert "overflow 'reject-publish-dlx' applies to classic queues only" in ctl_error(
        broker, "set_policy", "dlx", ".*", '{"overflow": "reject-publish-dlx"}')
    assert "not JSON" in ctl_error(broker, "set_policy", "bad", ".*", "{max-length: 1}")
    assert "no policy 'none' in vhost '/'" in ctl_error(broker, "clear_policy", "none")
    name = unique("plain")
    ctl(broker, "add_user", name, "pw")
    ctl(broker, "set_permissions", name, ".*", ".*", ".*")
    with pytest.raises(ManagementError, match=f"user '{name}' is not an administrator"):
        call(uri_for(broker, name, "pw"), "users.list")


def test_a_policy_limits_classic_queues_now_and_later(broker):
    prefix = unique("capped")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(f"{prefix}.a")
    publish_bodies(channel, f"{prefix}.a", [b"%d" % n for n in range(10)])
    ctl(broker, "set_policy", "--apply-to", "queues", f"cap-{prefix}", f"^{prefix}\\.",
        '{"max-length": 3}')
    # drop-head: the oldest go at once
    assert channel.queue_declare(f"{prefix}.a", passive=True).method.message_count == 3
    channel.queue_declare(f"{prefix}.b", arguments={"x-max-length": 2})  # lower: kept
    publish_bodies(channel, f"{prefix}.b", [b"%d" % n for n in range(5)])
    assert get_bodies(channel, f"{prefix}.b") == [b"3", b"4"]
    listed = ctl(broker, "list_policies")
    assert f"cap-{prefix}" in listed and '{"max-length":3}' in listed
    ctl(broker, "clear_policy", f"cap-{prefix}")
    publish_bodies(channel, f"{prefix}.a", [b"x"] * 5)
    assert channel.queue_declare(f"{prefix}.a", passive=True).method.message_count == 8
    connection.close()


def test_a_policy_changes_a_running_quorum_queue_through_its_log(broker):
    name = unique("qq-capped")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    publish_bodies(channel, name, [b"%d" % n for n in range(6)], delivery_mode=2)
    ctl(broker, "set_policy", "--apply-to", "quorum_queues", f"p-{name}", f"^{name}$",
        '{"max-length": 4, "overflow": "reject-publish", "delivery-limit": 1}')
    # the settings reach the machine through the queue's log (fifo UpdateConfig), before
    # the command returns on a node of its own: with reject-publish nothing is dropped,
    # and publishes are refused while over the limit
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", name, b"refused", pika.BasicProperties(delivery_mode=2))
    assert channel.queue_declare(name, passive=True).method.message_count == 6
    # delivery-limit 1: a message returned twice is dropped
    for _ in range(2):
        method, _properties, body = channel.basic_get(name)
        assert body == b"0"
        channel.basic_nack(method.delivery_tag, requeue=True)
    method, _properties, body = channel.basic_get(name)
    assert body == b"1"
    connection.close()


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_a_policys_message_ttl_and_dead_letter_exchange_reach_a_queue(broker, queue_type):
    """Policy keys message-ttl, dead-letter-exchange and dead-letter-routing-key (the
    quorum queues guide, "Policy Support"; the TTL and dead letter exchanges guides
    for classic queues): a message published after the policy expires with the
    policy's TTL and is dead-lettered, with reason expired, through the policy's
    exchange and routing key."""
    name = unique("ttlpol")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(f"{name}.dead", durable=True, arguments={"x-queue-type": queue_type})
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
    ctl(broker, "set_policy", "--apply-to", f"{queue_type}_queues", f"p-{name}", f"^{name}$",
        json.dumps({"message-ttl": 200, "dead-letter-exchange": "",
                    "dead-letter-routing-key": f"{name}.dead"}))
    channel.confirm_delivery()
    channel.basic_publish("", name, b"old", pika.BasicProperties(delivery_mode=2))
    deadline = time.monotonic() + 30  # expiry runs on the leader's tick (about 1 s)
    method = None
    while method is None:
        assert time.monotonic() < deadline, "the message was not dead-lettered"
        method, properties, body = channel.basic_get(f"{name}.dead", auto_ack=True)
        time.sleep(0.05)
    assert body == b"old"
    assert properties.headers["x-death"][0]["reason"] == "expired"
    assert properties.headers["x-death"][0]["queue"] == name
    assert channel.queue_declare(name, passive=True).method.message_count == 0
    connection.close()


def test_a_policys_alternate_exchange_takes_unroutable_messages(broker):
    name = unique("routed")
    connection = connect(broker)
    channel = connection.channel()
    channel.exchange_declare(name, "direct")
    channel.exchange_declare(f"{name}.ae", "fanout")
    channel.queue_declare(f"{name}.unrouted")
    channel.queue_bind(f"{name}.unrouted", f"{name}.ae")
    ctl(broker, "set_policy", "--apply-to", "exchanges", f"ae-{name}", f"^{name}$",
        json.dumps({"alternate-exchange": f"{name}.ae"}))
    channel.basic_publish(name, "nobody-bound", b"lost?")
    assert get_bodies(channel, f"{name}.unrouted") == [b"lost?"]
    connection.close()


def test_users_vhosts_permissions_and_policies_survive_a_restart(fresh_broker):
    broker = fresh_broker
    ctl(broker, "add_user", "dave", "pw")
    ctl(broker, "set_user_tags", "dave", "administrator")
    ctl(broker, "add_vhost", "kept")
    ctl(broker, "set_permissions", "-p", "kept", "dave", "^dave-", ".*", ".*")
    ctl(broker, "set_policy", "-p", "kept", "--priority", "7", "limit", "^dave-",
        '{"max-length": 5}')
    broker.restart()
    assert ["dave", "[administrator]"] in rows(ctl(broker, "list_users"))
    assert "kept" in ctl(broker, "list_vhosts")
    assert call(broker.uri, "permissions.list", user="dave") == [
        {"user": "dave", "vhost": "kept", "configure": "^dave-", "write": ".*",
         "read": ".*"}]
    assert call(broker.uri, "policies.list", vhost="kept") == [
        {"vhost": "kept", "name": "limit", "pattern": "^dave-",
         "definition": {"max-length": 5}, "priority": 7, "apply_to": "all"}]
    connection = open_as(broker, "dave", "pw", "kept")
    channel = connection.channel()
    channel.queue_declare("dave-q")
    publish_bodies(channel, "dave-q", [b"%d" % n for n in range(9)])
    deadline = time.monotonic() + 5
    while channel.queue_declare("dave-q", passive=True).method.message_count != 5:
        assert time.monotonic() < deadline, "the policy's max-length did not apply"
        time.sleep(0.05)
    connection.close()


def test_a_policys_reject_publish_dlx_nacks_and_dead_letters_on_a_classic_queue(broker):
    """overflow reject-publish-dlx from a policy (classic queues only, so the policy
    applies to classic_queues): the publish over max-length is nacked and the message
    dead-lettered through the policy's dead-letter exchange, reason maxlen."""
    name = unique("rpdlx")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(f"{name}.dead")
    channel.queue_declare(name)
    ctl(broker, "set_policy", "--apply-to", "classic_queues", f"p-{name}", f"^{name}$",
        json.dumps({"max-length": 1, "overflow": "reject-publish-dlx",
                    "dead-letter-exchange": "", "dead-letter-routing-key": f"{name}.dead"}))
    channel.confirm_delivery()
    channel.basic_publish("", name, b"kept")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", name, b"refused")
    method, properties, body = channel.basic_get(f"{name}.dead", auto_ack=True)
    assert body == b"refused" and properties.headers["x-death"][0]["reason"] == "maxlen"
    assert channel.queue_declare(name, passive=True).method.message_count == 1
    connection.close()
