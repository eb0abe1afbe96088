"""A follower sent its leader's snapshot while it applies entries that let it take a
snapshot of its own (queues/quorum/groups.py `_after_apply`, raft/core.py `compact`).

The shell applies a round's committed entries once their Sync is durable; meanwhile
it reads the leader's messages and steps them into the core. A follower that was cut
off and is now too far behind gets an InstallSnapshot: the core holds that snapshot
(unstable) until the next Ready persists it. If the entries being applied leave the
queue empty (the machine's ReleaseCursor), the node would snapshot its own state at
an index the leader's snapshot already covers; the core refuses such a compaction,
and the refusal stopped the node ("the node failed while applying or persisting its
logs", exit status 70). Found by the fault suite (random halves on 3 and 5 nodes): two
of five nodes stopped this way, the dead-letter queues lost their majority, and the
dead letters rejected after that never reached their target.

The leader's snapshot supersedes the follower's own: the node takes none then and
installs the leader's.
"""

from __future__ import annotations

from quorumqueue.broker.groups import metadata as meta
from quorumqueue.broker.groups.metadata import encode as encode_meta
from quorumqueue.broker.fifo import commands
from quorumqueue.broker.fifo.commands import Dequeue
from quorumqueue.broker.node import group_commit
from quorumqueue.broker.raft.forwarded import dump_snapshot
from quorumqueue.broker.raft.messages import AppendEntries, InstallSnapshot
from quorumqueue.broker.raft.types import COMMAND, LogEntry, SnapshotMeta
from tests.broker.node.test_forwarded_apply import ME, QUORUM, message, start

LEADER = "qq2@localhost"


def follower_queue(node):
    """The quorum queue "q" with members this node and LEADER: a follower here."""
    node.cluster.meta.propose_data(encode_meta("queue.declare", vhost="/", name="q",
                                               arguments=QUORUM, group="%2F/q/0123456789ab",
                                               members=[ME, LEADER], leader=LEADER))
    node.flush()
    return node.vhosts["/"].queues["q"]


def test_the_leaders_snapshot_arriving_while_entries_apply_is_installed(tmp_path):
    node = start(tmp_path)
    queue = follower_queue(node)
    empty_state = queue.snapshot()  # the leader's state at index 10: everything consumed
    get = commands.encode(Dequeue("k/get", True, "k"))
    # the leader replicates a message and a no-ack get of it, committed: applying them
    # leaves the queue empty, so the machine releases the log and the node snapshots
    queue.raft.step(AppendEntries(1, LEADER, ME, 0, 0, (
        LogEntry(1, 1, COMMAND, message(b"a")), LogEntry(2, 1, COMMAND, get)), 2))
    sync = group_commit.begin_sync(node)
    assert any(ready.committed for _member, _raft, ready in sync.round.readies)
    # while that round's Sync runs, the leader's snapshot arrives (the follower was
    # cut off, and the leader released its log meanwhile)
    queue.raft.step(InstallSnapshot(1, LEADER, ME, SnapshotMeta(10, 1, (ME, LEADER)),
                                    empty_state))
    sync.run()
    group_commit.end_sync(node, sync)  # applies 1-2: no snapshot of its own over 10
    node.flush()                       # the next round installs the leader's
    assert node.quorum.store.snapshot_meta(queue.group).index == 10
    assert queue.raft.applied_index == 10 and queue.raft.commit_index == 10
    assert queue.state.ready_count == 0


def test_the_metadata_group_too_installs_the_leaders_snapshot_arriving_while_it_applies(
        tmp_path):
    """The metadata group snapshots every `metadata_store.snapshot_interval` entries
    (1 here): the same race, the same answer."""
    node = start(tmp_path, metadata_snapshot_interval=1)
    group = node.cluster.meta
    state = dump_snapshot(group.applied, node.metadata_snapshot(), meta.encode_reply)
    last = group.raft.log.last_index()
    term = group.raft.term + 1  # a new leader, elsewhere
    declare = encode_meta("exchange.declare", vhost="/", name="x", type="direct",
                          durable=True, auto_delete=False, internal=False, arguments={})
    group.raft.step(AppendEntries(term, LEADER, ME, last, group.raft.log.last_term(),
                                  (LogEntry(last + 1, term, COMMAND, declare),), last + 1))
    sync = group_commit.begin_sync(node)
    group.raft.step(InstallSnapshot(term, LEADER, ME, SnapshotMeta(last + 10, term,
                                                                   (ME, LEADER)), state))
    sync.run()
    group_commit.end_sync(node, sync)
    node.flush()
    assert node.quorum.store.snapshot_meta(meta.META_GROUP).index == last + 10
    assert "x" not in node.vhosts["/"].exchanges  # the leader's metadata, without it
