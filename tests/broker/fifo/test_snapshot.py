"""Snapshot format versions (snapshot.py header): version 2 adds the length limits
and the reject-publish block, version 3 the publishers' rejected-seq gaps, version 4
message TTL (the queue's msg_ttl, the expiries of ready and checked-out messages),
version 5 single active consumer (the config's flag, the active consumer) and the
dead letters held by at-least-once dead lettering, version 6 suspected consumers
(fifo/nodes.py) and delivery counts of 0 for messages they held, version 7 lease fences
(fifo/leases.py); older snapshots still load (no limits, no gaps, no TTL, no single
active consumer, nothing held, nobody suspected, no lease fenced).
(Restore-and-replay equality is the property in test_machine.py.)"""

from __future__ import annotations

import json
import struct

import pytest

from quorumqueue.broker.fifo import snapshot
from quorumqueue.broker.fifo.commands import (Cancel, Checkout, Discard, DlxCheckout, Enqueue,
                                                  LeaseGrow, LeaseRelease, Meta, NodeDown)
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import FifoConfig, FifoState, LeaseFence

_head = struct.Struct(">4sHI")


def _filled(config: FifoConfig) -> FifoState:
    state = FifoState(config=config)
    for index, command in enumerate([Enqueue("p", 1, 10, 0), Enqueue("", 0, 20, 9),
                                     Checkout("c", 1, 0, "conn"), Enqueue("p", 2, 5, 0),
                                     Enqueue("q", 7, 5, 0)],
                                    start=1):
        state, _, _ = apply(Meta(index, 1, 0), command, state)
    return state


def _as_version(data: bytes, version: int) -> bytes:
    """The bytes a build of `version` (1, 3, 4 or 5) wrote for the same state, which
    must hold no suspected consumer, below 5 no single active consumer and no dead
    letter, below 4 no TTL: version 5 has no consumer's "suspected"; version 4 no
    single_active, active, "dlx" or dead_letter_at_least_once; version 3 no msg_ttl,
    expires, last_active, expiries_out or expiry arrays (the last three arrays, empty
    here); version 1 neither limits, block nor gaps."""
    _magic, _version, length = _head.unpack_from(data)
    document = json.loads(data[_head.size:_head.size + length])
    for lease in document["leases"]:
        assert lease.pop("fence") is None
    if version == 6:
        header = json.dumps(document, separators=(",", ":")).encode()
        return _head.pack(b"QQFS", version, len(header)) + header + data[_head.size + length:]
    for consumer in document["consumers"].values():
        assert consumer.pop("suspected") is False
    assert 0 not in dict(document["delivery_counts"]).values()
    if version == 5:
        header = json.dumps(document, separators=(",", ":")).encode()
        return _head.pack(b"QQFS", version, len(header)) + header + data[_head.size + length:]
    assert document["config"].pop("single_active") is False
    assert document.pop("active") is None
    assert not document["dlx"]["discards"] and document["dlx"]["consumer"] is None
    assert not document["config"]["dead_letter_at_least_once"]
    del document["dlx"]
    del document["config"]["dead_letter_at_least_once"]
    if version == 4:
        header = json.dumps(document, separators=(",", ":")).encode()
        return _head.pack(b"QQFS", version, len(header)) + header + data[_head.size + length:]
    assert document["array_lengths"][-3:] == [0, 0, 0] and not document["expiries_out"]
    assert document["config"]["msg_ttl"] is None and document["config"]["expires"] is None
    del document["config"]["msg_ttl"]
    del document["config"]["expires"]
    del document["expiries_out"]
    del document["last_active"]
    document["array_lengths"] = document["array_lengths"][:-3]
    if version == 1:
        for key in ("max_length", "max_bytes", "overflow"):
            del document["config"][key]
        del document["publishers_blocked"]
        del document["enqueuer_gaps"]
    header = json.dumps(document, separators=(",", ":")).encode()
    return _head.pack(b"QQFS", version, len(header)) + header + data[_head.size + length:]


def _as_version_1(data: bytes) -> bytes:
    return _as_version(data, 1)


def test_dump_writes_version_7_with_the_limits_and_gaps():
    state = _filled(FifoConfig(max_length=1, max_bytes=100, overflow="reject-publish"))
    data = snapshot.dump(state)
    assert _head.unpack_from(data)[1] == 7
    restored = snapshot.load(data)
    assert restored.config == FifoConfig(max_length=1, max_bytes=100,
                                         overflow="reject-publish")
    assert restored.publishers_blocked and snapshot.dump(restored) == data
    assert restored.enqueuer_gaps == {"p": 2, "q": 7}     # rejected while blocked


def test_version_1_snapshot_loads_as_a_queue_without_limits():
    state = _filled(FifoConfig())
    current = snapshot.dump(state)
    restored = snapshot.load(_as_version_1(current))
    assert restored.config == FifoConfig()
    assert not restored.publishers_blocked and restored.enqueuer_gaps == {}
    assert snapshot.dump(restored) == current


def test_version_3_snapshot_loads_as_a_queue_without_ttl():
    state = _filled(FifoConfig(max_length=1, max_bytes=100, overflow="reject-publish"))
    current = snapshot.dump(state)
    restored = snapshot.load(_as_version(current, 3))
    assert restored.config.msg_ttl is None and restored.expiries_out == {}
    assert all(queue.expiries is None
               for queue in (restored.high, restored.normal, restored.returns))
    assert snapshot.dump(restored) == current


def test_version_4_keeps_the_expiries_of_ready_and_checked_out_messages():
    state = FifoState(config=FifoConfig(msg_ttl=60_000))
    for index, command in enumerate([Enqueue("", 0, 10, 0), Enqueue("", 0, 20, 9, ttl=5_000),
                                     Checkout("c", 1, 0, "conn"), Enqueue("", 0, 5, 0)],
                                    start=1):
        state, _, _ = apply(Meta(index, 1, 1_000 * index), command, state)
    data = snapshot.dump(state)
    restored = snapshot.load(data)
    # the high-priority message (ttl 5 s at t=2 s) went to the consumer first
    assert restored.expiries_out == {2: 7_000} == state.expiries_out
    assert list(restored.normal.expiries) == [61_000, 64_000]
    assert restored.config.msg_ttl == 60_000 and snapshot.dump(restored) == data


def test_version_4_snapshot_loads_as_a_queue_without_single_active_consumer():
    state = _filled(FifoConfig(msg_ttl=60_000))
    current = snapshot.dump(state)
    restored = snapshot.load(_as_version(current, 4))
    assert not restored.config.single_active and restored.active is None
    assert snapshot.dump(restored) == current


def test_version_5_keeps_the_active_consumer_and_the_flag():
    state = FifoState(config=FifoConfig(single_active=True))
    for index, command in enumerate([Checkout("a", 1, 0, "conn-a"),
                                     Checkout("b", 1, 0, "conn-b"), Cancel("a")], start=1):
        state, _, _ = apply(Meta(index, 1, 0), command, state)
    data = snapshot.dump(state)
    restored = snapshot.load(data)
    assert restored.config.single_active and restored.active == "b" == state.active
    assert snapshot.dump(restored) == data


def test_version_4_snapshot_loads_as_a_queue_holding_no_dead_letters():
    state = _filled(FifoConfig(max_length=1, max_bytes=100, overflow="reject-publish"))
    current = snapshot.dump(state)
    restored = snapshot.load(_as_version(current, 4))
    assert restored.dlx.count == 0 and not restored.config.dead_letter_at_least_once
    assert snapshot.dump(restored) == current


def test_version_5_keeps_the_held_dead_letters_and_the_worker():
    config = FifoConfig(overflow="reject-publish", dead_letter_at_least_once=True)
    state = FifoState(config=config)
    script = [Enqueue("", 0, 10, 0), Enqueue("", 0, 20, 0), Enqueue("", 0, 30, 0),
              Checkout("c", 0, 0, "conn"), Discard("c", (1, 2, 3)),
              DlxCheckout("worker-1", 2)]
    for index, command in enumerate(script, start=1):
        state, _, _ = apply(Meta(index, 1, 0), command, state)
    assert state.dlx.count == 3 and len(state.dlx.consumer.checked) == 2
    data = snapshot.dump(state)
    restored = snapshot.load(data)
    assert restored.config == config and restored.dlx.bytes == 60
    assert list(restored.dlx.discards) == list(state.dlx.discards) == [(3, 30, "rejected")]
    assert restored.dlx.consumer == state.dlx.consumer
    assert restored.dlx.next_msg_id == 3 and snapshot.dump(restored) == data


def test_version_6_keeps_suspected_consumers_and_uncounted_returns():
    """A NodeDown suspects both consumers of node n1: the active one's message goes
    back with delivery count 0, kept as such (it is redelivered), and no consumer is
    active; a restore keeps all of it."""
    state = FifoState(config=FifoConfig(single_active=True))
    script = [Checkout("a", 1, 0, "n1:r1.1.1"), Checkout("b", 1, 0, "n1:r1.2.1"),
              Enqueue("", 0, 10, 0), NodeDown(("n1",))]
    for index, command in enumerate(script, start=1):
        state, _, _ = apply(Meta(index, 1, 0), command, state)
    assert state.consumers["a"].suspected and state.consumers["b"].suspected
    assert state.active is None and state.delivery_counts == {3: 0}
    data = snapshot.dump(state)
    restored = snapshot.load(data)
    assert restored.consumers == state.consumers and restored.active is None
    assert restored.delivery_counts == {3: 0} and snapshot.dump(restored) == data


def test_version_5_snapshot_loads_with_no_consumer_suspected():
    state = FifoState(config=FifoConfig(single_active=True))
    for index, command in enumerate([Checkout("a", 1, 0, "n1:r1.1.1"),
                                     Checkout("b", 1, 0, "n2:r2.1.1")], start=1):
        state, _, _ = apply(Meta(index, 1, 0), command, state)
    current = snapshot.dump(state)
    restored = snapshot.load(_as_version(current, 5))
    assert not any(c.suspected for c in restored.consumers.values())
    assert restored.active == "a" and snapshot.dump(restored) == current


def _leased(*commands) -> FifoState:
    state = FifoState()
    script = [Enqueue("", 0, 10, 0), Enqueue("", 0, 10, 0), LeaseGrow("fenced", 2, 0, 500),
              LeaseGrow("kept", 0, 0, 0), *commands]
    for index, command in enumerate(script, start=1):
        state, _, _ = apply(Meta(index, 1, 1_000 * index), command, state)
    return state


def test_version_7_keeps_a_lease_fence():
    state = _leased(LeaseRelease("fenced", fence=True))
    assert state.leases["fenced"].fence == LeaseFence(1, 2, "released", 5_000, 500)
    data = snapshot.dump(state)
    restored = snapshot.load(data)
    assert restored.leases == state.leases and snapshot.dump(restored) == data


def test_version_6_snapshot_loads_with_no_lease_fenced():
    state = _leased()
    current = snapshot.dump(state)
    restored = snapshot.load(_as_version(current, 6))
    assert restored.leases == state.leases and restored.leases["fenced"].fence is None
    assert snapshot.dump(restored) == current


def test_unknown_version_is_refused():
    data = bytearray(snapshot.dump(FifoState()))
    struct.pack_into(">H", data, 4, 8)
    with pytest.raises(ValueError, match="unknown fifo snapshot version 8"):
        snapshot.load(bytes(data))
