"""The node's queue deadlines (broker/queues/deadlines.py): one pending moment per
queue, the earliest; what is due is returned once, in time order; a later moment
for a queue that waits for an earlier one is left to that queue's callback."""

from __future__ import annotations

from quorumqueue.broker.queues.deadlines import Deadlines


class Owner:
    def __init__(self, name: str, ran: list) -> None:
        self.name, self.ran = name, ran

    def __call__(self, now: int) -> None:
        self.ran.append((self.name, now))


def test_each_owner_is_called_once_at_its_earliest_moment_in_time_order():
    ran: list = []
    a, b = Owner("a", ran), Owner("b", ran)
    deadlines = Deadlines()
    for ms, owner in ((300, a), (100, a), (200, b), (150, a), (250, b)):
        deadlines.add(ms, owner, owner)
    assert deadlines.next_ms() == 100 and len(deadlines) == 2
    assert deadlines.due(99) == []
    for callback in deadlines.due(220):
        callback(220)
    assert ran == [("a", 220), ("b", 220)]
    assert deadlines.next_ms() is None and deadlines.due(10_000) == []


def test_an_owner_called_registers_its_next_moment_itself():
    ran: list = []
    a = Owner("a", ran)
    deadlines = Deadlines()
    deadlines.add(100, a, a)
    deadlines.add(500, a, a)         # later than the pending one: a's callback's business
    [callback] = deadlines.due(100)
    deadlines.add(400, a, a)         # what the callback does
    assert deadlines.next_ms() == 400
    assert deadlines.due(399) == [] and len(deadlines.due(400)) == 1
    assert deadlines.next_ms() is None
