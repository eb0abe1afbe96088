"""peek (broker/fifo/peek.py): the ready message at a 1-based position is the one the
k-th basic.get would take, and peeking changes nothing (rabbit_fifo's query_peek,
behind `rabbitmq-queues peek`)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.fifo import snapshot
from quorumqueue.broker.fifo.commands import Cancel, Checkout, Dequeue, Meta, Return
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.peek import peek
from quorumqueue.broker.fifo.state import FifoState
from tests.broker.fifo.test_machine import Script, commands, concrete, configs


def test_positions_follow_delivery_order_returns_first_then_two_high_to_one_normal():
    s = Script()
    normal = s.enqueue(3, priority=0)
    high = s.enqueue(3, priority=9)
    s(Checkout("c", 1, 0, "x"))  # takes high[0]
    s(Cancel("c"))
    s(Return("c", (1,)))         # ...and returns it: first in line, delivery count 1
    assert [peek(s.state, k) for k in range(1, 8)] == [
        (high[0], 1), (high[1], 0), (normal[0], 0), (high[2], 0), (normal[1], 0),
        (normal[2], 0), None]


def test_a_position_below_one_is_refused():
    with pytest.raises(ValueError, match="positive integer"):
        peek(FifoState(), 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, min_size=5, max_size=50), configs)
def test_peek_at_k_is_what_the_kth_get_takes_and_changes_nothing(steps, config):
    state, seq = FifoState(config=config), [0]
    for position, step in enumerate(steps, start=1):
        state, _reply, _effects = apply(Meta(position, 1, position * 20),
                                        concrete(step, state, seq), state)
    before = snapshot.dump(state)
    peeked = [peek(state, k) for k in range(1, state.ready_count + 2)]
    assert snapshot.dump(state) == before
    taking, taken = copy.deepcopy(state), []
    for k in range(state.ready_count):
        taking, reply, _ = apply(Meta(len(steps) + 1 + k, 1, len(steps) * 20),
                                 Dequeue("peek-check", True, "conn-peek"), taking)
        delivery = reply[0]
        taken.append((delivery.raft_index, delivery.delivery_count))
    assert peeked == taken + [None]
