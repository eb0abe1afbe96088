"""Message TTL and dead-letter drops in the fifo machine, against the quorum queues
guide ("Queue and Per-Message TTL", "Poison Message Handling", "Dead Lettering")
and the TTL guide (the lower of queue and message TTL wins; TTL 0 expires unless
delivered at once; an expired message is never delivered). Time is the leader's,
in each command's Meta: nothing here waits."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.fifo import snapshot
from quorumqueue.broker.fifo.commands import (Checkout, Deliver, Dequeue, Discard, Down,
                                              Dropped, Enqueue, LeaseGrow, LeaseRelease, Meta,
                                              QueueExpired, Return, Settle, Tick,
                                              UpdateConfig, decode,
                                              encode, encode_enqueue)
from quorumqueue.broker.fifo.machine import apply, next_expiry, queue_expiry
from quorumqueue.broker.fifo.state import FifoConfig, FifoState
from quorumqueue.broker.amqp.properties import encode_properties

from .test_machine import Script, concrete, live_indexes, other_commands


def dropped(effects, reason=None):
    return [e.raft_index for e in effects
            if isinstance(e, Dropped) and (reason is None or e.reason == reason)]


def delivered(effects):
    return [d.raft_index for e in effects if isinstance(e, Deliver) for d in e.deliveries]


def test_queue_ttl_expires_at_the_head_on_a_tick_without_any_consumer():
    s = Script()
    s(UpdateConfig(20, None, None, "drop-head", msg_ttl=100), time=1_000)
    [a, b] = s.enqueue(2)
    assert next_expiry(s.state) == 1_100
    s(Tick(), time=1_099)
    assert s.state.ready_count == 2 and not dropped(s.effects)
    s(Tick(), time=1_100)
    assert dropped(s.effects, "expired") == [a, b] and s.state.ready_count == 0
    assert next_expiry(s.state) is None


def test_the_lower_of_message_and_queue_ttl_wins():
    s = Script()
    s(UpdateConfig(20, None, None, "drop-head", msg_ttl=500), time=0)
    s(Enqueue("", 0, 10, 0, ttl=50), time=0)          # message TTL lower: 50
    short = s.index
    s(Enqueue("", 0, 10, 0, ttl=5_000), time=0)       # queue TTL lower: 500
    long = s.index
    s(Tick(), time=60)
    assert dropped(s.effects, "expired") == [short]
    s(Tick(), time=499)
    assert not dropped(s.effects)
    s(Tick(), time=500)
    assert dropped(s.effects, "expired") == [long]


def test_an_expired_message_behind_the_head_is_never_delivered():
    """Only heads expire (as in RabbitMQ), but what reaches the head expired is dropped
    there, never handed out."""
    s = Script()
    s(Enqueue("", 0, 10, 0, ttl=10_000), time=0)
    first = s.index
    s(Enqueue("", 0, 10, 0, ttl=10), time=0)
    second = s.index
    s(Tick(), time=100)
    assert s.state.ready_count == 2                     # the head has not expired
    s(Checkout("c", 5, 0, "conn"), time=100)
    assert delivered(s.effects) == [first] and dropped(s.effects, "expired") == [second]


def test_ttl_zero_is_delivered_to_a_waiting_consumer_or_expires_at_once():
    s = Script()
    s(UpdateConfig(20, None, None, "drop-head", msg_ttl=0), time=0)
    [a] = s.enqueue(1)
    assert dropped(s.effects, "expired") == [a] and s.state.ready_count == 0
    s(Checkout("c", 1, 0, "conn"))
    [b] = s.enqueue(1)
    assert delivered(s.effects) == [b] and not dropped(s.effects)
    [c] = s.enqueue(1)                                   # prefetch 1 is full
    assert dropped(s.effects, "expired") == [c]
    assert s(Dequeue("g", True, "conn")) is None         # nothing left to get


def test_a_returned_message_keeps_its_expiry_and_a_checked_out_one_does_not_expire():
    s = Script()
    s(Enqueue("", 0, 10, 0, ttl=100), time=0)
    a = s.index
    s(Checkout("c", 1, 0, "conn"), time=0)
    s(Tick(), time=1_000)                                # checked out: not expired
    assert not dropped(s.effects) and s.state.checked_out_count == 1
    s(Return("c", (1,)), time=1_000)
    assert dropped(s.effects, "expired") == [a]
    assert not delivered(s.effects) and s.state.expiries_out == {}


def test_dead_letter_reasons_rejected_delivery_limit_and_maxlen():
    s = Script(delivery_limit=1)
    [a, b] = s.enqueue(2)
    s(Checkout("c", 2, 0, "conn"))
    s(Discard("c", (1,)))
    assert s.effects == [Dropped(a, "rejected")]
    s(Return("c", (2,)))                                 # delivery count 1: requeued
    assert not dropped(s.effects)
    s(Return("c", (3,)))                                 # count 2 > limit 1
    assert dropped(s.effects, "delivery_limit") == [b]
    s(UpdateConfig(1, 1, None, "drop-head"))
    s(Down("conn"))
    [c, d] = s.enqueue(2)
    assert dropped(s.effects, "maxlen") == [c]


def test_update_config_carries_the_message_ttl_in_its_own_tag():
    plain = UpdateConfig(20, None, None, "drop-head")
    with_ttl = UpdateConfig(20, 3, None, "reject-publish", msg_ttl=60_000)
    assert encode(plain)[0] == 14 and decode(encode(plain)) == plain
    assert encode(with_ttl)[0] == 15 and decode(encode(with_ttl)) == with_ttl


def test_an_enqueue_reads_its_ttl_from_the_expiration_property():
    header = encode_properties(4, {"expiration": "1500", "headers": {"a": 1},
                                   "delivery_mode": 2, "correlation_id": "x"})
    data = encode_enqueue("", 0, 0, "ex", "rk", header, b"body")
    assert decode(data) == Enqueue("", 0, 4, 0, ttl=1500)
    for bad in ("soon", "-5", ""):
        header = encode_properties(4, {"expiration": bad})
        assert decode(encode_enqueue("", 0, 0, "", "q", header, b"body")).ttl is None
    plain = encode_enqueue("", 0, 0, "", "q", encode_properties(4, {}), b"body")
    assert decode(plain).ttl is None


def test_a_queue_without_ttl_keeps_no_expiry_array():
    s = Script()
    s.enqueue(1000)
    assert s.state.normal.expiries is None
    with_ttl = Script()
    with_ttl(UpdateConfig(20, None, None, "drop-head", msg_ttl=60_000))
    with_ttl.enqueue(1000)
    # 8 bytes more per message for the expiry (the guide's 4.x figure is 2 bytes)
    per_message = (with_ttl.state.metadata_bytes() - s.state.metadata_bytes()) / 1000
    assert 8 <= per_message < 9


# ------------------------------------------------------------------ properties

ttl_enqueues = st.builds(lambda pr, ttl: ("enqueue", pr, ttl), st.sampled_from([0, 9]),
                         st.sampled_from([None, None, 0, 15, 60, 400]))
ttl_updates = st.builds(lambda ttl, limit: UpdateConfig(limit, None, None, "drop-head",
                                                        msg_ttl=ttl),
                        st.sampled_from([None, 0, 30, 200]), st.sampled_from([-1, 1, 20]))
steps = st.lists(st.tuples(
    st.booleans().flatmap(lambda enqueue: ttl_enqueues if enqueue
                          else st.one_of(other_commands, ttl_updates, st.just(Tick()))),
    st.integers(0, 40)), min_size=10, max_size=60)


def _command(step, state, seq):
    if isinstance(step, tuple) and step[0] == "enqueue":
        seq[0] += 1
        return Enqueue("", seq[0], 10, step[1], ttl=step[2])
    return concrete(step, state, seq)


def _expiry(command: Enqueue, config: FifoConfig, now: int) -> int | None:
    ttls = [t for t in (command.ttl, config.msg_ttl) if t is not None]
    return now + min(ttls) if ttls else None


@settings(max_examples=300, deadline=None)
@given(steps, st.sampled_from([None, 0, 30, 200]), st.integers(0, 60))
def test_no_message_is_both_delivered_and_dropped_and_none_is_delivered_expired(
        generated, queue_ttl, cut):
    """Whatever the commands and the times between them: a message handed out
    (Deliver, basic.get, lease) had not expired (a TTL-0 message only in its own
    enqueue's command); a dropped message is never handed out again nor dropped
    twice; "expired" drops only expired messages; and restoring a snapshot taken at
    any point, then replaying the same log, equals the full replay."""
    config = FifoConfig(delivery_limit=2, release_cursor_interval=3, msg_ttl=queue_ttl)
    state, seq, log = FifoState(config=config), [0], []
    expiries: dict[int, int | None] = {}
    gone: set[int] = set()
    now = 1_000
    for position, (step, advance) in enumerate(generated, start=1):
        now += advance
        command = _command(step, state, seq)
        log.append((command, now))
        leased_before = set(state.leases["L"].indexes) if "L" in state.leases else set()
        config_before = state.config
        state, reply, effects = apply(Meta(position, 1, now), command, state)
        if isinstance(command, Enqueue) and reply == "ok":
            expiries[position] = _expiry(command, config_before, now)
        handed = delivered(effects)
        if isinstance(command, Dequeue) and reply is not None:
            handed.append(reply[0].raft_index)
        if isinstance(command, LeaseGrow) and "L" in state.leases:
            handed += [i for i in state.leases["L"].indexes if i not in leased_before]
        for index in handed:
            expiry = expiries[index]
            assert index not in gone, "a dropped or settled message was handed out"
            assert expiry is None or expiry > now or (expiry == now and index == position), \
                "an expired message was handed out"
        if isinstance(command, Dequeue) and reply is not None and command.settled:
            gone.add(reply[0].raft_index)
        for effect in effects:
            if isinstance(effect, Dropped):
                assert effect.raft_index not in gone, "dropped twice"
                gone.add(effect.raft_index)
                if effect.reason == "expired":
                    assert expiries[effect.raft_index] is not None
                    assert expiries[effect.raft_index] <= now
        if isinstance(command, Settle):
            gone.update(i for i in expiries if i not in live_indexes(state)
                        and i not in gone)
        live = live_indexes(state)
        assert not set(live) & gone
        assert set(state.expiries_out) <= set(live)

    full = snapshot.dump(state)
    cut = cut % (len(log) + 1)
    replayed = FifoState(config=config)
    for position, (command, at) in enumerate(log[:cut], start=1):
        replayed, _, _ = apply(Meta(position, 1, at), command, replayed)
    restored = snapshot.load(snapshot.dump(replayed))
    for position, (command, at) in enumerate(log[cut:], start=cut + 1):
        restored, _, _ = apply(Meta(position, 1, at), command, restored)
    assert snapshot.dump(restored) == full
    again = FifoState(config=config)
    for position, (command, at) in enumerate(log, start=1):
        again, _, _ = apply(Meta(position, 1, at), command, again)
    assert snapshot.dump(again) == full


def test_lease_release_requeues_with_expiry_and_expired_messages_are_not_leased():
    s = Script()
    s(Enqueue("", 0, 10, 0, ttl=100), time=0)
    a = s.index
    s(Enqueue("", 0, 10, 0, ttl=10), time=0)
    s(LeaseGrow("L", 1, 0, 0), time=0)
    assert list(s.state.leases["L"].indexes) == [a]
    s(LeaseGrow("L", 5, 0, 0), time=50)                  # the second expired at 10
    assert list(s.state.leases["L"].indexes) == [a] and s.state.ready_count == 0
    s(LeaseRelease("L"), time=200)
    assert dropped(s.effects, "expired") == [a]


# ------------------------------------------------------------------ queue TTL (x-expires)


def expired(effects):
    return [e for e in effects if isinstance(e, QueueExpired)]


def test_an_unused_queue_expires_and_a_consumer_or_a_get_renews_it():
    """x-expires as rabbit_fifo's is_expired: no consumer and unused for longer than
    the period; a consumer or a basic.get is use, publishing is not."""
    s = Script()
    s(UpdateConfig(20, None, None, "drop-head", expires=1_000), time=10_000)
    s(Tick(), time=10_500)
    s.enqueue(1)                                         # publishing is not use
    s(Tick(), time=11_000)
    assert not expired(s.effects)
    s(Tick(), time=11_001)
    assert expired(s.effects) == [QueueExpired(1_001)]
    s(Dequeue("g", True, "conn"), time=11_500)           # a basic.get renews
    s(Tick(), time=12_400)
    assert not expired(s.effects)
    s(Checkout("c", 1, 0, "conn"), time=12_400)
    s(Tick(), time=99_000)                               # a consumer: never expires
    assert not expired(s.effects) and queue_expiry(s.state) is None
    s(Down("conn"), time=99_000)                         # gone: the period starts
    assert queue_expiry(s.state) == 100_001
    s(Tick(), time=100_001)
    assert expired(s.effects) == [QueueExpired(1_001)]


def test_a_new_queue_starts_its_period_at_the_first_tick():
    s = Script()
    s.state.config = FifoConfig(expires=500)             # declared with x-expires
    assert queue_expiry(s.state) == 0                    # the leader ticks at once
    s(Tick(), time=5_000)
    assert not expired(s.effects) and queue_expiry(s.state) == 5_501
    s(Tick(), time=5_501)
    assert expired(s.effects)


def test_update_config_carries_the_queue_expiry():
    command = UpdateConfig(20, None, None, "drop-head", expires=30_000)
    assert encode(command)[0] == 15 and decode(encode(command)) == command
    state = FifoState(config=FifoConfig(expires=30_000))
    state.last_active = 1234
    restored = snapshot.load(snapshot.dump(state))
    assert restored.config.expires == 30_000 and restored.last_active == 1234
