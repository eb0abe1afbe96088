"""The fifo package's hand-inlined copies ("twins") agree with their originals.

Each test runs the twin and the function it copies on random inputs and compares
what a user or a replaying member would see: bytes, state, effects."""
from __future__ import annotations

import struct
from types import SimpleNamespace
from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from quorumqueue.broker.amqp.properties import encode_properties
from quorumqueue.broker.fifo import commands as fifo_commands, serving, snapshot
from quorumqueue.broker.fifo.commands import Enqueue, Meta
from quorumqueue.broker.fifo.envelope import stamp, stamped_enqueue, stamped_enqueues
from quorumqueue.broker.fifo.in_place import enqueue_in_place, enqueue_run_in_place
from quorumqueue.broker.fifo.machine import _maybe_release_cursor, apply
from quorumqueue.broker.fifo.state import FifoState, is_high, pack

from .test_machine import commands, concrete, quiet_or_not

texts = st.text(st.characters(codec="utf-8") | st.sampled_from(["\udc80", "\udcff"]),
                max_size=40)


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(0, 2**63 - 1), st.integers(0, 255), texts.map(lambda t: t[:60]),
       texts.map(lambda t: t[:60]), st.binary(max_size=30), st.binary(max_size=30),
       st.binary(max_size=12))
def test_encode_enqueue_writes_the_publisher_as__s_does(publisher, seq, priority, exchange,
                                                        key, header, body, head):
    """encode_enqueue's publisher field (`_s`, inlined) is `_s(publisher)`, and the
    entry decodes back to what was encoded."""
    data = fifo_commands.encode_enqueue(publisher, seq, priority, exchange, key, header,
                                        body, head)
    start = len(head) + fifo_commands._enqueue_head.size
    written = fifo_commands._s(publisher)
    assert data[start:start + len(written)] == written
    assert fifo_commands.decode_message(data, len(head)) == (exchange, key, header, body)


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, min_size=5, max_size=60), quiet_or_not)
def test_ready_count_is_the_three_queues_lengths(steps, config):
    """FifoState.ready_count (len() of the queues, inlined) is len(high) + len(normal)
    + len(returns) after every command."""
    state, seq = FifoState(config=config), [0]
    for position, step in enumerate(steps, start=1):
        state, _, _ = apply(Meta(position, 1, position * 20), concrete(step, state, seq), state)
        assert state.ready_count == len(state.high) + len(state.normal) + len(state.returns)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**33), st.integers(0, 255), st.integers(0, 1000))
def test_an_enqueue_is_packed_as_pack_and_is_high_pack_it(size, priority, ttl_base):
    """_enqueue's packed size and queue choice (state.pack and state.is_high, inlined)
    are pack(size, priority) and the queue is_high names."""
    state = FifoState()
    state, reply, _ = apply(Meta(1, 1, ttl_base), Enqueue("", 0, size, priority), state)
    assert reply == "ok"
    queue = state.high if is_high(pack(size, priority)) else state.normal
    other = state.normal if queue is state.high else state.high
    assert list(queue.items()) == [(1, pack(size, priority))] and not len(other)


def _copy(state: FifoState) -> FifoState:
    copied = snapshot.load(snapshot.dump(state))
    copied.high_run = state.high_run
    copied.applied_since_cursor = state.applied_since_cursor
    return copied


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, min_size=5, max_size=60), quiet_or_not)
def test_the_inlined_first_tests_of_serve_consumers_and_release_cursor_are_theirs(
        steps, config):
    """Where `apply` skips serve_consumers (no consumer) or takes the release cursor's
    early return inline (not yet due, not empty), calling the original changes
    nothing but what the inline copy changes: no effect, the same state."""
    state, seq = FifoState(config=config), [0]
    for position, step in enumerate(steps, start=1):
        meta = Meta(position, 1, position * 20)
        state, _, _ = apply(meta, concrete(step, state, seq), state)
        if not state.consumers:  # `if state.consumers: serve_consumers(...)`
            copy, effects = _copy(state), []
            serving.serve_consumers(copy, effects)
            assert effects == [] and snapshot.dump(copy) == snapshot.dump(state)
        if (state.applied_since_cursor + 1 < state.config.release_cursor_interval
                and state.ready_count):  # the inline branch
            copy, effects = _copy(state), []
            _maybe_release_cursor(meta, copy, effects)
            inline = _copy(state)
            inline.applied_since_cursor += 1
            assert effects == [] and snapshot.dump(copy) == snapshot.dump(inline)


# a publish's entry: publisher, its seq's offset from the latest given out (below 0:
# a re-send; None: the seq of the publisher's gap, if any, closing it), priority, the head's body size, header (none, plain, an expiration,
# a bad one, the sink's headers), tag 1 or 21 (BCC keys), an envelope (TIMED) or not
entry_steps = st.tuples(
    st.just("entry"), st.sampled_from(["", "p1", "p2", "\u00e9"]), st.integers(-3, 1) | st.none(),
    st.sampled_from([0, 4, 5, 255]),
    st.sampled_from([0, 7, 2**31 - 1, 2**31, 2**32 - 1]),
    st.sampled_from([b"", encode_properties(7, {}),
                     encode_properties(7, {"expiration": "1500", "delivery_mode": 2}),
                     encode_properties(7, {"expiration": "soon"}),
                     encode_properties(7, {"delivery_mode": 2,
                                           "headers": {"x-publisher": "p1", "x-seq": 3}})]),
    st.sampled_from([1, 1, 21]), st.booleans())


def _entry(step, seq: list[int], time_ms: int, state: FifoState) -> tuple[bytes, int]:
    """(data, start): the Enqueue's bytes at `start`, after an envelope or not."""
    _kind, publisher, offset, priority, size, header, tag, timed = step
    seq[0] += 1
    at = (max(0, seq[0] + offset) if offset is not None
          else state.enqueuer_gaps.get(publisher, seq[0]))
    command = fifo_commands.encode_enqueue(publisher, at, priority, "",
                                           "q", header, b"body",
                                           blind_keys=("k",) if tag == 21 else ())
    command = fifo_commands._enqueue_head.pack(tag, priority, size, at) + \
        command[fifo_commands._enqueue_head.size:]  # any size the head can hold
    data = stamp(command, time_ms) if timed else command
    return data, len(data) - len(command)


@settings(max_examples=300, deadline=None)
@given(st.lists(commands | entry_steps, min_size=5, max_size=80), quiet_or_not,
       st.sampled_from([{}, {"p1": 2}, {"p2": 4, "\u00e9": 1}]))
def test_an_enqueue_stored_in_place_is_what_decode_and_apply_give(steps, config, gaps):
    """fifo/in_place.py enqueue_in_place (apply's short way, decode and _enqueue
    inlined): where it answers, its reply is that of apply(Meta, decode(data, start))
    with no effects, and the state (snapshot, counters, time) is the same; where it
    declines (None) it left the state as it was. The queue passes through consumers,
    limits, re-sends, gaps left by rejected seqs (`gaps`, as after a reject-publish
    limit was lifted) and due release cursors on the way."""
    state, usual = FifoState(config=replace(config)), FifoState(config=replace(config))
    state.enqueuer_gaps, usual.enqueuer_gaps = dict(gaps), dict(gaps)
    seq, taken = [0], 0
    for position, step in enumerate(steps, start=1):
        meta = Meta(position, 1, position * 20)
        if not (isinstance(step, tuple) and step[0] == "entry"):
            command = concrete(step, state, seq)
            state, _, _ = apply(meta, command, state)
            usual, _, _ = apply(meta, command, usual)
            continue
        data, start = _entry(step, seq, meta.system_time, state)
        before = snapshot.dump(state), state.now_ms, state.applied_since_cursor
        reply = enqueue_in_place(state, meta.index, meta.system_time, data, start)
        usual, usual_reply, usual_effects = apply(meta, fifo_commands.decode(data, start),
                                                  usual)
        if reply is None:
            assert (snapshot.dump(state), state.now_ms, state.applied_since_cursor) == before
            state, _, _ = apply(meta, fifo_commands.decode(data, start), state)
        else:
            taken += 1
            assert (reply, []) == (usual_reply, usual_effects)
        assert snapshot.dump(state) == snapshot.dump(usual)
        assert (state.now_ms, state.applied_since_cursor) == (usual.now_ms,
                                                               usual.applied_since_cursor)
    assume(taken > 0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=20), min_size=1, max_size=6), texts.map(lambda t: t[:40]),
       st.integers(1, 2**62), st.integers(0, 255), texts.map(lambda t: t[:60]),
       texts.map(lambda t: t[:60]), st.binary(max_size=12), st.binary(max_size=12),
       st.binary(max_size=12), st.integers(0, 2**63 - 1))
def test_a_batchs_entries_are_each_stamped_enqueue_of_its_message(
        bodies, publisher, first, priority, exchange, key, head, middle, tail, now_ms):
    """envelope.stamped_enqueues (a batch publish's entries, each in one join) is
    stamped_enqueue of each message: its seq first + k, its header head + u64 size +
    middle + i64 seq + tail, its body the record's."""
    records, offsets = b"", []
    for body in bodies:
        offsets.append(len(records))
        records += struct.pack(">I", len(body)) + body
    expected = [stamped_enqueue(now_ms, publisher, first + k, priority, exchange, key,
                                head + struct.pack(">Q", len(body)) + middle
                                + struct.pack(">q", first + k) + tail, body)
                for k, body in enumerate(bodies)]
    assert stamped_enqueues(now_ms, publisher, first, priority, exchange, key, head, middle,
                            tail, records, offsets) == expected


def test_a_run_across_publishers_of_one_name_length_is_an_in_place_enqueue_each():
    """fifo/in_place.py enqueue_run_in_place tells publishers apart by their names'
    bytes, not only their lengths: over a run whose publisher changes between names
    of one UTF-8 length ("p1", "p2", "\u00e9") and none, it stores what
    enqueue_in_place stores entry by entry (each publisher's highest seq, the
    messages, the leader time), and it stops at the first duplicate of each."""
    names = ["p1", "p2", "p1", "\u00e9", "", "p2", "\u00e9", "p1", "p2", "p2"]
    seqs = [1, 1, 2, 1, 0, 2, 2, 3, 3, 4]
    entries = [SimpleNamespace(index=position, term=1, kind=0, data=stamped_enqueue(
                   position * 10, name, seq, 0, "", "q", b"", b"body %d" % position))
               for position, (name, seq) in enumerate(zip(names, seqs), start=1)]
    run, single = FifoState(), FifoState()
    assert enqueue_in_place(run, 1, 10, entries[0].data, 9) == "ok"
    assert enqueue_run_in_place(run, entries, 1, len(entries), 0, 1) == (len(entries), 100)
    for entry in entries:
        assert enqueue_in_place(single, entry.index, entry.index * 10, entry.data, 9) == "ok"
    assert run.enqueuers == single.enqueuers == {"p1": 3, "p2": 4, "\u00e9": 2}
    assert snapshot.dump(run) == snapshot.dump(single)
    assert (run.now_ms, run.applied_since_cursor) == (single.now_ms, single.applied_since_cursor)
    again = entries + [SimpleNamespace(index=11, term=1, kind=0, data=stamped_enqueue(
        110, "p1", 3, 0, "", "q", b"", b"again"))]
    assert enqueue_run_in_place(run, again, 10, 11, 0, 1) == (10, -1)   # p1's 3: a duplicate


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["p1", "p1", "p2", ""]),
                          st.sampled_from([("", "q"), ("", "q"), ("x", "q"), ("", "qq"),
                                           ("", "p")]),
                          st.sampled_from(["none", "none", "persistent", "expiring",
                                           "expiring-other"])),
                min_size=1, max_size=12))
def test_a_run_reads_each_entrys_place_and_expiration_where_they_change(rows):
    """fifo/in_place.py enqueue_run_in_place reads an entry's exchange, routing key
    and header length only where its bytes differ from the entry before: over runs
    whose publisher, place and header change from entry to entry, it takes exactly
    the entries enqueue_in_place would store "ok" one by one, up to the first it
    would not (an expiration, a duplicate), and leaves the same state."""
    headers = {"none": b"",
               "persistent": encode_properties(7, {"delivery_mode": 2}),
               "expiring": encode_properties(7, {"expiration": "1500"}),
               "expiring-other": encode_properties(7, {"expiration": "1500",
                                                       "delivery_mode": 2})}
    entries, seqs = [], {}
    for position, (publisher, (exchange, key), header) in enumerate(rows, start=1):
        seqs[publisher] = seqs.get(publisher, 0) + 1
        entries.append(SimpleNamespace(index=position + 1, term=1, kind=0, data=stamped_enqueue(
            position * 10, publisher, seqs[publisher], 0, exchange, key, headers[header],
            b"body %d" % position)))
    first = SimpleNamespace(index=1, term=1, kind=0,
                            data=stamped_enqueue(5, "p0", 1, 0, "", "q", b"", b"first"))
    run, single = FifoState(), FifoState()
    assert enqueue_in_place(run, 1, 5, first.data, 9) == "ok"
    assert enqueue_in_place(single, 1, 5, first.data, 9) == "ok"
    taken = 0
    for entry in entries:
        if enqueue_in_place(single, entry.index, entry.index * 10 - 10, entry.data, 9) != "ok":
            break
        taken += 1
    stop, _time = enqueue_run_in_place(run, [first] + entries, 1, len(entries) + 1, 0, 1)
    assert stop - 1 == taken
    assert snapshot.dump(run) == snapshot.dump(single)
    assert run.enqueuers == single.enqueuers
