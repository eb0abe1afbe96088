"""The Ready loop over many groups (broker/groups/driver.py): etcd-io/raft's order —
persist, then send, then apply, then advance — for every group of a node at once,
with one store flush (one fdatasync) between persisting and sending.

First an interaction script with scripted cores and a recording store, so the order
of every call is visible; then real single-member groups over a real LogStore."""

from __future__ import annotations

import errno
import random

from quorumqueue.broker.groups import driver
from quorumqueue.broker.raft import COMMAND, HardState, LogEntry, RaftConfig, RaftNode
from quorumqueue.broker.raft.log import Snapshot
from quorumqueue.broker.raft.ready import Ready, Role
from quorumqueue.broker.raft.types import SnapshotMeta
from quorumqueue.broker.raft.storage import LogStore


def run_rounds(store, members, handler):
    """What a shell does (node/group_commit.py, with the flush inline): rounds until
    no group has a Ready."""
    for _round in range(driver.MAX_ROUNDS):
        batch = driver.persist_round(store, members)
        store.flush()
        if not batch:
            return
        driver.finish_round(batch, handler)
    raise AssertionError("Readies kept coming")


def make_ready(entries=(), messages=(), committed=(), hard_state=None, leader_changed=False):
    return Ready(hard_state=hard_state, snapshot=None, truncate_from=None,
                 entries=tuple(entries), messages=tuple(messages), committed=tuple(committed),
                 term=1, role=Role.LEADER, leader_id="n1", leader_changed=leader_changed,
                 commit_index=0, members=("n1",))


def entry(index, data=b"x"):
    return LogEntry(index, 1, COMMAND, data)


class ScriptedRaft:
    """A core that hands out the Readies it was given, one per round."""

    def __init__(self, name, readies, calls):
        self.name, self.readies, self.calls = name, list(readies), calls

    def ready(self):
        return self.readies.pop(0) if self.readies else None

    def advance(self, ready):
        self.calls.append(f"advance {self.name}")

    def ready_to_apply(self):
        self.calls.append(f"ready_to_apply {self.name}")
        return None


class Group:
    def __init__(self, name, readies, calls):
        self.group = name
        self.raft = ScriptedRaft(name, readies, calls)


class RecordingStore:
    def __init__(self, calls):
        self.calls = calls

    def append(self, group, entries):
        self.calls.append(f"append {group} {[e.index for e in entries]}")

    def set_hard_state(self, group, hard_state):
        self.calls.append(f"hard_state {group} term={hard_state.term}")

    def flush(self):
        self.calls.append("flush")


class RecordingHandler:
    def __init__(self, calls):
        self.calls = calls

    def send(self, member, messages):
        self.calls.append(f"send {member.group} {list(messages)}")

    def apply(self, member, ready):
        self.calls.append(f"apply {member.group} {[e.index for e in ready.committed]}")

    def advanced(self, member, ready):
        self.calls.append(f"advanced {member.group}")


def test_every_group_is_persisted_then_one_flush_then_sends_then_apply_and_advance():
    calls = []
    a = Group("a", [make_ready(entries=[entry(1), entry(2)], messages=["a->b App"],
                               hard_state=HardState(1, "a")),
                    make_ready(committed=[entry(1), entry(2)])], calls)
    b = Group("b", [make_ready(entries=[entry(7)], messages=["b->c App"],
                               committed=[entry(6)])], calls)
    run_rounds(RecordingStore(calls), [a, b], RecordingHandler(calls))
    assert calls == [
        # round 1: both groups persisted, one flush for both, then every send
        "append a [1, 2]", "hard_state a term=1", "append b [7]",
        "flush",
        "send a ['a->b App']", "send b ['b->c App']",
        "apply a []", "advance a", "advanced a",
        "apply b [6]", "advance b", "advanced b",
        # round 2: only a has a Ready (its entries, now durable, are committed)
        "flush",
        "apply a [1, 2]", "advance a", "advanced a",
        # no Ready left: the flush writes what applying buffered, if anything
        "flush",
    ]


def test_persist_round_buffers_and_finish_round_sends_applies_and_advances():
    """The two halves a shell with its own flush uses: nothing is sent, applied or
    advanced by persist_round."""
    calls = []
    a = Group("a", [make_ready(entries=[entry(1)], messages=["a->b App"])], calls)
    batch = driver.persist_round(RecordingStore(calls), [a])
    assert calls == ["append a [1]"]
    driver.finish_round(batch, RecordingHandler(calls))
    assert calls == ["append a [1]", "send a ['a->b App']", "apply a []", "advance a",
                     "advanced a"]


def test_a_member_that_left_while_the_store_flushed_is_not_driven():
    """The node left group b between persisting and finishing the round (its core is
    gone): a's Ready goes on, b's is dropped with its core."""
    calls = []
    a = Group("a", [make_ready(entries=[entry(1)], messages=["a->x App"])], calls)
    b = Group("b", [make_ready(entries=[entry(1)], messages=["b->x App"])], calls)
    batch = driver.persist_round(RecordingStore(calls), [a, b])
    b.raft = None
    driver.finish_round(batch, RecordingHandler(calls))
    assert calls == ["append a [1]", "append b [1]", "send a ['a->x App']", "apply a []",
                     "advance a", "advanced a"]


class Applier:
    """Applies committed commands of real groups; the first command proposes another
    (as a no-ack delivery proposes its settle while applying)."""

    def __init__(self, store):
        self.store = store
        self.applied = []
        self.durable_at_apply = []

    def send(self, member, messages):
        raise AssertionError("a group of one sends nothing")

    def apply(self, member, ready):
        for committed in ready.committed:
            if committed.kind != COMMAND:
                continue
            # what is applied is durable: the store has nothing left to write for it
            self.durable_at_apply.append(not self.store._pending.records)
            self.applied.append((member.group, committed.data))
            if committed.data == b"first":
                member.raft.propose(b"proposed while applying")

    def advanced(self, member, ready):
        pass


def test_groups_of_one_over_a_log_store_apply_everything_durable(tmp_path):
    store = LogStore(str(tmp_path))
    members = []
    for name in ("g1", "g2"):
        store.set_initial_members(name, ["n1"])
        member = Group(name, [], [])
        member.raft = RaftNode("n1", RaftConfig(), store.group_log(name), random.Random(1))
        member.raft.campaign()
        members.append(member)
    members[0].raft.propose(b"first")    # a group of one leads once it campaigns
    members[1].raft.propose(b"second")
    applier = Applier(store)
    run_rounds(store, members, applier)
    assert sorted(applier.applied) == [("g1", b"first"), ("g1", b"proposed while applying"),
                                       ("g2", b"second")]
    assert all(applier.durable_at_apply)
    assert all(m.raft.ready() is None for m in members)
    store.close()

    reopened = LogStore(str(tmp_path))    # everything applied was on disk
    assert reopened.last_index("g1") == 3 and reopened.last_index("g2") == 2
    reopened.close()


def test_apply_round_applies_what_the_flush_committed_before_newer_proposals_persist(tmp_path):
    """A shell that flushes off its event loop takes proposals while the flush runs
    (node/group_commit.py). Once it completes, a group of one's flushed entries are
    committed: `apply_round` applies them right away, while the newer proposal is
    still only in memory, waiting for the next round's flush."""
    store = LogStore(str(tmp_path))
    store.set_initial_members("g", ["n1"])
    member = Group("g", [], [])
    member.raft = RaftNode("n1", RaftConfig(), store.group_log("g"), random.Random(1))
    member.raft.campaign()
    applier = Applier(store)
    run_rounds(store, [member], applier)
    member.raft.propose(b"second")
    batch = driver.persist_round(store, [member])
    store.flush()
    member.raft.propose(b"third")          # came in while the flush ran
    driver.finish_round(batch, applier)
    assert applier.applied == []            # finish_round advances; that commits
    driver.apply_round([member], applier)
    assert applier.applied == [("g", b"second")]
    assert store.last_index("g") == 2       # third is not persisted yet
    driver.apply_round([member], applier)   # nothing more is committed and durable
    assert applier.applied == [("g", b"second")]

    run_rounds(store, [member], applier)
    assert applier.applied == [("g", b"second"), ("g", b"third")]
    assert all(applier.durable_at_apply)
    store.close()


class Wire:
    """Three members' handlers: what one sends is queued for its peers (step it in
    with `deliver`); what one applies is recorded."""

    def __init__(self):
        self.in_flight, self.applied, self.sent = [], {}, {}

    def handler(self, name):
        wire = self

        class Handler:
            def send(self, member, messages):
                wire.sent.setdefault(name, []).extend(messages)
                wire.in_flight.extend(messages)

            def apply(self, member, ready):
                wire.applied.setdefault(name, []).extend(
                    e.data for e in ready.committed if e.kind == COMMAND)

            def advanced(self, member, ready):
                pass

        return Handler()

    def deliver(self, members):
        while self.in_flight:
            message = self.in_flight.pop(0)
            members[message.to].raft.step(message)


def test_a_leaders_appends_leave_before_its_fsync_and_it_applies_only_after(tmp_path):
    """driver.send_early: the leader's AppendEntries go out while its own round is
    still unflushed; the followers persist them and answer, which commits the entry
    (two of three), but the leader applies it — and so confirms it — only once its
    own flush made it durable here. The followers' answers wait for their flush,
    and nothing is sent twice."""
    from quorumqueue.broker.raft.messages import AppendEntries, AppendEntriesResponse

    names = ("n1", "n2", "n3")
    stores = {n: LogStore(str(tmp_path / n)) for n in names}
    members, wire = {}, Wire()
    for n in names:
        stores[n].set_initial_members("g", names)
        members[n] = Group("g", [], [])
        members[n].raft = RaftNode(n, RaftConfig(), stores[n].group_log("g"), random.Random(1))

    def settle():  # every member's rounds, the flush inline, until the wire is quiet
        for _ in range(50):
            for n in names:
                run_rounds(stores[n], [members[n]], wire.handler(n))
            if not wire.in_flight:
                return
            wire.deliver(members)
        raise AssertionError("the group did not settle")

    members["n1"].raft.campaign()
    settle()
    assert members["n1"].raft.role is Role.LEADER
    wire.sent.clear()

    leader = members["n1"]
    leader.raft.propose(b"m")
    batch = driver.persist_round(stores["n1"], [leader])
    driver.send_early(batch, wire.handler("n1"))
    early = list(wire.sent["n1"])
    assert early and all(type(m) is AppendEntries and m.entries for m in early)

    for n in ("n2", "n3"):  # the followers take the appends and flush
        wire.deliver(members)
        follower_batch = driver.persist_round(stores[n], [members[n]])
        driver.send_early(follower_batch, wire.handler(n))
        assert n not in wire.sent  # a follower's answer never leaves before its flush
        stores[n].flush()
        driver.finish_round(follower_batch, wire.handler(n), sent_early=True)
        assert all(type(m) is AppendEntriesResponse for m in wire.sent[n])
    wire.deliver(members)  # their answers reach the leader, its flush still pending
    index = early[0].entries[-1].index
    assert leader.raft.commit_index >= index  # committed on two followers' disks
    assert wire.applied.get("n1", []) == []    # ... but not applied on the leader yet

    stores["n1"].flush()
    driver.finish_round(batch, wire.handler("n1"), sent_early=True)
    driver.apply_round([leader], wire.handler("n1"))
    assert wire.applied["n1"] == [b"m"]
    sent_appends = [m for m in wire.sent["n1"] if type(m) is AppendEntries
                    and m.entries and m.entries[-1].index == index]
    assert sorted(m.to for m in sent_appends) == ["n2", "n3"]  # once each, not twice
    settle()
    assert all(wire.applied[n] == [b"m"] for n in names)
    for store in stores.values():
        store.close()


class FullDiskStore(RecordingStore):
    """Has no room for the first snapshot install (ENOSPC, nothing written)."""

    def __init__(self, calls):
        super().__init__(calls)
        self.full = True

    def install_snapshot(self, group, meta, data):
        if self.full:
            self.full = False
            self.calls.append(f"install {group} {meta.index}: no room")
            raise OSError(errno.ENOSPC, "No space left on device")
        self.calls.append(f"install {group} {meta.index}")


def test_a_snapshot_the_disk_has_no_room_for_holds_its_group_only_until_a_later_round():
    """A full disk stops one group, not the node (driver.py, "A full disk"): the group
    whose snapshot install found no room is left out of the round, its Ready kept, and
    persisted first in the next round; the other group goes on meanwhile."""
    calls = []
    snapshot = Snapshot(SnapshotMeta(9, 2, ("n1",)), b"state")
    a = Group("a", [Ready(hard_state=None, snapshot=snapshot, truncate_from=None,
                          entries=(entry(10),), messages=("a->n1 SnapResp",), committed=(),
                          term=2, role=Role.FOLLOWER, leader_id="n1", leader_changed=False,
                          commit_index=9, members=("n1",))], calls)
    b = Group("b", [make_ready(entries=[entry(1)], messages=["b->x App"]),
                    make_ready(entries=[entry(2)])], calls)
    store, handler, held = FullDiskStore(calls), RecordingHandler(calls), {}
    batch = driver.persist_round(store, [a, b], held)
    assert list(held) == ["a"] and [member.group for member, _raft, _ready in batch] == ["b"]
    driver.finish_round(batch, handler)
    driver.apply_round([a, b], handler, held)      # a's core is not asked: it waits
    batch = driver.persist_round(store, [a, b], held)
    assert held == {}
    driver.finish_round(batch, handler)
    assert calls == [
        "install a 9: no room", "append b [1]",
        "send b ['b->x App']", "apply b []", "advance b", "advanced b",
        "ready_to_apply b",
        "install a 9", "append a [10]", "append b [2]",
        "send a ['a->n1 SnapResp']", "apply a []", "advance a", "advanced a",
        "apply b []", "advance b", "advanced b"]


def test_a_round_asks_only_the_groups_that_had_input_however_many_the_node_holds():
    """Issue 31, "Costs that follow the work": a node's round asks for a Ready only
    the groups whose cores had input since their last round (raft/core.py `awake`:
    a proposal, a message, an election, an advance), not each of its groups. With 400
    idle quorum queues, one confirmed publish to one of them asks a few groups, where
    the old scan asked every group in every round (>= 800 for two rounds)."""
    from pamqp import commands

    from tests.broker.node.harness import Client, new_node

    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    for number in range(400):
        client.declare_queue(1, f"q{number}", durable=True,
                             arguments={"x-queue-type": "quorum"})
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    asked = []
    original = RaftNode.ready

    def counted(raft):
        asked.append(raft)
        return original(raft)

    RaftNode.ready = counted
    try:
        client.publish(1, "", "q123", b"m", props=commands.Basic.Properties(delivery_mode=2))
        assert client.read_names() == ["Basic.Ack"]
    finally:
        RaftNode.ready = original
    assert 0 < len(asked) <= 8, len(asked)
    queue = client.node.vhosts["/"].queues["q123"]
    assert queue.ready_count == 1
