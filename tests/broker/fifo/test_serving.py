"""Which consumers a ready message may go to (fifo/serving.py): the consumers with
capacity, highest priority first, round-robin among equals (the quorum queues
guide, "Consumer Priorities" and "Consumer Prefetch"; rabbit_fifo's service queue).

`_ranked` is run after every command, in one pass over the consumers; it is held
equal here to the sort it replaced (`sorted` of those with `has_capacity`, by
priority then registration order), which the machine's script tests were written
against. With two consumers or more the machine serves from a roster it keeps
between commands (`_serve_many`, state.py `ServingRoster`); on random walks of
consumers it is held to what ranking them after every command serves."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.fifo import serving, snapshot
from quorumqueue.broker.fifo.commands import (Cancel, Checkout, Deliver, Dequeue, Down, Enqueue,
                                              Meta, NodeDown, NodeUp, Settle)
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import ConsumerState, FifoConfig, FifoState

from . import test_machine

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


def _serve_many_by_ranking(state, effects):
    """`_serve_many` as it was before the roster: the consumers with capacity ranked
    after every command (`_ranked`), then served."""
    ordered = serving._ranked(state.consumers)
    if not ordered:
        return
    if len(ordered) == 1 and serving._only_normal(state):
        serving._serve_one_from_normal(state, *ordered[0], effects)
    else:
        serving._serve_in_turn(state, ordered, effects)


# five consumers on nodes n1-n3, prefetch 0 (unlimited) to 3, mostly one priority;
# publishes half the time, so consumers fill, drain and refill
_walk_consumers = st.sampled_from(["c1", "c2", "c3", "c4", "c5"])


def _walk_conn(consumer: str) -> str:
    return f"n{min(int(consumer[1]), 3)}:r1.{consumer}"


walk_steps = st.booleans().flatmap(lambda enqueue: st.just(("enqueue", "", 0, 10)) if enqueue
                                   else st.one_of(
    st.builds(lambda c, n, pr: Checkout(c, n, pr, _walk_conn(c)), _walk_consumers,
              st.integers(0, 3), st.sampled_from([0, 0, 0, 1])),
    st.builds(lambda c, k: ("settle", c, k), _walk_consumers, st.integers(0, 3)),
    st.builds(lambda c, k: ("return", c, k), _walk_consumers, st.integers(0, 2)),
    st.builds(lambda c, k: ("discard", c, k), _walk_consumers, st.integers(0, 2)),
    st.builds(Cancel, _walk_consumers),
    st.builds(lambda c: Down(_walk_conn(c)), _walk_consumers),
    st.builds(lambda c: Dequeue(c, False, _walk_conn(c)), _walk_consumers),
    st.builds(lambda n: NodeDown((n,)), st.sampled_from(["n1", "n3"])),
    st.builds(lambda n: NodeUp(n, f"{n}:r1"), st.sampled_from(["n1", "n3"]))))


@settings(max_examples=150, deadline=None)
@given(st.lists(walk_steps | test_machine.commands, min_size=10, max_size=100),
       st.sampled_from([FifoConfig(release_cursor_interval=3)]) | test_machine.configs)
def test_the_roster_serves_what_ranking_every_command_serves(steps, config):
    """Random walks of consumers (checkouts with new prefetch and priority, settles,
    returns, discards, cancels, connections and nodes down and up, basic.get under a
    consumer's key) between publishes: with serving.py's roster, every command's
    reply, effects (which consumer gets which message, under which message id) and
    the state after it (rotation included) are those of ranking the consumers after
    every command. And the roster, when kept, is the one rebuilt from the consumers.
    Each walk starts with two consumers, so that most walks serve."""
    kept, seq_kept = FifoState(config=replace(config)), [0]
    ranking, seq_ranking = FifoState(config=replace(config)), [0]
    start = [Checkout(c, 2, 0, _walk_conn(c)) for c in ("c4", "c5")]
    for position, step in enumerate(start + steps, start=1):
        meta = Meta(position, 1, position * 20)
        kept, kept_reply, kept_effects = apply(meta, test_machine.concrete(step, kept, seq_kept),
                                               kept)
        with_roster = serving._serve_many
        serving._serve_many = _serve_many_by_ranking
        try:
            ranking, reply, effects = apply(
                meta, test_machine.concrete(step, ranking, seq_ranking), ranking)
        finally:
            serving._serve_many = with_roster
        assert (kept_reply, kept_effects) == (reply, effects)
        assert (snapshot.dump(kept), kept.rotation, kept.high_run) == (
            snapshot.dump(ranking), ranking.rotation, ranking.high_run)
        if kept.roster is not None:
            rebuilt = serving._roster(kept.consumers)
            assert ([key for key, _ in kept.roster.ranked], kept.roster.full,
                    kept.roster.one_priority) == (
                [key for key, _ in rebuilt.ranked], rebuilt.full, rebuilt.one_priority)
