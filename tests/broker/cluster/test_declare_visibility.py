"""A queue or exchange declared on one node is usable on every node as soon as the
declare-ok arrives, as on RabbitMQ 3.x (which replicates a declaration to every node
before answering). Here the declare-ok waits for the declaring node's apply only, so
another node may not have applied the declaration yet; a node that finds no queue or
exchange for a client's method passes a no-op through the metadata group first and
answers the 404 only if it still finds none (broker/node/ordering.py
`after_barrier`). A node that does not reach a majority of the metadata group answers
at once: no barrier could pass.

Checked: declare on node 1, then at once on node 3 a passive declare, a basic.consume,
a mandatory publish with confirms (RabbitMQ returns an unroutable mandatory message:
here it is routed again after the barrier), a publish to a new exchange, and a
queue.bind to it — many times in a loop, never a 404 or a return. And a minority
node (the other two killed) with a metadata timeout of ten minutes still answers a
passive declare of a missing queue with 404 within the test's bound. And a node
restarted while a queue was declared elsewhere routes the first publish it takes to
that queue: it opens its AMQP port once it caught up (broker/server/boot.py).
"""

from __future__ import annotations

import pika
import pytest

from tests.broker.cluster.test_cluster import connect, status
from tests.broker.cluster.test_metadata_timeout import answer_within
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(400)  # the waits inside have their own bounds

ROUNDS = 40


def every_node_reachable(cluster) -> bool:
    return all(status(u)["metadata_leader"] and all(n["reachable"] for n in status(u)["nodes"])
               for u in cluster.uris())


def test_a_declaration_on_one_node_is_found_at_once_on_another():
    with LocalCluster(3, proxied=False) as cluster:
        wait_for("every node reachable with a metadata leader",
                 lambda: every_node_reachable(cluster))
        one, _two, three = cluster.uris()
        with connect(one) as declarer, connect(three) as user:
            declaring = declarer.channel()
            using = user.channel()
            using.confirm_delivery()
            for n in range(ROUNDS):
                queue_type = "quorum" if n % 2 else "classic"
                queue = f"q{n}"
                declaring.queue_declare(queue, durable=True,
                                        arguments={"x-queue-type": queue_type})
                # a passive declare on node 3 right after the declare-ok on node 1
                assert using.queue_declare(queue, passive=True).method.message_count == 0
                declaring.queue_declare(f"{queue}-c", durable=True,
                                        arguments={"x-queue-type": queue_type})
                tag = using.basic_consume(f"{queue}-c", lambda *args: None)
                using.basic_cancel(tag)
                declaring.queue_declare(f"{queue}-m", durable=True,
                                        arguments={"x-queue-type": queue_type})
                # mandatory + confirms: pika raises UnroutableError on a basic.return
                using.basic_publish("", f"{queue}-m", b"m", pika.BasicProperties(
                    delivery_mode=2), mandatory=True)
                declaring.exchange_declare(f"x{n}", "fanout", durable=True)
                using.basic_publish(f"x{n}", "", b"x")  # 404 would close the channel
                declaring.exchange_declare(f"y{n}", "direct", durable=True)
                using.queue_bind(queue, f"y{n}", routing_key="k")
            assert using.is_open
            # the mandatory messages were routed (and delivered to their queues)
            for n in range(ROUNDS):
                assert using.queue_declare(f"q{n}-m", passive=True).method.message_count == 1


def test_a_minority_node_answers_a_missing_queue_at_once():
    config = "metadata_store.operation_timeout = 600000\n"  # a barrier would wait 10 min
    with LocalCluster(3, proxied=False, extra_config=config) as cluster:
        survivor, *gone = cluster.names
        uri = cluster.uri(survivor)
        wait_for("every node reachable with a metadata leader",
                 lambda: every_node_reachable(cluster))
        for name in gone:
            cluster.kill(name)
        wait_for("the others unreachable from " + survivor, lambda: not any(
            n["reachable"] for n in status(uri)["nodes"] if n["name"] != survivor))

        def passive_declare():
            with connect(uri) as connection:
                connection.channel().queue_declare("missing", passive=True)

        outcome = answer_within(passive_declare)
        error = outcome.get("error")
        assert isinstance(error, pika.exceptions.ChannelClosedByBroker), outcome
        assert (error.reply_code, error.reply_text) == (
            404, "NOT_FOUND - no queue 'missing' in vhost '/'")


def test_a_restarted_node_serves_once_it_knows_what_was_declared_while_it_was_down():
    """RabbitMQ 3.x starts its listeners once its tables are loaded from the running
    nodes; here a restarted node opens its AMQP port once it applied what the metadata
    group committed while it was down (broker/server/boot.py). The first publish through
    it, the moment it accepts a connection, is routed to a queue declared meanwhile: not
    confirmed and dropped as unroutable (a non-mandatory publish gets no basic.return)."""
    with LocalCluster(3, proxied=False) as cluster:
        wait_for("every node reachable with a metadata leader",
                 lambda: every_node_reachable(cluster))
        one, _two, three = cluster.names
        for round_ in range(3):
            cluster.kill(three)
            queue = f"declared-while-down-{round_}"
            with connect(cluster.uri(one)) as connection:
                connection.channel().queue_declare(queue, durable=True,
                                                   arguments={"x-queue-type": "quorum"})
            cluster.restart(three)  # returns as soon as it accepts AMQP
            with connect(cluster.uri(three)) as connection:
                channel = connection.channel()
                channel.confirm_delivery()
                channel.basic_publish("", queue, b"first", pika.BasicProperties(delivery_mode=2))

            def messages() -> int:
                with connect(cluster.uri(one)) as connection:
                    return connection.channel().queue_declare(
                        queue, passive=True).method.message_count

            wait_for(f"round {round_}: the publish confirmed through the restarted node "
                     f"in {queue}", lambda: messages() == 1)
