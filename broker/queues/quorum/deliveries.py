"""Quorum queue messages read back from the log, and Deliver effects handed to consumers.

Responsibilities: a quorum queue keeps no message bodies in its state
(broker/fifo). Every live message is its Enqueue entry in the group's log. This
module reads them back for whoever needs the message:
- one message decoded (`read_message`): a basic.get, a remote consumer's delivery;
  with its BCC keys (`read_dead_letter`): dead lettering;
- a lease range's messages as views (`read_message_spans`);
- a Deliver effect's messages for this node's consumer (`deliver`): a
  `DeliverBatch` action, which groups.py carries out. Or sent to a node without a
  replica, or returned.

How it works: the messages of one Deliver effect (or one lease range) lie close
together in the log. They are consecutive Enqueues, with the Settles that made room
between them; a returned message lies further back. So their entries are read in
runs (`_entries`). Indexes at most _GAP apart are one `LogStore.entries` call. That
is one read per segment or one slice of the memtable, with the few entries between
them. An entry's message is cut out without decoding (`commands.delivery_spans`).
The spans are views of the exchange and routing key as stored, the content header
and the body. (AMQP short strings: what basic.deliver carries, as they are.) The
channel writes the whole effect as one run of frames (the `DeliverBatch`, carried
out as `Channel.deliver_batch`).
That is one pass over the messages, with the delivery tags and unacked
bookkeeping in bulk. A message delivered before (its delivery count above 0) gets
`x-delivery-count` in its header (queues/quorum/queue.py `with_delivery_count`).
Everything else is sent byte for byte as published.

Invariants:
- A Deliver effect's messages are written in the machine's order. Their delivery
  tags follow it.
- A live message's entry is always in the log: the release cursor never passes it.
  So a missing one raises MessageGone.
- Nothing is written to a channel that is not open. Its messages go back to the
  queue (a Return).
- A no-ack consumer's deliveries are settled (one Settle) when they are handed
  out. The Settle is only proposed: the batch is written before any entry is
  applied.

Not here: which messages a consumer gets (broker/fifo/machine.py), the frames' bytes
(broker/amqp/codec.py `deliveries`), the channel's bookkeeping (channel.py), remote
delivery (broker/cluster/proxy.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...amqp.channel import ChannelState
from ...fifo import commands
from ...fifo.commands import Return, Settle
from ...fifo.envelope import TIMED, TIMED_HEAD
from ...raft.forwarded import FORWARDED, HEAD_SIZE
from ...raft.storage import LogStore
from ..actions import Action, DeliverBatch
from ..base import Consumer
from .queue import MessageGone, QuorumQueue, QuorumToken, with_delivery_count

# read per delivery: an enum member off its class costs ~8x a global on Python 3.11
_CHANNEL_OPEN = ChannelState.OPEN
# Messages whose log indexes lie at most this far apart are read with one call,
# with the entries between them (Settles, mostly, and messages settled since).
_GAP = 64
_TIMED_SIZE = TIMED_HEAD.size


def _command_start(data: bytes) -> int:
    """Where the Enqueue begins in an entry. That is after a forwarded command's
    identity and the time envelope (envelope.py), when present.
    A twin of QuorumGroups._apply_entries' inline decode: keep in step."""
    start = HEAD_SIZE if data[0] == FORWARDED else 0  # published on another node
    if data[start] == TIMED:  # the proposer's clock (message TTL)
        start += _TIMED_SIZE
    return start


def _entry_data(store: LogStore, queue: QuorumQueue, index: int) -> bytes:
    entry = store.entry(queue.group, index)
    if entry is None:
        raise MessageGone(f"quorum queue '{queue.name}': message at log index {index} "
                          "is missing from the log")
    return entry.data


def _entries(store: LogStore, queue: QuorumQueue, indexes: list[int]) -> list[bytes]:
    """The data of the entries at `indexes` (any order), in that order.
    The indexes are taken in runs whose neighbours lie at most _GAP entries apart.
    Each run's entries are read with one call: a segment read, or a slice of the
    memtable, with the few entries between them. What that did not find (outside
    the log now) is read one by one. A missing one raises MessageGone."""
    group = queue.group
    ordered = sorted(indexes)  # (a Deliver effect's are in order but for returns)
    found: dict[int, bytes] = {}
    lo = prev = ordered[0]
    for index in ordered[1:] + [ordered[-1] + _GAP + 1]:  # (a sentinel ends the last run)
        if index - prev > _GAP:
            try:
                found.update([(entry.index, entry.data)
                              for entry in store.entries(group, lo, prev + 1)])
            except (LookupError, ValueError):
                pass  # outside the log now: the one-by-one reads below say which
            lo = index
        prev = index
    get = found.get
    return [data if (data := get(index)) is not None else _entry_data(store, queue, index)
            for index in indexes]


def read_message(store: LogStore, queue: QuorumQueue, index: int) -> tuple[str, str, bytes, bytes]:
    """(exchange, routing key, content header, body) of the message at `index`."""
    data = _entry_data(store, queue, index)
    return commands.decode_message(data, _command_start(data))


def read_dead_letter(store: LogStore, queue: QuorumQueue,
                     index: int) -> tuple[str, str, bytes, bytes, tuple[str, ...]]:
    """`read_message` and the message's BCC keys (commands.blind_keys): what its
    dead-lettered copy is made of and routed by."""
    data = _entry_data(store, queue, index)
    start = _command_start(data)
    return (*commands.decode_message(data, start), commands.blind_keys(data, start))


def read_message_spans(store: LogStore, queue: QuorumQueue, indexes: list[int]) -> list[tuple]:
    """`commands.message_spans` of the messages at `indexes` (increasing), in
    order. They are views into their log entries, nothing decoded (a lease range's
    messages)."""
    if not indexes:
        return []
    return [commands.message_spans(data, _command_start(data))
            for data in _entries(store, queue, indexes)]


def read_entries(store: LogStore, queue: QuorumQueue, indexes: Sequence[int]) -> list[bytes]:
    """The whole log entries of the messages at `indexes`, as stored (but for the
    BCC keys: `_without_blind_keys`, for entries at or below `queue.blind_upto`).
    They are a lease range's, in its order. An "entries" lease read sends them so.
    Indexes that lie close together are read as one span of the log, one call, and
    picked from it. (A range mostly is consecutive Enqueues.) Else they are read as
    `_entries` reads them."""
    if not indexes:
        return []
    lo, hi = min(indexes), max(indexes)
    found = None
    if hi - lo < 2 * len(indexes) + _GAP:
        try:
            block = store.entries(queue.group, lo, hi + 1)
        except (LookupError, ValueError):
            block = []
        if len(block) == hi - lo + 1 and block[0].index == lo and block[-1].index == hi:
            if len(block) == len(indexes) and indexes[0] == lo and indexes[-1] == hi:
                found = [entry.data for entry in block]  # consecutive, in order
            else:
                found = [block[index - lo].data for index in indexes]
    if found is None:
        found = _entries(store, queue, list(indexes))
    if lo <= queue.blind_upto:  # a message with BCC keys may be among them
        found = [_without_blind_keys(data) for data in found]
    return found


def _without_blind_keys(data: bytes) -> bytes:
    """A stored entry as an "entries" read may send it: the BCC keys a tag 21 Enqueue
    keeps for its dead-lettered copy are cut (no consumer gets them, whatever form
    it reads in)."""
    return commands.cut_blind_keys(data, _command_start(data))


def deliver(groups, queue: QuorumQueue, key: str, deliveries) -> list[Action]:
    """A Deliver effect: `deliveries` for the consumer whose fifo key is `key`.
    They are fifo Deliveries, in the machine's order. `groups`: the node's
    QuorumGroups. Returns the `DeliverBatch` for a consumer of this node whose
    channel is open; else nothing (the messages went elsewhere, or back)."""
    consumer: "Consumer | None" = queue.by_key.get(key)
    cluster = groups.cluster
    if consumer is None and not cluster.is_local_key(key):
        owner = key.partition(":")[0]
        if queue.is_leader and owner not in queue.raft.members:
            # a node with no replica: the leader sends it the messages
            cluster.deliver_remote(queue, owner, key, deliveries)
        return []  # else that node's replica delivers
    if consumer is None and cluster.is_stale_identity(key):
        # an earlier run's consumer, not removed yet: what it is handed comes back
        # when it is (stale_downs, NodeUp); a Return here would count, and the
        # message could come straight back to it while it is still active
        return []
    if consumer is None:  # its Cancel or Down lost, or on its way
        queue.remove_unknown_consumer(key, tuple(d.msg_id for d in deliveries),
                                      groups.host.has_open_channel(key.partition("/")[0]))
        return []
    if consumer.channel.state is not _CHANNEL_OPEN:  # closing: the messages go back
        queue.propose(Return(key, tuple(d.msg_id for d in deliveries)), 0)
        return []
    no_ack = consumer.no_ack
    tokens: list[QuorumToken] = []  # what the channel keeps until settled (not no-ack)
    messages = []
    add_token, add_message = tokens.append, messages.append
    spans = commands.delivery_spans
    for delivery, data in zip(deliveries, _entries(groups.store, queue,
                                                   [d.raft_index for d in deliveries])):
        names, header, body = spans(data, _command_start(data))
        count = delivery.delivery_count
        if count:
            add_message((True, names, with_delivery_count(bytes(header), count), body))
        else:
            add_message((delivery.returned, names, header, body))
        if not no_ack:
            add_token(QuorumToken(key, delivery.msg_id))
    if no_ack:
        queue.propose(Settle(key, tuple(d.msg_id for d in deliveries)), 0)
    return [DeliverBatch(consumer, queue, tokens, messages)]
