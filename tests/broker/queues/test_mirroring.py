"""Classic queue mirroring's pure parts (queues/mirroring.py), as RabbitMQ's "Classic
Queue Mirroring" guide describes them: where mirrors go for each ha-mode ("Queue
Arguments that Control Mirroring", keeping existing mirrors on a policy change),
which mirror is promoted ("Mirrored Queue Implementation and Semantics", "Promotion
of Unsynchronised Mirrors on Failure"), replication of a leader's operations to its
mirrors with confirms spanning every mirror ("Publisher Confirms and Transactions"),
a new mirror starting empty and unsynchronised ("Unsynchronised Mirrors", "Configuring
Synchronisation", "Batch Synchronization"), and a promoted mirror's copy becoming the
queue with unacknowledged messages redelivered; a durable queue's mirror keeping its
copy of the persistent messages in its node's message store, and which mirror
`forget_cluster_node` of the leader's node promotes ("Loss of a Leader While All
Mirrors are Stopped"). The cluster test is
tests/broker/cluster/test_mirrored_queues.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from quorumqueue.broker.amqp.properties import decode_properties, encode_properties
from quorumqueue.broker.queues.actions import carry_out
from quorumqueue.broker.queues.base import Confirm
from quorumqueue.broker.queues.classic import ClassicQueue
from quorumqueue.broker.queues.message import Message
from quorumqueue.broker.queues.mirroring import (HaSettings, Mirroring, Replica,
                                                 desired_mirrors, forget_leader,
                                                 ha_settings,
                                                 leader_must_move, promotion_candidate)
from quorumqueue.broker.storage.message_store import MessageStore, queue_key

NODES = ("a", "b", "c", "d")


def settings(mode, params=None, **more) -> HaSettings:
    return HaSettings(mode, params, **more)


# ---------------------------------------------------------------- placement


@pytest.mark.parametrize("mode, params, current, down, expected", [
    ("all", None, (), (), ("b", "c", "d")),
    ("all", None, ("d",), ("c",), ("d", "b")),           # join order kept; c is down
    ("exactly", 1, (), (), ()),                          # just the leader
    ("exactly", 2, (), (), ("b",)),
    ("exactly", 2, ("d", "c"), (), ("d",)),              # keeps the oldest existing one
    ("exactly", 3, ("d",), ("b",), ("d", "c")),          # a down node is replaced
    ("exactly", 9, (), (), ("b", "c", "d")),             # fewer nodes than count: all
    ("nodes", ["c", "rabbit@nowhere"], ("b",), (), ("c",)),  # unknown names ignored
    ("nodes", ["a", "b"], (), (), ("b",)),
])
def test_each_ha_mode_places_mirrors(mode, params, current, down, expected):
    assert desired_mirrors(settings(mode, params), "a", NODES, down, current) == expected


def test_a_nodes_policy_without_the_leader_moves_it():
    """'nodes' Policy and Migrating Leaders."""
    assert leader_must_move(settings("nodes", ["c", "d"]), "a", NODES)
    assert not leader_must_move(settings("nodes", ["a", "c"]), "a", NODES)
    assert not leader_must_move(settings("nodes", ["x@y"]), "a", NODES)  # none is ours
    assert not leader_must_move(settings("all"), "a", NODES)


@pytest.mark.parametrize("mirrors, synced, down, rule, expected", [
    (("b", "c"), ("b", "c"), (), "always", "b"),        # the oldest synchronised
    (("b", "c"), ("c",), (), "always", "c"),            # synchronised before older
    (("b", "c"), ("b", "c"), ("b",), "always", "c"),    # the oldest running
    (("b", "c"), (), (), "always", "b"),                # unsynchronised: the oldest
    (("b", "c"), (), (), "when-synced", None),          # when-synced: none
    (("b", "c"), ("c",), (), "when-synced", "c"),
    (("b",), ("b",), ("b",), "always", None),
])
def test_promotion_picks_the_oldest_synchronised_mirror(mirrors, synced, down, rule,
                                                        expected):
    assert promotion_candidate(mirrors, synced, down, rule) == expected


# ---------------------------------------------------------------- replication


class Link:
    """In memory: each mirror's Replica applies what the leader sends; acks wait for
    `ack_all` (a mirror answering later)."""

    sync_batch_size = 4096   # the configuration's mirroring_sync_batch_size

    def __init__(self) -> None:
        self.replicas: dict[str, Replica] = {}
        self.waiting: list[tuple[str, object]] = []
        self.sent: list[tuple[str, str]] = []

    def send(self, node, queue, op) -> None:
        self.sent.append((node, op[0]))
        self.replicas.setdefault(node, Replica()).apply(op)

    def ask(self, node, queue, op, answer) -> None:
        op[-1] = len(self.waiting) + 1
        self.send(node, queue, op)
        self.waiting.append((node, answer))

    def ack_all(self, node) -> None:
        for item in [w for w in self.waiting if w[0] == node]:
            self.waiting.remove(item)
            item[1](True)

    def release(self, node, queue) -> None:
        self.ack_all(node)

    def boot(self, node):
        return "boot"

    def carry_out(self, actions) -> None:
        carry_out(actions)


class Channel:
    def __init__(self) -> None:
        self.got: list = []

    def get_ok(self, queue, token, no_ack, redelivered, exchange, key, remaining, header,
               body) -> None:
        self.got.append((token, body, redelivered))

    def get_empty(self) -> None:
        self.got.append(None)


def message(body: bytes) -> Message:
    return Message("", "q", decode_properties(encode_properties(len(body), {}))[1], body)


def mirrored_queue(link: Link, *mirrors: str, sync_mode="manual", batch=4096):
    queue = ClassicQueue("/", "q", False, None, False, {})
    queue.mirroring = Mirroring(queue, link, settings("all", sync_mode=sync_mode,
                                                      sync_batch_size=batch))
    for mirror in mirrors:
        queue.mirroring.attach(mirror, "boot")
    return queue


def bodies(replica: Replica) -> list[bytes]:
    return [item[3] for item in replica.entries.values()]


def test_a_confirm_leaves_only_when_every_mirror_has_the_message():
    link = Link()
    queue = mirrored_queue(link, "b", "c")
    channel, answered = Channel(), set()
    confirm = Confirm(channel, 1, answered)
    queue.publish(message(b"m1"), None, confirm)
    assert confirm.outstanding == 2
    link.ack_all("b")
    assert confirm.outstanding == 1
    link.ack_all("c")
    assert confirm.outstanding == 0 and confirm.ok
    assert answered == {channel}  # the node sends it (nothing called on the channel)
    assert bodies(link.replicas["b"]) == bodies(link.replicas["c"]) == [b"m1"]


def test_a_mirror_that_leaves_no_longer_holds_confirms_back():
    link = Link()
    queue = mirrored_queue(link, "b", "c")
    confirm = Confirm(Channel(), 1, set())
    queue.publish(message(b"m1"), None, confirm)
    link.ack_all("b")
    queue.mirroring.detach("c")   # its node failed: the remaining mirrors hold it
    assert confirm.outstanding == 0 and confirm.ok


def test_deleting_the_queue_releases_the_confirms_waiting_for_mirrors():
    link = Link()
    queue = mirrored_queue(link, "b")
    confirm = Confirm(Channel(), 1, set())
    queue.publish(message(b"m1"), None, confirm)
    queue.delete()
    assert confirm.outstanding == 0 and confirm.ok


def test_acks_and_first_deliveries_reach_the_mirrors():
    link = Link()
    queue = mirrored_queue(link, "b")
    for body in (b"1", b"2", b"3"):
        queue.publish(message(body), None, None)
    channel = Channel()
    carry_out(queue.basic_get(channel, no_ack=False))   # 1: delivered, unacked
    carry_out(queue.basic_get(channel, no_ack=False))   # 2: delivered, then acked
    queue.settle(channel, [channel.got[1][0]], None)
    replica = link.replicas["b"]
    assert bodies(replica) == [b"1", b"3"]
    assert [item[5] for item in replica.entries.values()] == [True, False]  # delivered
    queue.purge(None)
    assert bodies(replica) == [b"1"]  # the unacked one survives a purge, as on the leader


def test_a_new_mirror_starts_empty_and_is_synchronised_once_old_messages_drain():
    link = Link()
    queue = mirrored_queue(link, "b")
    queue.publish(message(b"old"), None, None)
    queue.mirroring.attach("c", "boot")
    queue.publish(message(b"new"), None, None)
    assert bodies(link.replicas["c"]) == [b"new"]
    assert queue.mirroring.synchronised() == ["b"]
    channel = Channel()
    carry_out(queue.basic_get(channel, no_ack=True))    # "old" leaves the queue
    assert queue.mirroring.synchronised() == ["b", "c"]


def test_sync_sends_the_contents_in_batches_and_automatic_mode_syncs_at_once():
    """"Batch Synchronization": ha-sync-batch-size messages at a time, the next batch
    once the mirror acknowledged the last; synchronised after the last one."""
    link = Link()
    queue = mirrored_queue(link, batch=2)
    for body in (b"1", b"2", b"3"):
        queue.publish(message(body), None, None)
    queue.mirroring.attach("b", "boot")
    queue.publish(message(b"4"), None, None)   # the mirror has this one already
    assert queue.mirroring.synchronised() == []
    assert queue.mirroring.sync() == 1
    assert bodies(link.replicas["b"]) == [b"4", b"1", b"2"]  # the first batch only
    assert queue.sync_progress == 2 and queue.mirroring.synchronised() == []
    link.ack_all("b")
    assert queue.sync_progress == 3 and queue.mirroring.synchronised() == []
    link.ack_all("b")
    assert queue.mirroring.synchronised() == ["b"] and queue.sync_progress is None
    assert sorted(bodies(link.replicas["b"])) == [b"1", b"2", b"3", b"4"]
    assert [op for node, op in link.sent if node == "b"].count("s") == 2  # 2 + 1
    assert queue.mirroring.sync() == 0   # nothing left to synchronise

    auto = Link()
    queue = mirrored_queue(auto, sync_mode="automatic")
    queue.publish(message(b"x"), None, None)
    queue.mirroring.attach("b", "boot")
    assert queue.mirroring.synchronised() == []
    auto.ack_all("b")
    assert queue.mirroring.synchronised() == ["b"]
    assert bodies(auto.replicas["b"]) == [b"x"]


def test_without_ha_sync_batch_size_the_configured_mirroring_sync_batch_size_applies():
    """"Batch Synchronization": "If no value is set mirroring_sync_batch_size is used
    as the default value"."""
    link = Link()
    link.sync_batch_size = 2
    queue = mirrored_queue(link, batch=None)
    for body in (b"1", b"2", b"3"):
        queue.publish(message(body), None, None)
    queue.mirroring.attach("b", "boot")
    assert queue.mirroring.sync() == 1
    assert bodies(link.replicas["b"]) == [b"1", b"2"]   # 2 a batch
    link.ack_all("b")
    assert bodies(link.replicas["b"]) == [b"1", b"2", b"3"]
    assert ha_settings(SimpleNamespace(definition={"ha-mode": "all"})).sync_batch_size \
        is None   # the policy sets none: the configuration's
    assert ha_settings(SimpleNamespace(definition={
        "ha-mode": "all", "ha-sync-batch-size": 7})).sync_batch_size == 7


def test_a_cancelled_sync_leaves_the_mirror_unsynchronised_and_holding_what_it_got():
    """rabbitmqctl cancel_sync_queue: the synchronisation stops between two batches;
    late acknowledgements send nothing more; the mirror holds the first batch and
    every new message, and is synchronised later only once the older ones drain."""
    link = Link()
    queue = mirrored_queue(link, batch=1)
    for body in (b"1", b"2", b"3"):
        queue.publish(message(body), None, None)
    queue.mirroring.attach("b", "boot")
    assert queue.mirroring.cancel_sync() is False   # none running: not_syncing
    assert queue.mirroring.sync() == 1
    assert queue.mirroring.sync() == 1               # already running: goes on
    waiting = Channel()
    carry_out(queue.basic_get(waiting, no_ack=True))  # held while the sync runs
    assert waiting.got == []
    assert queue.mirroring.cancel_sync() is True
    assert queue.sync_progress is None
    assert [body for _token, body, _again in waiting.got] == [b"1"]   # answered now
    link.ack_all("b")                                # the batch's late acknowledgement
    assert [op for node, op in link.sent if node == "b"].count("s") == 1
    assert queue.mirroring.synchronised() == []
    queue.publish(message(b"4"), None, None)
    assert bodies(link.replicas["b"]) == [b"4"]      # it got 1, which the get took
    for _ in range(2):
        carry_out(queue.basic_get(Channel(), no_ack=True))  # 2, 3 drain (1 went above)
    assert queue.mirroring.synchronised() == ["b"]


def test_a_promoted_mirror_serves_its_copy_with_unacked_messages_redelivered():
    link = Link()
    leader = mirrored_queue(link, "b", "c")
    for body in (b"0", b"1", b"2", b"3"):
        leader.publish(message(body), None, None)
    channel = Channel()
    # "0" handed out in automatic acknowledgement mode: "messages that are in-flight
    # on their way to consumers in automatic acknowledgement mode ... will not be
    # requeued by the new leader"
    carry_out(leader.basic_get(channel, no_ack=True))
    carry_out(leader.basic_get(channel, no_ack=False))  # "1" unacked when the leader dies

    class Previous:  # the RemoteClassicQueue on b, with its copy
        replica = link.replicas["b"]

    promoted = ClassicQueue("/", "q", False, None, False, {}, host="b", synced=("c",))
    promoted.mirroring = Mirroring(promoted, link, None)
    promoted.mirroring.adopt("c", "boot")
    promoted.take_over(Previous())
    got = Channel()
    for _ in range(4):
        carry_out(promoted.basic_get(got, no_ack=True))
    assert [(body, again) for _token, body, again in got.got[:3]] == [
        (b"1", True), (b"2", False), (b"3", False)]
    assert got.got[3] is None
    assert promoted.next_seq == 5
    # the other mirror was synchronised and stays so: it holds what the leader holds
    assert promoted.mirroring.mirrors["c"].first_seq == 0


# ---------------------------------------------------------------- a mirror's copy on disk

KEY = queue_key("/", "q")


def op_publish(seq: int, body: bytes, persistent: bool = True, ask: int = 0) -> list:
    header = encode_properties(len(body), {"delivery_mode": 2 if persistent else 1})
    return ["p", seq, "", "q", header, body, 0, None, ask]


def recovered(directory) -> dict:
    store = MessageStore(str(directory))
    items = store.recover().get(KEY, [])
    store.close()
    return {item.seq: (item.body, item.delivered) for item in items}


def test_a_durable_queues_mirror_writes_its_persistent_messages_to_its_store(tmp_path):
    """RabbitMQ's mirrors keep their own copy of a durable queue's persistent messages
    on disk: the publish's acknowledgement waits for the batch holding it."""
    store = MessageStore(str(tmp_path))
    store.recover()
    replica = Replica(store, KEY, durable=True)
    assert replica.apply(["x"]) == 0
    first = replica.apply(op_publish(1, b"one", ask=7))
    assert first == store.batch_id   # the ack waits for this batch's fsync
    replica.apply(op_publish(2, b"two"))
    assert replica.apply(op_publish(3, b"transient", persistent=False)) == 0
    replica.apply(op_publish(4, b"four"))
    replica.apply(["v", [1]])       # delivered, unacked
    replica.apply(["d", [2, 3]])    # acked
    store.close()
    assert recovered(tmp_path) == {1: (b"one", True), 4: (b"four", False)}

    # the node restarted: the copy comes back, not `complete` (its leader may have
    # received more since)
    store = MessageStore(str(tmp_path))
    again = Replica(store, KEY, durable=True)
    again.recover(store.recover()[KEY])
    assert bodies(again) == [b"one", b"four"] and not again.complete
    assert again.entries[1][5] is True   # delivered: redelivered if it is promoted
    # "k" (a new leader's contents) and "x" (the leader resets it) reach the store
    again.apply(["k", [4]])
    store.flush()
    assert recovered(tmp_path) == {4: (b"four", False)}
    again.apply(["x"])
    store.close()
    assert recovered(tmp_path) == {} and again.complete


def test_a_non_durable_queues_mirror_keeps_its_copy_in_memory(tmp_path):
    store = MessageStore(str(tmp_path))
    store.recover()
    replica = Replica(store, KEY, durable=False)
    assert replica.apply(op_publish(1, b"one")) == 0
    assert not store.has_pending and bodies(replica) == [b"one"]


def test_a_mirror_promoted_from_its_stored_copy_does_not_write_it_again(tmp_path):
    store = MessageStore(str(tmp_path))
    store.recover()
    replica = Replica(store, KEY, durable=True)
    for seq in (1, 2, 3):
        replica.apply(op_publish(seq, b"%d" % seq))
    replica.apply(op_publish(4, b"4", persistent=False))
    replica.apply(["v", [2]])
    store.flush()

    class Previous:  # the RemoteClassicQueue with its copy
        pass

    Previous.replica = replica
    promoted = ClassicQueue("/", "q", True, None, False, {}, store=store, host="b")
    promoted.take_over(Previous())
    assert not store.has_pending   # its records are the mirror's, under the same key
    got = Channel()
    for _ in range(4):
        carry_out(promoted.basic_get(got, no_ack=False))
    assert [(body, again) for _token, body, again in got.got] == [
        (b"1", False), (b"2", True), (b"3", False), (b"4", False)]
    promoted.settle(got, [got.got[0][0]], None)   # acked through the new leader
    store.close()
    assert sorted(recovered(tmp_path)) == [2, 3]  # the transient one is not stored


@pytest.mark.parametrize("record, chosen", [
    # the first synchronised mirror in join order, else the first mirror
    ({"host": "a", "mirrors": ["b", "c"], "synced": ["b", "c"]}, "b"),
    ({"host": "a", "mirrors": ["b", "c"], "synced": ["c"]}, "c"),
    ({"host": "a", "mirrors": ["b", "c"], "synced": []}, "b"),
    ({"host": "a", "mirrors": [], "synced": []}, None),   # no mirror: it stays
    ({"host": "b", "mirrors": ["a", "c"], "synced": ["a"]}, None),  # not led there
])
def test_forgetting_the_leaders_node_promotes_a_mirror(record, chosen):
    """"Loss of a Leader While All Mirrors are Stopped": the others rejoin it empty
    (its placement adds them again, as any mirror joining a leader)."""
    new = forget_leader(record, "a")
    if chosen is None:
        assert new is None
    else:
        assert new == {"host": chosen, "mirrors": [], "synced": []}


@pytest.mark.parametrize("record, chosen", [
    ({"host": "a", "mirrors": ["b", "c"], "synced": ["c"]}, "c"),
    ({"host": "a", "mirrors": ["b", "c"], "synced": []}, None),  # the queue stays
])
def test_forgetting_the_leaders_node_promotes_no_unsynchronised_mirror_when_synced(
        record, chosen):
    """"Promotion of Unsynchronised Mirrors on Failure": a leader "removed from the
    cluster" is a failure too, and when-synced "will make sure that unsynchronised
    mirrors are not promoted"."""
    new = forget_leader(record, "a", "when-synced")
    if chosen is None:
        assert new is None
    else:
        assert new == {"host": chosen, "mirrors": [], "synced": []}


@pytest.mark.parametrize("record, chosen", [
    # c stopped after b: c leads
    ({"host": "a", "mirrors": ["b", "c"], "synced": ["b", "c"], "stopped": ["b", "c"]},
     "c"),
    ({"host": "a", "mirrors": ["b", "c"], "synced": ["b", "c"], "stopped": ["c", "b"]},
     "b"),
    # d never announced its stop: it stopped after the others (or runs still)
    ({"host": "a", "mirrors": ["b", "c", "d"], "synced": ["b", "c", "d"],
      "stopped": ["c", "b"]}, "d"),
    # the most recently stopped synchronised one
    ({"host": "a", "mirrors": ["b", "c"], "synced": ["b"], "stopped": ["b", "c"]}, "b"),
    # none synchronised (ha-promote-on-failure always): the most recently stopped
    ({"host": "a", "mirrors": ["b", "c"], "synced": [], "stopped": ["b", "c"]}, "c"),
    # a stop of a node no longer a mirror counts for nothing
    ({"host": "a", "mirrors": ["b", "c"], "synced": ["b", "c"], "stopped": ["b", "x"]},
     "c"),
])
def test_forgetting_the_leaders_node_promotes_the_most_recently_stopped_mirror(
        record, chosen):
    """"Loss of a Leader While All Mirrors are Stopped": "If there is more than one
    candidate, the most recently stopped mirror will be chosen" (the record's
    "stopped": the mirrors whose nodes announced a controlled shutdown, in order)."""
    assert forget_leader(record, "a") == {"host": chosen, "mirrors": [], "synced": []}


def test_a_mirrors_stop_is_kept_in_the_record_while_it_is_a_mirror():
    """The leader's queue keeps the stop order from its record (so that it and
    every node's metadata agree), only for the mirrors it still has: one that left
    and joined again is not stopped."""
    from quorumqueue.broker.queues.mirroring import leader_record_changed

    from types import SimpleNamespace

    queue = mirrored_queue(Link(), "b", "c")
    queue.host = "a"
    queue.node = SimpleNamespace(clock_ms=0, mirror_link=SimpleNamespace(
        boot=lambda mirror: "boot"))
    assert leader_record_changed(queue, {"host": "a", "mirrors": ["b", "c"],
                                         "synced": ["b", "c"], "stopped": ["c", "b"]})
    assert queue.metadata_record()["stopped"] == ["c", "b"]
    leader_record_changed(queue, {"host": "a", "mirrors": ["b"], "synced": ["b"],
                                  "stopped": ["c", "b"]})
    assert queue.metadata_record()["stopped"] == ["b"]
    leader_record_changed(queue, {"host": "a", "mirrors": ["b", "c"], "synced": ["b"],
                                  "stopped": ["b"]})
    assert forget_leader(queue.metadata_record(), "a") == {"host": "b", "mirrors": [],
                                                           "synced": []}


def test_a_message_bcc_keys_reach_every_copy_and_the_promoted_leader(tmp_path):
    """A message published with BCC keys (they route its dead-lettered copy:
    queues/dead_letter.py) is replicated with them: by the publish (the "p" op), by a
    synchronisation batch, into a durable mirror's store, and back into the message
    of the mirror promoted to leader; a message without keys carries none."""
    def selected(body: bytes, keys: tuple) -> Message:
        properties = decode_properties(encode_properties(len(body), {"delivery_mode": 2}))[1]
        properties.blind_keys = keys
        return Message("", "q", properties, body)

    link = Link()
    leader = mirrored_queue(link, "b")
    leader.publish(selected(b"early", ("e1", "e2")), None, None)
    leader.publish(selected(b"plain", ()), None, None)
    leader.mirroring.attach("c", "boot")   # it gets the two by a synchronisation batch
    leader.mirroring.sync()
    link.ack_all("c")
    store = MessageStore(str(tmp_path))
    store.recover()
    durable = Replica(store, KEY, durable=True)
    durable.apply(["x"])
    link.replicas["d"] = durable
    leader.mirroring.attach("d", "boot")
    leader.publish(selected(b"late", ("l",)), None, None)
    for node in ("b", "c"):
        assert {item[3]: item[6] for item in link.replicas[node].entries.values()} == {
            b"early": ("e1", "e2"), b"plain": (), b"late": ("l",)}, node
    store.flush()
    again = MessageStore(str(tmp_path))
    assert [(m.body, m.blind_keys) for m in again.recover()[KEY]] == [(b"late", ("l",))]
    again.close()

    class Previous:  # the RemoteClassicQueue on b, with its copy
        replica = link.replicas["b"]

    promoted = ClassicQueue("/", "q", False, None, False, {}, host="b")
    promoted.take_over(Previous())
    assert [(entry.message.body, entry.message.properties.blind_keys)
            for level in promoted.levels for entry in level] == [
        (b"early", ("e1", "e2")), (b"plain", ()), (b"late", ("l",))]
