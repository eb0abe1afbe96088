"""UpdateConfig: a policy changing a running quorum queue's max-length,
max-length-bytes, overflow and delivery-limit (seed 002 "Policy Support"; seed 003,
delivery-limit "覆盖限制" set by policy), as rabbit_fifo's update_config applies it:
the new limits hold at once, a delivery limit from the next return on (machine.py
header). The property over random command sequences is in test_machine.py; the
scripted walk-through in scripts/update_config.txt."""

from __future__ import annotations

import pytest

from quorumqueue.broker.fifo import snapshot
from quorumqueue.broker.fifo.commands import (Checkout, Dequeue, Dropped, Enqueue, Meta,
                                              Return, UpdateConfig, decode, encode)
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import FifoConfig, FifoState


class Queue:
    def __init__(self, config: FifoConfig) -> None:
        self.state, self.index = FifoState(config=config), 0

    def __call__(self, command):
        self.index += 1
        self.state, reply, self.effects = apply(Meta(self.index, 1, 0), command, self.state)
        return reply

    def enqueue(self, n: int, size: int = 10) -> list:
        return [self(Enqueue("", 0, size, 0)) for _ in range(n)]

    @property
    def dropped(self) -> list[tuple[int, str]]:
        return [(e.raft_index, e.reason) for e in self.effects if isinstance(e, Dropped)]


@pytest.mark.parametrize("arguments, key", [
    ((-2, None, None, "drop-head"), "delivery_limit"),
    ((True, None, None, "drop-head"), "delivery_limit"),
    ((1 << 63, None, None, "drop-head"), "delivery_limit"),
    ((20, -1, None, "drop-head"), "max_length"),
    ((20, "5", None, "drop-head"), "max_length"),
    ((20, None, -1, "drop-head"), "max_bytes"),
    ((20, None, 1 << 63, "drop-head"), "max_bytes"),
    ((20, None, None, "reject-publish-dlx"), "overflow"),
    ((20, None, None, "drop_head"), "overflow")])
def test_impossible_settings_are_refused_when_the_command_is_built(arguments, key):
    with pytest.raises(ValueError, match=f"'{key}'"):
        UpdateConfig(*arguments)


def test_encoding_is_tag_14_and_26_bytes():
    data = encode(UpdateConfig(3, None, 100, "reject-publish"))
    assert data[0] == 14 and len(data) == 26
    assert decode(data) == UpdateConfig(3, None, 100, "reject-publish")
    with pytest.raises(ValueError, match="overflow code 7"):
        decode(data[:1] + b"\x07" + data[2:])


def test_drop_head_lowered_drops_the_oldest_and_keeps_the_rest_of_the_config():
    q = Queue(FifoConfig(delivery_limit=5, release_cursor_interval=100))
    q.enqueue(5)
    assert q(UpdateConfig(5, 2, None, "drop-head")) is None
    assert q.dropped == [(1, "maxlen"), (2, "maxlen"), (3, "maxlen")]
    assert q.state.config == FifoConfig(5, 100, 2, None, "drop-head")
    q.enqueue(1)
    assert q.dropped == [(4, "maxlen")] and q.state.ready_count == 2


def test_max_bytes_lowered_drops_until_the_bytes_fit():
    q = Queue(FifoConfig())
    q.enqueue(3, size=10)
    q(UpdateConfig(20, None, 15, "drop-head"))
    assert q.dropped == [(1, "maxlen"), (2, "maxlen")] and q.state.ready_bytes == 10


def test_checked_out_messages_do_not_count_against_a_new_limit():
    q = Queue(FifoConfig())
    q.enqueue(4)
    q(Checkout("c", 2, 0, "conn"))
    q(UpdateConfig(20, 2, None, "drop-head"))
    assert q.dropped == [] and q.state.checked_out_count == 2


def test_reject_publish_blocks_at_once_and_unblocks_at_80_percent_of_the_new_limit():
    q = Queue(FifoConfig())
    q.enqueue(6)
    q(UpdateConfig(20, 5, None, "reject-publish"))
    assert q.state.publishers_blocked and q.dropped == []
    assert q.enqueue(1) == ["rejected"]
    # raised to 7: 6 ready is within it but above 80% (5): still blocked
    q(UpdateConfig(20, 7, None, "reject-publish"))
    assert q.state.publishers_blocked
    # raised to 10: 6 <= 8, unblocked
    q(UpdateConfig(20, 10, None, "reject-publish"))
    assert not q.state.publishers_blocked and q.enqueue(1) == ["ok"]


@pytest.mark.parametrize("update, dropped", [
    (UpdateConfig(20, None, None, "reject-publish"), []),     # limits removed
    (UpdateConfig(20, 2, None, "drop-head"), [(1, "maxlen"), (2, "maxlen"), (3, "maxlen")])])
def test_a_block_is_lifted_by_removing_the_limits_or_switching_to_drop_head(update, dropped):
    q = Queue(FifoConfig(max_length=4, overflow="reject-publish"))
    q.enqueue(5)
    assert q.state.publishers_blocked
    q(update)
    assert not q.state.publishers_blocked and q.dropped == dropped
    assert q.enqueue(1) == ["ok"]


def test_a_lower_delivery_limit_applies_when_a_message_is_next_returned():
    q = Queue(FifoConfig(delivery_limit=5))
    [_] = q.enqueue(1)
    q(Checkout("c", 1, 0, "conn"))
    for msg_id in (1, 2):
        q(Return("c", (msg_id,)))   # redelivered at once, count 1 then 2
    q(UpdateConfig(1, None, None, "drop-head"))
    assert q.dropped == [] and q.state.checked_out_count == 1   # count 2 > 1: kept for now
    q(Return("c", (3,)))
    assert q.dropped == [(1, "delivery_limit")]


def test_a_ready_message_over_a_lowered_delivery_limit_is_delivered_once_more():
    q = Queue(FifoConfig(delivery_limit=5))
    q.enqueue(1)
    delivery, _left = q(Dequeue("g", False, "conn"))
    q(Return("g", (delivery.msg_id,)))
    q(Return("g", (q(Dequeue("g", False, "conn"))[0].msg_id,)))   # ready, count 2
    q(UpdateConfig(1, None, None, "drop-head"))
    again, _left = q(Dequeue("g", False, "conn"))
    assert again.delivery_count == 2
    q(Return("g", (again.msg_id,)))
    assert q.dropped == [(1, "delivery_limit")]


def test_switching_the_delivery_limit_on_moves_later_returns_near_the_head():
    q = Queue(FifoConfig(delivery_limit=-1))
    q.enqueue(3)
    a, b, c = 1, 2, 3                                  # their raft indexes
    first, _ = q(Dequeue("g", False, "conn"))
    q(Return("g", (first.msg_id,)))                    # -1: a goes to the tail
    q(UpdateConfig(2, None, None, "drop-head"))
    second, _ = q(Dequeue("g", False, "conn"))
    assert second.raft_index == b
    q(Return("g", (second.msg_id,)))                   # now near the head
    order = [q(Dequeue("h", True, "conn"))[0].raft_index for _ in range(3)]
    assert order == [b, c, a]


def test_an_update_to_the_current_settings_changes_no_message():
    q = Queue(FifoConfig(max_length=3, overflow="reject-publish"))
    q.enqueue(4)
    q(Checkout("c", 1, 0, "conn"))
    before = snapshot.load(snapshot.dump(q.state))
    q(UpdateConfig(20, 3, None, "reject-publish"))
    assert q.effects == [] and q.state.publishers_blocked
    before.last_index, before.applied_since_cursor = (q.state.last_index,
                                                      q.state.applied_since_cursor)
    assert snapshot.dump(q.state) == snapshot.dump(before)


def test_a_snapshot_after_an_update_restores_the_new_config():
    q = Queue(FifoConfig(release_cursor_interval=7))
    q.enqueue(3)
    q(UpdateConfig(0, 2, 100, "reject-publish"))
    restored = snapshot.load(snapshot.dump(q.state))
    assert restored.config == FifoConfig(0, 7, 2, 100, "reject-publish")
    assert restored.publishers_blocked
