"""A forwarded command appended twice is applied once (broker/raft/forwarded.py,
groups/replicated.py `admit`, queues/quorum/groups.py `apply`): a leader that appended and
replicated a command a follower forwarded, then crashed before answering, leaves it
in the log, and the follower's resend is appended again by the next leader. And a
node's forwards to a quorum queue are applied in the order it sent them, however
they were appended (`admit_in_order`): one lost and resent after later ones waits for
nothing, the later ones wait for it.

The entries are appended here as those two leaders would have, into a node's real
groups (a quorum queue, the metadata group), and applied by the node's own Ready loop:
the state changes once, the duplicate's waiter gets the first application's reply,
and the same holds after a snapshot (restored, or a restart from it) and for a log
replayed after a restart, old-format entries included.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from quorumqueue.broker.auth.users import UserStore
from quorumqueue.broker.groups.metadata import encode as encode_meta
from quorumqueue.broker.cluster.cluster import _Pending
from quorumqueue.broker.config import Settings
from quorumqueue.broker.fifo import commands
from quorumqueue.broker.fifo.commands import Delivery, Dequeue, encode_enqueue
from quorumqueue.broker.fifo.envelope import stamp
from quorumqueue.broker.node.node import Node
from quorumqueue.broker.queues.actions import GetEmpty, GetOk
from quorumqueue.broker.queues.quorum import groups as quorum_groups
from quorumqueue.broker.queues.quorum.queue import MessageGone
from quorumqueue.broker.raft import forwarded as forwarded_module
from quorumqueue.broker.raft.forwarded import WINDOW, Identity, wrap
from quorumqueue.broker.raft.messages import AppendEntries, RequestVoteResponse
from quorumqueue.broker.raft.types import NOOP, LogEntry
from quorumqueue.broker.raft.storage import LogStore, StorageConfig
from quorumqueue.broker.server.server import assemble_node
from quorumqueue.broker.storage.metadata_store import MetadataStore

ME = "qq1@localhost"
QUORUM = {"x-queue-type": "quorum"}
FOLLOWER = 0x5EED  # the forwarding node's run
HEADER = b"\x00\x3c\x00\x00" + bytes(8) + b"\x00\x00"  # an empty class-60 content header


def start(tmp_path, name: str = "node", **settings) -> Node:
    """A node on DATA_DIR tmp_path/name (the same name again: a restart), recovered as
    the server recovers one."""
    config = Settings(node_name=ME, data_dir=str(tmp_path / name), **settings)
    node = assemble_node(config, UserStore.with_default_user(),
                         LogStore(config.data_dir, StorageConfig(fsync=False)),
                         metadata_store=MetadataStore(config.data_dir))
    node.recover()
    node.cluster.meta.recover()
    return node


def declare(node: Node, group: str = "%2F/q/0123456789ab"):
    """The quorum queue "q", declared through the metadata group (a node recovers
    what its metadata names)."""
    node.cluster.meta.propose_data(encode_meta("queue.declare", vhost="/", name="q",
                                               arguments=QUORUM, group=group,
                                               members=[ME], leader=ME))
    node.flush()
    return node.vhosts["/"].queues["q"]


def message(body: bytes) -> bytes:
    return encode_enqueue("", 0, 0, "", "q", HEADER, body)


def forwarded(seq: int, data: bytes) -> bytes:
    return wrap(Identity(FOLLOWER, seq, True), data)


def append(group, data: bytes, replies: list | None = None, waiter=None) -> int:
    """Append `data` to the group's log as its leader does; `replies` gets the reply of
    this entry, or `waiter` is called with it (as a forwarding node waits at the
    (index, term) it was told)."""
    index = group.raft.propose(data)
    if replies is not None or waiter is not None:
        group.wait_at(index, group.raft.term, data, waiter or replies.append)
    return index


def bodies(node: Node, queue) -> list[bytes]:
    indexes = [index for index, _size in queue.state.normal.items()]
    return [node.quorum.read_message(queue, index)[3] for index in indexes]


def test_a_publish_appended_twice_is_stored_once_and_confirmed_twice(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    replies: list = []
    append(queue, forwarded(1, message(b"once")), replies)       # the first leader's append
    append(queue, message(b"local"))                             # proposed on the leader
    append(queue, forwarded(1, message(b"once")), replies)       # the resend, appended again
    node.quorum.flush()
    assert bodies(node, queue) == [b"once", b"local"]
    # the duplicate's waiter: not "rejected", so the publisher's confirm is an ack
    assert replies == ["ok", None]


def test_a_basic_get_appended_twice_takes_one_message_and_answers_both_with_it(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    first_index = append(queue, message(b"m0"))
    for n in (1, 2):
        append(queue, message(b"m%d" % n))
    get = forwarded(1, commands.encode(Dequeue("qq2@localhost:b.1.1/get", False,
                                               "qq2@localhost:b.1.1")))
    replies: list = []
    append(queue, get, replies)
    append(queue, get, replies)
    node.quorum.flush()
    assert queue.ready_count == 2 and queue.unacked_count == 1
    first = Delivery(1, first_index, 0)
    assert replies == [(first, 2), (first, 2)]  # the same message, not a second one


class Channel:
    """Who asked for a basic.get (QuorumQueue.got answers it with actions)."""

    is_open = True


def test_a_no_ack_get_applied_twice_after_its_message_was_released_answers_empty(tmp_path):
    """The first application took and settled the message; by the time the duplicate
    is applied the log below the release cursor may be gone: the duplicate's client
    gets get-empty (a no-ack get is at most once), not an error in the apply loop."""
    node = start(tmp_path)
    queue = declare(node)
    append(queue, message(b"a"))
    channel = Channel()
    answers: list = []
    answer = lambda reply: answers.extend(queue.got(channel, "k/get", True, reply))  # noqa: E731
    get = forwarded(1, commands.encode(Dequeue("k/get", True, "k")))
    append(queue, get, waiter=answer)
    node.flush()
    [got] = answers
    assert type(got) is GetOk and got.to is channel
    assert (got.body, got.remaining, got.no_ack) == (b"a", 0, True)
    node.quorum.store.release(queue.group, queue.raft.applied_index + 1)
    append(queue, get, waiter=answer)
    node.flush()
    assert answers[1:] == [GetEmpty(channel)]


def test_identities_appended_out_of_order_are_applied_once_in_their_order(tmp_path):
    """A follower's forward of 2 was lost with a leader and resent after 3 was appended
    (and repeats of 1, 2, 3 appended again): the queue keeps the publisher's order (the
    queues guide, "Message Ordering": messages published on one channel are enqueued in
    publishing order; the quorum queues guide, "Queue Leader Location": every operation
    goes through the leader to keep FIFO order). Each is stored once, and the confirms
    come in the same order: 3's after 2's."""
    node = start(tmp_path)
    queue = declare(node)
    confirmed: list = []
    for seq in (1, 3, 2, 3, 1, 4, 2):
        append(queue, forwarded(seq, message(b"%d" % seq)),
               waiter=lambda reply, seq=seq: confirmed.append((seq, reply)))
    node.quorum.flush()
    assert bodies(node, queue) == [b"1", b"2", b"3", b"4"]
    # repeats are answered None ("stored"), as any duplicate; 3 waits for 2
    assert confirmed == [(1, "ok"), (2, "ok"), (3, "ok"), (3, None), (1, None), (4, "ok"),
                         (2, None)]


def test_a_held_forward_survives_a_snapshot_and_a_restart_and_follows_its_gap(
        tmp_path, monkeypatch):
    """A publish (seq 3) is held behind a basic.get (seq 2) lost with a leader, while the
    messages after it are snapshotted: the snapshot keeps 3 pending and the log keeps
    its entry (the release cursor stays at it, though no message below it is live), so
    after a restart the resent get is applied, then 3, read back from the log."""
    node = start(tmp_path)
    queue = declare(node)
    get = commands.encode(Dequeue("k/get", True, "k"))
    append(queue, forwarded(1, get))
    held_at = append(queue, forwarded(3, message(b"3")))
    node.quorum.flush()
    # a snapshot at every release cursor (each command's)
    queue.state.config = replace(queue.state.config, release_cursor_interval=1)
    monkeypatch.setattr(quorum_groups, "MIN_SNAPSHOT_INTERVAL", 1)
    for _ in range(3):
        append(queue, message(b"local"))
    node.quorum.flush()
    assert node.quorum.store.snapshot_meta(queue.group).index > held_at
    assert node.quorum.store.release_cursor(queue.group) <= held_at
    node.quorum.store.close()
    again = start(tmp_path)
    again.flush()
    recovered = again.vhosts["/"].queues["q"]
    assert recovered.applied == queue.applied and recovered.applied.lowest_pending() == held_at
    replies: list = []
    append(recovered, forwarded(2, get), replies)
    again.flush()
    assert bodies(again, recovered) == [b"local", b"local", b"3"]  # the get took one
    assert [reply[1] for reply in replies] == [2]  # two left when it was applied, then 3


def test_on_an_idle_queue_the_leader_gives_a_gap_up_with_a_tick_after_hold_ms(tmp_path):
    """The forwarding node died before resending 2, and nothing else comes to the
    queue: HOLD_MS after 3 was stamped, the leader's tick proposes a Tick, whose time
    gives the gap up on every member; 3 is stored (never confirmed: nobody waits)."""
    node = start(tmp_path)
    queue = declare(node)
    at = 1_700_000_000_000
    append(queue, forwarded(1, stamp(message(b"1"), at)))
    append(queue, forwarded(3, stamp(message(b"3"), at + 1)))
    node.quorum.flush()
    node.quorum.tick(at + forwarded_module.HOLD_MS)             # not yet
    node.flush()
    assert bodies(node, queue) == [b"1"]
    node.quorum.tick(at + 1 + forwarded_module.HOLD_MS)
    node.flush()
    assert bodies(node, queue) == [b"1", b"3"]


def test_a_consumer_gets_the_messages_a_given_up_gap_releases(tmp_path):
    """The gap above is given up by the Tick, the first entry of its round, while a
    consumer waits on the queue: the released publish is handed to the consumer and
    reaches its client (before, it was checked out to the consumer as if replayed
    after a restart, and never sent: the fault suite's kill-majority run found it
    ready only once the consumer left, confirmed and never delivered)."""
    from pamqp import commands as amqp

    from tests.broker.node.harness import Client, method

    node = start(tmp_path)
    queue = declare(node)
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    client.send(1, method(amqp.Basic.Consume, queue="q", consumer_tag="c"))
    (_channel, ok), = client.read_deliveries()
    assert type(ok) is amqp.Basic.ConsumeOk
    at = 1_700_000_000_000
    append(queue, forwarded(1, stamp(message(b"1"), at)))
    append(queue, forwarded(3, stamp(message(b"3"), at + 1)))
    node.flush()
    assert [d.body for d in client.read_deliveries()] == [b"1"]
    node.quorum.tick(at + 1 + forwarded_module.HOLD_MS)
    node.flush()
    assert [d.body for d in client.read_deliveries()] == [b"3"]
    assert queue.unacked_count == 2 and queue.ready_count == 0


def test_a_node_that_forwarded_to_a_queue_keeps_its_order_once_it_leads_it(tmp_path):
    """This node forwarded 1 and 2 to the queue's leader elsewhere; 2 was lost with that
    leader and this node leads the queue now. A publish made here before 2 is proposed
    again (by its waiter's term check, or a resend) goes after 2: it carries the node's
    next seq, 3, and waits for 2, instead of being appended bare ahead of it."""
    node = start(tmp_path)
    queue = declare(node)
    own = node.cluster.origin
    node.cluster._forwarded[queue.group] = 2          # the seqs it gave as a follower
    append(queue, wrap(Identity(own, 1, True), message(b"1")))
    confirmed: list = []
    queue.propose_data(message(b"3"), lambda reply: confirmed.append(("3", reply)))
    append(queue, wrap(Identity(own, 2, True), message(b"2")),
           waiter=lambda reply: confirmed.append(("2", reply)))
    node.quorum.flush()
    assert bodies(node, queue) == [b"1", b"2", b"3"]
    assert confirmed == [("2", "ok"), ("3", "ok")]


def test_a_forward_no_one_waits_for_lost_with_its_leader_is_proposed_again(tmp_path):
    """This node forwarded seq 1, a publish without confirms (no waiter), to the queue's
    leader elsewhere, which appended it at index i in its term, said so, and died before
    replicating it; the next leader's entry at i is of a newer term. This node's next
    forward, seq 2, a confirmed publish, must not wait behind a gap no one fills (held
    until forwarded.HOLD_MS): seq 1 is proposed again, and both are stored in order.
    (Fault suite, kill-majority: a follower's acks lost that way held its confirms
    back for 50 s.)"""
    node = start(tmp_path)
    queue = declare(node)
    cluster = node.cluster
    own, old_term = cluster.origin, queue.raft.term
    cluster._forwarded[queue.group] = 1                # seq 1 went to another leader
    lost_at = queue.raft.log.last_index() + 1
    cluster.pending.add(99, _Pending(queue, wrap(Identity(own, 1, False), message(b"1")),
                                     None))
    cluster._on_accepted("qq2@localhost", {"r": [99], "i": [lost_at], "t": [old_term]})
    # a newer term: this member steps down (a peer's higher term) and is elected
    # again; the new term's first entry lands at i
    queue.raft.step(RequestVoteResponse(old_term + 1, "qq2@localhost", ME, False))
    queue.raft.campaign()
    node.quorum.flush()
    assert queue.raft.term > old_term
    confirmed: list = []
    queue.propose_data(message(b"2"), confirmed.append)  # seq 2, after seq 1
    node.quorum.flush()
    node.quorum.flush()
    assert bodies(node, queue) == [b"1", b"2"]
    assert confirmed == ["ok"]


def test_a_numbered_command_this_leader_lost_with_its_term_is_forwarded_again(tmp_path):
    """This node forwarded to the queue before, so it numbers what it proposes while it
    leads (ReplicatedGroup.propose_run). It proposes seq 2, an ack-like command no one
    waits for, and loses the append: a leader of a newer term overwrites index i before
    it commits. Applying that leader's entry at i, this member sends seq 2 to the new
    leader, so the seq is not a gap that holds its later commands back."""
    node = start(tmp_path)
    queue = declare(node)
    cluster = node.cluster
    cluster._forwarded[queue.group] = 1
    queue.propose_data(message(b"lost"), None)         # seq 2, appended here, unsynced
    lost_at, term = queue.raft.log.last_index(), queue.raft.term
    assert not cluster.pending
    queue.raft.step(AppendEntries(term + 1, "qq2@localhost", ME, lost_at - 1,
                                  queue.raft.log.term_at(lost_at - 1),
                                  (LogEntry(lost_at, term + 1, NOOP, b""),), lost_at))
    node.quorum.flush()
    node.quorum.flush()
    resent = [pending.data for pending in cluster.pending.values()]
    assert resent == [wrap(Identity(cluster.origin, 2, False), message(b"lost"))]


def test_a_gap_that_never_fills_is_given_up_after_hold_entries(tmp_path, monkeypatch):
    """The forwarding node died before it resent 2 (nobody waits for 3 and 4 any more):
    once HOLD_ENTRIES entries were applied past 3, the gap is given up and 3, 4 are
    stored in their order; a 2 that still comes is stored then, once."""
    monkeypatch.setattr(forwarded_module, "HOLD_ENTRIES", 5)
    node = start(tmp_path)
    queue = declare(node)
    append(queue, forwarded(1, message(b"1")))
    append(queue, forwarded(3, message(b"3")))
    append(queue, forwarded(4, message(b"4")))
    for _ in range(2):
        append(queue, message(b"local"))
    node.quorum.flush()
    assert bodies(node, queue) == [b"1", b"local", b"local"]   # 3 and 4 wait
    for _ in range(2):
        append(queue, message(b"later"))
    node.quorum.flush()
    # given up before the entry HOLD_ENTRIES after 3's is applied
    assert bodies(node, queue) == [b"1", b"local", b"local", b"later", b"3", b"4", b"later"]
    append(queue, forwarded(2, message(b"2")))
    append(queue, forwarded(3, message(b"3")))                  # a repeat: still skipped
    node.quorum.flush()
    assert bodies(node, queue)[-1:] == [b"2"] and bodies(node, queue).count(b"3") == 1


def test_a_publish_resent_after_window_later_forwards_is_stored_and_confirmed(tmp_path):
    """A follower publishing fast while its queue's leader changes: its forward of
    "late" was lost with the old leader and is resent after WINDOW later forwards of
    the same node were appended and applied (forwarded.py's floor passed it). The
    resend is applied: "late" is stored and its confirm is an ack of a stored message,
    never an ack for a message the queue does not hold. A forward applied before and
    appended again that late is stored twice (at least once, never lost)."""
    node = start(tmp_path)
    queue = declare(node)
    for seq in range(2, WINDOW + 50):
        append(queue, forwarded(seq, message(b"m")))
    node.quorum.flush()
    replies: list = []
    append(queue, forwarded(1, message(b"late")), replies)      # the resend
    append(queue, forwarded(2, message(b"m")), replies)         # a very late duplicate
    node.quorum.flush()
    stored = bodies(node, queue)
    assert stored.count(b"late") == 1
    assert stored.count(b"m") == len(range(2, WINDOW + 50)) + 1   # seq 2 twice
    assert replies == ["ok", "ok"]


def test_a_duplicate_after_a_restored_snapshot_is_skipped_with_its_reply(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    index_a = append(queue, message(b"a"))
    replies: list = []
    get = forwarded(1, commands.encode(Dequeue("k/get", True, "k")))
    append(queue, get, replies)
    node.quorum.flush()
    snapshot = queue.snapshot()
    # a follower that installs this snapshot, then gets the entry appended again
    other = start(tmp_path, "follower")
    follower = declare(other)
    follower.restore(snapshot)
    assert follower.state.ready_count == 0 and follower.applied == queue.applied
    append(follower, message(b"b"))
    append(follower, get, replies)
    other.quorum.flush()
    assert follower.ready_count == 1  # "b" is still there: the get was not applied again
    assert replies == [(Delivery(0, index_a, 0), 0)] * 2


def test_a_restart_replays_old_and_new_entries_and_skips_the_duplicate(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    append(queue, message(b"old-format"))            # as every entry before identities
    append(queue, forwarded(1, message(b"forwarded")))
    append(queue, forwarded(1, message(b"forwarded")))
    node.flush()
    node.quorum.store.close()
    again = start(tmp_path)
    again.flush()
    recovered = again.vhosts["/"].queues["q"]
    assert bodies(again, recovered) == [b"old-format", b"forwarded"]
    assert recovered.applied == queue.applied


def test_a_restart_from_a_snapshot_skips_a_duplicate_appended_after_it(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    # a snapshot after every command (the machine's release-cursor interval)
    queue.state.config = replace(queue.state.config, release_cursor_interval=1)
    append(queue, forwarded(1, message(b"forwarded")))
    append(queue, message(b"local"))
    node.quorum.flush()
    snapshot_at = node.quorum.store.snapshot_meta(queue.group).index
    assert snapshot_at == 2  # holds the forwarded command's identity
    append(queue, forwarded(1, message(b"forwarded")))
    node.flush()
    node.quorum.store.close()
    again = start(tmp_path)
    again.flush()
    recovered = again.vhosts["/"].queues["q"]
    assert recovered.raft.applied_index > snapshot_at + 1  # the duplicate was replayed
    assert bodies(again, recovered) == [b"forwarded", b"local"]
    assert recovered.applied == queue.applied


def exchange_declare(name: str, type_: str) -> bytes:
    return encode_meta("exchange.declare", vhost="/", name=name, type=type_, durable=True,
                       auto_delete=False, internal=False, arguments={})


def test_a_metadata_command_resent_does_not_undo_what_followed_it(tmp_path):
    node = start(tmp_path)
    meta = node.cluster.meta
    declare = forwarded(1, exchange_declare("x", "direct"))
    replies: list = []
    append(meta, declare, replies)
    append(meta, encode_meta("exchange.delete", vhost="/", name="x", if_unused=False))
    append(meta, declare, replies)  # applied again, it would declare x once more
    node.flush()
    assert "x" not in node.vhosts["/"].exchanges and replies == [None, None]


def test_a_metadata_error_reply_survives_a_snapshot_and_a_restart(tmp_path):
    node = start(tmp_path, metadata_snapshot_interval=1)
    meta = node.cluster.meta
    append(meta, exchange_declare("y", "direct"))
    refused = forwarded(1, exchange_declare("y", "fanout"))
    replies: list = []
    append(meta, refused, replies)
    append(meta, encode_meta("exchange.delete", vhost="/", name="y", if_unused=False))
    node.flush()
    assert replies[0][:2] == ("error", 406) and "y" not in node.vhosts["/"].exchanges
    assert node.quorum.store.snapshot_meta(meta.group).index == meta.raft.applied_index
    node.quorum.store.close()
    again = start(tmp_path, metadata_snapshot_interval=1)
    again.flush()
    append(again.cluster.meta, refused, replies)  # the resend, after the restart
    again.flush()
    # answered as the first time, and not applied (it would declare y, fanout, now)
    assert replies[1] == replies[0] and "y" not in again.vhosts["/"].exchanges


def test_the_queue_row_lists_waits_of_any_term_beside_a_terms_own(tmp_path):
    """A queue's row (queues list, the management API) lists the replies this node
    waits for; a wait that any term's entry ends (term None) sorts before a term's at
    the same index (sorting them together raised TypeError, and the management API's
    sampling of queue counts failed on every such row)."""
    node = start(tmp_path)
    queue = declare(node)
    queue.wait_at(50, 3, b"", lambda reply: None)
    queue.wait_at(50, None, b"", lambda reply: None)
    assert queue.stats(node.name)["waiting"] == [(50, None), (50, 3)]


def test_message_spans_read_in_bulk_equal_the_messages_read_one_by_one(tmp_path):
    """A packed lease read takes its messages' spans PACK_MESSAGES at a time
    (QuorumGroups.read_message_spans): the same messages as read_message, in the
    order asked, forwarded entries included; an index that holds no message fails."""
    node = start(tmp_path)
    queue = declare(node)
    for number in range(6):
        data = message(b"m%d" % number)
        # every other one forwarded, with its node's next seq (1, 2, 3)
        append(queue, forwarded(number // 2 + 1, data) if number % 2 else data)
    node.flush()
    indexes = [index for index, _size in queue.state.normal.items()]
    spans = node.quorum.read_message_spans(queue, indexes[1:])
    assert [bytes(content)[len(HEADER):] for *_names, content in spans] == [
        node.quorum.read_message(queue, index)[3] for index in indexes[1:]]
    assert [(bytes(exchange), bytes(key), length) for exchange, key, length, _ in spans] \
        == [(b"", b"q", len(HEADER))] * 5
    with pytest.raises(MessageGone, match="missing from the log"):
        node.quorum.read_message_spans(queue, [indexes[-1] + 1000])


def test_a_consumer_gets_forwarded_and_stamped_entries_as_published(tmp_path):
    """A Deliver effect's messages are cut from their entries in one pass
    (queues/quorum/deliveries.py): entries forwarded from another node (an identity before the
    command) and entries in the time envelope (a publish's clock) are delivered with
    the same names, header and body as plain ones."""
    from pamqp import commands as amqp

    from quorumqueue.broker.fifo.envelope import stamped_enqueue
    from tests.broker.node.harness import Client, method

    node = start(tmp_path)
    queue = declare(node)
    for number in range(8):
        data = (stamped_enqueue(1_700_000_000_000, "", 0, 0, "", "q", HEADER, b"m%d" % number)
                if number % 4 >= 2 else message(b"m%d" % number))
        append(queue, forwarded(number // 2 + 1, data) if number % 2 else data)
    node.flush()
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    client.send(1, method(amqp.Basic.Consume, queue="q", consumer_tag="c"))
    (_channel, ok), *got = client.read_deliveries()
    assert type(ok) is amqp.Basic.ConsumeOk
    assert [(d.method.delivery_tag, d.method.exchange, d.method.routing_key, d.body)
            for d in got] == [(n + 1, "", "q", b"m%d" % n) for n in range(8)]
