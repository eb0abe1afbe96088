"""Virtual host and user limits on a running node, set as with rabbitmqctl
(`quorumqueue ctl set_vhost_limits`, `set_user_limits`...): what a pika client then
sees (RabbitMQ's reply codes and texts: the vhosts guide's "Limits" and the user
limits guide), and that the limits are definitions that survive a restart."""

from __future__ import annotations

import json

import pytest
from pika import exceptions as pe

from .pika_support import unique
from .test_definitions import ctl, ctl_error, open_as, rows

pytestmark = pytest.mark.timeout(120)


def vhost_with_guest(broker) -> str:
    vhost = unique("lim")
    ctl(broker, "add_vhost", vhost)
    ctl(broker, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    return vhost


def test_vhost_max_connections_refuses_connection_open_with_530(broker):
    """rabbit_reader is_over_vhost_connection_limit: at connection.open, 530
    NOT_ALLOWED; a closed connection no longer counts; 0 allows none."""
    vhost = vhost_with_guest(broker)
    out = ctl(broker, "set_vhost_limits", "-p", vhost, '{"max-connections": 2}')
    assert f'Setting vhost limits to "{{"max-connections": 2}}" for vhost "{vhost}"' in out
    assert json.loads(ctl(broker, "list_vhost_limits", "-p", vhost)) == {"max-connections": 2}
    first, second = open_as(broker, "guest", "guest", vhost), open_as(broker, "guest", "guest",
                                                                      vhost)
    with pytest.raises(pe.ProbableAccessDeniedError) as refused:
        open_as(broker, "guest", "guest", vhost)
    assert (f"(530) \"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': "
            "connection limit (2) is reached") in str(refused.value)
    first.close()
    third = open_as(broker, "guest", "guest", vhost)  # the closed one is not counted
    third.close()
    second.close()
    open_as(broker, "guest", "guest").close()  # other vhosts are not limited
    ctl(broker, "set_vhost_limits", "-p", vhost, '{"max-connections": 0}')
    with pytest.raises(pe.ProbableAccessDeniedError) as refused:
        open_as(broker, "guest", "guest", vhost)
    assert "connection limit (0) is reached" in str(refused.value)
    assert f'Clearing vhost "{vhost}" limits' in ctl(broker, "clear_vhost_limits", "-p", vhost)
    assert ctl(broker, "list_vhost_limits", "-p", vhost).strip() == ""
    open_as(broker, "guest", "guest", vhost).close()


def test_vhost_max_queues_refuses_a_new_queue_with_406(broker):
    """rabbit_queue_type check_vhost_queue_limit: a new queue past max-queues is 406
    PRECONDITION_FAILED; existing queues may be redeclared; a negative limit is none;
    set_vhost_limits replaces the whole definition."""
    vhost = vhost_with_guest(broker)
    ctl(broker, "set_vhost_limits", "-p", vhost, '{"max-queues": 2, "max-connections": 5}')
    ctl(broker, "set_vhost_limits", "-p", vhost, '{"max-queues": 2}')
    assert json.loads(ctl(broker, "list_vhost_limits", "-p", vhost)) == {"max-queues": 2}
    connection = open_as(broker, "guest", "guest", vhost)
    try:
        channel = connection.channel()
        channel.queue_declare("q1", durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_declare("", exclusive=True)  # every queue counts, as in RabbitMQ
        channel.queue_declare("q1", durable=True, arguments={"x-queue-type": "quorum"})
        with pytest.raises(pe.ChannelClosedByBroker) as refused:
            channel.queue_declare("q3")
        assert (refused.value.reply_code, refused.value.reply_text) == (
            406, f"PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost "
                 f"'{vhost}' (2) is reached")
        ctl(broker, "set_vhost_limits", "-p", vhost, '{"max-queues": -1}')
        connection.channel().queue_declare("q3")
    finally:
        connection.close()
    assert [vhost, '{"max-queues":-1}'] in rows(ctl(broker, "list_vhost_limits", "--global"))


def test_user_limits_refuse_connections_and_channels_with_530(broker):
    """The user limits guide: max-connections refused at connection.open, max-channels
    (all the user's connections together) at channel.open, both 530 NOT_ALLOWED closing
    the connection; set_user_limits merges, clear_user_limits removes one or all."""
    user = unique("limited")
    ctl(broker, "add_user", user, "pw")
    ctl(broker, "set_permissions", user, ".*", ".*", ".*")
    ctl(broker, "set_user_limits", user, '{"max-connections": 2}')
    out = ctl(broker, "set_user_limits", user, '{"max-channels": 3}')
    assert f'Setting user limits to "{{"max-channels": 3}}" for user "{user}"' in out
    assert json.loads(ctl(broker, "list_user_limits", "--user", user)) == {
        "max-connections": 2, "max-channels": 3}
    first, second = open_as(broker, user, "pw"), open_as(broker, user, "pw")
    with pytest.raises(pe.ProbableAccessDeniedError) as refused:
        open_as(broker, user, "pw")
    assert (f"(530) \"NOT_ALLOWED - connection refused for user '{user}': user connection "
            "limit (2) is reached") in str(refused.value)
    first.channel(), first.channel(), second.channel()
    with pytest.raises(pe.ConnectionClosedByBroker) as closed:
        second.channel()
    assert (closed.value.reply_code, closed.value.reply_text) == (
        530, f"NOT_ALLOWED - number of channels opened for user '{user}' has reached the "
             "maximum allowed user limit of (3)")
    # second's channel went with it: first may open one more
    first.channel()
    first.close()
    assert [user, '{"max-channels":3,"max-connections":2}'] in rows(
        ctl(broker, "list_user_limits", "--all"))
    assert f'Clearing "max-channels" limit for user "{user}"' in ctl(
        broker, "clear_user_limits", user, "max-channels")
    assert json.loads(ctl(broker, "list_user_limits", "--user", user)) == {
        "max-connections": 2}
    ctl(broker, "clear_user_limits", user, "all")
    assert ctl(broker, "list_user_limits", "--user", user).strip() == ""
    connections = [open_as(broker, user, "pw") for _ in range(3)]
    for connection in connections:
        connection.close()


@pytest.mark.parametrize("command, definition, text", [
    ("set_vhost_limits", '{"max-conections": 1}',
     'Unrecognised terms [{<<"max-conections">>,1}] in limits'),
    ("set_vhost_limits", '{"max-queues": "ten"}',
     'max-queues should be a number, actually was <<"ten">>'),
    ("set_user_limits", '{"max-queues": 1}',
     'Unrecognised terms [{<<"max-queues">>,1}] in user-limits'),
    ("set_user_limits", '{"max-channels": 1.5}',
     "max-channels should be a number, actually was 1.5"),
])
def test_invalid_limits_are_refused_naming_the_term(broker, command, definition, text):
    """rabbit_parameter_validation's proplist and integer checks, and their texts."""
    target = ["-p", "/"] if command == "set_vhost_limits" else ["guest"]
    assert text in ctl_error(broker, command, *target, definition)


def test_limits_survive_a_restart(fresh_broker):
    """Limits are definitions: kept in the metadata, as after rabbitmqctl."""
    broker = fresh_broker
    vhost = vhost_with_guest(broker)
    ctl(broker, "set_vhost_limits", "-p", vhost, '{"max-connections": 1, "max-queues": 5}')
    ctl(broker, "set_user_limits", "guest", '{"max-channels": 4}')
    ctl(broker, "change_password", "guest", "guest")  # keeps the user's limits
    broker.restart()
    assert json.loads(ctl(broker, "list_vhost_limits", "-p", vhost)) == {
        "max-connections": 1, "max-queues": 5}
    assert json.loads(ctl(broker, "list_user_limits", "--user", "guest")) == {
        "max-channels": 4}
    connection = open_as(broker, "guest", "guest", vhost)
    try:
        with pytest.raises(pe.ProbableAccessDeniedError):
            open_as(broker, "guest", "guest", vhost)
    finally:
        connection.close()


def test_limits_need_an_administrator(broker):
    user = unique("plain")
    ctl(broker, "add_user", user, "pw")
    ctl(broker, "set_permissions", user, ".*", ".*", ".*")
    from quorumqueue.client.management import ManagementError, call

    uri = f"amqp://{user}:pw@127.0.0.1:{broker.port}/%2F"
    for op, arguments in (("vhosts.set_limits", {"vhost": "/", "limits": {"max-queues": 1}}),
                          ("users.set_limits", {"name": user, "limits": {"max-channels": 1}})):
        with pytest.raises(ManagementError, match="ACCESS_REFUSED"):
            call(uri, op, **arguments)
