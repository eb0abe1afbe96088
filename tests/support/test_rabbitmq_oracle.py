"""The RabbitMQ oracle node: it speaks AMQP, and it leaves nothing behind.

Real processes and sockets (loopback only); skipped when RabbitMQ is absent.
"""

import socket
import subprocess

import pika
import pytest

from tests.support.rabbitmq import RabbitMQNode, RabbitMQNodeError, processes_with_marker

needs_rabbitmq = pytest.mark.skipif(not RabbitMQNode.available(), reason=RabbitMQNode.skip_reason)


def pgrep(pattern: str) -> str:
    return subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout


def test_publish_with_confirms_then_get_it_back(rabbitmq: RabbitMQNode) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq.uri))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare(queue="", exclusive=True).method.queue
        # Raises (UnroutableError / NackError) unless the broker confirms it.
        channel.basic_publish(
            exchange="",
            routing_key=queue,
            body=b"oracle says hello",
            properties=pika.BasicProperties(delivery_mode=2, message_id="m-1"),
            mandatory=True,
        )
        method, properties, body = channel.basic_get(queue, auto_ack=False)
        assert method is not None, "message confirmed but not in the queue"
        assert (body, properties.message_id, method.redelivered) == (b"oracle says hello", "m-1", False)
        channel.basic_ack(method.delivery_tag)
        assert channel.basic_get(queue) == (None, None, None)
    finally:
        connection.close()


def test_uri_names_the_loopback_port(rabbitmq: RabbitMQNode) -> None:
    assert rabbitmq.uri == f"amqp://guest:guest@127.0.0.1:{rabbitmq.port}/%2F"
    assert rabbitmq.startup_seconds is not None and rabbitmq.startup_seconds < rabbitmq.startup_timeout


@needs_rabbitmq
def test_stop_leaves_no_process_port_or_file_behind() -> None:
    node = RabbitMQNode().start()
    base_dir, name = node.base_dir, node.node_name
    ports = (node.port, node.dist_port, node.epmd_port)
    try:
        assert name in pgrep(name), "the node name must be on beam's command line"
        # beam, the launcher script, erl_child_setup, inet_gethost, epmd ...
        assert len(processes_with_marker(name)) >= 3
    finally:
        node.stop()
    assert pgrep(name) == ""
    assert processes_with_marker(name) == []
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert base_dir is not None and not base_dir.exists()
    node.stop()  # idempotent


@needs_rabbitmq
def test_failed_start_reports_the_log_tail_and_cleans_up() -> None:
    node = RabbitMQNode(extra_config="no_such_setting.at_all = 1")
    with pytest.raises(RabbitMQNodeError) as failure:
        node.start()
    message = str(failure.value)
    assert "exited with status" in message
    assert "no_such_setting" in message, "the tail of the node's output names the bad key"
    assert processes_with_marker(node.node_name) == []
    assert pgrep(node.node_name) == ""


def test_unknown_busy_wait_setting_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="scheduler_busy_wait"):
        RabbitMQNode(scheduler_busy_wait="sometimes")
