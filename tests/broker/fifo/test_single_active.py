"""Single active consumer in the fifo machine (broker/fifo/single_active.py), against
RabbitMQ's consumers guide ("Single Active Consumer"; RabbitMQ 4.x: "Single Active
Consumer and Consumer Priorities"). The worked examples are the scripts
scripts/single_active_consumer*.txt; here, properties over any sequence of commands.
(Restore-from-any-snapshot equals full replay, single active consumer included, is
the property in test_machine.py.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.fifo import single_active
from quorumqueue.broker.fifo.commands import (ActiveConsumerChanged, Checkout, Deliver, Meta,
                                              UpdateConfig)
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import FifoConfig, FifoState

from .test_machine import commands, concrete


def _candidates(state: FifoState) -> dict:
    return {key: consumer for key, consumer in state.consumers.items()
            if not consumer.cancelled and not consumer.pull_only and not consumer.suspected}


def _rank(consumer) -> tuple[int, int]:
    return -consumer.priority, consumer.order


sac_configs = st.builds(FifoConfig, delivery_limit=st.sampled_from([-1, 2, 20]),
                        release_cursor_interval=st.just(3),
                        max_length=st.none() | st.integers(0, 4), single_active=st.just(True))


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, min_size=10, max_size=80), sac_configs)
def test_only_the_active_consumer_gets_deliveries_and_takeovers_follow_the_rules(steps, config):
    """After every command: every Deliver goes to the one active consumer, and a
    change of it is an ActiveConsumerChanged effect; there is
    an active consumer whenever one may take over; the active consumer changes only
    when it left (cancelled, down) — then to the best waiting one by priority, then
    registration order — or to a higher-priority waiting one once it holds no
    unacked message; a quiescing consumer gets nothing."""
    state, seq = FifoState(config=config), [0]
    for position, step in enumerate(steps, start=1):
        command = concrete(step, state, seq)
        before = state.active
        if before is not None:  # what it was before the command (a Checkout updates it)
            before_priority = state.consumers[before].priority
        state, _reply, effects = apply(Meta(position, 1, position * 20), command, state)
        candidates = _candidates(state)
        delivered_to = {e.consumer for e in effects if isinstance(e, Deliver)}
        changes = [e for e in effects if isinstance(e, ActiveConsumerChanged)]
        assert changes == ([ActiveConsumerChanged(state.active)] if state.active != before
                           else [])
        assert delivered_to <= {state.active}, "a waiting consumer got a delivery"
        assert not any(c.checked for c in state.consumers.values()
                       if c.suspected and not c.pull_only), "a suspected consumer holds one"
        assert (state.active is None) == (not candidates)
        if state.active is None:
            continue
        active = candidates[state.active]
        waiting = [c for key, c in candidates.items() if key != state.active]
        if single_active.quiescing(state):
            assert not delivered_to and active.checked
            assert any(c.priority > active.priority for c in waiting)
        if state.active == before:
            continue
        if before in candidates:  # it stayed registered, and gave way to a higher priority
            assert active.priority > min(before_priority, candidates[before].priority)
            assert not candidates[before].checked  # (its last message went in this command)
        assert all(_rank(active) < _rank(c) for c in waiting
                   if c.priority >= active.priority), "not the best waiting consumer"


def test_an_update_config_keeps_single_active_consumer():
    """x-single-active-consumer is an argument only (no policy key, RabbitMQ's
    consumers guide): a policy's UpdateConfig leaves it as it was."""
    state = FifoState(config=FifoConfig(single_active=True))
    state, _, _ = apply(Meta(1, 1, 0), Checkout("a", 0, 0, "conn-a"), state)
    state, _, _ = apply(Meta(2, 1, 0), Checkout("b", 0, 0, "conn-b"), state)
    state, _, _ = apply(Meta(3, 1, 0), UpdateConfig(5, 10, None, "drop-head"), state)
    assert state.config.single_active and state.active == "a"
    assert single_active.waiting_order(state) == ["b"]
