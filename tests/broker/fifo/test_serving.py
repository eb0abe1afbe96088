"""Which consumers a ready message may go to (fifo/serving.py): the consumers with
capacity, highest priority first, round-robin among equals (the quorum queues
guide, "Consumer Priorities" and "Consumer Prefetch"; rabbit_fifo's service queue).

`_ranked` is run after every command, in one pass over the consumers; it is held
equal here to the sort it replaced (`sorted` of those with `has_capacity`, by
priority then registration order), which the machine's script tests were written
against."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.fifo import serving
from quorumqueue.broker.fifo.commands import Checkout, Deliver, Enqueue, Meta, Settle
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import ConsumerState, FifoConfig, FifoState

consumer_states = st.builds(
    lambda prefetch, priority, order, pull_only, cancelled, suspected, checked:
    ConsumerState(prefetch, priority, "conn", order, pull_only=pull_only,
                  cancelled=cancelled, suspected=suspected,
                  checked={n: (n, 10, 0) for n in range(checked)}),
    st.sampled_from([0, 1, 2, 3]), st.sampled_from([0, 0, 0, 1, 5]),
    st.integers(0, 30), st.booleans(), st.booleans(), st.booleans(), st.integers(0, 4))


@settings(max_examples=300, deadline=None)
@given(st.lists(consumer_states, max_size=14))
def test_ranked_is_the_sort_of_the_consumers_with_capacity(states):
    """Any mix of priorities, registration orders (ties and a dict out of order
    included), prefetch limits reached or not, cancelled, pull-only and suspected
    consumers: `_ranked` gives the list the sort gives, item for item."""
    consumers = {f"c{n}": state for n, state in enumerate(states)}
    assert serving._ranked(consumers) == sorted(
        (item for item in consumers.items() if item[1].has_capacity()),
        key=lambda item: (-item[1].priority, item[1].order))


def test_ten_consumers_take_messages_one_by_one_in_turn():
    """Ten consumers of equal priority, prefetch 2, messages enqueued one at a time:
    the first ten go to each consumer in registration order; after that the turn is
    the queue's rotation counter over the consumers that still have room (a full one
    drops out of the turn: c0 fills at message 11, so message 12 goes to the third
    of the nine left). Every consumer ends with two; the next message waits, and the
    first settle gives it to the consumer that made room. (As main did before the
    one-pass ranking: the sequence was taken from it.)"""
    state = FifoState(config=FifoConfig(20, 2048))
    index = 0

    def step(command):
        nonlocal state, index
        index += 1
        state, _reply, effects = apply(Meta(index, 1, 1000), command, state)
        return [(e.consumer, d.raft_index) for e in effects if isinstance(e, Deliver)
                for d in e.deliveries]

    for n in range(10):
        step(Checkout(f"c{n}", prefetch=2, priority=0, connection="conn"))
    got = []
    for _ in range(20):
        got += step(Enqueue("", index + 1, 10, 0))
    assert [key for key, _ in got] == [f"c{n}" for n in
                                       (0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                        0, 3, 6, 9, 4, 1, 2, 8, 5, 7)]
    assert state.ready_count == 0
    assert step(Enqueue("", index + 1, 10, 0)) == []  # everyone is full
    assert state.ready_count == 1
    waiting = index
    assert step(Settle("c7", (1,))) == [("c7", waiting)]


def test_a_higher_priority_consumer_takes_all_it_has_room_for_first():
    """Priorities 5, 0, 0: the priority 5 consumer takes messages while it has room
    (prefetch 3), then the two others share the rest in turn."""
    state = FifoState(config=FifoConfig(20, 2048))
    index = 0
    delivered = []
    for key, priority in (("low-a", 0), ("high", 5), ("low-b", 0)):
        index += 1
        state, _, _ = apply(Meta(index, 1, 1000),
                            Checkout(key, prefetch=3, priority=priority, connection="conn"),
                            state)
    for _ in range(7):
        index += 1
        state, _, effects = apply(Meta(index, 1, 1000), Enqueue("", index, 10, 0), state)
        delivered += [e.consumer for e in effects if isinstance(e, Deliver)]
    assert delivered[:3] == ["high"] * 3
    assert sorted(delivered[3:]) == ["low-a", "low-a", "low-b", "low-b"]
