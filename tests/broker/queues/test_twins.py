"""broker/queues' hand-inlined copies ("twins") agree with their originals."""
from __future__ import annotations

import struct
from dataclasses import replace
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.fifo import snapshot
from quorumqueue.broker.fifo.commands import (Enqueue, Meta, Settle, UpdateConfig, encode,
                                              encode_enqueue)
from quorumqueue.broker.fifo.envelope import decode_entry, stamp
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import FifoState
from quorumqueue.broker.groups.replicated import ReplicatedGroup, RunWaiter
from quorumqueue.broker.queues.base import Confirm
from quorumqueue.broker.queues.quorum import deliveries
from quorumqueue.broker.queues.quorum.groups import QuorumGroups
from quorumqueue.broker.raft import COMMAND
from quorumqueue.broker.raft.forwarded import AppliedIds, Identity, wrap
from quorumqueue.broker.raft.types import NOOP

from ..fifo.test_machine import commands as machine_commands, concrete, quiet_or_not
from .test_confirm import ANSWERED, Channel


def _seen(confirm: Confirm) -> tuple:
    return confirm.ok, confirm.outstanding, confirm.channel.answered


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["rejected", None, 0]),
       st.lists(st.sampled_from(["ok", "rejected", "duplicate", None, 0, 1]), max_size=8))
def test_a_held_reply_answers_as_answer_of_reply_not_refused_does(refused, replies):
    """Confirm._reply (`_answer(reply != refused)` with the body inlined): the same
    ack or nack, queues outstanding and answers (`ANSWERED.add`) as `_answer`, for
    every run of machine replies."""
    fast, slow = Confirm(Channel(), 1, ANSWERED), Confirm(Channel(), 1, ANSWERED)
    replying = [fast.hold_reply(refused) for _ in replies]
    answering = [slow.hold() for _ in replies]
    for reply, one, other in zip(replies, replying, answering):
        one(reply)
        other(reply != refused)
        assert _seen(fast) == _seen(slow)
    assert fast.ok == all(reply != refused for reply in replies)


waiting_lists = st.lists(st.tuples(st.sampled_from([None, 1, 2, 3]), st.binary(max_size=3)),
                         min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(waiting_lists, st.integers(1, 3))
def test_the_apply_loops_lone_waiter_case_is_take_waiters_answer(waiting, term):
    """queues/quorum/groups.py's apply loop answers a lone waiter of this term (or a
    barrier) itself (twin of ReplicatedGroup.take_waiters' usual case). Where it
    does, take_waiters answers that waiter alone and proposes nothing again; in
    every other case the loop calls take_waiters."""
    proposed = []
    waiters = [(expected, data, object()) for expected, data in waiting]
    group = SimpleNamespace(waiters={7: list(waiters)},
                            propose_data=lambda data, waiter: proposed.append(waiter))
    answered = ReplicatedGroup.take_waiters(group, 7, term)
    if len(waiters) == 1 and waiters[0][0] in (term, None):  # the loop's own case
        assert answered == [waiters[0][2]] and proposed == [] and group.waiters == {}
    assert sorted(map(id, answered + proposed)) == sorted(id(w[2]) for w in waiters)


entries = st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 10**6),
                             st.sampled_from(["", "p1"]), st.integers(0, 9)),
                   min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(entries)
def test_the_apply_loop_decodes_an_entry_in_place_as_decode_entry_does(steps):
    """QuorumGroups._apply_entries reads an entry's leader time and command in place,
    after a forwarded entry's head (twin of fifo/envelope.py decode_entry): the
    machine state and the queue's leader time are those of decode_entry on the
    command's bytes, applied in turn."""
    queue = SimpleNamespace(deleted=False, waiters={}, applied_term=0, applied=AppliedIds(),
                            last_time_ms=0, state=FifoState(), replay_until=0,
                            is_leader=True)
    queue.admit_in_order = lambda index, term, data: ReplicatedGroup.admit_in_order(
        queue, index, term, data)
    group = SimpleNamespace(_apply_effects=lambda queue, effects, replaying: None)
    expected, now_ms, logged, seq = FifoState(), 0, [], 0
    for index, (timed, wrapped, time_ms, publisher, priority) in enumerate(steps, start=1):
        command = encode_enqueue(publisher, index, priority, "", "q", b"", b"body")
        if timed:
            command = stamp(command, time_ms)
        seq += wrapped  # the forwarding node's next seq: its forwards, in order
        data = wrap(Identity(9, seq, False), command) if wrapped else command
        logged.append(SimpleNamespace(index=index, term=1, data=data, kind=COMMAND))
        stamped, decoded = decode_entry(command)
        now_ms = now_ms if stamped is None else stamped
        expected, _, _ = apply(Meta(index, 1, now_ms), decoded, expected)
    QuorumGroups._apply_entries(group, queue, logged)
    assert snapshot.dump(queue.state) == snapshot.dump(expected)
    assert queue.last_time_ms == now_ms


class Waiter:
    """A proposal's waiter: its answer (or its command proposed again) is logged."""

    def __init__(self, name: int, log: list) -> None:
        self.name, self.log = name, log

    def __call__(self, reply) -> None:
        self.log.append(("answered", self.name, reply))


def _waiting(waiters: dict) -> list:
    return [(index, [(expected, data, waiter.name) for expected, data, waiter in waiting])
            for index, waiting in waiters.items()]


# rounds: the member's term moves on (or not); proposals (or barriers) at the next
# index + offset, in the member's term; then runs of entries, NOOP or COMMAND, of
# the last term applied or of the member's term
member_rounds = st.lists(st.tuples(
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=2),
    st.lists(st.tuples(st.lists(st.booleans(), min_size=1, max_size=3), st.booleans()),
             max_size=2)), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(member_rounds)
def test_the_apply_loop_skips_entry_committed_only_where_it_would_do_nothing(rounds):
    """QuorumGroups._apply_entries calls entry_committed only when the entry is of a
    newer term than `applied_term` and waiters are there (twin of its early return).
    So with no waiters `applied_term` stays behind: that differs on purpose. What
    must agree with entry_committed and take_waiters called for every entry: the
    waiters answered (with their replies) and proposed again, in order, and the
    waiters left. A member proposes in its own term, never older than what it
    applied, so a stale `applied_term` dooms nothing that should stay."""
    fast_log: list = []
    slow_log: list = []
    queue = SimpleNamespace(deleted=False, waiters={}, applied_term=0, applied=AppliedIds(),
                            last_time_ms=0, state=FifoState(), replay_until=0,
                            is_leader=True)
    queue.propose_data = lambda data, waiter: fast_log.append(("proposed", waiter.name))
    queue.entry_committed = lambda index, term: ReplicatedGroup.entry_committed(
        queue, index, term)
    queue.take_waiters = lambda index, term: ReplicatedGroup.take_waiters(queue, index, term)
    group = SimpleNamespace(_apply_effects=lambda queue, effects, replaying: None)
    model = SimpleNamespace(waiters={}, applied_term=0, state=FifoState())
    model.propose_data = lambda data, waiter: slow_log.append(("proposed", waiter.name))
    term = last_term = 1
    index = name = 0
    for moves_on, waits, runs in rounds:
        term += moves_on
        for offset, barrier in waits:
            name += 1
            expected = None if barrier else term
            for waiters, log in ((queue.waiters, fast_log), (model.waiters, slow_log)):
                waiters.setdefault(index + 1 + offset, []).append(
                    (expected, b"d%d" % name, Waiter(name, log)))
        for kinds, newer in runs:
            last_term = term if newer else last_term
            logged = []
            for command in kinds:
                index += 1
                data = encode_enqueue("", index, 0, "", "q", b"", b"body") if command else b""
                logged.append(SimpleNamespace(index=index, term=last_term, data=data,
                                              kind=COMMAND if command else NOOP))
                ReplicatedGroup.entry_committed(model, index, last_term)
                reply = None
                if command:
                    model.state, reply, _ = apply(Meta(index, last_term, 0),
                                                  decode_entry(data)[1], model.state)
                for waiter in ReplicatedGroup.take_waiters(model, index, last_term):
                    waiter(reply)
            QuorumGroups._apply_entries(group, queue, logged)
            assert fast_log == slow_log
            assert _waiting(queue.waiters) == _waiting(model.waiters)
            assert queue.applied_term <= model.applied_term


stored_entries = st.tuples(st.booleans(), st.booleans(),
                           st.sampled_from(["enqueue", "settle"]),
                           st.lists(st.sampled_from(["k", "bcc-é", ""]), max_size=3),
                           st.sampled_from(["", "p1"]), st.binary(max_size=6))


@settings(max_examples=300, deadline=None)
@given(stored_entries)
def test_a_lease_read_finds_the_command_as_the_apply_loop_does(entry):
    """deliveries.py `_command_start` skips a forwarded entry's identity, then the
    leader's time (twin of the apply loop's inline decode, whose own test is
    test_the_apply_loop_decodes_an_entry_in_place_as_decode_entry_does). For an
    entry built from those heads and a command, it is where the command begins.
    `_without_blind_keys` keeps both heads and gives the tag 1 Enqueue of the same
    message, or any other command as it is."""
    wrapped, timed, kind, keys, publisher, body = entry
    if kind == "enqueue":
        command = encode_enqueue(publisher, 3, 0, "x", "q", b"", body, blind_keys=tuple(keys))
        plain = encode_enqueue(publisher, 3, 0, "x", "q", b"", body)
    else:
        command = plain = encode(Settle("c", (1, 2)))
    head = b""
    if timed:
        head = stamp(b"", 12345)
    if wrapped:
        head = wrap(Identity(9, 4, True), head)
    data = head + command
    assert deliveries._command_start(data) == len(head)
    assert deliveries._without_blind_keys(data) == head + plain


def _apply_loop_queue(config, log: list) -> SimpleNamespace:
    """What QuorumGroups._apply_entries reads and calls of a quorum queue."""
    queue = SimpleNamespace(deleted=False, waiters={}, applied_term=0, applied=AppliedIds(),
                            last_time_ms=0, state=FifoState(config=replace(config)),
                            replay_until=0, is_leader=True, blind_upto=0)
    queue.admit_in_order = lambda index, term, data: ReplicatedGroup.admit_in_order(
        queue, index, term, data)
    queue.entry_committed = lambda index, term: ReplicatedGroup.entry_committed(
        queue, index, term)
    queue.take_waiters = lambda index, term: ReplicatedGroup.take_waiters(queue, index, term)
    queue.check_out_again = lambda connection: log.append(("check out again", connection))
    return queue


# a round: entries, each a command of the machine's property tests (no UpdateConfig:
# the per-entry side's config stays as cleared) or a publish (publisher, seq offset:
# below 0 a re-send; timed; forwarded; a waiter or not)
publishes = st.tuples(st.just("publish"), st.sampled_from(["", "p1", "p2"]),
                      st.integers(-2, 1), st.booleans(), st.booleans(), st.booleans())
apply_rounds = st.lists(st.lists(
    machine_commands.filter(lambda step: not isinstance(step, UpdateConfig)) | publishes,
    min_size=1, max_size=6), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(apply_rounds, quiet_or_not)
def test_the_apply_loops_in_place_enqueue_is_its_per_entry_path(rounds, config):
    """QuorumGroups._apply_entries stores a publish into a quiet queue in place
    (fifo/in_place.py, where `decode` and `apply` did it before). Against the same
    loop with the queue's quiet_enqueue cleared (every entry decoded and applied, the
    machine's full way): the same waiters' replies, deliveries, effects, machine
    state and leader time, round by round; consumers come and go in between."""
    logs: tuple[list, list] = ([], [])
    queues = [_apply_loop_queue(config, log) for log in logs]
    groups = [SimpleNamespace(
        _apply_effects=lambda queue, effects, replaying, log=log: log.append(
            ("effects", list(effects), replaying)),
        host=SimpleNamespace(boot_id="n1:r1"),
        cluster=SimpleNamespace(tell_downed=lambda queue, c, log=log: log.append(("down", c))))
        for log in logs]
    delivered = deliveries.deliver
    index, seq, forwarded = 0, [0], 0
    try:
        for round_steps in rounds:
            queues[1].state.config.quiet_enqueue = False
            entries = []
            for step in round_steps:
                index += 1
                waits = False
                if isinstance(step, tuple) and step[0] == "publish":
                    _kind, publisher, offset, timed, wrapped, waits = step
                    seq[0] += 1
                    data = encode_enqueue(publisher, max(0, seq[0] + offset), 0, "", "q",
                                          b"", b"body")
                    data = stamp(data, index * 10) if timed else data
                    if wrapped:
                        forwarded += 1
                        data = wrap(Identity(9, forwarded, False), data)
                else:
                    command = concrete(step, queues[0].state, seq)
                    data = (encode_enqueue(command.publisher, command.seq, command.priority,
                                           "", "q", b"", b"x" * command.size)
                            if isinstance(command, Enqueue) else encode(command))
                entries.append(SimpleNamespace(index=index, term=1, data=data, kind=COMMAND))
                if waits:
                    for queue, log in zip(queues, logs):
                        queue.waiters[index] = [(1, data, Waiter(index, log))]
            for queue, group, log in zip(queues, groups, logs):
                deliveries.deliver = lambda group, queue, key, held, log=log: log.append(
                    ("deliver", key, list(held)))
                QuorumGroups._apply_entries(group, queue, entries)
            fast, slow = queues
            assert logs[0] == logs[1]
            assert snapshot.dump(fast.state) == snapshot.dump(slow.state)
            assert (fast.state.now_ms, fast.state.applied_since_cursor, fast.last_time_ms,
                    fast.blind_upto) == (slow.state.now_ms, slow.state.applied_since_cursor,
                                         slow.last_time_ms, slow.blind_upto)
    finally:
        deliveries.deliver = delivered


def _proposing_queue(clock_ms: int, settling: list) -> SimpleNamespace:
    """What QuorumQueue.publish and publish_batch read and call of a queue."""
    held: list = []  # the queues the node's round is to propose for: added each time
    queue = SimpleNamespace(groups=SimpleNamespace(clock_ms=clock_ms,
                                                   holding=SimpleNamespace(add=held.append)),
                            settling=list(settling), publishing=[], flushed=0, held=held)

    def flush_settlements():
        queue.flushed += 1
        queue.settling = []
    queue.flush_settlements = flush_settlements
    return queue


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=30), min_size=1, max_size=8), st.integers(1, 2**40),
       st.sampled_from([b"p", b"spark-query/3f2a/0", "é".encode()]), st.integers(0, 9),
       st.sampled_from(["", "amq.direct"]), st.sampled_from(["q", "rk.é"]),
       st.booleans(), st.booleans(), st.integers(0, 2**40))
def test_a_batch_proposed_in_place_is_its_messages_published_one_by_one(
        bodies, first, publisher, priority, exchange, key, confirmed, settling, clock_ms):
    """QuorumQueue.publish_batch (entries built from the batch in place,
    fifo/envelope.py stamped_enqueues) proposes what QuorumQueue.publish of each of
    split's messages proposes, in order: the same entry bytes, the same run and
    holding, settlements flushed first. Its confirm holds one reply, a RunWaiter
    (one list item in the run): answered with the last message's reply, it acks or
    nacks as a waiter per message does for every run of replies the machine gives
    (stored or duplicate, then refused: fifo's test_after_a_refused_seq_...)."""
    from quorumqueue.broker.amqp.batch_publish import split
    from quorumqueue.broker.amqp.properties import decode_properties
    from quorumqueue.broker.queues.message import Message
    from quorumqueue.broker.queues.quorum.queue import QuorumQueue

    from ..node.test_batch_publish import batch_entry, header, records

    body = records(*bodies)
    payload = header(first, len(body), batch_entry(len(bodies)), publisher=publisher)
    payload = payload[:12] + struct.pack(">H", struct.unpack_from(">H", payload, 12)[0]
                                         | 1 << 11) + payload[14:] + bytes([priority])
    properties = decode_properties(payload)[1]
    assert properties.priority == priority
    batch = split(properties, body, 1 << 20)
    fast, slow = _proposing_queue(clock_ms, [1] * settling), _proposing_queue(clock_ms,
                                                                               [1] * settling)
    channels = Channel(), Channel()
    confirms = [Confirm(channel, 1, ANSWERED) if confirmed else None for channel in channels]
    QuorumQueue.publish_batch(fast, batch, exchange, key, channels[0], confirms[0])
    for record_properties, record_body in batch.records:
        QuorumQueue.publish(slow, Message(exchange, key, record_properties, record_body),
                            channels[1], confirms[1])
    [(datas, waiter)] = fast.publishing
    assert datas == [data for data, _ in slow.publishing]
    assert (waiter is None) == (not confirmed)
    assert len(fast.held) == len(slow.held) == 1 and fast.held[0] is fast
    assert (fast.flushed, fast.settling) == (slow.flushed, slow.settling)
    if confirmed:
        assert isinstance(waiter, RunWaiter) and confirms[0].outstanding == 1
        assert confirms[1].outstanding == len(bodies)
        for stored in range(len(bodies) + 1):  # `stored` taken, the rest refused
            replies = ["ok", "duplicate"] * stored
            replies = replies[:stored] + ["rejected"] * (len(bodies) - stored)
            ones, others = Confirm(Channel(), 1, ANSWERED), Confirm(Channel(), 1, ANSWERED)
            RunWaiter(ones.hold_reply("rejected"), "rejected")(replies[-1])
            for reply in replies:
                others.hold_reply("rejected")(reply)
            assert (ones.ok, ones.outstanding) == (others.ok, others.outstanding)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["ok", "rejected", "duplicate", None]), min_size=1,
                max_size=8), st.randoms())
def test_a_run_waiter_split_answers_once_as_a_waiter_per_command_would(replies, random):
    """RunWaiter.split (a batch forwarded to the leader: a waiter per command): the
    one waiter is answered once, after the last of them in whatever order they
    come, and the confirm acks or nacks as one hold_reply per command would."""
    answered: list = []
    run = RunWaiter(answered.append, "rejected")
    order = list(enumerate(run.split(len(replies))))
    random.shuffle(order)
    for position, (k, one) in enumerate(order):
        one(replies[k])
        assert len(answered) == (position == len(order) - 1)
    assert (answered[0] == "rejected") == ("rejected" in replies)
    ones, others = Confirm(Channel(), 1, ANSWERED), Confirm(Channel(), 1, ANSWERED)
    ones.hold_reply("rejected")(answered[0])
    for reply in replies:
        others.hold_reply("rejected")(reply)
    assert ones.ok == others.ok


_EXPIRING = struct.pack(">HHQH", 60, 0, 4, 0x0100) + bytes([4]) + b"1000"  # expiration 1000
_PERSISTENT = struct.pack(">HHQH", 60, 0, 4, 0x1000) + bytes([2])  # delivery mode 2
# where a publish goes and its header when it has no expiration: (exchange, routing
# key, header); the run reads these fields again only where they change
_PLACES = [("", "q", b"")] * 6 + [("x", "q", b""), ("", "qq", b""), ("", "q", _PERSISTENT),
                                  ("", "p", b"")]

# a round's entries: a publish (publisher, seq offset: below 0 a re-send, timed,
# forwarded, an expiration, a waiter, the term moves on first, its place), a NOOP, or
# a command of the machine's property tests; long runs of timed publishes come often
run_steps = st.one_of(
    st.tuples(st.just("publish"), st.sampled_from(["", "p1", "p1", "p2"]),
              st.sampled_from([0, 0, 0, 1, -1, -3]), st.sampled_from([True] * 6 + [False]),
              st.sampled_from([False] * 8 + [True]), st.sampled_from([False] * 8 + [True]),
              st.booleans(), st.sampled_from([False] * 10 + [True]),
              st.sampled_from(_PLACES)),
    st.just("noop"),
    machine_commands.filter(lambda step: not isinstance(step, UpdateConfig)))
run_rounds = st.lists(st.tuples(st.lists(run_steps, min_size=1, max_size=25),
                                st.none() | st.integers(1, 30)), min_size=1, max_size=8)


@settings(max_examples=250, deadline=None)
@given(run_rounds, quiet_or_not)
def test_the_apply_loops_run_of_in_place_enqueues_is_one_in_place_enqueue_each(rounds, config):
    """QuorumGroups._apply_entries hands the entries after one stored in place to
    fifo/in_place.py `enqueue_run_in_place` (groups.py `_store_run`), where it
    stored them one by one before. Against the same loop with the run switched off:
    the same replies to the same waiters in the same order, waiters proposed again,
    effects and deliveries, machine state and counters, leader time and applied
    term, round by round. Terms move on between entries (with waiters: their
    entry_committed), a forwarded gap's give-up may be due (`give_up_at`)."""
    from quorumqueue.broker.queues.quorum import groups as groups_module

    logs: tuple[list, list] = ([], [])
    queues = [_apply_loop_queue(config, log) for log in logs]
    for queue, log in zip(queues, logs):
        queue.propose_data = lambda data, waiter, log=log: log.append(("proposed", waiter.name))
    groups = [SimpleNamespace(
        _apply_effects=lambda queue, effects, replaying, log=log: log.append(
            ("effects", list(effects), replaying)),
        _maybe_give_up=QuorumGroups._maybe_give_up,
        host=SimpleNamespace(boot_id="n1:r1"),
        cluster=SimpleNamespace(tell_downed=lambda queue, c, log=log: log.append(("down", c))))
        for log in logs]
    delivered, store_run = deliveries.deliver, groups_module._store_run
    index, seq, forwarded, term = 0, [0], 0, 1
    try:
        for round_steps, give_up_in in rounds:
            entries = []
            for step in round_steps:
                index += 1
                waits = False
                kind = COMMAND
                if step == "noop":
                    data, kind = b"", NOOP
                elif isinstance(step, tuple) and step[0] == "publish":
                    (_kind, publisher, offset, timed, wrapped, expiring, waits,
                     newer, (exchange, key, header)) = step
                    term += newer
                    seq[0] += 1
                    data = encode_enqueue(publisher, max(0, seq[0] + offset), 0, exchange,
                                          key, _EXPIRING if expiring else header, b"body")
                    data = stamp(data, index * 10) if timed else data
                    if wrapped:
                        forwarded += 1
                        data = wrap(Identity(9, forwarded, False), data)
                else:
                    command = concrete(step, queues[0].state, seq)
                    data = (encode_enqueue(command.publisher, command.seq, command.priority,
                                           "", "q", b"", b"x" * command.size)
                            if isinstance(command, Enqueue) else encode(command))
                entries.append(SimpleNamespace(index=index, term=term, data=data, kind=kind))
                if waits:
                    for queue, log in zip(queues, logs):
                        queue.waiters[index] = [(term, data, Waiter(index, log))]
            for queue, group, log, runs in zip(queues, groups, logs, (True, False)):
                if give_up_in is not None:  # as if a forwarded gap were held
                    queue.applied.give_up_at = index - len(entries) + give_up_in
                deliveries.deliver = lambda group, queue, key, held, log=log: log.append(
                    ("deliver", key, list(held)))
                groups_module._store_run = (store_run if runs else
                                            lambda queue, entries, position, at: (position, at))
                QuorumGroups._apply_entries(group, queue, entries)
            fast, slow = queues
            assert logs[0] == logs[1]
            assert snapshot.dump(fast.state) == snapshot.dump(slow.state)
            assert (fast.state.now_ms, fast.state.applied_since_cursor, fast.last_time_ms,
                    fast.applied_term, fast.state.enqueue_count, fast.state.last_index) == (
                slow.state.now_ms, slow.state.applied_since_cursor, slow.last_time_ms,
                slow.applied_term, slow.state.enqueue_count, slow.state.last_index)
            assert _waiting(fast.waiters) == _waiting(slow.waiters)
    finally:
        deliveries.deliver, groups_module._store_run = delivered, store_run
