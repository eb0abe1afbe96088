"""Policies against RabbitMQ 3.10.8: which of a policy's keys apply to what, and how a
key set both by a policy and by an argument merges (issue 32, item 7). The same
policies (rabbitmqctl set_policy on RabbitMQ, quorumqueue ctl set_policy here) and
the same client steps (pika) on both brokers; what the client then sees must agree.

RabbitMQ 3.10.8's merge rules (rabbit_amqqueue_process:process_args_policy for
classic queues, rabbit_quorum_queue's args_policy_lookup calls, rabbit_exchange's
alternate exchange): an exchange's alternate-exchange argument wins over its policy's;
a classic queue takes the lower of argument and policy for expires, message-ttl,
max-length and max-length-bytes, and the argument for the dead-letter keys and
overflow; a quorum queue takes the lower for message-ttl, max-length,
max-length-bytes and delivery-limit, the policy's expires and overflow, and the
argument's dead-letter keys. quorumqueue's quorum queues take the lower expires, as
RabbitMQ 4.x's do (a deliberate difference, docs/behaviour/differences.md).
"""

from __future__ import annotations

import time

import pika
import pytest

from tests.differential.test_definitions_against_rabbitmq import (qqctl, rabbitmq_node,  # noqa: F401
                                                                   rabbitmqctl, vhost_uri)
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.timeout(300)


def both(rabbitmq_node, run) -> tuple:  # noqa: F811
    theirs = run(vhost_uri(rabbitmq_node.port, "guest", "guest", "%2F"),
                 lambda *a: rabbitmqctl(rabbitmq_node, *a))
    with BrokerProcess() as broker:
        ours = run(vhost_uri(broker.port, "guest", "guest", "%2F"),
                   lambda *a: qqctl(broker, *a))
    return theirs, ours


def count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def test_an_alternate_exchange_policy_applies_to_exchanges(rabbitmq_node):  # noqa: F811
    """A policy applying to exchanges with alternate-exchange gives an exchange its
    alternate exchange (unroutable messages go there); an exchange's own argument
    wins over it (rabbit_policy:get_arg); an exchange the policy does not match has
    none. An alternate-exchange in a policy for queues only is accepted (RabbitMQ
    validates a policy's keys, not its apply-to) and acts on nothing: neither on the
    exchange its pattern matches nor on the queue."""
    def run(uri: str, ctl) -> dict:
        ctl("set_policy", "--apply-to", "exchanges", "pol-ae", "^pol-ae-",
            '{"alternate-exchange": "pol-alt"}')
        ctl("set_policy", "--apply-to", "queues", "pol-qae", "^pol-qae-",
            '{"alternate-exchange": "pol-alt"}')
        connection = pika.BlockingConnection(pika.URLParameters(uri))
        channel = connection.channel()
        for exchange, queue in (("pol-alt", "pol-alt-q"), ("pol-alt2", "pol-alt2-q")):
            channel.exchange_declare(exchange, "fanout")
            channel.queue_declare(queue)
            channel.queue_bind(queue, exchange)
        channel.exchange_declare("pol-ae-x", "direct")
        channel.exchange_declare("pol-ae-arg", "direct",
                                 arguments={"alternate-exchange": "pol-alt2"})
        channel.exchange_declare("pol-qae-x", "direct")
        channel.queue_declare("pol-qae-q")
        channel.confirm_delivery()
        for exchange in ("pol-ae-x", "pol-ae-x", "pol-ae-arg", "pol-qae-x"):
            channel.basic_publish(exchange, "nowhere", b"unroutable")
        channel.basic_publish("", "pol-qae-q", b"routed")
        counts = {queue: count(channel, queue)
                  for queue in ("pol-alt-q", "pol-alt2-q", "pol-qae-q")}
        connection.close()
        return counts

    theirs, ours = both(rabbitmq_node, run)
    assert ours == theirs == {"pol-alt-q": 2, "pol-alt2-q": 1, "pol-qae-q": 1}


def test_policy_and_argument_limits_merge_as_rabbitmq_merges_them(rabbitmq_node):  # noqa: F811
    """max-length and message-ttl: the lower of policy and argument, on classic and
    quorum queues; overflow: the argument's on a classic queue, the policy's on a
    quorum queue. Each queue: (publishes refused, messages left)."""
    def run(uri: str, ctl) -> dict:
        ctl("set_policy", "--apply-to", "queues", "pol-lim", "^pol-lim-",
            '{"max-length": 3, "overflow": "reject-publish"}')
        ctl("set_policy", "--apply-to", "queues", "pol-ttl", "^pol-ttl-",
            '{"message-ttl": 600000}')
        connection = pika.BlockingConnection(pika.URLParameters(uri))
        channel = connection.channel()
        channel.confirm_delivery()
        seen = {}
        for kind in ("classic", "quorum"):
            for name, arguments in ((f"pol-lim-{kind}-argument-lower",
                                     {"x-max-length": 2, "x-overflow": "drop-head"}),
                                    (f"pol-lim-{kind}-policy-lower",
                                     {"x-max-length": 5, "x-overflow": "drop-head"}),
                                    (f"pol-ttl-{kind}", {"x-message-ttl": 1})):
                channel.queue_declare(name, durable=True,
                                      arguments={"x-queue-type": kind, **arguments})
                refused = 0
                for n in range(6):
                    try:
                        channel.basic_publish("", name, b"%d" % n,
                                              pika.BasicProperties(delivery_mode=2))
                    except pika.exceptions.NackError:
                        refused += 1
                seen[name] = refused
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                count(channel, f"pol-ttl-{kind}") for kind in ("classic", "quorum")):
            time.sleep(0.2)  # the 1 ms TTL (the lower) expires them; a bound, not a wait
        for kind in ("classic", "quorum"):
            for name in (f"pol-lim-{kind}-argument-lower", f"pol-lim-{kind}-policy-lower",
                         f"pol-ttl-{kind}"):
                seen[name] = (seen[name], count(channel, name))
        connection.close()
        return seen

    theirs, ours = both(rabbitmq_node, run)
    assert ours == theirs


def test_queue_expires_from_policy_and_argument(rabbitmq_node):  # noqa: F811
    """expires set by both: a classic queue takes the lower. A quorum queue of
    RabbitMQ 3.10.8 takes the policy's; quorumqueue's the lower, as RabbitMQ 4.x's
    rabbit_quorum_queue does (args_policy_lookup with min): a deliberate difference
    (docs/behaviour/differences.md). Which queues are gone once the short-lived ones
    have gone (bounded wait)."""
    def run(uri: str, ctl) -> dict:
        ctl("set_policy", "--apply-to", "queues", "pol-exp-short", "^pol-exp-short-",
            '{"expires": 1000}')
        ctl("set_policy", "--apply-to", "queues", "pol-exp-long", "^pol-exp-long-",
            '{"expires": 600000}')
        connection = pika.BlockingConnection(pika.URLParameters(uri))
        channel = connection.channel()
        names = []
        for kind in ("classic", "quorum"):
            for name, expires in ((f"pol-exp-short-{kind}", 600000),
                                  (f"pol-exp-long-{kind}", 1000)):
                channel.queue_declare(name, durable=True,
                                      arguments={"x-queue-type": kind, "x-expires": expires})
                names.append(name)
        connection.close()

        def present() -> set:
            # listing renews no lease; a passive declare renews a classic queue's
            # (RabbitMQ's too), so probing by declaring kept it alive for the whole wait
            return set(ctl("list_queues", "name").split()) & set(names)

        # three expire after 1 s whichever rule applies; wait for them, generously
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and present() & {
                "pol-exp-short-classic", "pol-exp-short-quorum", "pol-exp-long-classic"}:
            time.sleep(0.5)
        time.sleep(3)  # the fourth's 1 s argument, had it won, has had three times over
        return {name: name in present() for name in names}

    theirs, ours = both(rabbitmq_node, run)
    gone_with_the_lower = {"pol-exp-short-classic": False, "pol-exp-long-classic": False,
                           "pol-exp-short-quorum": False}
    assert theirs == {**gone_with_the_lower, "pol-exp-long-quorum": True}  # its policy
    assert ours == {**gone_with_the_lower, "pol-exp-long-quorum": False}   # the lower
