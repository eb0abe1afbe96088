"""At-least-once dead lettering on a running broker (the quorum queues guide, "Dead
Lettering": "Activating at-least-once dead-lettering", its Limitations and Caveats).

A source quorum queue with `x-dead-letter-strategy: at-least-once`, `x-overflow:
reject-publish` and a dead-letter exchange keeps each dead-lettered message until the
target queue confirmed it; the queue reports what it holds (`messages_dlx`,
`message_bytes_dlx`, as RabbitMQ's queue stats). A target that does not exist yet
keeps the messages in the source queue (the guide's caveat "The messages cannot be
routed to any queue"), and the dead-letter worker's retries deliver them once it does.
The broker retries every second here (`dead_letter_worker_publisher_confirm_timeout`,
RabbitMQ's 180 s by default; RabbitMQ's own tests of the worker use 1 s as well).
"""

from __future__ import annotations

import json

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from quorumqueue.client.management import call
from tests.broker.server.pika_support import connect, unique
from tests.support.broker import BrokerProcess
from tests.support.cluster import wait_for

pytestmark = pytest.mark.timeout(180)

BOUND = 60.0  # seconds: the machine is shared; retries run on the one-second tick


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(extra_config="dead_letter_worker_publisher_confirm_timeout = 1000\n") \
            as process:
        yield process


def at_least_once(target: str, **more) -> dict:
    return {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish", "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": target, **more}


def row(broker, name: str) -> dict:
    return next(q for q in call(broker.uri, "queues.list", vhost="/") if q["name"] == name)


def reject_all(channel, queue: str, count: int) -> None:
    """Take `count` messages from `queue` and nack each without requeue."""
    for _ in range(count):
        method, _properties, _body = wait_for(
            f"a message in {queue}", lambda: (got := channel.basic_get(queue))[0] and got,
            timeout=BOUND)
        channel.basic_nack(method.delivery_tag, requeue=False)


def drain(channel, queue: str) -> list[tuple[bytes, dict]]:
    got = []
    while (message := channel.basic_get(queue, auto_ack=True))[0] is not None:
        got.append((message[2], message[1].headers))
    return got


def test_a_nack_without_requeue_reaches_a_quorum_target_with_x_death(broker):
    source, target = unique("alo-src"), unique("alo-dst")
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(target, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_declare(source, durable=True, arguments=at_least_once(target))
        channel.confirm_delivery()
        for number in range(5):
            channel.basic_publish("", source, b"m%d" % number,
                                  pika.BasicProperties(delivery_mode=2))
        reject_all(channel, source, 5)
        wait_for("5 dead letters in the target, none held in the source", lambda: (
            row(broker, target)["ready"] == 5 and row(broker, source)["messages_dlx"] == 0
            and row(broker, source)["ready"] == 0), timeout=BOUND)
        messages = drain(channel, target)
    assert sorted(body for body, _headers in messages) == [b"m%d" % n for n in range(5)]
    for _body, headers in messages:
        death = headers["x-death"][0]
        assert (death["reason"], death["queue"], death["count"]) == (
            "rejected", source, 1)
        assert headers["x-first-death-reason"] == "rejected"
        assert headers["x-last-death-queue"] == source


def test_a_missing_target_keeps_the_dead_letters_until_it_is_declared(broker):
    source, target = unique("alo-src"), unique("alo-late")
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(source, durable=True, arguments=at_least_once(target))
        channel.confirm_delivery()
        for number in range(3):
            channel.basic_publish("", source, b"late-%d" % number,
                                  pika.BasicProperties(delivery_mode=2))
        reject_all(channel, source, 3)
        # no queue to route to: the source keeps them, and says so
        stats = wait_for("3 dead letters held by the source", lambda: (
            (r := row(broker, source))["messages_dlx"] == 3 and r), timeout=BOUND)
        assert stats["ready"] == 0 and stats["message_bytes_dlx"] == 3 * len(b"late-0")
        assert stats["bytes"] == stats["message_bytes_dlx"]  # message_bytes includes them
        channel.queue_declare(target, durable=True, arguments={"x-queue-type": "quorum"})
        wait_for("the held dead letters delivered once the target exists", lambda: (
            row(broker, target)["ready"] >= 3 and row(broker, source)["messages_dlx"] == 0),
            timeout=BOUND)
        bodies = {body for body, _headers in drain(channel, target)}
    assert bodies == {b"late-0", b"late-1", b"late-2"}


def test_held_dead_letters_count_towards_the_length_limit(broker):
    """The guide's caveat: held dead letters "contribute to the queue resource limits,
    such as max length limits so that the queue can refuse to accept more messages
    until some have been removed"."""
    source, target = unique("alo-src"), unique("alo-absent")
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(source, durable=True,
                              arguments=at_least_once(target, **{"x-max-length": 2}))
        channel.confirm_delivery()
        for number in range(2):
            channel.basic_publish("", source, b"%d" % number)
        reject_all(channel, source, 2)
        wait_for("2 held dead letters", lambda: row(broker, source)["messages_dlx"] == 2,
                 timeout=BOUND)
        channel.basic_publish("", source, b"2")  # 3 > 2: accepted (the overshoot of one)
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", source, b"3")


def test_with_drop_head_at_least_once_falls_back_to_at_most_once(broker):
    """The guide's Limitations: "if drop-head is configured the dead-lettering will fall
    back to at-most-once": with no route, the dead letter is gone, not held."""
    source = unique("alo-drophead")
    with connect(broker) as connection:
        channel = connection.channel()
        arguments = at_least_once(unique("alo-nowhere"))
        del arguments["x-overflow"]  # drop-head, the default
        channel.queue_declare(source, durable=True, arguments=arguments)
        channel.confirm_delivery()
        channel.basic_publish("", source, b"x")
        reject_all(channel, source, 1)
        stats = wait_for("the rejection applied", lambda: (
            (r := row(broker, source))["ready"] == 0 and r["unacked"] == 0 and r),
            timeout=BOUND)
    assert stats["messages_dlx"] == 0 and stats["bytes"] == 0


def ctl(broker, *args: str) -> None:
    result = CliRunner().invoke(main, ["ctl", *args, "--base-uri", broker.management_url])
    assert result.exit_code == 0, result.output


def test_a_policy_turns_at_least_once_on_and_off(broker):
    """Policy keys dead-letter-strategy, overflow and dead-letter-exchange (the guide:
    "apply all of the following policies (or the equivalent queue arguments)"); a
    switch back to at-most-once deletes the held dead letters ("any dead-lettered
    messages that have not yet been confirmed by all target queues will be deleted")."""
    source = unique("alo-policy")
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(source, durable=True, arguments={"x-queue-type": "quorum"})
        ctl(broker, "set_policy", "--apply-to", "quorum_queues", f"p-{source}", f"^{source}$",
            json.dumps({"dead-letter-strategy": "at-least-once", "overflow": "reject-publish",
                        "dead-letter-exchange": "", "dead-letter-routing-key": "absent"}))
        channel.confirm_delivery()
        channel.basic_publish("", source, b"held")
        reject_all(channel, source, 1)
        wait_for("the dead letter held (no route)",
                 lambda: row(broker, source)["messages_dlx"] == 1, timeout=BOUND)
        ctl(broker, "set_policy", "--apply-to", "quorum_queues", f"p-{source}", f"^{source}$",
            json.dumps({"dead-letter-exchange": "", "dead-letter-routing-key": "absent"}))
        wait_for("the held dead letter deleted", lambda: (
            (r := row(broker, source))["messages_dlx"] == 0 and r["bytes"] == 0),
            timeout=BOUND)


def test_held_dead_letters_survive_a_kill_and_reach_a_target_declared_after_it():
    """Held dead letters are replicated state (the log and snapshots): after kill -9
    and a restart, the new run's worker takes them over and delivers them."""
    with BrokerProcess(extra_config="dead_letter_worker_publisher_confirm_timeout = 1000\n") \
            as process:
        source, target = unique("alo-src"), unique("alo-after")
        with connect(process) as connection:
            channel = connection.channel()
            channel.queue_declare(source, durable=True, arguments=at_least_once(target))
            channel.confirm_delivery()
            for number in range(4):
                channel.basic_publish("", source, b"kept-%d" % number,
                                      pika.BasicProperties(delivery_mode=2))
            reject_all(channel, source, 4)
            wait_for("4 held dead letters", lambda: row(process, source)["messages_dlx"] == 4,
                     timeout=BOUND)
        process.restart(kill=True)
        assert wait_for("the held dead letters after the restart", lambda: (
            row(process, source)["messages_dlx"] == 4), timeout=BOUND)
        with connect(process) as connection:
            channel = connection.channel()
            channel.queue_declare(target, durable=True, arguments={"x-queue-type": "quorum"})
            wait_for("the dead letters in the target", lambda: (
                row(process, target)["ready"] >= 4 and row(process, source)["messages_dlx"] == 0),
                timeout=BOUND)
            bodies = {body for body, _headers in drain(channel, target)}
    assert bodies == {b"kept-%d" % n for n in range(4)}


def test_a_classic_target_confirms_after_its_message_store_sync(broker):
    """A durable classic target confirms a persistent dead letter once its message
    store has it on disk; a transient one at once. Either way the source lets go."""
    source, target = unique("alo-src"), unique("alo-classic")
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(target, durable=True)
        channel.queue_declare(source, durable=True, arguments=at_least_once(target))
        channel.confirm_delivery()
        channel.basic_publish("", source, b"persistent", pika.BasicProperties(delivery_mode=2))
        channel.basic_publish("", source, b"transient", pika.BasicProperties(delivery_mode=1))
        reject_all(channel, source, 2)
        wait_for("both in the classic target, none held", lambda: (
            row(broker, target)["ready"] == 2 and row(broker, source)["messages_dlx"] == 0),
            timeout=BOUND)
        got = {body: headers["x-death"][0]["reason"] for body, headers in drain(channel, target)}
    assert got == {b"persistent": "rejected", b"transient": "rejected"}
