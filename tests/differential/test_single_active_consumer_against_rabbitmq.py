"""Single active consumer on quorum queues: RabbitMQ 3.10.8 and quorumqueue alike.

RabbitMQ supports x-single-active-consumer on quorum queues since 3.8: one consumer
at a time gets messages, the others wait and take over in registration order when
it cancels or its channel goes away (the consumers guide, "Single Active
Consumer"). Each scenario runs on both brokers through the raw probe client
(tests/differential/probe.py) and the transcripts — replies, reply texts,
deliveries with their consumer tags, redelivered flags and bodies — must be equal.
Where a scenario asks which consumer is active, RabbitMQ answers through
`rabbitmqctl list_consumers` (its `active` column) and quorumqueue through
`queues.list` (`single_active_consumer_tag`).

Not here, because 3.10.8 predates it: single active consumer with consumer
priorities (RabbitMQ 4.x, "Single Active Consumer and Consumer Priorities": a
higher-priority consumer takes over once the active one has no unacked messages).
3.10.8 ignores x-priority for the choice; quorumqueue follows 4.x, tested in
tests/broker/fifo (scripts/single_active_consumer_priorities.txt) and
tests/broker/server/test_quorum_single_active.py.

Masked: 3.10.8 adds `x-delivery-count: 0` to a quorum queue's first delivery; 4.x
(and quorumqueue) only to redeliveries (as in test_against_rabbitmq.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable

import pytest
from pamqp import commands as amqp

from quorumqueue.client.management import call as management_call
from tests.differential.probe import Probe
from tests.support.rabbitmq import MARKER_VARIABLE, RabbitMQNode

pytestmark = pytest.mark.timeout(180)

RABBITMQCTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
SAC = {"x-queue-type": "quorum", "x-single-active-consumer": True}
WAIT_S = 30.0  # how long a probe waits for an answer or a delivery (a bound, not a pace)

ActiveTag = Callable[[str], "str | None"]
SCENARIOS: dict[str, Callable[[Probe, ActiveTag], None]] = {}


def scenario(function):
    SCENARIOS[function.__name__] = function
    return function


def rabbitmq_active_tag(node: RabbitMQNode) -> ActiveTag:
    """The tag of the active consumer of a queue, as `rabbitmqctl list_consumers`
    shows it (run against the oracle node as test_permissions_against_rabbitmq does)."""
    base = node.base_dir
    environment = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "TMPDIR")
                   if name in os.environ}
    environment.update(HOME=str(base / "home"), ERL_EPMD_PORT=str(node.epmd_port),
                       ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_USE_LONGNAME="false",
                       RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"))
    environment[MARKER_VARIABLE] = node.node_name

    def active(queue: str) -> str | None:
        result = subprocess.run(
            [str(RABBITMQCTL), "-n", node.node_name, "list_consumers", "-q", "--formatter",
             "json", "queue_name", "consumer_tag", "active"],
            env=environment, check=True, capture_output=True, timeout=60)
        rows = [row for row in json.loads(result.stdout)
                if row["queue_name"] == queue and row["active"]]
        assert len(rows) <= 1, rows
        return rows[0]["consumer_tag"] if rows else None

    return active


def quorumqueue_active_tag(uri: str) -> ActiveTag:
    def active(queue: str) -> str | None:
        [row] = [r for r in management_call(uri, "queues.list", vhost="/")
                 if r["name"] == queue]
        return row["single_active_consumer_tag"]

    return active


def open_channel(c: Probe, number: int) -> None:
    c.call(number, amqp.Channel.Open())


def declare(c: Probe, queue: str, arguments=SAC, number: int = 1) -> dict:
    return c.call(number, amqp.Queue.Declare(queue=queue, durable=True, arguments=arguments))


def fill(c: Probe, queue: str, bodies) -> None:
    """Publish `bodies` to `queue` and wait for their confirms (channel 9)."""
    open_channel(c, 9)
    c.call(9, amqp.Confirm.Select())
    for body in bodies:
        c.publish(9, "", queue, body)
    c.collect(len(bodies))
    c.call(9, amqp.Channel.Close(200, "filled", 0, 0))


def consume(c: Probe, number: int, queue: str, tag: str, prefetch: int = 0,
            **options) -> None:
    open_channel(c, number)
    if prefetch:
        c.call(number, amqp.Basic.Qos(prefetch_count=prefetch))
    c.call(number, amqp.Basic.Consume(queue=queue, consumer_tag=tag, **options))


def check_active(c: Probe, active: ActiveTag, queue: str) -> None:
    c.record({"active consumer": active(queue)})


@scenario
def handover_on_cancel(c: Probe, active: ActiveTag) -> None:
    """The first consumer gets everything; acked and cancelled, the second takes over."""
    queue = "dt-sac-cancel"
    declare(c, queue)
    fill(c, queue, ["m1", "m2", "m3"])
    consume(c, 2, queue, "dt-sac-a")
    consume(c, 3, queue, "dt-sac-b")
    c.collect(3)
    check_active(c, active, queue)
    c.send(2, amqp.Basic.Ack(delivery_tag=3, multiple=True))
    c.call(2, amqp.Basic.Cancel(consumer_tag="dt-sac-a"))
    c.publish(1, "", queue, "m4")
    c.publish(1, "", queue, "m5")
    c.collect(2)
    check_active(c, active, queue)
    c.call(1, amqp.Queue.Declare(queue=queue, passive=True))


@scenario
def handover_on_channel_close_without_cancel(c: Probe, active: ActiveTag) -> None:
    """The active consumer's channel closes (no basic.cancel) holding two unacked
    messages: the next consumer gets them back first (redelivered), then the third."""
    queue = "dt-sac-close"
    declare(c, queue)
    fill(c, queue, ["m1", "m2", "m3"])
    consume(c, 2, queue, "dt-sac-a", prefetch=2)
    c.collect(2)
    consume(c, 3, queue, "dt-sac-b", prefetch=10)
    c.call(2, amqp.Channel.Close(200, "bye", 0, 0))
    c.collect(3)
    check_active(c, active, queue)


@scenario
def handover_on_cancel_with_unacked_messages(c: Probe, active: ActiveTag) -> None:
    """Cancelled with two unacked messages, the first consumer keeps them (they can
    still be acked or rejected); the second takes over at once with the third; the
    first's channel then closes and its two come back to the second."""
    queue = "dt-sac-unacked"
    declare(c, queue)
    fill(c, queue, ["m1", "m2", "m3"])
    consume(c, 2, queue, "dt-sac-a", prefetch=2)
    c.collect(2)
    consume(c, 3, queue, "dt-sac-b", prefetch=10)
    c.call(2, amqp.Basic.Cancel(consumer_tag="dt-sac-a"))
    c.collect(1)
    check_active(c, active, queue)
    c.call(2, amqp.Channel.Close(200, "bye", 0, 0))
    c.collect(2)


@scenario
def waiting_consumers_take_over_in_registration_order(c: Probe, active: ActiveTag) -> None:
    """Three consumers (the exclusive flag accepted and not enforced on a quorum
    queue), all three in declare-ok's consumer count; the active one cancels, then
    the next: each time the longest waiting one takes over."""
    queue = "dt-sac-order"
    declare(c, queue)
    consume(c, 2, queue, "dt-sac-a")
    consume(c, 3, queue, "dt-sac-b", exclusive=True)
    consume(c, 4, queue, "dt-sac-c")
    check_active(c, active, queue)
    c.call(1, amqp.Queue.Declare(queue=queue, passive=True))  # waiting consumers count
    for number, tag in ((2, "dt-sac-a"), (3, "dt-sac-b")):
        c.call(number, amqp.Basic.Cancel(consumer_tag=tag))
        c.publish(1, "", queue, f"after {tag}")
        c.collect(1)
        check_active(c, active, queue)


@scenario
def redeclare_equivalence(c: Probe, active: ActiveTag) -> None:
    """x-single-active-consumer is compared on a redeclare (rabbit_amqqueue's
    declare_args): left out, false instead of true, or added to a queue without it."""
    declare(c, "dt-sac-equiv")
    declare(c, "dt-sac-equiv")
    for arguments in ({"x-queue-type": "quorum"},
                      {"x-queue-type": "quorum", "x-single-active-consumer": False}):
        declare(c, "dt-sac-equiv", arguments)
        open_channel(c, 1)
    declare(c, "dt-sac-plain", {"x-queue-type": "quorum"})
    declare(c, "dt-sac-plain", SAC)


def _masked(transcript: list) -> list:
    """3.10.8's `x-delivery-count: 0` on first deliveries left out (module header)."""
    for entry in transcript:
        for event in entry.get("events", []):
            headers = event.get("properties", {}).get("headers")
            if headers and headers.get("x-delivery-count") == 0:
                del headers["x-delivery-count"]
                if not headers:
                    del event["properties"]["headers"]
            if event.get("properties") == {}:
                del event["properties"]
    return transcript


def _run(uri: str, function, active: ActiveTag) -> list:
    with Probe.open(uri, timeout=WAIT_S) as probe:
        open_channel(probe, 1)  # declares and publishes; consumers on channels 2 and up
        function(probe, active)
        return _masked(probe.transcript)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_single_active_consumer_answers_like_rabbitmq(name, rabbitmq, broker):
    function = SCENARIOS[name]
    expected = _run(rabbitmq.uri, function, rabbitmq_active_tag(rabbitmq))
    actual = _run(broker.uri, function, quorumqueue_active_tag(broker.uri))
    assert actual == expected
