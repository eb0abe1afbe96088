"""With the metadata group's majority lost, a change that waits on it is answered in
bounded time with an error, as RabbitMQ 4 answers a Khepri operation that timed out:
541 INTERNAL_ERROR (which closes the connection) with rabbit_amqqueue's and
rabbit_channel's texts, after `metadata_store.operation_timeout`. The management RPC
(quorumqueue queues delete, ctl set_policy...) answers with the same error."""

from __future__ import annotations

import threading

import pika
import pytest

from quorumqueue.client.management import ManagementError, call
from tests.broker.cluster.test_cluster import connect, status
from tests.support.cluster import CONVERGE_TIMEOUT, LocalCluster, wait_for

pytestmark = pytest.mark.timeout(400)  # the waits inside have their own bounds

CONFIG = "metadata_store.operation_timeout = 2000\n"


def answer_within(action, seconds: float = CONVERGE_TIMEOUT):
    """What `action()` returned or raised, failing the test if it did neither within
    `seconds` (a wait that never ends is the bug this file is about)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = action()
        except Exception as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"no answer within {seconds:g}s"
    return outcome


def amqp_failure(uri: str, method) -> pika.exceptions.ConnectionClosedByBroker:
    def act():
        with connect(uri) as connection:
            method(connection.channel())

    outcome = answer_within(act)
    error = outcome.get("error")
    assert isinstance(error, pika.exceptions.ConnectionClosedByBroker), outcome
    return error


def test_changes_without_a_metadata_majority_fail_in_bounded_time():
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        one, two, three = cluster.names
        uri = cluster.uri(one)
        wait_for("every node reachable with a metadata leader", lambda: all(
            status(u)["metadata_leader"] and all(n["reachable"] for n in status(u)["nodes"])
            for u in cluster.uris()))
        with connect(uri) as connection:
            channel = connection.channel()
            channel.exchange_declare("kept-x", "direct", durable=True)
            for name in ("doomed", "doomed-rpc"):
                channel.queue_declare(name, durable=True, arguments={
                    "x-queue-type": "quorum", "x-quorum-initial-group-size": 1})

        cluster.pause(two)
        cluster.pause(three)
        try:
            closed = amqp_failure(uri, lambda ch: ch.queue_delete("doomed"))
            assert (closed.reply_code, closed.reply_text) == (
                541, "INTERNAL_ERROR - failed to delete queue 'doomed' in vhost '/' due to "
                     "a timeout")
            closed = amqp_failure(uri, lambda ch: ch.queue_declare(
                "new-q", durable=True, arguments={"x-queue-type": "quorum"}))
            assert (closed.reply_code, closed.reply_text) == (
                541, f"INTERNAL_ERROR - Could not declare quorum queue 'new-q' in vhost '/' "
                     f"on node '{one}' because the metadata store operation timed out")
            closed = amqp_failure(uri, lambda ch: ch.exchange_declare("new-x", "fanout"))
            assert (closed.reply_code, closed.reply_text) == (
                541, "INTERNAL_ERROR - failed to declare exchange 'new-x' in vhost '/' "
                     "because the operation timed out")
            closed = amqp_failure(uri, lambda ch: ch.exchange_delete("kept-x"))
            assert (closed.reply_code, closed.reply_text) == (
                541, "INTERNAL_ERROR - failed to delete exchange 'kept-x' in vhost '/' due "
                     "to a timeout")
            closed = amqp_failure(uri, lambda ch: ch.queue_bind("doomed-rpc", "kept-x", "k"))
            assert closed.reply_code == 541
            assert "due to a timeout" in closed.reply_text

            outcome = answer_within(lambda: call(uri, "queues.delete", vhost="/",
                                                 name="doomed-rpc"))
            assert isinstance(outcome.get("error"), ManagementError), outcome
            assert str(outcome["error"]).endswith(
                "INTERNAL_ERROR - failed to delete queue 'doomed-rpc' in vhost '/' due to a "
                "timeout")
            outcome = answer_within(lambda: call(
                uri, "policies.set", vhost="/", name="p", pattern="^x$",
                definition={"max-length": 1}))
            assert isinstance(outcome.get("error"), ManagementError), outcome
            assert "INTERNAL_ERROR - failed to apply 'policies.set' due to a timeout" in str(
                outcome["error"])
        finally:
            cluster.resume(two)
            cluster.resume(three)
        # with the majority back, changes are answered again
        with connect(uri) as connection:
            connection.channel().queue_declare("after", durable=True,
                                               arguments={"x-queue-type": "quorum"})
