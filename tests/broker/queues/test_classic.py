"""The classic queue core: ordering, priorities, length limits and consumer choice.

RabbitMQ behaviours checked: priority queues (x-max-priority; higher first, FIFO
within a priority, priorities above the maximum count as the maximum), a requeued
message returning to its original position (rabbit_variable_queue keeps it by seq
id), x-max-length / x-max-length-bytes with x-overflow drop-head or reject-publish,
consumer priorities (x-priority) with round-robin inside a priority, and
x-single-active-consumer.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.amqp.codec import Properties
from quorumqueue.broker.queues.classic import ClassicQueue
from quorumqueue.broker.queues.message import Message


def message(body: bytes = b"m", priority: int = 0) -> Message:
    return Message("", "q", Properties(b"", len(body), priority=priority), body)


def new_queue(**limits) -> ClassicQueue:
    return ClassicQueue("/", "q", False, None, False, {}, **limits)


def push(queue: ClassicQueue, *bodies: bytes, priority: int = 0) -> list:
    dropped = []
    for body in bodies:
        dropped += queue.push(queue.make_entry(message(body, priority), stored=False))
    return dropped


def drain(queue: ClassicQueue) -> list[bytes]:
    out = []
    while (entry := queue.pop()) is not None:
        out.append(entry.message.body)
    return out


@dataclass(eq=False)
class FakeConsumer:
    """What a queue asks of a consumer: its priority, exclusivity and capacity."""

    tag: str
    priority: int = 0
    exclusive: bool = False
    capacity: bool = True

    def has_capacity(self) -> bool:
        return self.capacity


def picks(queue: ClassicQueue, count: int) -> list[str | None]:
    out = []
    for _ in range(count):
        consumer = queue.next_consumer()
        out.append(consumer.tag if consumer else None)
    return out


# ---------------------------------------------------------------- ordering and priorities


def test_fifo_without_priorities_ignores_message_priority():
    """RabbitMQ: without x-max-priority a queue is FIFO whatever the priority property."""
    queue = new_queue()
    push(queue, b"1", priority=9)
    push(queue, b"2", priority=0)
    push(queue, b"3", priority=5)
    assert drain(queue) == [b"1", b"2", b"3"]


def test_priority_levels_higher_first_fifo_within_a_level():
    """RabbitMQ priority queues: the highest priority is delivered first, FIFO within
    one priority; a priority above x-max-priority counts as the maximum."""
    queue = new_queue(max_priority=5)
    for body, priority in ((b"p0-a", 0), (b"p5-a", 5), (b"p3", 3), (b"p9", 9),
                           (b"p0-b", 0), (b"p5-b", 5), (b"p1", 1)):
        push(queue, body, priority=priority)
    assert queue.ready_count == 7
    assert [e.message.body for e in queue.ready_entries()] == \
        [b"p5-a", b"p9", b"p5-b", b"p3", b"p1", b"p0-a", b"p0-b"]
    assert drain(queue) == [b"p5-a", b"p9", b"p5-b", b"p3", b"p1", b"p0-a", b"p0-b"]
    assert queue.ready_count == 0 and queue.ready_bytes == 0


def test_requeue_returns_to_the_original_position_marked_redelivered():
    """RabbitMQ: a rejected/recovered message goes back to where it was, not to the
    tail (classic queues order by sequence id)."""
    queue = new_queue()
    push(queue, b"1", b"2", b"3", b"4", b"5")
    first, second, third = queue.pop(), queue.pop(), queue.pop()
    queue.requeue(second)
    queue.requeue(first)
    push(queue, b"6")
    entries = list(queue.ready_entries())
    assert [e.message.body for e in entries] == [b"1", b"2", b"4", b"5", b"6"]
    assert [e.redelivered for e in entries] == [True, True, False, False, False]
    queue.requeue(third)
    assert drain(queue) == [b"1", b"2", b"3", b"4", b"5", b"6"]


def test_requeue_into_its_priority_level():
    """RabbitMQ priority queues: a requeued message returns to its own priority."""
    queue = new_queue(max_priority=2)
    push(queue, b"low-1", b"low-2", priority=0)
    push(queue, b"high-1", b"high-2", priority=2)
    high = queue.pop()
    low_entries = [queue.pop(), queue.pop(), queue.pop()]
    assert [e.message.body for e in low_entries] == [b"high-2", b"low-1", b"low-2"]
    queue.requeue(low_entries[2])
    queue.requeue(high)
    assert drain(queue) == [b"high-1", b"low-2"]


# ---------------------------------------------------------------- length limits


def test_max_length_drop_head_drops_the_oldest():
    """x-max-length with the default x-overflow=drop-head: the head is dropped to make
    room, and the dropped entries are handed back (the node forgets them)."""
    queue = new_queue(max_length=2)
    assert push(queue, b"1", b"2") == []
    dropped = push(queue, b"3")
    assert [e.message.body for e in dropped] == [b"1"]
    assert not queue.would_overflow(message())
    assert drain(queue) == [b"2", b"3"]


def test_max_length_bytes_drop_head_drops_until_it_fits():
    """RabbitMQ x-max-length-bytes counts message bodies; drop-head drops until it fits."""
    queue = new_queue(max_length_bytes=10)
    push(queue, b"aaaa", b"bbbb")
    dropped = push(queue, b"cccccccc")
    assert [e.message.body for e in dropped] == [b"aaaa", b"bbbb"]
    assert queue.ready_bytes == 8
    assert drain(queue) == [b"cccccccc"]


def test_max_length_zero_drops_everything():
    """RabbitMQ: x-max-length 0 with drop-head keeps nothing."""
    queue = new_queue(max_length=0)
    assert [e.message.body for e in push(queue, b"1")] == [b"1"]
    assert queue.ready_count == 0


def test_reject_publish_refuses_instead_of_dropping():
    """x-overflow=reject-publish: a full queue refuses new messages (the publisher
    gets a nack) and keeps its head."""
    queue = new_queue(max_length=2, overflow="reject-publish")
    push(queue, b"1")
    assert not queue.would_overflow(message(b"2"))
    push(queue, b"2")
    assert queue.would_overflow(message(b"3"))
    queue.pop()
    assert not queue.would_overflow(message(b"3"))


def test_reject_publish_by_bytes():
    """RabbitMQ x-max-length-bytes with reject-publish refuses what does not fit."""
    queue = new_queue(max_length_bytes=10, overflow="reject-publish")
    push(queue, b"123456")
    assert not queue.would_overflow(message(b"1234"))
    assert queue.would_overflow(message(b"12345"))


def test_purge_empties_ready_messages_only():
    """spec 1.7.2.5 queue.purge: unacked messages are not purged."""
    queue = new_queue(max_priority=3)
    push(queue, b"1", priority=1)
    push(queue, b"2", priority=3)
    unacked = queue.pop()
    purged = queue.take_ready()
    assert [e.message.body for e in purged] == [b"1"]
    assert (queue.ready_count, queue.ready_bytes) == (0, 0)
    queue.requeue(unacked)
    assert drain(queue) == [b"2"]


# ---------------------------------------------------------------- consumers


def test_round_robin_within_one_priority():
    """RabbitMQ delivers round-robin between consumers of equal priority."""
    queue = new_queue()
    for tag in "abc":
        queue.add_consumer(FakeConsumer(tag))
    assert picks(queue, 7) == ["a", "b", "c", "a", "b", "c", "a"]


def test_round_robin_skips_consumers_without_capacity():
    """RabbitMQ: a consumer at its prefetch limit is skipped, not waited for."""
    queue = new_queue()
    consumers = {tag: FakeConsumer(tag) for tag in "abc"}
    for consumer in consumers.values():
        queue.add_consumer(consumer)
    consumers["b"].capacity = False
    assert picks(queue, 4) == ["a", "c", "a", "c"]
    consumers["b"].capacity = True
    assert picks(queue, 3) == ["a", "b", "c"]
    for consumer in consumers.values():
        consumer.capacity = False
    assert picks(queue, 1) == [None]


def test_consumer_priority_serves_the_highest_group_with_capacity():
    """RabbitMQ consumer priorities (x-priority): active consumers of the highest
    priority get messages; lower ones only while all higher ones are full."""
    queue = new_queue()
    low, high_1, high_2 = FakeConsumer("low", -1), FakeConsumer("h1", 5), FakeConsumer("h2", 5)
    middle = FakeConsumer("mid", 0)
    for consumer in (low, high_1, middle, high_2):
        queue.add_consumer(consumer)
    assert picks(queue, 4) == ["h1", "h2", "h1", "h2"]
    high_1.capacity = high_2.capacity = False
    assert picks(queue, 2) == ["mid", "mid"]
    middle.capacity = False
    assert picks(queue, 1) == ["low"]
    high_2.capacity = True
    assert picks(queue, 2) == ["h2", "h2"]


def test_removing_a_consumer_keeps_the_rotation_going():
    """RabbitMQ: basic.cancel leaves the other consumers in rotation."""
    queue = new_queue()
    consumers = [FakeConsumer(tag) for tag in "abc"]
    for consumer in consumers:
        queue.add_consumer(consumer)
    assert picks(queue, 1) == ["a"]
    queue.remove_consumer(consumers[1])
    assert queue.consumer_count == 2
    assert sorted(picks(queue, 2)) == ["a", "c"]
    queue.remove_consumer(consumers[1])  # removing twice is harmless
    assert queue.consumer_count == 2


def test_single_active_consumer_delivers_to_the_first_registered_only():
    """x-single-active-consumer: one consumer (the earliest registered) gets every
    message; others wait, even while it has no capacity; when it goes, the next in
    registration order takes over."""
    queue = new_queue(single_active_consumer=True)
    first, second, third = FakeConsumer("1"), FakeConsumer("2", priority=10), FakeConsumer("3")
    for consumer in (first, second, third):
        queue.add_consumer(consumer)
    assert picks(queue, 3) == ["1", "1", "1"]
    first.capacity = False
    assert picks(queue, 1) == [None]
    queue.remove_consumer(first)
    assert queue.active_consumer is second
    assert picks(queue, 2) == ["2", "2"]
    queue.remove_consumer(second)
    queue.remove_consumer(third)
    assert queue.active_consumer is None and picks(queue, 1) == [None]


def test_exclusive_consumer_is_tracked():
    """spec 1.8.3.3 basic.consume exclusive: the queue knows its exclusive consumer."""
    queue = new_queue()
    consumer = FakeConsumer("x", exclusive=True)
    queue.add_consumer(consumer)
    assert queue.exclusive_consumer is consumer
    queue.remove_consumer(consumer)
    assert queue.exclusive_consumer is None


def test_auto_delete_only_after_a_consumer_came_and_went():
    """RabbitMQ: an auto-delete queue is deleted when its last consumer goes, never
    before it had one."""
    queue = ClassicQueue("/", "q", False, None, True, {})
    assert not queue.is_unused_for_auto_delete()
    consumer = FakeConsumer("c")
    queue.add_consumer(consumer)
    assert not queue.is_unused_for_auto_delete()
    queue.remove_consumer(consumer)
    assert queue.is_unused_for_auto_delete()


# ---------------------------------------------------------------- property


operations = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(min_value=0, max_value=12),
              st.binary(max_size=6)),
    st.tuples(st.just("pop")),
    st.tuples(st.just("requeue"), st.integers(min_value=0, max_value=50)),
    st.tuples(st.just("purge")),
), max_size=40)


@pytest.mark.parametrize("max_priority", [0, 3])
@settings(max_examples=150, deadline=None)
@given(ops=operations)
def test_queue_matches_a_sorted_model(max_priority, ops):
    """Invariants: ready_count and ready_bytes are the sums over the levels, and pop
    always returns the ready entry with the highest level, then the lowest sequence
    number, whatever mix of pushes, pops, requeues and purges came before."""
    queue = new_queue(max_priority=max_priority)
    model: dict[int, tuple[int, int]] = {}  # seq -> (level, size)
    out: list = []  # popped, not yet requeued
    for op in ops:
        if op[0] == "push":
            entry = queue.make_entry(message(op[2], op[1]), stored=False)
            assert queue.push(entry) == []
            model[entry.seq] = (min(op[1], max_priority), len(op[2]))
        elif op[0] == "pop":
            entry = queue.pop()
            if not model:
                assert entry is None
                continue
            expected = min(model, key=lambda seq: (-model[seq][0], seq))
            assert entry.seq == expected
            del model[expected]
            out.append(entry)
        elif op[0] == "requeue" and out:
            entry = out.pop(op[1] % len(out))
            queue.requeue(entry)
            model[entry.seq] = (min(entry.message.priority, max_priority), entry.message.size)
        elif op[0] == "purge":
            assert sorted(e.seq for e in queue.take_ready()) == sorted(model)
            model.clear()
        assert queue.ready_count == len(model) == sum(len(level) for level in queue.levels)
        assert queue.ready_bytes == sum(size for _level, size in model.values())
    assert [e.seq for e in queue.ready_entries()] == \
        sorted(model, key=lambda seq: (-model[seq][0], seq))
