"""The quorum-queue state machine against RabbitMQ 4.2's quorum queues guide
("Priorities", "Poison Message Handling" and its delivery-limit, "Repeated Requeues")
and RabbitMQ's rabbit_fifo semantics."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from quorumqueue.broker.fifo import leases, snapshot
from quorumqueue.broker.fifo.commands import (Cancel, Checkout, Deliver, Delivery, Dequeue,
                                              Discard, Down, Dropped, Enqueue, LeaseGrow,
                                              LeaseRelease, LeaseReleased, LeaseSettle, Meta,
                                              NodeDown, NodeUp, Purge, ReleaseCursor, Return, Settle, Tick,
                                              UpdateConfig, decode, encode, encode_enqueue,
                                              decode_message)
from quorumqueue.broker.fifo.machine import apply, lowest_live_index
from quorumqueue.broker.fifo.state import FifoConfig, FifoState, LeaseState


class Script:
    """Applies commands at increasing raft indexes; remembers replies and effects."""

    def __init__(self, delivery_limit: int = 20, interval: int = 2048) -> None:
        self.state = FifoState(config=FifoConfig(delivery_limit, interval))
        self.index = 0
        self.time = 1_000

    def __call__(self, command, time=None):
        self.index += 1
        if time is not None:
            self.time = time
        self.state, reply, effects = apply(Meta(self.index, 1, self.time), command, self.state)
        self.reply, self.effects = reply, effects
        return reply

    def enqueue(self, n=1, priority=0, size=10, publisher=""):
        indexes = []
        for _ in range(n):
            self(Enqueue(publisher, self.index + 1, size, priority))
            indexes.append(self.index)
        return indexes

    def delivered(self, consumer=None):
        return [d for e in self.effects if isinstance(e, Deliver)
                and (consumer is None or e.consumer == consumer) for d in e.deliveries]


def test_enqueue_checkout_settle():
    s = Script()
    [a, b] = s.enqueue(2)
    s(Checkout("c1", prefetch=10, priority=0, connection="conn1"))
    assert [(d.msg_id, d.raft_index, d.delivery_count) for d in s.delivered("c1")] == \
        [(1, a, 0), (2, b, 0)]
    assert s(Settle("c1", (1, 2))) == 2
    assert s.state.ready_count == 0 and s.state.checked_out_count == 0


def test_publisher_sequence_deduplication():
    s = Script()
    assert s(Enqueue("pub", 1, 5, 0)) == "ok"
    assert s(Enqueue("pub", 1, 5, 0)) == "duplicate"
    assert s(Enqueue("pub", 2, 5, 0)) == "ok"
    assert s(Enqueue("", 1, 5, 0)) == "ok"  # no publisher id: never de-duplicated
    assert s.state.ready_count == 3


def test_prefetch_limits_and_settle_refills():
    s = Script()
    s.enqueue(5)
    s(Checkout("c", 2, 0, "x"))
    assert len(s.delivered()) == 2
    s(Settle("c", (1,)))
    assert [d.msg_id for d in s.delivered()] == [3]


def test_round_robin_and_consumer_priority():
    """a and b (x-priority 5, prefetch 1) take one each before the priority-0
    consumer gets any; within a priority, consumers alternate."""
    s = Script()
    s(Checkout("low", 0, 0, "x"))
    s(Checkout("a", 1, 5, "x"))
    s(Checkout("b", 1, 5, "x"))
    owners = []
    for _ in range(3):
        s.enqueue(1)
        owners += [e.consumer for e in s.effects if isinstance(e, Deliver)]
    assert sorted(owners[:2]) == ["a", "b"] and owners[2] == "low"


def test_two_priority_levels_served_two_to_one():
    """4.2 guide: priority > 4 is high, served 2:1 against normal."""
    s = Script()
    normal = s.enqueue(3, priority=0)
    high = s.enqueue(4, priority=9)
    order = [s(Dequeue("g", True, "x"))[0].raft_index for _ in range(7)]
    # a high message published after the normal head waits for its turn: 2 high, 1 normal
    assert order == [high[0], high[1], normal[0], high[2], high[3], normal[1], normal[2]]


def test_high_priority_message_older_than_normal_head_goes_first():
    s = Script()
    high = s.enqueue(3, priority=5)
    normal = s.enqueue(1, priority=4)  # 4 is still normal
    order = [s(Dequeue("g", True, "x"))[0].raft_index for _ in range(4)]
    assert order == high + normal


def test_return_goes_near_the_head_with_x_delivery_count():
    s = Script(delivery_limit=20)
    [a, b, c] = s.enqueue(3)
    s(Checkout("c", 1, 0, "x"))
    assert s.delivered()[0].raft_index == a
    s(Return("c", (1,)))
    redelivered = s.delivered()
    assert (redelivered[0].raft_index, redelivered[0].delivery_count) == (a, 1)


def test_without_delivery_limit_returns_go_to_the_tail():
    """4.2 guide: with delivery-limit -1 a returned message goes to the back."""
    s = Script(delivery_limit=-1)
    [a, b, c] = s.enqueue(3)
    d = s(Dequeue("g", False, "x"))[0]
    s(Return("g", (d.msg_id,)))
    order = [s(Dequeue("g2", True, "x"))[0].raft_index for _ in range(3)]
    assert order == [b, c, a]


def test_delivery_limit_drops_after_limit_returns():
    s = Script(delivery_limit=2)
    [a] = s.enqueue(1)
    s(Checkout("c", 1, 0, "x"))
    counts = []
    for _ in range(3):
        delivery = s.delivered()[0]
        counts.append(delivery.delivery_count)
        s(Return("c", (delivery.msg_id,)))
    assert counts == [0, 1, 2]
    assert Dropped(a, "delivery_limit") in s.effects
    assert s.state.ready_count == 0


def test_discard_drops_and_purge_counts_ready_only():
    s = Script()
    [a, b, c] = s.enqueue(3)
    delivery = s(Dequeue("g", False, "x"))[0]
    s(Discard("g", (delivery.msg_id,)))
    assert s.effects[0] == Dropped(a, "rejected")
    s(Dequeue("g", False, "x"))
    assert s(Purge()) == 1  # the checked-out message survives a purge
    assert s.state.checked_out_count == 1


def test_connection_down_returns_messages_with_count_plus_one():
    s = Script()
    s.enqueue(2)
    s(Checkout("c", 10, 0, "conn-1"))
    s(Checkout("other", 10, 0, "conn-2"))
    s(Down("conn-1"))
    assert "c" not in s.state.consumers
    redelivered = s.delivered("other")
    assert [d.delivery_count for d in redelivered] == [1, 1]


def test_cancel_keeps_unacked_settleable():
    s = Script()
    s.enqueue(2)
    s(Checkout("c", 1, 0, "x"))
    s(Cancel("c"))
    assert s.state.consumers["c"].cancelled
    s.enqueue(1)
    assert s.delivered() == []
    assert s(Settle("c", (1,))) == 1
    assert "c" not in s.state.consumers


def test_lease_grow_read_settle_release():
    s = Script()
    idx = s.enqueue(5)
    assert s(LeaseGrow("q1", 3, 0, 60_000)) == (1, 3)
    assert leases.entries(s.state, "q1", 0, 3) == [(1, idx[0], 0), (2, idx[1], 0),
                                                   (3, idx[2], 0)]
    # reads are replayable and settle nothing: a sub-range and the whole range read
    # again give the same rows, and the state is as before
    before = snapshot.dump(s.state)
    assert leases.entries(s.state, "q1", 1, 3) == [(2, idx[1], 0), (3, idx[2], 0)]
    assert leases.entries(s.state, "q1", 0, 3) == [(1, idx[0], 0), (2, idx[1], 0),
                                                   (3, idx[2], 0)]
    assert snapshot.dump(s.state) == before
    assert (s.state.leased_count, s.state.ready_count) == (3, 2)
    assert s(LeaseGrow("q1", 10, 0, 60_000)) == (4, 5)
    assert s(LeaseSettle("q1", 3)) == 3
    with pytest.raises(ValueError):
        leases.entries(s.state, "q1", 0, 3)
    assert s(LeaseRelease("q1")) == 2
    assert s.state.ready_count == 2
    # a later grow continues the sequence; released messages carry delivery count 1
    assert s(LeaseGrow("q1", 10, 0, 60_000)) == (6, 7)
    assert [count for _, _, count in leases.entries(s.state, "q1", 5, 7)] == [1, 1]


def test_a_lease_grow_takes_returned_messages_with_their_delivery_count():
    # delivery-limit -1: a returned message goes to the back of the queue (the 4.2
    # guide) and keeps its count; a grow with no byte limit takes them in one slice
    s = Script(delivery_limit=-1)
    [a, b, c] = s.enqueue(3)
    d = s(Dequeue("g", False, "x"))[0]
    s(Return("g", (d.msg_id,)))
    assert s(LeaseGrow("q1", 5, 0, 0)) == (1, 3)
    assert leases.entries(s.state, "q1", 0, 3) == [(1, b, 0), (2, c, 0), (3, a, 1)]
    assert s.state.ready_count == 0 and s.state.ready_bytes == 0
    assert not s.state.delivery_counts


def test_lease_max_bytes_and_idle_timeout():
    s = Script()
    s.enqueue(10, size=100)
    assert s(LeaseGrow("q", 100, 250, 1000), time=0) == (1, 3)
    s(Tick(), time=500)
    assert s.state.leased_count == 3
    s(Tick(), time=2000)
    assert LeaseReleased("q", "timeout") in s.effects
    assert s.state.leased_count == 0 and s.state.ready_count == 10


def test_release_cursor_is_lowest_live_index():
    s = Script(interval=1)
    [a, b, c] = s.enqueue(3)
    s(Checkout("c", 0, 0, "x"))
    s(Settle("c", (1,)))
    cursors = [e for e in s.effects if isinstance(e, ReleaseCursor)]
    assert cursors and cursors[-1].index == b
    s(Settle("c", (2, 3)))
    cursors = [e for e in s.effects if isinstance(e, ReleaseCursor)]
    assert cursors[-1].index == s.index + 1  # empty: everything applied so far is dead


def test_config_keeps_positional_construction_and_defaults_to_no_limit():
    config = FifoConfig(5, 100)
    assert (config.delivery_limit, config.release_cursor_interval) == (5, 100)
    assert (config.max_length, config.max_bytes, config.overflow) == (None, None, "drop-head")
    assert not config.has_limit


@pytest.mark.parametrize("settings, key", [
    ({"max_length": -1}, "max_length"), ({"max_bytes": "10"}, "max_bytes"),
    ({"max_length": True}, "max_length"), ({"overflow": "reject-publish-dlx"}, "overflow"),
    ({"overflow": "drop_head"}, "overflow")])
def test_impossible_length_limit_settings_fail_naming_the_key(settings, key):
    with pytest.raises(ValueError, match=f"'{key}'"):
        FifoConfig(**settings)


def test_commands_round_trip_through_their_encoding():
    for command in [Checkout("c", 5, -2, "conn"), Cancel("c"), Settle("c", (1, 2, 3)),
                    Return("c", ()), Discard("c", (9,)), Purge(), Down("conn"),
                    Dequeue("g", True, "conn"), LeaseGrow("l", 10, 1 << 40, 5000),
                    LeaseSettle("l", 7), LeaseRelease("l"), LeaseRelease("l", fence=True),
                    Tick(),
                    UpdateConfig(20, None, None, "drop-head"),
                    UpdateConfig(-1, 0, (1 << 63) - 1, "reject-publish"),
                    UpdateConfig(0, 5, None, "reject-publish")]:
        assert decode(encode(command)) == command
    data = encode_enqueue("pub", 7, 9, "ex", "rk", b"HDR", b"body")
    assert decode(data) == Enqueue("pub", 7, 4, 9)
    assert decode_message(data) == ("ex", "rk", b"HDR", b"body")


# ------------------------------------------------------------------ properties

consumers = st.sampled_from(["c1", "c2", "g1"])
enqueues = st.builds(lambda p, pr, size: ("enqueue", p, pr, size),
                     st.sampled_from(["", "p1", "p2"]), st.sampled_from([0, 3, 5, 9]),
                     st.sampled_from([0, 7, 10, 25]))
# each consumer's connection is on a node (`node:run.connection`, as nodes.py reads
# identities): c1 and g1 on n1, c2 on n2; NodeDown and NodeUp (this run or another)
# suspect, reinstate and remove them
_NODE = {"c1": "n1", "g1": "n1", "c2": "n2"}


def _conn(consumer: str) -> str:
    return f"{_NODE[consumer]}:r1.{consumer}"


# a channel's basic.get messages are held under a key of their own ("c1/"), never a
# consumer's (broker/queues/quorum/queue.py basic_get), on the same connection
holders = st.sampled_from(["c1", "c2", "g1", "c1/", "c2/", "g1/"])


other_commands = st.one_of(
    st.builds(lambda c, n, pr: Checkout(c, n, pr, _conn(c)), consumers,
              st.integers(0, 3), st.integers(0, 2)),
    st.builds(Cancel, consumers),
    st.builds(lambda c, k: ("settle", c, k), holders, st.integers(0, 3)),
    st.builds(lambda c, k: ("return", c, k), holders, st.integers(0, 3)),
    st.builds(lambda c, k: ("discard", c, k), holders, st.integers(0, 3)),
    st.just(Purge()),
    st.builds(lambda c: Down(_conn(c)), consumers),
    st.builds(lambda c, s: Dequeue(f"{c}/", s, _conn(c)), consumers, st.booleans()),
    st.builds(lambda nodes: NodeDown(tuple(nodes)),
              st.lists(st.sampled_from(["n1", "n2"]), min_size=1, max_size=2, unique=True)),
    st.builds(lambda n, r: NodeUp(n, f"{n}:{r}"), st.sampled_from(["n1", "n2"]),
              st.sampled_from(["r1", "r1", "r2"])),
    st.builds(lambda n, b: LeaseGrow("L", n, b, 50), st.integers(0, 4), st.integers(0, 30)),
    st.builds(lambda k: ("lease_settle", k), st.integers(0, 6)),
    st.just(LeaseRelease("L")), st.just(LeaseRelease("L", fence=True)),
    st.just(Tick()),
)
# a policy changing the limits (UpdateConfig): about one command in 28
update_configs = st.builds(
    UpdateConfig, delivery_limit=st.sampled_from([-1, 0, 2, 20]),
    max_length=st.none() | st.integers(0, 4), max_bytes=st.none() | st.integers(0, 40),
    overflow=st.sampled_from(["drop-head", "reject-publish"]))
# half enqueues, so queues fill up and length limits are reached and left again
# (not one_of(enqueues, other_commands): Hypothesis flattens nested one_of)
commands = st.booleans().flatmap(
    lambda enqueue: enqueues if enqueue else st.one_of(other_commands, update_configs))


def concrete(step, state: FifoState, seq: list[int]):
    """Turn a generated step into a command valid against the current state."""
    if isinstance(step, tuple):
        kind = step[0]
        if kind == "enqueue":
            seq[0] += 1
            return Enqueue(step[1], seq[0], step[3], step[2])
        if kind == "lease_settle":
            lease = state.leases.get("L")
            return LeaseSettle("L", (lease.first_seq - 1 + step[1]) if lease else step[1])
        consumer = state.consumers.get(step[1])
        ids = tuple(sorted(consumer.checked)[:step[2]]) if consumer else ()
        return {"settle": Settle, "return": Return, "discard": Discard}[kind](step[1], ids)
    return step


def live_indexes(state: FifoState) -> list[int]:
    live = []
    for queue in (state.high, state.normal, state.returns):
        live += [i for i, _ in queue.items()]
    for consumer in state.consumers.values():
        live += [item[0] for item in consumer.checked.values()]
    for lease in state.leases.values():
        live += list(lease.indexes)
    return live


configs = st.builds(
    FifoConfig, delivery_limit=st.sampled_from([-1, 0, 2, 20]),
    release_cursor_interval=st.just(3),
    max_length=st.none() | st.integers(0, 4), max_bytes=st.none() | st.integers(0, 40),
    overflow=st.sampled_from(["drop-head", "reject-publish"]),
    single_active=st.booleans())


def within_limits(state: FifoState) -> bool:
    config = state.config
    return ((config.max_length is None or state.ready_count <= config.max_length)
            and (config.max_bytes is None or state.ready_bytes <= config.max_bytes))


def at_or_below_80_percent(state: FifoState) -> bool:
    """rabbit_fifo's is_below_soft_limit: ready <= trunc(limit * 0.8) for every limit."""
    config = state.config
    return ((config.max_length is None or 5 * state.ready_count <= 4 * config.max_length)
            and (config.max_bytes is None or 5 * state.ready_bytes <= 4 * config.max_bytes))


@settings(max_examples=150, deadline=None)
@given(st.lists(commands, min_size=10, max_size=60), configs, st.integers(0, 60))
def test_snapshot_at_any_point_then_replay_equals_full_replay(steps, config, cut):
    """rabbit_fifo's property: restore from a snapshot and replay the rest == replay all;
    every message is accounted for exactly once; the length limits in force (the
    starting config, then each UpdateConfig's) hold (drop-head: within them after every
    command; reject-publish: over them only while publishers are blocked, and an
    enqueue is rejected exactly when they are)."""
    state, seq, log = FifoState(config=config), [0], []
    enqueued, gone = set(), set()
    for position, step in enumerate(steps, start=1):
        command = concrete(step, state, seq)
        log.append(command)
        meta = Meta(position, 1, position * 20)
        if isinstance(command, Settle) and command.consumer in state.consumers:
            checked = state.consumers[command.consumer].checked
            gone.update(checked[m][0] for m in command.msg_ids if m in checked)
        if isinstance(command, Purge):
            gone.update(i for q in (state.high, state.normal, state.returns)
                        for i, _ in q.items())
        if isinstance(command, LeaseSettle) and "L" in state.leases:
            lease = state.leases["L"]
            count = max(0, min(command.up_to, lease.end_seq) - lease.first_seq + 1)
            gone.update(lease.indexes[:count])
        blocked_before = state.publishers_blocked
        gap_before = (state.enqueuer_gaps.get(command.publisher)
                      if isinstance(command, Enqueue) and command.publisher else None)
        state, reply, effects = apply(meta, command, state)
        if isinstance(command, Enqueue) and reply == "ok":
            enqueued.add(position)
        if isinstance(command, Enqueue) and reply != "duplicate":
            # rejected while blocked, or past the publisher's first unstored rejected seq
            assert (reply == "rejected") == (
                blocked_before or (gap_before is not None and command.seq > gap_before))
        if isinstance(command, UpdateConfig):
            assert reply is None
            assert state.config == FifoConfig(  # x-single-active-consumer: argument only
                command.delivery_limit, config.release_cursor_interval, command.max_length,
                command.max_bytes, command.overflow, single_active=config.single_active)
        if state.config.overflow == "drop-head":
            assert within_limits(state) and not state.publishers_blocked
        else:  # blocked when over a limit; stays blocked until at or below 80% of each
            assert state.publishers_blocked == (
                not within_limits(state)
                or (blocked_before and not at_or_below_80_percent(state)))
            assert not any(isinstance(e, Dropped) and e.reason == "maxlen" for e in effects)
        if isinstance(command, Dequeue) and command.settled and reply is not None:
            gone.add(reply[0].raft_index)
        for effect in effects:
            if isinstance(effect, Dropped):
                gone.add(effect.raft_index)
        live = live_indexes(state)
        assert len(live) == len(set(live)), "a message is in two places"
        assert set(live) | gone == enqueued, "a message was lost or invented"
        assert not set(live) & gone
        lowest = lowest_live_index(state)
        assert lowest == (min(live) if live else None)

    full = snapshot.dump(state)
    cut = cut % (len(log) + 1)
    replayed = FifoState(config=config)
    for position, command in enumerate(log[:cut], start=1):
        replayed, _, _ = apply(Meta(position, 1, position * 20), command, replayed)
    restored = snapshot.load(snapshot.dump(replayed))
    assert restored.config == replayed.config
    assert restored.publishers_blocked == replayed.publishers_blocked
    assert restored.enqueuer_gaps == replayed.enqueuer_gaps
    assert restored.active == replayed.active
    for position, command in enumerate(log[cut:], start=cut + 1):
        restored, _, _ = apply(Meta(position, 1, position * 20), command, restored)
    assert snapshot.dump(restored) == full


def test_metadata_bytes_per_queued_message_is_compact():
    """The state keeps 12 bytes per ready message in typed arrays (goal: <= 32 B)."""
    s = Script()
    for _ in range(10_000):
        s(Enqueue("", 0, 1000, 0))
    per_message = s.state.metadata_bytes() / 10_000
    assert per_message <= 32, per_message


def _copy(state: FifoState) -> FifoState:
    copied = snapshot.load(snapshot.dump(state))
    copied.high_run = state.high_run
    return copied


def _observable(state: FifoState) -> tuple:
    return (snapshot.dump(state), state.high_run, state.ready_bytes, state.ready_count,
            [(q.bytes, len(q)) for q in (state.high, state.normal, state.returns)])


# mostly normal priority and returns to the tail (no delivery limit), so the normal
# queue often holds returned messages, with their delivery counts
normal_enqueues = st.builds(lambda p, pr, size: ("enqueue", p, pr, size),
                            st.sampled_from(["", "p1"]), st.sampled_from([0, 0, 3, 9]),
                            st.sampled_from([0, 7, 25]))
grow_commands = st.booleans().flatmap(lambda e: normal_enqueues if e else other_commands)
grow_configs = st.builds(FifoConfig, delivery_limit=st.sampled_from([-1, -1, 2]),
                         release_cursor_interval=st.just(3))


@settings(max_examples=150, deadline=None)
@given(st.lists(grow_commands, min_size=5, max_size=40), grow_configs, st.integers(0, 6))
def test_a_bulk_lease_grow_assigns_what_one_by_one_assigns(steps, config, count):
    """leases.grow takes the next messages in one slice when all ready ones are in the
    normal queue and no byte limit applies: the same messages, sequences, delivery
    counts and queue bytes as taking them one by one (take_next's order)."""
    state, seq, compared = FifoState(config=config), [0], 0
    for position, step in enumerate(steps, start=1):
        state, _, _ = apply(Meta(position, 1, position * 20), concrete(step, state, seq), state)
        if len(state.high) or len(state.returns):
            continue
        bulk, each = _copy(state), _copy(state)
        for copy in (bulk, each):
            copy.leases.setdefault("B", LeaseState())
        leases._take_normal(count, bulk, bulk.leases["B"])
        leases._take_each(count, 0, each, each.leases["B"], [])
        assert _observable(bulk) == _observable(each)
        taken = min(count, len(state.normal))
        assert len(bulk.leases["B"].indexes) == taken
        compared += taken > 0
    # an example where no grow of one or more messages took any compared nothing
    assume(compared > 0 or count == 0)
    # and through the machine: a grow with no byte limit answers as before
    if not len(state.high) and not len(state.returns):
        grown, reply, _ = apply(Meta(len(steps) + 1, 1, 0), LeaseGrow("B", count, 0, 0),
                                _copy(state))
        assert reply == (1, min(count, len(state.normal)))


@settings(max_examples=150, deadline=None)
@given(st.lists(grow_commands, min_size=5, max_size=60), grow_configs)
def test_serving_one_consumer_in_one_pass_hands_out_what_one_by_one_does(steps, config):
    """serving.py serves a lone consumer from the normal queue in one pass
    (`_serve_one_from_normal`): every command's reply and effects (the Deliver's
    message ids, indexes, delivery counts, redelivered) and the state after it are
    those of taking the messages one at a time (`_serve_in_turn`), as a replay on
    another member must reproduce."""
    from quorumqueue.broker.fifo import serving

    def one_by_one(state, key, consumer, effects):
        serving._serve_in_turn(state, [(key, consumer)], effects)

    fast, seq_fast, slow, seq_slow = FifoState(config=config), [0], FifoState(config=config), [0]
    served = 0
    for position, step in enumerate(steps, start=1):
        meta = Meta(position, 1, position * 20)
        fast, fast_reply, fast_effects = apply(meta, concrete(step, fast, seq_fast), fast)
        bulk = serving._serve_one_from_normal
        serving._serve_one_from_normal = one_by_one
        try:
            slow, slow_reply, slow_effects = apply(meta, concrete(step, slow, seq_slow), slow)
        finally:
            serving._serve_one_from_normal = bulk
        assert (fast_reply, fast_effects) == (slow_reply, slow_effects)
        assert (_observable(fast), fast.rotation) == (_observable(slow), slow.rotation)
        served += any(isinstance(effect, Deliver) for effect in fast_effects)
    assume(served > 0)


# queues the short way of `apply` applies to (no limits, no single active consumer),
# and others; UpdateConfig steps add and remove limits on the way
quiet_or_not = st.one_of(st.builds(FifoConfig, delivery_limit=st.sampled_from([-1, 2, 20]),
                                   release_cursor_interval=st.sampled_from([3, 50])),
                         configs)


# a keyed publisher's re-send: seq `back` below the latest one given out, so a
# duplicate, a gap filled, or a seq stored late (the idempotent-replay case)
resends = st.builds(lambda p, back: ("resend", p, back), st.sampled_from(["p1", "p2"]),
                    st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(st.lists(commands | resends, min_size=10, max_size=80), quiet_or_not)
def test_a_quiet_enqueue_taken_the_short_way_is_what_the_full_way_gives(steps, config):
    """`apply` stores an Enqueue nothing watches (no consumers, no limits or TTLs, the
    release cursor not due), keyed or not, without its aftercare: the same reply,
    effects and state (its snapshot and counters) as the full way, forced here by
    clearing the config's quiet_enqueue before every command. Re-sent keyed seqs
    give duplicates, also into an empty queue (a release cursor then)."""
    short, full = FifoState(config=replace(config)), FifoState(config=replace(config))
    seq = [0]
    for position, step in enumerate(steps, start=1):
        if isinstance(step, tuple) and step[0] == "resend":
            command = Enqueue(step[1], max(1, seq[0] - step[2]), 10, 0)
        else:
            command = concrete(step, short, seq)
        meta = Meta(position, 1, position * 20)
        full.config.quiet_enqueue = False
        short, reply, effects = apply(meta, command, short)
        full, full_reply, full_effects = apply(meta, command, full)
        assert (reply, effects) == (full_reply, full_effects)
        assert snapshot.dump(short) == snapshot.dump(full)
        assert (short.now_ms, short.last_active) == (full.now_ms, full.last_active)


# a batch publish's messages: a run of Enqueues of publisher "pb", seqs from `back`
# below the next one (a re-send overlapping stored ones) on, applied one after another
batches = st.builds(lambda back, count, size: ("batch", back, count, size),
                    st.integers(0, 4), st.integers(1, 6), st.sampled_from([0, 7, 25]))


@settings(max_examples=200, deadline=None)
@given(st.lists(commands | batches, min_size=5, max_size=60), configs)
def test_after_a_refused_seq_every_later_seq_of_a_batch_is_refused(steps, config):
    """A run of one publisher's increasing seqs, applied in turn (what a batch publish
    proposes): once one is refused ("rejected", reject-publish), so is every later
    one (the publisher's gap, docs/behaviour/idempotent-publishing.md). So the last
    message's reply is "rejected" exactly when any message's is: the one reply a
    batch publish's confirm waits for (groups/replicated.py `RunWaiter`)."""
    state, seq, next_seq, index = FifoState(config=replace(config)), [0], 1, 0
    for step in steps:
        if isinstance(step, tuple) and step[0] == "batch":
            _kind, back, count, size = step
            first = max(1, next_seq - back)
            replies = []
            for k in range(count):
                index += 1
                state, reply, _ = apply(Meta(index, 1, index * 10),
                                        Enqueue("pb", first + k, size, 0), state)
                replies.append(reply)
            next_seq = max(next_seq, first + count)
            refused = [reply == "rejected" for reply in replies]
            assert refused == sorted(refused)  # never stored after a refusal
            assert (replies[-1] == "rejected") == any(refused)
        else:
            index += 1
            state, _, _ = apply(Meta(index, 1, index * 10), concrete(step, state, seq), state)
