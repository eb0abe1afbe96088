"""A consumer's Cancel or Down that never reached the log does not leave a consumer
with no channel behind it in the queue (queues/quorum/queue.py `must_land`, queues/quorum/groups.py
`_remove_unknown_consumer`).

Found by the fault suite (pause-long, 3 nodes, seed 208): a leader paused longer than
an election closed its clients' connections for missed heartbeats when it resumed,
before it heard of the new term, and appended their Downs to its own log; the new
leader's entries replaced that tail, and nothing proposed the Downs again. The dead
consumer stayed registered; once it was the single active consumer, every message
went to it, came back from its node counted, and went to it again until the delivery
limit dropped it (504 confirmed messages lost).

Here a node's real quorum queue (one member, the leader) is driven by its own Ready
loop: the lost append is a proposal that vanishes, and the next term's first entry
is appended at its index, as the new leader's entry would replace it.
"""

from __future__ import annotations

from quorumqueue.broker.fifo import commands
from quorumqueue.broker.fifo.commands import Checkout

from .test_forwarded_apply import append, declare, message, start


class ClosedChannel:
    """What `QuorumQueue.channel_closed` reads of a channel."""

    def __init__(self, identity: str) -> None:
        self.quorum_identity = identity


def lose_next_proposal(queue) -> None:
    """The leader's next proposal is 'appended' and lost (its index is handed out, the
    entry never stays); then the leader steps down and wins the next term, whose first
    entry (a no-op) takes that index."""
    raft = queue.raft
    real = raft.propose

    def vanishing(data, *args, **kwargs):
        raft.propose = real
        return raft.log.last_index() + 1

    raft.propose = vanishing
    return raft


def new_term(queue) -> None:
    raft = queue.raft
    raft._become_follower(raft.term + 1, None)  # deposed, as a paused leader is
    raft.campaign()                             # one member: leader again, term + 1


def test_a_channel_down_whose_append_was_lost_is_proposed_again(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    identity = f"{node.boot_id}.7.1"
    append(queue, commands.encode(Checkout(f"{identity}/c1", 10, 0, identity)))
    node.flush()
    assert f"{identity}/c1" in queue.state.consumers
    lose_next_proposal(queue)
    queue.channel_closed(ClosedChannel(identity), [])
    new_term(queue)
    for _ in range(3):  # the next term's entry applied, then the Down proposed again
        node.flush()
    assert queue.state.consumers == {}


def test_a_cancel_whose_append_was_lost_is_proposed_again(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    identity = f"{node.boot_id}.7.1"

    class OpenChannel(ClosedChannel):
        is_open = True

    class Consumer:
        tag, exclusive = "c1", False

    consumer = Consumer()
    queue.add_consumer(consumer, f"{identity}/c1")
    append(queue, commands.encode(Checkout(f"{identity}/c1", 10, 0, identity)))
    node.flush()
    lose_next_proposal(queue)
    queue.cancel(OpenChannel(identity), consumer)
    new_term(queue)
    for _ in range(3):
        node.flush()
    assert queue.state.consumers == {}


def test_messages_handed_to_a_consumer_this_node_does_not_have_stay_in_the_queue(tmp_path):
    """The machine holds a consumer of this node's current run that the node does not
    know (its Down was lost before this fix, or is on its way): what it is handed comes
    back once, and the consumer is removed, instead of going back to it until the
    delivery limit drops it."""
    node = start(tmp_path)
    queue = declare(node)
    identity = f"{node.boot_id}.9.1"
    append(queue, commands.encode(Checkout(f"{identity}/ghost", 10, 0, identity)))
    append(queue, message(b"m1"))
    append(queue, message(b"m2"))
    for _ in range(5):
        node.flush()
    assert queue.state.consumers == {}
    assert queue.ready_count == 2
    assert sorted(queue.state.delivery_counts.values()) == [1, 1]  # handed out once


class OpenChannelSession:
    """A session of this node with one open channel (what `Node.has_open_channel`
    reads of the node's sessions)."""

    def __init__(self, identity: str) -> None:
        from quorumqueue.broker.amqp.channel import ChannelState

        channel = type("OpenChannel", (), {"quorum_identity": identity,
                                           "state": ChannelState.OPEN})()
        self.channels = {1: channel}


def test_a_consumer_cancelled_on_an_open_channel_is_cancelled_and_its_messages_return(
        tmp_path):
    """The node does not have the consumer but its channel is open (a basic.cancel whose
    Cancel was lost): a Cancel, then the messages come back, once."""
    node = start(tmp_path)
    queue = declare(node)
    identity = f"{node.boot_id}.9.1"
    node.sessions.add(OpenChannelSession(identity))
    append(queue, commands.encode(Checkout(f"{identity}/ghost", 10, 0, identity)))
    append(queue, message(b"m1"))
    for _ in range(5):
        node.flush()
    assert queue.state.consumers == {}
    assert queue.ready_count == 1
    assert list(queue.state.delivery_counts.values()) == [1]


def test_a_node_without_a_replica_handed_messages_for_a_consumer_it_lacks_removes_it(
        tmp_path):
    """The same through the leader's `deliver` message to a node with no replica
    (cluster/proxy.py `on_deliver`): that node proposes the consumer's Down."""
    from quorumqueue.broker.cluster import proxy

    node = start(tmp_path)
    queue = declare(node)
    identity = f"{node.boot_id}.9.1"
    append(queue, commands.encode(Checkout(f"{identity}/ghost", 10, 0, identity)))
    node.flush()
    proxy.on_deliver(node.cluster, "qq2@localhost", {
        "g": queue.group, "k": f"{identity}/ghost",
        "m": [[1, 0, "", "q", b"", b"m1"]]})
    for _ in range(3):
        node.flush()
    assert queue.state.consumers == {}


def test_a_node_without_a_replica_asks_whether_the_consumers_own_channel_is_open(tmp_path):
    """`on_deliver` for a consumer the node lacks, while another channel of the node is
    open: the consumer's channel is not, so the node proposes its Down (what it held
    goes back), not a Cancel and a Return as for a consumer whose channel is open."""
    from quorumqueue.broker.cluster import proxy
    from quorumqueue.broker.fifo.commands import Down

    node = start(tmp_path)
    queue = declare(node)
    identity = f"{node.boot_id}.9.1"
    node.sessions.add(OpenChannelSession(f"{node.boot_id}.8.1"))  # another connection's
    append(queue, commands.encode(Checkout(f"{identity}/ghost", 10, 0, identity)))
    node.flush()
    proposed = []
    real = queue.propose
    queue.propose = lambda command, *args: (proposed.append(command), real(command, *args))
    proxy.on_deliver(node.cluster, "qq2@localhost", {
        "g": queue.group, "k": f"{identity}/ghost",
        "m": [[1, 0, "", "q", b"", b"m1"]]})
    assert [type(command) for command in proposed] == [Down]
