"""A node restarted after a crash removes the consumers of its earlier run's
connections (broker/fifo/machine.py `stale_downs`, proposed by broker/queues/quorum/groups.py
after the replay). RabbitMQ's quorum-queue guide (4.2, "Poison Message Handling")
counts *unsuccessful delivery attempts* toward the delivery limit: each message a dead
consumer held comes back once, delivery count + 1, and no message is handed to
another dead consumer while they are removed (that is no delivery attempt, and its
Down counted it again: the fault suite's kill-all runs lost confirmed messages of a
single-active-consumer queue to the delivery limit that way)."""

from __future__ import annotations

import pytest

from quorumqueue.broker.fifo.commands import (Checkout, Deliver, Dropped, Enqueue, Meta)
from quorumqueue.broker.fifo.machine import apply, stale_downs
from quorumqueue.broker.fifo.state import FifoConfig, FifoState


class Queue:
    def __init__(self, single_active: bool) -> None:
        self.state = FifoState(config=FifoConfig(single_active=single_active))
        self.index = 0
        self.effects: list = []

    def apply(self, command):
        self.index += 1
        self.state, reply, effects = apply(Meta(self.index, 1, self.index), command,
                                           self.state)
        self.effects.extend(effects)
        return effects

    def counts(self, consumer: str) -> dict[int, int]:
        """Message (raft index) -> delivery count, of what `consumer` was handed."""
        return {d.raft_index: d.delivery_count for e in self.effects if isinstance(e, Deliver)
                and e.consumer == consumer for d in e.deliveries}


def run(queue: Queue, run_id: int, prefetch: int) -> list[str]:
    """Three consumers on three connections of one run; the first registered is active."""
    keys = []
    for n in range(3):
        key = f"run{run_id}.{n}/ch/tag{n}"
        queue.apply(Checkout(key, prefetch, 0, f"run{run_id}.{n}"))
        keys.append(key)
    return keys


def restart(queue: Queue, run_id: int) -> list:
    stale = {c.connection for c in queue.state.consumers.values()
             if c.connection.startswith(f"run{run_id}.")}
    effects = []
    for command in stale_downs(queue.state, stale):
        effects.extend(queue.apply(command))
    return effects


@pytest.mark.parametrize("single_active", [True, False])
@pytest.mark.parametrize("active_connection", [0, 1, 2])
def test_after_a_crash_each_unacked_message_is_counted_once_and_nothing_goes_to_a_dead_consumer(
        single_active, active_connection):
    """Three consumers of the crashed run, each on its own connection; which one is
    active (single active consumer) or sorts first varies. After the restart's
    commands: no delivery was made, no message dropped, no consumer is left, and a new
    consumer gets every message: those held before the crash with count 1, the rest 0."""
    queue = Queue(single_active)
    for n in range(3):
        number = (n + active_connection) % 3  # the first registered is active
        queue.apply(Checkout(f"old.{number}/ch/tag", 2, 0, f"old.{number}"))
    for seq in range(1, 6):  # without single active consumer the last one has room
        queue.apply(Enqueue("", seq, 1, 0))
    held = {d.raft_index for e in queue.effects if isinstance(e, Deliver) for d in e.deliveries}
    assert len(held) == (2 if single_active else 5)
    stale = {f"old.{n}" for n in range(3)}
    effects = []
    for command in stale_downs(queue.state, stale):
        effects.extend(queue.apply(command))
    assert [e for e in effects if isinstance(e, (Deliver, Dropped))] == []
    assert queue.state.consumers == {} and queue.state.active is None
    queue.apply(Checkout("new/ch/tag", 0, 0, "new"))
    counts = queue.counts("new/ch/tag")
    assert len(counts) == 5
    assert {index: count for index, count in counts.items() if count} == dict.fromkeys(held, 1)


def test_ten_crashes_count_only_the_deliveries_made_before_each():
    """A single-active-consumer queue whose node crashes 10 times, three consumers
    on three connections each run, the active one holding 2 of 6 messages each time
    (prefetch 2; returned messages go first, so the same 2): every crash adds 1 to the
    count of the 2 it held and nothing to the other 4, which no client received. (Each
    crash added up to 3 when the dead consumers were made active one after another:
    after 7 crashes the 2 passed the delivery limit, 20, and were dropped.)"""
    queue = Queue(single_active=True)
    run(queue, 0, 2)
    for seq in range(1, 7):
        queue.apply(Enqueue("", seq, 1, 0))
    expected: dict[int, int] = {}
    for run_id in range(10):
        active = queue.state.active
        assert active is not None and active.startswith(f"run{run_id}.")
        held = queue.counts(active)
        for index, count in held.items():
            assert count == expected.get(index, 0)
            expected[index] = count + 1
        effects = restart(queue, run_id)
        assert [e for e in effects if isinstance(e, (Deliver, Dropped))] == []
        queue.effects.clear()
        run(queue, run_id + 1, 2)
    assert sorted(expected.values()) == [10, 10]
    queue.apply(Checkout("last/ch/tag", 0, 0, "last"))
    assert not [e for e in queue.effects if isinstance(e, Dropped)]
