"""Consumers of a node that is gone (broker/fifo/nodes.py): NodeDown suspects them,
NodeUp reinstates them or, for a node's earlier runs, removes them.

As rabbit_fifo's noconnection handling (the 4.2 guide: "Single Active Consumer",
"Poison Message Handling" — the delivery limit counts *unsuccessful* delivery
attempts): a suspected consumer gets nothing and is never the single active one;
what it held goes back redelivered but uncounted. Before, a leader that had not heard
from a node for 5 s proposed a Down per connection (delivery count + 1 each), and the
consumers of nodes it had not yet heard from after every node was killed could be
made active and served in between: after a few kill-alls, messages no client had
received passed the delivery limit (the fault suite's kill-all runs, 5 nodes)."""

from __future__ import annotations

import pytest

from quorumqueue.broker.fifo.commands import (Cancel, Checkout, Deliver, Delivery, Dequeue,
                                                  Down, Dropped, Enqueue, Meta, NodeDown,
                                                  NodeUp, Return, Settle, Tick,
                                                  UpdateConfig, decode, encode)
from quorumqueue.broker.fifo.machine import apply, stale_downs
from quorumqueue.broker.fifo.nodes import node_commands, node_of
from quorumqueue.broker.fifo.state import FifoConfig, FifoState


class Queue:
    def __init__(self, single_active: bool = True, **config) -> None:
        self.state = FifoState(config=FifoConfig(single_active=single_active, **config))
        self.index = 0
        self.effects: list = []

    def apply(self, command, time_ms: int = 0):
        self.index += 1
        self.state, reply, effects = apply(Meta(self.index, 1, time_ms), command, self.state)
        self.effects.extend(effects)
        return effects

    def delivered(self, effects=None) -> list[tuple[str, Delivery]]:
        return [(e.consumer, d) for e in (self.effects if effects is None else effects)
                if isinstance(e, Deliver) for d in e.deliveries]


def consume(queue: Queue, node: str, run: str, number: int, prefetch: int = 2) -> str:
    """A consumer of connection `number` of `node`'s run `run` (identity
    `node:run.connection.channel`, as broker/node/channel.py writes it)."""
    connection = f"{node}:{run}.{number}.1"
    key = f"{connection}/tag{number}"
    queue.apply(Checkout(key, prefetch, 0, connection))
    return key


def test_node_of_reads_the_node_from_a_connection_identity():
    assert node_of("qq1@localhost:ab12cd.4.1") == "qq1@localhost"
    assert node_of("ab12cd.4.1") is None  # written before nodes named themselves


def test_the_commands_round_trip_through_their_encoding():
    for command in (NodeDown(("qq1@localhost", "qq2@localhost")), NodeDown(()),
                    NodeUp("qq1@localhost", "qq1@localhost:ab12")):
        assert decode(encode(command)) == command
    assert encode(NodeDown(("n",))) == b"\x13\x00\x01\x00\x01n"


def test_the_active_consumers_node_gone_the_next_takes_over_with_its_messages_uncounted():
    """SAC: the active consumer on n1 holds 2 messages; its node is suspected down:
    in that one command the consumer on n2 is active and gets both, redelivered with
    delivery count 0 (no x-delivery-count), then a new message fresh."""
    queue = Queue()
    first = consume(queue, "n1", "r1", 1)
    second = consume(queue, "n2", "r1", 1)
    for seq in (1, 2, 3):
        queue.apply(Enqueue("", seq, 1, 0))
    assert [key for key, _d in queue.delivered()] == [first, first]
    effects = queue.apply(NodeDown(("n1",)))
    assert queue.state.active == second and queue.state.consumers[first].suspected
    assert queue.delivered(effects) == [(second, Delivery(1, 3, 0, True)),
                                        (second, Delivery(2, 4, 0, True))]
    assert all(d.redelivered for _key, d in queue.delivered(effects))
    queue.apply(Settle(second, (1, 2)))
    assert queue.delivered()[-1] == (second, Delivery(3, 5, 0))  # the third, fresh
    assert not queue.delivered()[-1][1].redelivered


def test_without_a_delivery_limit_the_uncounted_returns_are_redelivered_too():
    """With no delivery limit returned messages go back to the tail of the normal
    queue (not to the returns queue), from where the next consumer is served in one
    pass: the new message first, fresh, then the suspected consumer's two,
    redelivered with delivery count 0; a message returned counted comes back with
    its count."""
    queue = Queue(delivery_limit=-1)
    first = consume(queue, "n1", "r1", 1)
    second = consume(queue, "n2", "r1", 1, prefetch=3)
    for seq in (1, 2, 3):
        queue.apply(Enqueue("", seq, 1, 0))
    effects = queue.apply(NodeDown(("n1",)))
    assert queue.delivered(effects) == [(second, Delivery(1, 5, 0, False)),
                                        (second, Delivery(2, 3, 0, True)),
                                        (second, Delivery(3, 4, 0, True))]
    effects = queue.apply(Return(second, (1,)))  # its room: straight back to it
    assert queue.delivered(effects) == [(second, Delivery(4, 5, 1, False))]
    assert queue.delivered(effects)[0][1].redelivered


def test_a_suspected_consumer_gets_nothing_and_an_old_down_would_have_counted():
    """Without single active consumer: n1's consumer is suspected, everything goes to
    n2's. The same loss told by a Down (what a leader proposed before) counts 1."""
    queue = Queue(single_active=False)
    first = consume(queue, "n1", "r1", 1, prefetch=0)
    second = consume(queue, "n2", "r1", 1, prefetch=0)
    queue.apply(Enqueue("", 1, 1, 0))  # round robin: to n1's first
    queue.apply(NodeDown(("n1",)))
    for seq in (2, 3, 4):
        queue.apply(Enqueue("", seq, 1, 0))
    assert {key for key, _d in queue.delivered()[1:]} == {second}
    assert queue.delivered()[1][1] == Delivery(1, 3, 0, True)

    told_by_down = Queue(single_active=False)
    first = consume(told_by_down, "n1", "r1", 1, prefetch=0)
    consume(told_by_down, "n2", "r1", 1, prefetch=0)
    told_by_down.apply(Enqueue("", 1, 1, 0))
    told_by_down.apply(Down(f"n1:r1.1.1"))
    assert told_by_down.delivered()[1][1] == Delivery(1, 3, 1)


def test_a_node_back_in_the_same_run_gets_its_consumers_back_waiting():
    """A node only cut off: NodeUp with the run its consumers belong to reinstates
    them. The single active consumer stays where it went; n1's waits in its place and
    takes over when the other goes; without single active consumer it is served again."""
    queue = Queue()
    first = consume(queue, "n1", "r1", 1)
    second = consume(queue, "n2", "r1", 1)
    queue.apply(NodeDown(("n1",)))
    assert queue.state.active == second
    queue.apply(NodeUp("n1", "n1:r1"))
    assert not queue.state.consumers[first].suspected and queue.state.active == second
    queue.apply(Enqueue("", 1, 1, 0))
    assert queue.delivered()[-1][0] == second
    queue.apply(Cancel(second))
    queue.apply(Settle(second, (1,)))
    assert queue.state.active == first

    plain = Queue(single_active=False)
    first = consume(plain, "n1", "r1", 1, prefetch=0)
    consume(plain, "n2", "r1", 1, prefetch=0)
    plain.apply(NodeDown(("n1",)))
    plain.apply(NodeUp("n1", "n1:r1"))
    plain.apply(Enqueue("", 1, 1, 0))
    plain.apply(Enqueue("", 2, 1, 0))
    assert {key for key, _d in plain.delivered()} == {first, f"n2:r1.1.1/tag1"}


def test_a_node_back_in_a_new_run_has_its_earlier_consumers_removed_in_one_command():
    """After a restart, three consumers of n1's earlier run are still registered (the
    first active, holding 2 messages) beside a live one on n2. NodeUp with n1's new run
    removes all three in one command: the 2 come back counted once (the delivery made
    before the crash) and go to n2's consumer; no earlier-run consumer is made active
    or handed anything, as a Down per connection did one after another."""
    queue = Queue()
    old = [consume(queue, "n1", "r1", n) for n in range(3)]
    for seq in range(1, 5):
        queue.apply(Enqueue("", seq, 1, 0))
    live = consume(queue, "n2", "r2", 1, prefetch=10)
    effects = queue.apply(NodeUp("n1", "n1:r2"))
    assert [c for c in queue.state.consumers] == [live] and queue.state.active == live
    assert [(key, d.delivery_count) for key, d in queue.delivered(effects)] == [
        (live, 1), (live, 1), (live, 0), (live, 0)]
    assert not [e for e in effects if isinstance(e, Dropped)]
    assert old[0] not in [key for key, _d in queue.delivered(effects)]


def test_a_cancelled_consumer_and_a_basic_get_of_a_node_gone_give_back_what_they_hold():
    queue = Queue(single_active=False)
    cancelled = consume(queue, "n1", "r1", 1, prefetch=1)
    queue.apply(Enqueue("", 1, 1, 0))
    queue.apply(Cancel(cancelled))
    queue.apply(Enqueue("", 2, 1, 0))
    queue.apply(Dequeue("n1:r1.2.1/get", False, "n1:r1.2.1"))
    assert queue.state.checked_out_count == 2
    queue.apply(NodeDown(("n1",)))
    assert cancelled not in queue.state.consumers          # held nothing more: gone
    assert queue.state.consumers["n1:r1.2.1/get"].suspected
    assert queue.state.ready_count == 2 and queue.state.delivery_counts == {2: 0, 4: 0}
    queue.apply(Checkout("n2:r1.1.1/tag", 0, 0, "n2:r1.1.1"))
    assert [d for _key, d in queue.delivered()[1:]] == [Delivery(1, 2, 0, True),
                                                        Delivery(2, 4, 0, True)]


def test_a_queue_whose_only_consumers_are_suspected_is_unused():
    """Queue TTL (x-expires): a suspected consumer does not keep the queue in use, as
    rabbit_fifo's is_expired leaves suspected consumers out."""
    queue = Queue(single_active=False, expires=1000)
    consume(queue, "n1", "r1", 1)
    queue.apply(Tick(), time_ms=1)
    queue.apply(NodeDown(("n1",)), time_ms=2)
    effects = queue.apply(Tick(), time_ms=1100)
    assert any(type(e).__name__ == "QueueExpired" for e in effects)


@pytest.mark.parametrize("live, expected", [
    ({"n1": "n1:r1", "n2": "n2:r1"}, []),
    ({"n1": "n1:r1"}, [NodeDown(("n2",))]),
    ({"n1": "n1:r1", "n2": "n2:r2"}, [NodeUp("n2", "n2:r2")]),
    ({"n3": "n3:r1"}, [NodeDown(("n1", "n2"))]),
])
def test_node_commands_from_the_leaders_view(live, expected):
    queue = Queue()
    consume(queue, "n1", "r1", 1)
    consume(queue, "n2", "r1", 1)
    queue.apply(Checkout("ab12.1.1/tag", 1, 0, "ab12.1.1"))  # no node: left alone
    assert node_commands(queue.state, live) == expected


def test_node_commands_ask_back_suspected_consumers_once_their_node_is_heard_again():
    queue = Queue()
    consume(queue, "n1", "r1", 1)
    queue.apply(NodeDown(("n1",)))
    assert node_commands(queue.state, {"n2": "n2:r1"}) == []   # suspected already
    assert node_commands(queue.state, {"n1": "n1:r1"}) == [NodeUp("n1", "n1:r1")]


def kill_all(queue: Queue, nodes: list[str], runs: dict[str, str], generation: int,
             leader: str) -> list:
    """Every node killed and restarted in a new run; `leader` leads first, hearing
    from no one yet: it proposes node_commands (a NodeUp for itself, a NodeDown for the
    others), then its own stale_downs; then each other node's first ping (a NodeUp),
    then that node's own stale_downs."""
    effects = []
    old = dict(runs)
    for node in nodes:
        runs[node] = f"r{generation}"
    live: dict[str, str] = {}
    for node in [leader] + [n for n in nodes if n != leader]:
        live[node] = f"{node}:{runs[node]}"
        for command in node_commands(queue.state, live):
            effects += queue.apply(command)
        effects += restart_cleanup(queue, node, old[node])
    return effects


def restart_cleanup(queue: Queue, node: str, old_run: str) -> list:
    """What `node` proposes for its own earlier run once it replayed its log."""
    stale = {c.connection for c in queue.state.consumers.values()
             if c.connection.startswith(f"{node}:{old_run}.")}
    effects = []
    for command in stale_downs(queue.state, stale):
        effects += queue.apply(command)
    return effects


def old_kill_all(queue: Queue, nodes: list[str], runs: dict[str, str], generation: int,
                 leader: str) -> list:
    """The same, told as before: each node cleans up its own earlier run
    (stale_downs), one node after another, and the leader has nothing to say."""
    effects = []
    old = dict(runs)
    for node in nodes:
        runs[node] = f"r{generation}"
    for node in [leader] + [n for n in nodes if n != leader]:
        effects += restart_cleanup(queue, node, old[node])
    return effects


def five_nodes_killed_twenty_times(single_active: bool, how) -> Queue:
    """Five nodes with a consumer each (prefetch 2), 6 messages, and every node killed
    20 times (the default delivery limit is 20), the first leader after each a
    different node; the consumers register again after each."""
    nodes = [f"n{k}" for k in range(1, 6)]
    runs = dict.fromkeys(nodes, "r0")
    queue = Queue(single_active)
    for node in nodes:
        consume(queue, node, runs[node], 1)
    for seq in range(1, 7):
        queue.apply(Enqueue("", seq, 1, 0))
    for generation in range(1, 21):
        how(queue, nodes, runs, generation, nodes[generation % 5])
        assert not queue.state.consumers
        for node in nodes:
            consume(queue, node, runs[node], 1)
    return queue


@pytest.mark.parametrize("single_active", [True, False])
def test_twenty_kill_alls_of_five_nodes_count_at_most_one_each_and_drop_nothing(single_active):
    """Told by the leader (NodeUp for the nodes it hears, NodeDown for the others), a
    kill-all adds at most 1 to a message's delivery count (when the first leader's own
    consumer held it at the crash: its earlier run died holding it) and nothing to
    what other nodes' consumers held: none of the 6 messages passes the limit. Told as
    before, the same kill-alls made dead consumers active one after another, each
    counting the messages again: messages were dropped."""
    queue = five_nodes_killed_twenty_times(single_active, kill_all)
    assert not [e for e in queue.effects if isinstance(e, Dropped)]
    assert queue.state.checked_out_count + queue.state.ready_count == 6
    counts = dict(queue.state.delivery_counts)
    for consumer in queue.state.consumers.values():
        counts.update({index: count for index, _size, count in consumer.checked.values()})
    assert max(counts.values(), default=0) <= 20
    if single_active:
        before = five_nodes_killed_twenty_times(single_active, old_kill_all)
        assert [e for e in before.effects if isinstance(e, Dropped)]


def test_a_lowered_delivery_limit_still_drops_a_message_over_it_when_it_comes_back():
    """The limit is read on return, as for any return: a message already over a lowered
    limit leaves when a suspicion returns it (rabbit_fifo checks on every return)."""
    queue = Queue(single_active=False)
    key = consume(queue, "n1", "r1", 1)
    queue.apply(Enqueue("", 1, 1, 0))
    queue.apply(Down(f"n1:r1.1.1"))                 # count 1
    consume(queue, "n1", "r1", 2)                   # gets it again, count 1
    queue.apply(UpdateConfig(0, None, None, "drop-head"))
    effects = queue.apply(NodeDown(("n1",)))
    assert [e for e in effects if isinstance(e, Dropped)] == [Dropped(2, "delivery_limit")]
    assert key not in queue.state.consumers
