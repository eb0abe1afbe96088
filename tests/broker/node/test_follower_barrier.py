"""A count asked of a quorum queue's replica is answered, whether the replica leads or
follows, also while it holds publishes or settlements not yet proposed
(groups/replicated.py `after_applied`, queues/quorum/queue.py `declare_ok`).

A replica holds a client's publishes until its node's next round and proposes them as
one run; a count asked meanwhile (a passive queue.declare, another node's `stat`, a
peek) first proposes them, then waits for everything appended here to be applied, so
that it includes them. A leader appends them itself. A follower forwards them to the
leader and appends nothing: its log ends where it has applied, and a wait for that
index was never answered. A passive queue.declare on a follower while a client
published there waited for ever (pika's queue_declare has no timeout: the Spark
connector's driver hung in it, tests/connector/test_reconnect.py's cluster query).

Nodes are assembled in process as in test_forwarded_apply.py; a follower is a replica
of a queue whose other member (the leader) is not in this process.
"""

from __future__ import annotations

from quorumqueue.broker.fifo import commands
from quorumqueue.broker.amqp.properties import decode_properties, encode_properties
from quorumqueue.broker.groups.metadata import encode as encode_meta
from quorumqueue.broker.queues.message import Message
from tests.broker.node.test_forwarded_apply import ME, QUORUM, start

OTHER = "qq2@localhost"


def declare(node, members: list[str], leader: str):
    node.cluster.meta.propose_data(encode_meta("queue.declare", vhost="/", name="q",
                                               arguments=QUORUM, group="%2F/q/0123456789ab",
                                               members=members, leader=leader))
    node.flush()
    return node.vhosts["/"].queues["q"]


def publish(queue, body: bytes) -> None:
    """What a client's basic.publish routed to `queue` does (no confirm, no key)."""
    properties = decode_properties(encode_properties(len(body), {"delivery_mode": 2}))[1]
    queue.publish(Message("", "q", properties, body), None, None)


class Asker:
    """Who asked the declare-ok (queues/base.py): it keeps the counts."""

    def __init__(self, answers: list) -> None:
        self.answers = answers

    def declare_ok(self, ready: int, consumers: int) -> None:
        self.answers.append((ready, consumers))


def test_a_follower_holding_publishes_answers_a_passive_declare(tmp_path):
    node = start(tmp_path)
    queue = declare(node, [ME, OTHER], leader=OTHER)
    assert not queue.is_leader
    publish(queue, b"m")
    assert queue.publishing  # held until the node's next round
    answers: list = []
    queue.declare_ok(Asker(answers))
    # forwarded to the leader; nothing is appended here, so nothing is left to apply
    assert not queue.publishing and not queue.has_unapplied()
    assert answers == [(0, 0)]


def test_a_follower_holding_settlements_answers_a_barrier(tmp_path):
    node = start(tmp_path)
    queue = declare(node, [ME, OTHER], leader=OTHER)
    queue.settling.append((commands.Settle, "key", [1]))  # what an ack leaves here
    answered: list = []
    queue.after_applied(answered.append)
    assert answered == [None]


def test_a_leader_holding_publishes_answers_once_they_are_applied(tmp_path):
    node = start(tmp_path)
    queue = declare(node, [ME], leader=ME)
    assert queue.is_leader
    publish(queue, b"m")
    answers: list = []
    queue.declare_ok(Asker(answers))
    assert answers == []  # appended here: answered after the apply, which counts it
    node.flush()
    assert answers == [(1, 0)]
