"""Lease-mode offsets and planning (connector/offsets.py), pure.

connector/README.md, "Lease mode": a batch's (start, end] is fixed once Spark logs
its end offset; so offsets must round-trip through the checkpoint unchanged, a bad
one must fail loudly, and an unchanged offset must serialise to the same text.
"""

from __future__ import annotations

import json
import pickle

import pytest

from quorumqueue.connector.offsets import (Cut, LeaseOffset, LeaseRange, OffsetError,
                                           batch_end, batch_limit, new_lease_name,
                                           partition_sizes, ranges,
                                           rotated, to_grow)


def test_initial_offset_names_a_fresh_lease_and_starts_every_queue_at_zero():
    offset = LeaseOffset.initial("spark-1", ["orders", "audit"])
    assert offset.to_json() == {"lease": "spark-1", "queues": {"audit": 0, "orders": 0}}
    assert new_lease_name() != new_lease_name()
    assert new_lease_name().startswith("spark-")


def test_json_round_trip_is_canonical():
    offset = LeaseOffset.of("l", {"b": 2, "a": 1})
    text = json.dumps(offset.to_json())
    assert text == '{"lease": "l", "queues": {"a": 1, "b": 2}}'
    again = LeaseOffset.from_json(json.loads(text))
    assert again == offset and json.dumps(again.to_json()) == text
    # the same positions given in another order are the same offset, same text
    assert json.dumps(LeaseOffset.from_json({"lease": "l", "queues": {"b": 2, "a": 1}})
                      .to_json()) == text


@pytest.mark.parametrize("document", [
    None, [], {"lease": "l"}, {"queues": {}}, {"lease": "", "queues": {}},
    {"lease": 3, "queues": {}}, {"lease": "l", "queues": []},
    {"lease": "l", "queues": {"q": -1}}, {"lease": "l", "queues": {"q": "3"}},
    {"lease": "l", "queues": {"q": True}}, {"lease": "l", "queues": {"q": 1.5}},
    {"lease": "l", "queues": {}, "extra": 1},
    {"consume": {"q": 1}},
])
def test_anything_else_from_a_checkpoint_is_refused(document):
    with pytest.raises(OffsetError):
        LeaseOffset.from_json(document)


def test_positions_and_advancing():
    offset = LeaseOffset.of("l", {"a": 5})
    assert offset.position("a") == 5 and offset.position("new") == 0
    assert offset.advanced({"a": 7, "new": 2}).to_json() == {"lease": "l",
                                                           "queues": {"a": 7, "new": 2}}
    assert offset.advanced({"a": 5}) == offset
    with pytest.raises(OffsetError, match="move back from 5 to 4"):
        offset.advanced({"a": 4})


@pytest.mark.parametrize("queues, turn, order", [
    (["a"], 0, ["a"]), (["a"], 5, ["a"]), (["a", "b", "c"], 0, ["a", "b", "c"]),
    (["a", "b", "c"], 1, ["b", "c", "a"]), (["a", "b", "c"], 5, ["c", "a", "b"]), ([], 3, []),
])
def test_queues_take_turns_at_being_served_first(queues, turn, order):
    assert rotated(queues, turn) == order


# start, budget, target -> limit
@pytest.mark.parametrize("start, budget, target, limit", [
    (0, None, None, None),    # read everything: no limit
    (10, 5, None, 15),        # maxMessagesPerTrigger
    (10, 0, None, 10),        # budget used up by queues served earlier
    (10, None, 12, 12),       # AvailableNow: stop at the target
    (10, 5, 12, 12),          # both: the nearer
    (10, 5, 30, 15),
    (10, None, 10, 10),       # target reached
])
def test_batch_limit(start, budget, target, limit):
    assert batch_limit(start, budget, target) == limit


# held (lease end), limit -> how many to grow, then the batch end once grown to `after`
@pytest.mark.parametrize("held, limit, grow, after, end", [
    (10, None, 99, 30, 30),   # no limit: ask for everything, take what came
    (10, 15, 5, 15, 15),      # ask for the rest of the budget
    (10, 15, 5, 12, 12),      # fewer were ready
    (20, 15, 0, 20, 15),      # the lease already holds more (assigned before a crash)
    (15, 15, 0, 15, 15),
])
def test_growing_and_batch_end(held, limit, grow, after, end):
    assert to_grow(held, limit, everything=99) == grow
    assert batch_end(after, limit) == end


def test_ranges_cut_each_queue_into_partitions():
    start = LeaseOffset.of("l", {"a": 0, "b": 7})
    end = LeaseOffset.of("l", {"a": 25, "b": 7, "c": 3})
    assert ranges(start, end, max_messages=10) == [
        LeaseRange("a", "l", 0, 10), LeaseRange("a", "l", 10, 20), LeaseRange("a", "l", 20, 25),
        LeaseRange("c", "l", 0, 3)]
    assert ranges(end, end, max_messages=10) == []


def test_ranges_refuse_impossible_batches():
    with pytest.raises(OffsetError, match="span two leases"):
        ranges(LeaseOffset.of("l", {}), LeaseOffset.of("m", {}), 10)
    with pytest.raises(OffsetError, match="below its start"):
        ranges(LeaseOffset.of("l", {"a": 5}), LeaseOffset.of("l", {"a": 4}), 10)


def test_a_partition_pickles_for_the_executors():
    part = LeaseRange("orders", "spark-1", 10, 20)
    assert pickle.loads(pickle.dumps(part)) == part
    assert part.value == ("orders", 10, 20)


# ------------------------------------------------------------------ partition sizes
# Options minPartitions and maxMessagesPerPartition (connector/README.md, "Options").

LEASE = Cut(per_queue=4, floor=2_000, cap=25_000)      # lease_reader.LEASE_CUT
CONSUME = Cut(per_queue=None, floor=1, cap=5_000)       # consume_reader.CONSUME_CUT


def sizes(counts, cut, **options) -> list[int]:
    named = {f"q{i}": count for i, count in enumerate(counts)}
    return list(partition_sizes(named, cut, options.get("min_partitions"),
                                options.get("max_per_partition")).values())


@pytest.mark.parametrize("cut, counts, options, expected", [
    # the modes' own cuts: a quarter of the largest queue within 2,000..25,000; 5,000
    (LEASE, [10], {}, [2_000]),
    (LEASE, [100_000], {}, [25_000]),
    # past 4 x 25,000 a multiple of 4 partitions, evened out: whole waves of tasks
    (LEASE, [100_001], {}, [12_501]),                          # 8, not 5
    (LEASE, [300_000, 10], {}, [25_000, 25_000]),              # 12
    (LEASE, [310_000], {}, [19_375]),                          # 16, not 13
    (LEASE, [40_000, 10], {}, [10_000, 10_000]),
    (CONSUME, [12_000], {}, [5_000]),
    # maxMessagesPerPartition caps a partition (and lowers the 2,000 floor to it)
    (LEASE, [100_000], {"max_per_partition": 7_000}, [7_000]),
    (LEASE, [100_000], {"max_per_partition": 50_000}, [25_000]),   # it only caps: still 4
    (LEASE, [10], {"max_per_partition": 3}, [3]),
    (CONSUME, [12_000], {"max_per_partition": 100}, [100]),
    # minPartitions: the largest size giving at least that many partitions in all,
    # each queue's partitions evened out
    (LEASE, [100], {"min_partitions": 4}, [25]),              # 4 x 25, not 33+33+33+1
    (LEASE, [100, 1], {"min_partitions": 4}, [34, 1]),        # 34+34+32 and 1
    (CONSUME, [10, 10], {"min_partitions": 5}, [4, 4]),       # 4+4+2 twice: 6 partitions
    (CONSUME, [10, 10], {"min_partitions": 2}, [5_000, 5_000]),   # one per queue is two
    (CONSUME, [3], {"min_partitions": 8}, [1]),               # fewer messages than asked
    (LEASE, [100_000], {"min_partitions": 2}, [25_000]),      # the cut already gives 4
    (LEASE, [900], {"min_partitions": 4, "max_per_partition": 100}, [100]),
    (LEASE, [0, 7], {"min_partitions": 2}, [6, 4]),   # 4+3; the empty queue has no pieces
])
def test_partition_sizes(cut, counts, options, expected):
    assert sizes(counts, cut, **options) == expected


@pytest.mark.parametrize("counts", [[1], [7, 3], [100, 1, 50], [9_999, 10_001], [5] * 9])
@pytest.mark.parametrize("min_partitions", [1, 2, 3, 7, 16, 64])
def test_min_partitions_is_met_whenever_the_batch_has_that_many_messages(counts,
                                                                        min_partitions):
    chosen, unforced = sizes(counts, LEASE, min_partitions=min_partitions), sizes(counts, LEASE)
    pieces = sum(-(-count // size) for count, size in zip(counts, chosen))
    assert pieces >= min(min_partitions, sum(counts))
    if sum(-(-count // size) for count, size in zip(counts, unforced)) >= min_partitions:
        assert chosen == unforced          # the mode's own cut was enough: unchanged
        return
    for count, size in zip(counts, chosen):   # even: no piece far smaller than the others
        assert count % size == 0 or count % size >= size - -(-count // size)


def test_ranges_cut_each_queue_by_its_own_size():
    start, end = LeaseOffset.of("l", {"a": 0, "b": 10}), LeaseOffset.of("l", {"a": 100, "b": 11})
    cut = ranges(start, end, {"a": 25, "b": 25})
    assert [(r.queue, r.start, r.end) for r in cut] == [
        ("a", 0, 25), ("a", 25, 50), ("a", 50, 75), ("a", 75, 100), ("b", 10, 11)]
