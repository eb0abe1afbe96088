"""Issue 31, "an idle queue costs nothing per tick": the node's periodic timers (the
Raft tick, the quorum queues' Tick, the consumer-node checks, the policy catch-up, the
membership reconciliation) visit the groups that need them, not every group. Deterministic: the timers are called
by hand, no clock, no sleeping."""

from __future__ import annotations

from quorumqueue.broker.cluster import consumer_nodes
from quorumqueue.broker.node import membership
from quorumqueue.broker.raft.core import RaftNode
from tests.broker.node.harness import Client, new_node

QUEUES = 60


def _idle_node():
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    for number in range(QUEUES):
        client.declare_queue(1, f"q{number}", durable=True,
                             arguments={"x-queue-type": "quorum"})
    client.node.flush()
    return client


def _run_timers(node, rounds: int = 5) -> None:
    quorum = node.quorum
    for _ in range(rounds):
        quorum.raft_tick()
        quorum.tick(node.clock_ms)
        consumer_nodes.tick(node.cluster)
        node.tick_policies()
        node.tick_queues()
        membership.reconcile(node)
        node.flush()


def test_an_idle_node_with_many_quorum_queues_ticks_none_of_them(monkeypatch):
    client = _idle_node()
    node = client.node
    _run_timers(node)  # the first visits find there is nothing to do
    ticked: list[str] = []
    original = RaftNode.tick

    def counting(self):
        ticked.append(self._group)
        original(self)

    monkeypatch.setattr(RaftNode, "tick", counting)
    _run_timers(node, rounds=20)
    quorum = node.quorum
    assert len(quorum.queues) == QUEUES + 1  # and the metadata group
    assert ticked == []
    assert (quorum.ticking, quorum.timed, quorum.watched, quorum.policy_due,
            quorum.membership_due) == ({}, {}, {}, {}, {})
    # and each is usable afterwards
    client.publish(1, "", "q7", b"still here")
    client.node.flush()
    got = client.get(1, "q7")
    assert got.body == b"still here"


def test_a_queue_enters_the_timers_it_needs_and_its_timers_still_fire():
    """A consumer puts its queue under the consumer-node check, a message TTL under the
    Tick; the expired message still leaves through the Tick the timer proposes."""
    client = _idle_node()
    node = client.node
    _run_timers(node)
    quorum = node.quorum
    client.declare_queue(1, "ttl", durable=True,
                         arguments={"x-queue-type": "quorum", "x-message-ttl": 1000})
    node.set_clock(1.0, 1_000_000)
    client.publish(1, "", "ttl", b"expires")
    node.flush()
    ttl = node.vhosts["/"].queues["ttl"]
    assert ttl.group in quorum.timed and len(ttl.state.normal) == 1
    node.set_clock(6.0, 1_005_000)
    for _ in range(3):
        quorum.tick(node.clock_ms)
        node.flush()
    assert len(ttl.state.normal) == 0
    q5 = node.vhosts["/"].queues["q5"]
    client.call(1, _consume("q5"), "Basic.ConsumeOk")
    node.flush()
    assert q5.group in quorum.watched
    _run_timers(node)
    assert q5.group in quorum.watched and len(quorum.watched) == 1


def _consume(queue: str):
    from pamqp import commands

    return commands.Basic.Consume(queue=queue, consumer_tag="c")
