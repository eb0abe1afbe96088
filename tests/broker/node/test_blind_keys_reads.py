"""No read of a quorum queue sends a message's BCC keys, the raw "entries" lease read
included (queues/quorum/deliveries.py `read_entries`): the keys stay in the log entry
(tag 21, FORMAT.md) for the dead-lettered copy only, and an entry that keeps them is
sent as the tag 1 entry of the same message. Entries are appended as a leader does and
applied by the node's own loop; a restart from a snapshot, whose messages' entries
the node did not apply, is covered too."""

from __future__ import annotations

from dataclasses import replace

from quorumqueue.broker.fifo import commands
from quorumqueue.broker.fifo.envelope import stamp

from .test_forwarded_apply import HEADER, append, declare, forwarded, start

KEYS = ("blind-copy", "other-secret")


def enqueue(body: bytes, blind_keys: tuple[str, ...] = ()) -> bytes:
    return commands.encode_enqueue("", 0, 0, "", "q", HEADER, body, blind_keys=blind_keys)


def test_an_entries_read_sends_a_bcc_message_as_the_same_message_without_its_keys(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    indexes = [append(queue, enqueue(b"plain")),
               append(queue, enqueue(b"blind", KEYS)),                       # local
               append(queue, forwarded(1, enqueue(b"forwarded", KEYS))),     # forwarded
               append(queue, stamp(enqueue(b"stamped", KEYS), 1_000))]      # timed
    node.quorum.flush()
    read = node.quorum.read_entries(queue, indexes)
    assert not any(key.encode() in data for data in read for key in KEYS)
    alone = [enqueue(b"plain"), enqueue(b"blind"), forwarded(1, enqueue(b"forwarded")),
             stamp(enqueue(b"stamped"), 1_000)]
    assert read == alone
    # the keys are still kept for the dead-lettered copy
    assert commands.blind_keys(node.quorum.store.entry(queue.group, indexes[1]).data) == KEYS


def test_entries_above_the_last_bcc_message_are_sent_as_stored(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    first = append(queue, enqueue(b"blind", KEYS))
    later = [append(queue, enqueue(b"%d" % n)) for n in range(3)]
    node.quorum.flush()
    assert queue.blind_upto == first
    stored = [node.quorum.store.entry(queue.group, index).data for index in later]
    read = node.quorum.read_entries(queue, later)
    assert all(a is b for a, b in zip(read, stored))  # no copy made


def test_after_a_restart_from_a_snapshot_the_keys_are_not_sent_either(tmp_path):
    node = start(tmp_path)
    queue = declare(node)
    queue.state.config = replace(queue.state.config, release_cursor_interval=1)
    index = append(queue, enqueue(b"blind", KEYS))
    append(queue, enqueue(b"after"))
    node.quorum.flush()
    assert node.quorum.store.snapshot_meta(queue.group).index >= index
    node.flush()
    node.quorum.store.close()
    again = start(tmp_path)
    again.flush()
    recovered = again.vhosts["/"].queues["q"]
    [read] = again.quorum.read_entries(recovered, [index])
    assert read == enqueue(b"blind")
