"""One AMQP channel: consumers, deliveries, acks, publisher confirms and transactions.

Responsibilities: the basic.* and confirm/tx semantics of a single channel. Frames
go out through the owning session's buffer. Shared state (queues, routing, storage)
is reached through the node.

How it works:
- Every delivery gets the next delivery tag. Unless no-ack, it is remembered in
  `unacked` (insertion order = tag order), with its queue and the queue's token for
  it. That lasts until ack/nack/reject/recover or close. Then the queue gets its
  tokens back (queues/base.py: the channel never asks which type a queue is).
- Capacity, as rabbit_limiter decides. A consumer takes a message while two limits
  allow: its own prefetch (basic.qos global=false, fixed at consume time) and the
  channel's shared prefetch (global=true). A no-ack consumer has no prefetch of its
  own, and its deliveries do not count. But it waits too while the channel's unacked
  deliveries are at the shared limit. Capacity freed under the shared limit goes
  first to the queues of the consumers served longest ago (`_refill`). So consumers
  and queues share the channel's deliveries. (RabbitMQ resumes its blocked queues in
  a random order. This is the deterministic form of the same fairness.)
- Confirms: each publish in confirm mode gets the next sequence number and a
  `Confirm` (queues/base.py). Its outcome waits in `pending_confirms`: ack, or nack
  when a queue refused it. It waits until the store batch holding it is fsynced,
  and every queue that answers later has answered. Confirms go out in order. A run
  of acks goes as one `multiple` ack.
- Transactions: publishes and acks are buffered until tx.commit, dropped on
  rollback. Only then do acks free prefetch, as in RabbitMQ. tx.commit-ok waits for
  what a publisher confirm of each committed publish would wait for. That is the
  fsync of a durable classic queue's batch, or a quorum queue's majority. The
  publishes get silent confirms (seq 0), and the commit-ok queues behind them
  (queues/base.py Confirm). A publish a queue refused fails the commit ("partial tx
  completion", as RabbitMQ).
- Consumer timeout, as RabbitMQ 4.2's rabbit_channel (the consumers guide's
  "Delivery Acknowledgement Timeout"). Each unacked delivery, basic.get's included,
  remembers when it left (`delivered_at`, the node's clock: time is passed in). On
  the session's channel tick, `consumer_timed_out(now)` looks at the oldest unacked
  delivery only. It returns the 406 that closes the channel if that one has been
  unacked for longer than its queue's timeout. The timeout is the lower of
  x-consumer-timeout and a consumer-timeout policy. Else it is the node's
  consumer_timeout (None: no timeout). Closing the channel returns every unacked
  delivery to its queue (`close`).
- Permissions: `check_access` asks auth/users.py. It remembers the last
  PERMISSION_CACHE_SIZE checks that passed, with the user's rights they passed
  under. (RabbitMQ's per-channel permission cache; rights that changed miss it.)

Invariants: delivery tags start at 1 and only grow. An unacked token belongs to
exactly one channel. A message nacked or rejected without requeue goes back to its
queue as such (`settle(..., requeue=False)`): the queue dead-letters or drops it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from ..amqp import codec, spec
from ..amqp.channel import ChannelState
from ..amqp.errors import AMQPError, precondition
from ..auth.users import Permissions, check_access
from ..queues.actions import carry_out
from ..queues.base import Confirm, Queue
from ..queues.settings import consumer_timeout

if TYPE_CHECKING:  # pragma: no cover
    from .session import Session

PERMISSION_CACHE_SIZE = 12  # rabbit_channel's ?MAX_PERMISSION_CACHE_SIZE
_OPEN = ChannelState.OPEN  # (a global: an enum member off its class is slow on Python 3.11)


class Consumer:
    __slots__ = ("channel", "queue", "tag", "no_ack", "exclusive", "priority", "prefetch",
                 "unacked", "arguments", "reply_to", "served")

    def __init__(self, channel: "Channel", queue: Queue | None, tag: str, no_ack: bool,
                 exclusive: bool, priority: int, prefetch: int, arguments: dict) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = tag
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch = prefetch  # 0 = unlimited
        self.unacked = 0
        self.arguments = arguments
        self.reply_to = False  # a direct reply-to pseudo consumer
        self.served = 0  # the delivery tag of its latest delivery (0: none yet)

    def has_capacity(self) -> bool:
        channel = self.channel
        if not channel.flow_active or channel.state is not _OPEN:
            return False
        if channel.global_prefetch and channel.unacked_count >= channel.global_prefetch:
            return False  # the channel's shared limit holds no-ack consumers too
        return self.no_ack or not (self.prefetch and self.unacked >= self.prefetch)

    def charge(self) -> None:
        """A queue decided a delivery to it (a Deliver action): counted now."""
        if not self.no_ack:
            self.unacked += 1
            self.channel.unacked_count += 1


def _served(consumer: Consumer) -> int:
    return consumer.served


class Channel:
    def __init__(self, session: "Session", number: int, adopted: dict | None = None) -> None:
        """`adopted`: the modes of a channel opened on another worker of this node,
        whose connection this one adopted (node/handover.py `capture`): not counted as
        opened again."""
        self.session = session
        self.node = session.node
        self.number = number
        self.state = ChannelState.OPEN  # CLOSING once closed (by either side)
        self.consumers: dict[str, Consumer] = {}
        self.lease_ranges: set[str] = set()  # tags of lease ranges streaming (leases.py)
        self.next_delivery_tag = 1
        # delivery tag -> (queue, the queue's token for the delivery, consumer or None)
        self.unacked: dict[int, tuple[Queue, object, Consumer | None]] = {}
        self.unacked_count = 0  # unacked deliveries counted against global prefetch
        # delivery tag -> when it was delivered (node clock, monotonic seconds): every
        # tag in `unacked` or in a tx-buffered settlement has one (consumer timeout)
        self.delivered_at: dict[int, float] = {}
        self.consumer_prefetch = 0  # basic.qos global=false: applies to new consumers
        self.global_prefetch = 0
        self.flow_active = True
        self.confirm_mode = False
        self.next_publish_seq = 1
        self.pending_confirms: deque[Confirm] = deque()
        self.tx_mode = False
        self.tx_publishes: list = []
        self.tx_settlements: list = []
        self.tx_refused = False  # a queue refused a publish of the commit under way
        self.last_queue_name = ""  # server-named queue reuse (queue "" = last declared)
        self.reply_to_consumer: Consumer | None = None
        self.queues_used: dict[int, Queue] = {}  # consumed or got from: told of the close
        # methods received while a metadata change this channel made is not applied yet,
        # run once it is, in order (ordering.hold); None: nothing to wait for
        self.held: list | None = None
        # (vhost, queue, basic.cancel frames) while this channel's queue.delete goes
        # through the metadata log: its own consumers' cancels follow the delete-ok
        self.deleting: tuple[str, str, list] | None = None
        # (permission, kind, name) -> the user's Permissions it passed under
        self.permitted: dict[tuple[str, str, str], Permissions] = {}
        self.published = False  # a message was published here (rabbitmq_global_publishers)
        if adopted is None:
            self.node.counters.channels_opened += 1
            return
        self.confirm_mode = adopted["confirm"]
        self.next_publish_seq = adopted["next_publish_seq"]
        self.consumer_prefetch = adopted["consumer_prefetch"]
        self.global_prefetch = adopted["global_prefetch"]
        self.flow_active = adopted["flow_active"]
        self.last_queue_name = adopted["last_queue_name"]
        self.published = adopted["published"]

    @property
    def is_open(self) -> bool:
        return self.state == ChannelState.OPEN

    @property
    def quorum_identity(self) -> str:
        """Who this channel is to the fifo machine (its Down returns our messages)."""
        session = self.session
        return f"{self.node.boot_id}.{session.connection_id}.{self.number}"

    # ------------------------------------------------------------ permissions

    def check_access(self, permission: str, kind: str, name: str) -> None:
        """403 ACCESS_REFUSED unless this channel's user has `permission` on `name`.
        The permission is configure, write or read. `kind` is queue or exchange, in
        the session's vhost."""
        session = self.session
        vhost = session.vhost.name
        rights = session.user.permissions.get(vhost)
        key = (permission, kind, name)
        permitted = self.permitted
        if rights is not None and permitted.get(key) is rights:
            return
        check_access(session.user, vhost, permission, kind, name)
        if len(permitted) >= PERMISSION_CACHE_SIZE:
            del permitted[next(iter(permitted))]
        permitted[key] = rights

    # ------------------------------------------------------------ output

    def send(self, data: bytes) -> None:
        self.session.write(data)

    # ------------------------------------------------------------ deliveries

    def deliver(self, consumer: Consumer, queue: Queue, token, redelivered: bool,
                exchange: str, routing_key: str, header: bytes, body: bytes,
                charged: bool = False) -> None:
        """basic.deliver of one message to `consumer`. Unless no-ack, `token` is
        kept until the client settles the delivery. Then the queue gets it back.
        `charged`: `consumer.charge()` counted it already (a Deliver action)."""
        tag = self.next_delivery_tag
        self.next_delivery_tag += 1
        consumer.served = tag
        session = self.session
        session.write(codec.delivery(self.number, consumer.tag, tag, redelivered, exchange,
                                     routing_key, header, body, session.frame_max))
        counters = self.node.counters.by_type[queue.type_name]
        counts = queue.message_counts
        if redelivered:
            counters.redelivered += 1
            counts.redeliver += 1
        if not consumer.no_ack:
            counters.consume_manual_ack += 1
            counts.deliver += 1
            self.unacked[tag] = (queue, token, consumer)
            self.delivered_at[tag] = self.node.now
            if not charged:
                consumer.unacked += 1
                self.unacked_count += 1
        else:
            counters.consume_auto_ack += 1
            counts.deliver_no_ack += 1

    def deliver_batch(self, consumer: Consumer, queue: Queue, tokens: list,
                      messages: list) -> None:
        """`deliver` of each of `messages` in order, as one run of frames.
        A message is (redelivered, names, content header, body), as
        `codec.deliveries` takes it. `tokens[i]` is kept for message i until
        settled. With no-ack, `tokens` is not read."""
        count = len(messages)
        first = self.next_delivery_tag
        self.next_delivery_tag = first + count
        consumer.served = first + count - 1
        session = self.session
        parts: list = []
        codec.deliveries(self.number, consumer.tag, first, messages, session.frame_max, parts)
        session.write_parts(parts)
        counters = self.node.counters.by_type[queue.type_name]
        counts = queue.message_counts
        redelivered = [message[0] for message in messages].count(True)
        if redelivered:
            counters.redelivered += redelivered
            counts.redeliver += redelivered
        if not consumer.no_ack:
            counters.consume_manual_ack += count
            counts.deliver += count
            tags = range(first, first + count)
            self.unacked.update(zip(tags, [(queue, token, consumer) for token in tokens]))
            self.delivered_at.update(dict.fromkeys(tags, self.node.now))
            consumer.unacked += count
            self.unacked_count += count
        else:
            counters.consume_auto_ack += count
            counts.deliver_no_ack += count

    def get_ok(self, queue: Queue, token, no_ack: bool, redelivered: bool, exchange: str,
               routing_key: str, remaining: int, header: bytes, body: bytes) -> None:
        """basic.get-ok with one message; unless no-ack, `token` is kept as for a
        delivery."""
        tag = self.next_delivery_tag
        self.next_delivery_tag += 1
        self.send(codec.basic_get_ok(self.number, tag, redelivered, exchange, routing_key,
                                     remaining))
        self.session.write_parts(codec.content(self.number, header, body,
                                               self.session.frame_max))
        counters = self.node.counters.by_type[queue.type_name]
        counts = queue.message_counts
        if redelivered:
            counters.redelivered += 1
            counts.redeliver += 1
        if not no_ack:
            counters.get_manual_ack += 1
            counts.get += 1
            self.unacked[tag] = (queue, token, None)
            self.delivered_at[tag] = self.node.now
            self.unacked_count += 1
        else:
            counters.get_auto_ack += 1
            counts.get_no_ack += 1

    def get_empty(self) -> None:
        self.send(codec.basic_get_empty(self.number))

    def refused(self, error: AMQPError) -> None:
        """A basic.get that could not be asked of the queue's host (a `Refused`
        action): the channel fails, once what it sent before is answered."""
        self.session.fail_later(error, self)

    # ------------------------------------------------------------ settlement

    def _take(self, delivery_tag: int, multiple: bool, method: tuple[int, int]) -> list:
        """Remove and return the unacked deliveries an ack/nack/reject names."""
        if multiple:
            if delivery_tag == 0:
                taken = list(self.unacked.items())
                self.unacked.clear()
                return taken
            if delivery_tag not in self.unacked and (
                    delivery_tag >= self.next_delivery_tag or delivery_tag < 0):
                raise precondition(f"unknown delivery tag {delivery_tag}").at(*method)
            taken = []
            for tag in list(self.unacked):
                if tag > delivery_tag:
                    break
                taken.append((tag, self.unacked.pop(tag)))
            if not taken:
                raise precondition(f"unknown delivery tag {delivery_tag}").at(*method)
            return taken
        item = self.unacked.pop(delivery_tag, None)
        if item is None:
            raise precondition(f"unknown delivery tag {delivery_tag}").at(*method)
        return [(delivery_tag, item)]

    def settle(self, delivery_tag: int, multiple: bool, requeue: bool | None,
               method: tuple[int, int]) -> None:
        """ack (requeue None), nack/reject (requeue True/False)."""
        if not multiple and not self.tx_mode:
            # one delivery (PerfTest acks each): `_take` and `_apply_settlements`
            # without their lists and dicts, the same steps in the same order
            item = self.unacked.pop(delivery_tag, None)
            if item is None:
                raise precondition(f"unknown delivery tag {delivery_tag}").at(*method)
            queue, token, consumer = item
            self.delivered_at.pop(delivery_tag, None)
            self.unacked_count -= 1
            if consumer is not None:  # before the queue hears of it: it may deliver again
                consumer.unacked -= 1
            if requeue is None:
                self.node.counters.by_type[queue.type_name].acknowledged += 1
                queue.message_counts.ack += 1
            actions = queue.settle(self, [token], requeue)
            if actions:
                carry_out(actions)
            if self.global_prefetch:
                self._refill(())
            elif consumer is not None and consumer.queue is not None:
                actions = consumer.queue.capacity_freed()  # `_refill` of one consumer
                if actions:
                    carry_out(actions)
            return
        taken = self._take(delivery_tag, multiple, method)
        if self.tx_mode:
            # RabbitMQ: the queues and the prefetch limits see these only at tx.commit
            self.tx_settlements.append((taken, requeue))
            return
        self._apply_settlements(taken, requeue)

    def _apply_settlements(self, taken: list, requeue: bool | None) -> None:
        """Hand each queue its settled tokens (in tag order). Then the consumers
        whose prefetch this freed may take more."""
        by_queue: dict[int, tuple[Queue, list]] = {}
        consumers = []
        delivered_at = self.delivered_at
        for tag, (queue, token, consumer) in taken:
            delivered_at.pop(tag, None)
            self.unacked_count -= 1
            if consumer is not None:
                consumer.unacked -= 1
                consumers.append(consumer)
            by_queue.setdefault(id(queue), (queue, []))[1].append(token)
        for queue, tokens in by_queue.values():
            if requeue is None:
                self.node.counters.by_type[queue.type_name].acknowledged += len(tokens)
                queue.message_counts.ack += len(tokens)
            carry_out(queue.settle(self, tokens, requeue))
        self._refill(consumers)

    def _refill(self, consumers) -> None:
        """Capacity was freed on this channel: let its consumers' queues deliver.
        Under the shared prefetch, every consumer's queue may, served longest ago
        first."""
        if self.global_prefetch:
            consumers = sorted(self.consumers.values(), key=_served)
        seen = set()
        for consumer in consumers:
            queue = consumer.queue
            if queue is not None and id(queue) not in seen:
                seen.add(id(queue))
                carry_out(queue.capacity_freed())

    def consumer_timed_out(self, now: float) -> AMQPError | None:
        """The channel error that closes this channel, else None. It is due when
        the oldest unacked delivery waited longer than its queue's consumer timeout.
        Only the oldest is looked at (rabbit_channel's evaluate_consumer_timeout).
        The timeout is read now, so a policy set since the delivery counts."""
        if not self.unacked:
            return None
        tag = next(iter(self.unacked))
        queue = self.unacked[tag][0]
        policy = self.node.policy_for(queue.vhost, queue.type_name, queue.name)
        timeout = consumer_timeout(queue.arguments, policy)
        if timeout is None:
            timeout = self.node.settings.consumer_timeout_ms
        if timeout is None or (now - self.delivered_at.get(tag, now)) * 1000 <= timeout:
            return None
        return AMQPError(spec.PRECONDITION_FAILED,
                         f"delivery acknowledgement on channel {self.number} timed out. "
                         f"Timeout value used: {timeout} ms. This timeout value can be "
                         "configured, see consumers doc guide to learn more")

    def recover(self, requeue: bool) -> None:
        if not requeue:
            raise AMQPError(spec.NOT_IMPLEMENTED, "requeue=false")  # ids: recover(-async)
        taken = list(self.unacked.items())
        self.unacked.clear()
        self._apply_settlements(taken, True)

    # ------------------------------------------------------------ publishing

    def next_confirm(self) -> int:
        seq = self.next_publish_seq
        self.next_publish_seq += 1
        return seq

    def open_confirm(self, seq: int) -> Confirm:
        """The confirm of publish `seq`, queued in order. The queues the message is
        routed to say what it waits for (queues/base.py). Then `close_confirm`."""
        confirm = Confirm(self, seq, self.node.answered_confirms)
        self.pending_confirms.append(confirm)
        return confirm

    def close_confirm(self, confirm: Confirm) -> None:
        """Every queue has taken the message. Send the confirm now if it waits for
        nothing. Else send it once the node's fsync (`synced`) or the queues'
        answers allow."""
        if confirm.batch_id or confirm.outstanding:
            self.node.awaiting_sync.add(self)
        else:
            self.release_confirms(self.node.synced_batch_id)

    def release_answered_confirms(self) -> None:
        """Send the confirms queues answered for meanwhile (`Confirm`: this channel in
        the node's `answered_confirms`), those now due (Node.release_answered)."""
        if self.release_confirms(self.node.synced_batch_id):
            self.node.awaiting_sync.discard(self)

    def release_confirms(self, synced_batch_id: int) -> bool:
        """Send the confirms whose batches are on disk; True when none remain."""
        pending = self.pending_confirms
        run_end = 0
        confirmed = 0
        while pending and pending[0].batch_id <= synced_batch_id and not pending[0].outstanding:
            confirm = pending.popleft()
            seq = confirm.seq
            if not seq:  # a transaction's publish (nothing to send) or its commit-ok
                if confirm.reply is None:
                    self.tx_refused |= not confirm.ok
                    continue
                refused, self.tx_refused = self.tx_refused, False
                if refused:  # rabbit_channel: a queue refused a committed publish
                    self.session.fail_later(precondition("partial tx completion").at(
                        *spec.TX_COMMIT), self)
                    return True
                self.send(confirm.reply)
                continue
            if confirm.ok:
                run_end = seq
                confirmed += 1
                continue
            if run_end:
                self.send(codec.basic_ack(self.number, run_end, True))
                run_end = 0
            self.send(codec.basic_nack(self.number, seq, False))
        if run_end:
            self.send(codec.basic_ack(self.number, run_end, True))
        if confirmed:
            self.node.counters.confirmed += confirmed
        return not pending

    def commit(self) -> None:
        """tx.commit: apply the buffered publishes and settlements. Commit-ok leaves
        once every publish is where its confirm would have waited for it to be.
        A queue may refuse one (reject-publish: the nack of a confirm). Then the
        commit fails with 406 "partial tx completion", as rabbit_channel's does."""
        publishes, self.tx_publishes = self.tx_publishes, []
        settlements, self.tx_settlements = self.tx_settlements, []
        for taken, requeue in settlements:
            self._apply_settlements(taken, requeue)
        if publishes:  # their confirm numbers are not sent (the commit-ok is)
            self.node.publish_all(self, [(publish, properties, body, 0)
                                     for publish, properties, body, _seq in publishes],
                              tx=True)
        done = Confirm(self, 0, self.node.answered_confirms, codec.tx_commit_ok(self.number))
        self.pending_confirms.append(done)
        self.close_confirm(done)

    def rollback(self) -> None:
        """tx.rollback: drop buffered publishes. Buffered acks are undone, so those
        deliveries are unacked again. They never stopped counting against
        prefetch."""
        self.tx_publishes.clear()
        settlements, self.tx_settlements = self.tx_settlements, []
        restored = dict(self.unacked)
        for taken, _requeue in settlements:
            restored.update(taken)
        self.unacked = dict(sorted(restored.items()))

    # ------------------------------------------------------------ consumers

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers[consumer.tag] = consumer

    def cancel(self, tag: str) -> Consumer | None:
        self.lease_ranges.discard(tag)  # its stream stops at its next step
        consumer = self.consumers.pop(tag, None)
        if consumer is None:
            return None
        if consumer.reply_to:
            self.node.unregister_reply_to(self)
            self.reply_to_consumer = None
        elif consumer.queue is not None:
            carry_out(consumer.queue.cancel(self, consumer))
            self.node.consumer_removed(consumer.queue)
        return consumer

    # ------------------------------------------------------------ teardown

    def close(self) -> None:
        """The channel is gone: cancel consumers, return unacked messages."""
        self.node.counters.channels_closed += 1
        self.state = ChannelState.CLOSING  # deliveries in flight from quorum queues are returned
        for tag in list(self.consumers):
            self.cancel(tag)
        # every queue consumed or got from hears of the close, with the tokens of its
        # unacked deliveries, tx-buffered settlements included (they never happened)
        returned: dict[int, tuple[Queue, list]] = {
            key: (queue, []) for key, queue in self.queues_used.items()}
        held = list(self.unacked.values())
        for tx_taken, _requeue in self.tx_settlements:
            held += [item for _tag, item in tx_taken]
        for queue, token, _consumer in held:
            returned.setdefault(id(queue), (queue, []))[1].append(token)
        self.unacked.clear()
        self.delivered_at.clear()
        self.unacked_count = 0
        self.queues_used.clear()
        self.tx_settlements.clear()
        self.tx_publishes.clear()
        for queue, tokens in returned.values():
            carry_out(queue.channel_closed(self, tokens))
        self.pending_confirms.clear()
        self.node.awaiting_sync.discard(self)
