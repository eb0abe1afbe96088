"""Flow control in the server shell (broker/server/server.py `receive`,
docs/behaviour/flow-control.md): one group-commit round takes at most
`flow_control.round_methods` of client input; while the node is behind (a Sync runs
and the next round's budget is spent) a publisher's socket is not read, its
connection shows state "flow" (RabbitMQ's flow control guide), and once the Sync
ends its input is read and handled again: every message arrives, in order.

The broker runs in this process, with the writer thread held inside a Sync by the
gate of test_group_commit.py, so "the node is behind" is a state the test sets up,
not a race."""

from __future__ import annotations

import threading

import pika
import pytest

from quorumqueue.broker.config import Settings
from tests.broker.server.test_group_commit import (WAIT, connect, gate,  # noqa: F401
                                                   running_server, wait_until)

pytestmark = pytest.mark.timeout(120)

BUDGET = 8          # methods per round
MESSAGES = 200


@pytest.fixture
def server(tmp_path, gate):  # noqa: F811 - the gate fixture, imported
    yield from running_server(Settings(host="127.0.0.1", port=0,
                                       data_dir=str(tmp_path / "node"),
                                       flow_round_methods=BUDGET), gate)


def states(server) -> list[str]:
    return [row["state"] for row in server.client_rows()["connections"]]


def test_a_publisher_is_not_read_while_the_node_is_behind_and_is_read_again_after(server,
                                                                                  gate):
    setup = connect(server)
    setup.channel().queue_declare("flow", durable=True,
                                  arguments={"x-queue-type": "quorum"})
    group = server.node.vhosts["/"].queues["flow"]
    first = group.raft.log.last_index()
    publisher = connect(server)
    channel = publisher.channel()
    gate.close()
    for index in range(MESSAGES):   # no confirms: all written at once, unanswered
        channel.basic_publish("", "flow", str(index).encode(),
                              pika.BasicProperties(delivery_mode=2))
    assert gate.wait_entered(1), "no Sync began for the publishes"
    # behind: the held Sync has at most one round's publishes, the next round at most
    # one budget more; the rest waits unread and the connection is in flow
    wait_until(lambda: "flow" in states(server), "the publisher's connection to be in flow")
    assert group.raft.log.last_index() - first <= 2 * BUDGET
    assert [s for s in server.connections if s.input_held] != []

    gate.open()     # the node catches up: the publisher is read again, to the end
    wait_until(lambda: group.raft.log.last_index() - first >= MESSAGES,
               "every publish to be handled")
    wait_until(lambda: "flow" not in states(server), "the connection to leave flow")
    check = setup.channel()
    got = []
    for _ in range(MESSAGES):
        _method, _properties, body = check.basic_get("flow", auto_ack=True)
        got.append(body)
    assert got == [str(index).encode() for index in range(MESSAGES)]
    publisher.close()
    setup.close()


def test_a_burst_larger_than_the_budget_goes_through_round_after_round(server, gate):
    """With no Sync held, a burst of 25 budgets is handled round after round; the
    passive declare written after it is answered after every publish (a channel's
    methods act in order, flow control or not)."""
    connection = connect(server)
    channel = connection.channel()
    channel.queue_declare("steady", durable=True, arguments={"x-queue-type": "quorum"})
    for index in range(MESSAGES):
        channel.basic_publish("", "steady", str(index).encode(),
                              pika.BasicProperties(delivery_mode=2))
    assert channel.queue_declare("steady", passive=True).method.message_count == MESSAGES
    connection.close()


def test_a_loop_stall_longer_than_half_the_election_timeout_is_logged(server, caplog):
    """Diagnosis of the stall flow control bounds: a Raft tick that fires late by
    half the shortest election timeout (500 ms by default) is logged, since no
    heartbeat left the node meanwhile."""
    caplog.set_level("WARNING", logger="quorumqueue.broker")
    stalled = threading.Event()

    def stall():                     # the node's loop busy for 0.8 s
        import time

        time.sleep(0.8)
        stalled.set()

    server._loop.call_soon_threadsafe(stall)
    assert stalled.wait(WAIT)
    wait_until(lambda: any("ms late: the event loop was busy" in record.getMessage()
                           for record in caplog.records), "the late tick's warning")


@pytest.fixture
def short_slices(tmp_path):
    """A broker whose input slices are 5 ms (raft.tick_interval_ms = 10): a burst of
    publishes is handled over many loop iterations."""
    settings = Settings(host="127.0.0.1", port=0, data_dir=str(tmp_path / "node"),
                        raft_tick_ms=10)
    yield from running_server(settings)


def test_input_handled_in_short_slices_arrives_whole_and_in_order(short_slices):
    """Two publishers' bursts, sliced between loop iterations: every message is
    stored, each publisher's in its order."""
    connections = [connect(short_slices) for _ in range(2)]
    channels = [connection.channel() for connection in connections]
    channels[0].queue_declare("sliced", durable=True, arguments={"x-queue-type": "quorum"})
    count = 500
    for index in range(count):
        for number, channel in enumerate(channels):
            channel.basic_publish("", "sliced", f"{number}-{index}".encode(),
                                  pika.BasicProperties(delivery_mode=2))
    for channel in channels:   # answered after the channel's publishes, in order
        channel.queue_declare("sliced", passive=True)
    got = [channels[0].basic_get("sliced", auto_ack=True)[2] for _ in range(2 * count)]
    for number in range(2):
        mine = [body for body in got if body.startswith(f"{number}-".encode())]
        assert mine == [f"{number}-{index}".encode() for index in range(count)]
    for connection in connections:
        connection.close()
