"""At-least-once dead lettering in the fifo machine (the quorum queues guide, "Dead
Lettering": "the source quorum queue will retain the dead-lettered messages until they
have been acknowledged", they "contribute to the queue resource limits", and a strategy
change away from at-least-once deletes them), after rabbit_fifo_dlx."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.fifo import snapshot
from quorumqueue.broker.fifo.commands import (Cancel, Checkout, Deliver, Dequeue, Discard,
                                              DlxCheckout, DlxDeliver, DlxDelivery, DlxSettle,
                                              Down, Dropped, Enqueue, LeaseGrow, LeaseSettle,
                                              Meta, Purge, Return, Settle, Tick, UpdateConfig,
                                              decode, encode)
from quorumqueue.broker.fifo.machine import apply, lowest_live_index
from quorumqueue.broker.fifo.state import FifoConfig, FifoState, fifo_config

AT_LEAST_ONCE = FifoConfig(overflow="reject-publish", dead_letter_at_least_once=True)


class Script:
    def __init__(self, config: FifoConfig = AT_LEAST_ONCE) -> None:
        self.state = FifoState(config=config)
        self.index = 0

    def __call__(self, command, time: int = 1_000):
        self.index += 1
        self.state, self.reply, self.effects = apply(Meta(self.index, 1, time), command,
                                                     self.state)
        return self.reply

    def dlx_delivered(self):
        return [d for e in self.effects if isinstance(e, DlxDeliver) for d in e.deliveries]


def test_the_strategy_is_in_force_only_with_an_exchange_and_reject_publish():
    base = {"x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish"}
    assert fifo_config(base).dead_letter_at_least_once
    # drop-head (the default overflow): RabbitMQ falls back to at-most-once
    assert not fifo_config({**base, "x-overflow": "drop-head"}).dead_letter_at_least_once
    assert not fifo_config({k: v for k, v in base.items()
                            if k != "x-overflow"}).dead_letter_at_least_once
    # no dead-letter exchange: no dead lettering at all (rabbit_quorum_queue's dlh)
    assert not fifo_config({k: v for k, v in base.items()
                            if k != "x-dead-letter-exchange"}).dead_letter_at_least_once
    assert not fifo_config({**base, "x-dead-letter-strategy": "at-most-once"}) \
        .dead_letter_at_least_once


def test_a_rejected_message_is_held_until_the_worker_settles_it():
    s = Script()
    s(Enqueue("", 0, 10, 0))
    s(Checkout("c", 0, 0, "conn"))
    s(Discard("c", (1,)))
    assert not any(isinstance(e, Dropped) for e in s.effects)  # held, not dropped
    assert s.state.dlx.count == 1 and s.state.dlx.bytes == 10
    assert lowest_live_index(s.state) == 1  # its log entry stays
    s(DlxCheckout("w1", 32))
    assert s.dlx_delivered() == [DlxDelivery(1, 1, "rejected")]
    assert s(DlxSettle("w1", (1,))) == 1
    assert s.state.dlx.count == 0 and s.state.dlx.bytes == 0
    assert lowest_live_index(s.state) is None


def test_the_worker_prefetch_bounds_what_is_checked_out():
    s = Script(FifoConfig(overflow="reject-publish", dead_letter_at_least_once=True,
                          msg_ttl=0))
    s(DlxCheckout("w1", 2))
    for _ in range(5):
        s(Enqueue("", 0, 10, 0))  # TTL 0, no consumer: each expires at once
    assert s.state.dlx.count == 5 and len(s.state.dlx.consumer.checked) == 2
    s(DlxSettle("w1", (1,)))
    assert [d.raft_index for d in s.dlx_delivered()] == [4]
    assert all(d.reason == "expired" for d in s.dlx_delivered())
    assert s.state.dlx.count == 4


def test_a_new_worker_gets_what_the_old_one_had_not_settled_in_order():
    """The leader moved: its successor's worker registers; the old worker's checked
    out messages are redelivered first (duplicates at the target are allowed, loss
    is not), and a late settle from the old worker is ignored."""
    s = Script()
    s(Checkout("c", 0, 0, "conn"))
    for _ in range(4):
        s(Enqueue("", 0, 10, 0))
    s(DlxCheckout("old", 2))
    s(Discard("c", (1, 2, 3, 4)))
    assert [(d.msg_id, d.raft_index) for d in s.dlx_delivered()] == [(1, 2), (2, 3)]
    s(DlxCheckout("new", 3))
    assert [(d.msg_id, d.raft_index) for d in s.dlx_delivered()] == [(3, 2), (4, 3), (5, 4)]
    assert s(DlxSettle("old", (1, 2))) == 0
    assert s.state.dlx.count == 4
    assert s(DlxSettle("new", (3, 4, 5))) == 3 and s.state.dlx.count == 1


def test_held_dead_letters_count_towards_the_length_limit():
    """The guide: held dead letters "contribute to the queue resource limits", so the
    queue refuses publishes until some are removed."""
    s = Script(FifoConfig(max_length=2, overflow="reject-publish",
                          dead_letter_at_least_once=True))
    s(Checkout("c", 0, 0, "conn"))
    for _ in range(3):
        s(Enqueue("", 0, 10, 0))
    s(Discard("c", (1, 2, 3)))
    assert s.state.ready_count == 0 and s.state.dlx.count == 3
    assert s(Enqueue("", 0, 10, 0)) == "rejected"
    s(DlxCheckout("w", 32))
    s(DlxSettle("w", (1, 2, 3)))
    assert not s.state.publishers_blocked
    assert s(Enqueue("", 0, 10, 0)) == "ok"


def test_switching_away_from_at_least_once_deletes_the_held_dead_letters():
    s = Script()
    s(Checkout("c", 0, 0, "conn"))
    s(Enqueue("", 0, 10, 0))
    s(Enqueue("", 0, 10, 0))
    s(DlxCheckout("w", 1))
    s(Discard("c", (1, 2)))
    s(UpdateConfig(20, None, None, "drop-head"))
    assert s.state.dlx.count == 0 and s.state.dlx.consumer is None
    assert not any(isinstance(e, Dropped) for e in s.effects)  # deleted, not dead-lettered
    assert lowest_live_index(s.state) is None
    s(Enqueue("", 0, 10, 0))
    s(Discard("c", (3,)))
    assert [e for e in s.effects if isinstance(e, Dropped)] == [Dropped(7, "rejected")]


def test_purge_leaves_held_dead_letters():
    s = Script()
    s(Checkout("c", 1, 0, "conn"))
    s(Enqueue("", 0, 10, 0))
    s(Enqueue("", 0, 10, 0))
    s(Discard("c", (1,)))
    assert s(Purge()) == 0  # the second went to the consumer
    assert s.state.dlx.count == 1


def test_dlx_commands_round_trip_through_their_encoding():
    for command in [DlxCheckout("node-a/boot/7", 32), DlxSettle("w", (1, 5, 9)),
                    UpdateConfig(20, None, None, "reject-publish", None, None, True),
                    UpdateConfig(3, 10, None, "reject-publish", 500, None, True)]:
        assert decode(encode(command)) == command
    assert encode(UpdateConfig(20, None, None, "reject-publish", None, None, True))[0] == 18
    assert encode(UpdateConfig(20, None, None, "reject-publish"))[0] == 14


# ------------------------------------------------------------------ properties

consumers = st.sampled_from(["c1", "c2"])
steps = st.one_of(
    st.builds(lambda size: ("enqueue", size), st.sampled_from([0, 7, 10, 25])),
    st.builds(lambda size: ("enqueue", size), st.sampled_from([5, 10])),
    st.builds(lambda c, n: Checkout(c, n, 0, "conn-" + c), consumers, st.integers(0, 3)),
    st.builds(Cancel, consumers),
    st.builds(lambda c, k: ("settle", c, k), consumers, st.integers(0, 3)),
    st.builds(lambda c, k: ("return", c, k), consumers, st.integers(0, 3)),
    st.builds(lambda c, k: ("discard", c, k), consumers, st.integers(0, 3)),
    st.builds(lambda c: Down("conn-" + c), consumers),
    st.builds(lambda c, s: Dequeue(c, s, "conn-" + c), consumers, st.booleans()),
    st.builds(lambda n: LeaseGrow("L", n, 0, 0), st.integers(0, 3)),
    st.builds(lambda k: ("lease_settle", k), st.integers(0, 3)),
    st.just(Purge()),
    st.just(Tick()),
    # a worker keeps its prefetch (the node's worker identity changes with the term)
    st.builds(lambda w: DlxCheckout(w, int(w[1])), st.sampled_from(["w1", "w2", "w3"])),
    st.builds(lambda k: ("dlx_settle", k), st.integers(0, 3)),
    st.builds(lambda w, k: ("dlx_settle_as", w, k), st.sampled_from(["w1", "w2", "w3"]),
              st.integers(0, 3)),
    st.builds(lambda alo, length: UpdateConfig(1, length, None, "reject-publish", 40, None,
                                               alo),
              st.sampled_from([True, True, True, False]), st.none() | st.integers(1, 4)),
)
configs = st.builds(lambda limit, length: FifoConfig(
    delivery_limit=limit, release_cursor_interval=3, max_length=length,
    overflow="reject-publish", msg_ttl=40, dead_letter_at_least_once=True),
    st.sampled_from([-1, 0, 1, 2]), st.none() | st.integers(1, 4))


def concrete(step, state: FifoState, seq: list[int]):
    if not isinstance(step, tuple):
        return step
    kind = step[0]
    if kind == "enqueue":
        seq[0] += 1
        return Enqueue("p", seq[0], step[1], 0)
    if kind == "lease_settle":
        lease = state.leases.get("L")
        return LeaseSettle("L", (lease.first_seq - 1 + step[1]) if lease else step[1])
    if kind in ("dlx_settle", "dlx_settle_as"):
        consumer = state.dlx.consumer
        worker = consumer.worker if consumer and kind == "dlx_settle" else step[1]
        ids = tuple(sorted(consumer.checked)[:step[-1]]) if consumer else (1,)
        return DlxSettle(worker, ids)
    consumer = state.consumers.get(step[1])
    ids = tuple(sorted(consumer.checked)[:step[2]]) if consumer else ()
    return {"settle": Settle, "return": Return, "discard": Discard}[kind](step[1], ids)


def held(state: FifoState) -> list[tuple[int, int]]:
    """(raft index, size) of every held dead letter."""
    items = [(i, size) for i, size, _reason in state.dlx.discards]
    if state.dlx.consumer is not None:
        items += [(i, size) for i, size, _reason in state.dlx.consumer.checked.values()]
    return items


def client_held(state: FifoState) -> list[int]:
    live = [i for q in (state.high, state.normal, state.returns) for i, _ in q.items()]
    live += [item[0] for c in state.consumers.values() for item in c.checked.values()]
    live += [i for lease in state.leases.values() for i in lease.indexes]
    return live


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, min_size=10, max_size=70), configs, st.integers(0, 70))
def test_no_message_is_both_delivered_and_dead_lettered(steps, config, cut):
    """With at-least-once dead lettering: a message is consumed (settled by a client)
    or dead-lettered (held, then settled by the worker), never both; once dead it is
    never handed to a client again; every held dead letter is counted (count and
    bytes), is live (release cursor), is checked out to the current worker within its
    prefetch, and leaves only by the current worker's settle or a switch away from
    at-least-once; nothing is lost or invented; and restoring a snapshot at any point
    and replaying equals the full replay."""
    state, seq, log = FifoState(config=config), [0], []
    enqueued, consumed, dead, dead_gone, purged = set(), set(), set(), set(), set()
    dropped_total: set[int] = set()
    sizes: dict[int, int] = {}
    for position, step in enumerate(steps, start=1):
        command = concrete(step, state, seq)
        log.append(command)
        before_held = {i for i, _ in held(state)}
        before_client = set(client_held(state))
        if isinstance(command, Settle) and command.consumer in state.consumers:
            checked = state.consumers[command.consumer].checked
            consumed.update(checked[m][0] for m in command.msg_ids if m in checked)
        if isinstance(command, LeaseSettle) and "L" in state.leases:
            lease = state.leases["L"]
            count = max(0, min(command.up_to, lease.end_seq) - lease.first_seq + 1)
            consumed.update(lease.indexes[:count])
        if isinstance(command, Purge):
            purged.update(i for q in (state.high, state.normal, state.returns)
                          for i, _ in q.items())
        worker_before = state.dlx.consumer.worker if state.dlx.consumer else None
        state, reply, effects = apply(Meta(position, 1, position * 20), command, state)
        if isinstance(command, Enqueue) and reply == "ok":
            enqueued.add(position)
            sizes[position] = command.size
        if isinstance(command, Dequeue) and command.settled and reply is not None:
            consumed.add(reply[0].raft_index)
        now_held = {i for i, _ in held(state)}
        dead |= now_held
        left = before_held - now_held
        if left:  # only the current worker's settle, or a switch away, removes them
            assert (isinstance(command, DlxSettle) and command.worker == worker_before) or (
                isinstance(command, UpdateConfig) and not command.dead_letter_at_least_once)
        dead_gone |= left
        handed = {d.raft_index for e in effects if isinstance(e, Deliver)
                  for d in e.deliveries}
        if isinstance(command, Dequeue) and reply is not None:
            handed.add(reply[0].raft_index)
        handed |= set(client_held(state)) - before_client
        assert not handed & dead, "a dead-lettered message was handed to a client"
        assert not consumed & dead, "a message was both consumed and dead-lettered"
        dropped = {e.raft_index for e in effects if isinstance(e, Dropped)}
        assert not dropped or not state.config.dead_letter_at_least_once
        dropped_total |= dropped
        dead |= dropped
        for effect in effects:
            if isinstance(effect, DlxDeliver):
                assert effect.worker == state.dlx.consumer.worker
                assert {d.raft_index for d in effect.deliveries} <= now_held
        # counted: count and bytes match what is held; within the worker's prefetch
        items = held(state)
        assert state.dlx.count == len(items)
        assert state.dlx.bytes == sum(size for _i, size in items)
        assert all(size == sizes[i] for i, size in items)
        if state.dlx.consumer is not None:
            assert len(state.dlx.consumer.checked) <= state.dlx.consumer.prefetch
            assert not state.dlx.discards or (
                len(state.dlx.consumer.checked) == state.dlx.consumer.prefetch)
        # accounted for exactly once
        live = client_held(state) + [i for i, _ in items]
        assert len(live) == len(set(live)), "a message is in two places"
        gone = consumed | dead_gone | purged | dropped_total
        assert set(live) | gone == enqueued, "a message was lost or invented"
        assert not set(live) & gone
        assert lowest_live_index(state) == (min(live) if live else None)

    full = snapshot.dump(state)
    cut = cut % (len(log) + 1)
    replayed = FifoState(config=config)
    for position, command in enumerate(log[:cut], start=1):
        replayed, _, _ = apply(Meta(position, 1, position * 20), command, replayed)
    restored = snapshot.load(snapshot.dump(replayed))
    for position, command in enumerate(log[cut:], start=cut + 1):
        restored, _, _ = apply(Meta(position, 1, position * 20), command, restored)
    assert snapshot.dump(restored) == full
