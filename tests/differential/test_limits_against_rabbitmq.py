"""Differential tests of vhost and user limits: RabbitMQ 3.10.8 and quorumqueue refuse
alike (reply codes, texts, class and method ids, as in test_against_rabbitmq.py).

Both brokers get the same definitions: a vhost dl-limits with max-connections 1 and
max-queues 1, where guest may do everything, and a user dl-limited (full rights in
"/") with max-connections 1 and max-channels 2. RabbitMQ gets them from
`rabbitmqctl add_vhost / set_vhost_limits / set_user_limits` against the session's
oracle node, quorumqueue from `quorumqueue ctl` with the same arguments.

RabbitMQ tracks a new connection asynchronously (a connection_created event), so a
refusal may take a moment to hold: the scenarios try again, within a bound, until
the broker refuses, and record the refusal (quorumqueue refuses at the first try).
"""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from pamqp import commands as amqp

from quorumqueue.cli.main import main
from tests.differential.probe import Probe
from tests.differential.test_permissions_against_rabbitmq import rabbitmqctl

VHOST = "dl-limits"
USER = "dl-limited"
# (rabbitmqctl arguments), the same for `quorumqueue ctl`
DEFINITIONS = (
    ("add_vhost", VHOST),
    ("set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*"),
    ("set_vhost_limits", "-p", VHOST, '{"max-connections": 1, "max-queues": 1}'),
    ("add_user", USER, USER),
    ("set_permissions", "-p", "/", USER, ".*", ".*", ".*"),
    ("set_user_limits", USER, '{"max-connections": 1, "max-channels": 2}'),
)
REFUSAL_WITHIN = 10.0  # seconds RabbitMQ may take to count a new connection


@pytest.fixture(scope="module")
def rabbitmq_limits(rabbitmq):
    for arguments in DEFINITIONS:
        rabbitmqctl(rabbitmq, *arguments)
    return rabbitmq


@pytest.fixture(scope="module")
def broker_limits(broker):
    for arguments in DEFINITIONS:
        result = CliRunner().invoke(main, ["ctl", *arguments, "--base-uri", broker.management_url])
        assert result.exit_code == 0, result.output
    return broker


def uri_of(uri: str, user: str = "guest", vhost: str = "%2F") -> str:
    base = uri.rsplit("/", 1)[0].replace("guest:guest", f"{user}:{user}"
                                         if user != "guest" else "guest:guest")
    return f"{base}/{vhost}"


def refused_connection(uri: str, label: str, transcript: list) -> None:
    """Open connections to `uri` until one is refused (closing the accepted ones);
    record the refusal."""
    deadline = time.monotonic() + REFUSAL_WITHIN
    while True:
        probe = Probe(uri, label=label, transcript=[])
        try:
            opened = probe.handshake(record_failure=False)["open"]
        finally:
            probe.close()
        if opened["method"] != "Connection.OpenOk" or time.monotonic() > deadline:
            transcript.append({"connection": label, "handshake": opened})
            return
        time.sleep(0.2)


def allowed(uri: str) -> Probe:
    """A connection to `uri` once the broker accepts it (RabbitMQ forgets a closed
    connection asynchronously too)."""
    deadline = time.monotonic() + REFUSAL_WITHIN
    while True:
        probe = Probe(uri)
        if probe.handshake(record_failure=False)["open"]["method"] == "Connection.OpenOk":
            return probe
        probe.close()
        assert time.monotonic() < deadline, f"{uri} refused connections for too long"
        time.sleep(0.2)


def vhost_connection_limit(uri: str) -> list:
    with allowed(uri_of(uri, vhost=VHOST)) as first:
        first.label = "first"
        refused_connection(uri_of(uri, vhost=VHOST), "second", first.transcript)
        first.call(1, amqp.Channel.Open())  # the first connection still works
        return first.transcript


def vhost_queue_limit(uri: str) -> list:
    with allowed(uri_of(uri, vhost=VHOST)) as c:
        c.call(1, amqp.Channel.Open())
        c.call(1, amqp.Queue.Declare(queue="dl-q1"))
        c.call(1, amqp.Queue.Declare(queue="dl-q1"))  # redeclaring is not a new queue
        c.call(1, amqp.Queue.Declare(queue="dl-q2"))
        c.call(2, amqp.Channel.Open())
        c.call(2, amqp.Queue.Delete(queue="dl-q1"))
        return c.transcript


def user_connection_limit(uri: str) -> list:
    with allowed(uri_of(uri, user=USER)) as first:
        first.label = "first"
        refused_connection(uri_of(uri, user=USER), "second", first.transcript)
        return first.transcript


def user_channel_limit(uri: str) -> list:
    with allowed(uri_of(uri, user=USER)) as c:
        for number in (1, 2, 3):
            c.call(number, amqp.Channel.Open())
        return c.transcript


SCENARIOS = {f.__name__: f for f in (vhost_connection_limit, vhost_queue_limit,
                                      user_connection_limit, user_channel_limit)}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_limits_refuse_like_rabbitmq(name, rabbitmq_limits, broker_limits):
    observe = SCENARIOS[name]
    expected = observe(rabbitmq_limits.uri)
    actual = observe(broker_limits.uri)
    assert actual == expected
    assert any("Close" in str(entry) for entry in expected), expected  # a refusal was seen
