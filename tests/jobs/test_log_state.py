"""jobs/log_state.py `liveness`: the live messages of a queue's log as a restarted broker
would hold them, with a forwarded command appended twice (a leader crash between
append and answer) counted once, from the entries alone or over a snapshot that holds
the identity, and over a snapshot written before identities existed; a forward that
came before a lower seq of its node is held (live: the log keeps it) and applied in
its turn, also when the snapshot holds it.
"""

from __future__ import annotations

from quorumqueue.broker.fifo import snapshot as fifo_snapshot
from quorumqueue.broker.fifo.commands import Meta, encode_enqueue, encode_reply
from quorumqueue.broker.fifo.envelope import decode_entry
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import FifoState
from quorumqueue.broker.raft.forwarded import AppliedIds, Identity, dump_snapshot, wrap
from quorumqueue.broker.raft.storage import LogStore, StorageConfig
from quorumqueue.broker.raft.types import COMMAND, LogEntry, SnapshotMeta
from quorumqueue.jobs.log_state import liveness

GROUP = "%2F/orders/0123456789ab"
FIRST = Identity(0xFEED, 1, True)


def message(body: bytes) -> bytes:
    return encode_enqueue("", 0, 0, "", "orders", b"\x00\x3c", body)


def write(data_dir: str, entries: list[bytes], snapshot: tuple[int, bytes] | None = None):
    store = LogStore(data_dir, StorageConfig(fsync=False))
    store.set_initial_members(GROUP, ["n1"])
    first = 1 if snapshot is None else snapshot[0] + 1
    if snapshot is not None:
        store.install_snapshot(GROUP, SnapshotMeta(snapshot[0], 1, ("n1",)), snapshot[1])
    store.append(GROUP, [LogEntry(first + k, 1, COMMAND, data)
                         for k, data in enumerate(entries)])
    store.flush()
    store.close()


def live(data_dir: str) -> list[int]:
    return list(liveness(data_dir)[GROUP].live)


def test_a_command_forwarded_twice_is_one_live_message(tmp_path):
    write(str(tmp_path), [wrap(FIRST, message(b"a")), message(b"b"),
                          wrap(FIRST, message(b"a")), wrap(Identity(0xFEED, 2, False),
                                                           message(b"c"))])
    assert live(str(tmp_path)) == [1, 2, 4]


def snapshot_after_one(applied: AppliedIds, wrapped: bool) -> bytes:
    state = FifoState()
    state, _reply, _effects = apply(Meta(1, 1, 0), decode_entry(message(b"a"))[1], state)
    machine = fifo_snapshot.dump(state)
    return dump_snapshot(applied, machine, encode_reply) if wrapped else machine


def test_a_duplicate_after_a_snapshot_that_holds_its_identity_is_not_live(tmp_path):
    applied = AppliedIds()
    applied.record(FIRST, 1, "ok")
    write(str(tmp_path), [wrap(FIRST, message(b"a")), message(b"b")],
          snapshot=(1, snapshot_after_one(applied, wrapped=True)))
    assert live(str(tmp_path)) == [1, 3]


def test_a_snapshot_of_the_previous_version_still_reads(tmp_path):
    write(str(tmp_path), [message(b"b")], snapshot=(1, snapshot_after_one(AppliedIds(),
                                                                         wrapped=False)))
    assert live(str(tmp_path)) == [1, 2]


def test_a_forward_held_for_its_turn_is_live_and_applied_after_its_gap(tmp_path):
    c = wrap(Identity(0xFEED, 3, True), message(b"c"))
    write(str(tmp_path / "held"), [wrap(FIRST, message(b"a")), c, message(b"d")])
    held = liveness(str(tmp_path / "held"))[GROUP]
    assert list(held.live) == [1, 2, 3] and held.messages == 2   # c waits for seq 2
    write(str(tmp_path / "filled"), [wrap(FIRST, message(b"a")), c,
                                     wrap(Identity(0xFEED, 2, True), message(b"b"))])
    filled = liveness(str(tmp_path / "filled"))[GROUP]
    assert list(filled.live) == [1, 2, 3] and filled.messages == 3


def test_a_forward_held_in_the_snapshot_is_read_back_from_the_log_below_it(tmp_path):
    applied = AppliedIds()
    assert applied.admit_in_order(FIRST, 1, 1) == 0
    assert applied.admit_in_order(Identity(0xFEED, 3, True), 2, 1) == 2   # HELD
    store = LogStore(str(tmp_path), StorageConfig(fsync=False))
    store.set_initial_members(GROUP, ["n1"])
    store.append(GROUP, [LogEntry(1, 1, COMMAND, wrap(FIRST, message(b"a"))),
                         LogEntry(2, 1, COMMAND, wrap(Identity(0xFEED, 3, True), message(b"c"))),
                         LogEntry(3, 1, COMMAND, wrap(Identity(0xFEED, 2, True), message(b"b")))])
    store.flush()
    store.write_snapshot(GROUP, SnapshotMeta(2, 1, ("n1",)), snapshot_after_one(applied, True))
    store.flush()
    store.close()
    group = liveness(str(tmp_path))[GROUP]
    assert group.snapshot_index == 2 and list(group.live) == [1, 2, 3]
    assert group.messages == 3
