"""The quorum-queue state machine: `apply(meta, command, state) -> (state, reply, effects)`.

Deterministic: the result depends only on the arguments. Time arrives as
`meta.system_time`, failures as Down commands. No I/O, clocks or randomness. For
speed the state is updated in place and returned: `apply` owns the state it is
given. After the command itself, `apply` runs the aftercare every command may need.
That is the single active consumer, expiries, serving consumers, limits, dead
letters and the release cursor. An Enqueue none of it can concern skips it, with
the same result. (Such an Enqueue meets no consumers and no settings that act on
it; a key only adds the de-duplication, which `_enqueue` does either way.)
tests/broker/fifo/test_machine.py checks the two ways against each other.

Semantics (RabbitMQ's quorum queues, 4.2 guide):
- Enqueue, with per-publisher sequence de-duplication.
- Consumers check out messages within their prefetch. They are served by consumer
  priority (x-priority), round-robin within a priority.
- Two message priority levels. AMQP priority > 4 is high, served 2:1 against
  normal. But a high message older than the normal head always goes first.
- Settle removes. Return requeues with delivery count + 1. With a delivery limit
  set, it goes near the head (served before ready messages). With -1, at the tail.
  Over the limit (count > limit) the message is dropped (dead-lettered later).
- Discard (reject/nack without requeue) drops. Purge drops what is ready.
- A consumer's connection going down returns its messages, delivery count + 1.
  A node restarted after a crash cancels its old consumers before their Downs
  (`stale_downs`).
- A node the leader no longer hears from has its consumers *suspected* (NodeDown).
  Their messages return uncounted. They get nothing until the node is back
  (NodeUp). Consumers of a node's earlier runs are removed when it is (nodes.py).
- Leases: named consumers that survive disconnects. They are grown, read, settled
  and released by sequence numbers. They are released when idle past their
  timeout (Tick).
- Single active consumer (config.single_active, x-single-active-consumer). Only one
  consumer at a time is served. The others wait and take over in priority, then
  registration order (single_active.py).
- Length limits (x-max-length, x-max-length-bytes, x-overflow; below). And the
  limits changed while the queue runs (UpdateConfig, from a policy; below).
- The release cursor (lowest live raft index) is emitted periodically. So storage
  can drop the log below it once a snapshot at that point exists.
- Message TTL and dead lettering (below).
- Queue TTL (x-expires, as rabbit_fifo's `is_expired`). `last_active` is the leader
  time of the last use. A use is a command that had a consumer (before or after
  it), a basic.get or a config change. Commands with a consumer count only while
  the queue has an expiry. The first Tick starts it for a new queue. A Tick may
  find no consumer and `now - last_active > expires`. It then emits QueueExpired
  (on every Tick while so), and the leader's node deletes the queue. Publishing
  does not count as use. Nor does a redeclare: the 4.2 guide's feature matrix says
  "Partial (queue redeclaration does not renew the lease)".

Message TTL, as rabbit_fifo (the quorum queues guide, "Queue and Per-Message TTL";
the TTL guide). An Enqueue gets the expiry `now + ttl`. Now is the leader time in
its entry. The ttl is the lower of the queue's and the message's `expiration`
property. (The queue's is `config.msg_ttl`, from x-message-ttl or a policy's
message-ttl.) A later change of the queue's TTL does not change queued messages'
expiries. Expired messages are removed from the heads of the ready queues
(returns, high, normal). That happens after every command, and before every message
is handed out (serving.py `take_next`). So an expired message is never delivered,
given or leased. The leader proposes a Tick when a head has expired
(queues/quorum/groups.py). So expiry does not wait for a consumer. As in RabbitMQ
only heads expire. A message behind a longer-lived one leaves when it reaches a
head. It is never delivered: it is checked there. A TTL of 0 lets a message be
handed to a waiting consumer in the command that enqueues it. Otherwise it expires
at once. Checked-out and leased messages do not expire. Returned to the queue,
they keep their expiry. Expiry is `expiry <= now`.

Dead lettering: every message that leaves without being settled is a
`Dropped(index, reason)` effect. The reason is "rejected" (Discard), "expired",
"maxlen" (drop-head) or "delivery_limit" (returned more often than the limit).
Purge and queue deletion are not dead lettering (RabbitMQ's neither). What happens
to a dropped message is the node's business (queues/quorum/groups.py). It is
discarded, or published to the dead-letter exchange by the leader, at most once.
At-least-once dead lettering may be in force (`config.dead_letter_at_least_once`).
That needs a dead-letter exchange, strategy at-least-once, overflow reject-publish.
Then a dying message is not a Dropped effect. It is held in the state (dlx.py).
It is checked out to the leader's dead-letter worker (DlxCheckout, DlxDeliver
effects) until the worker settles it (DlxSettle). Held messages count towards the
length limits. Purge leaves them: rabbit_fifo's purge takes ready messages only.

Length limits, as rabbit_fifo's `evaluate_limit` applies them after every command:
- What counts: *ready* messages (queued and returned) and their body bytes.
  Messages checked out by consumers or held by leases do not. The queue-length
  guide: "In all cases the number of ready messages is used; unacknowledged
  messages do not count towards the limit". That is what `messages_ready` /
  `message_bytes_ready` show. rabbit_fifo's `is_over_limit` reads `messages_ready`
  and `msg_bytes_enqueue`, not `messages_total`. Over a limit means
  `ready > max_length` or `ready bytes > max_bytes`.
- The check runs after consumers are served, whatever the command. A message
  handed straight to a waiting consumer never counts. Returns, Down and lease
  releases that push ready messages over a limit trigger it too.
- drop-head (default): while over a limit, the message that would be delivered
  next is dropped (`Dropped(index, "maxlen")`). So after each command the queue is
  within its limits. A message larger than max_bytes drops itself.
- reject-publish: the 4.2 guide (seeds 002/003, "Length Limit") says it "allows a
  quorum queue to overshoot its limit by at least one message". rabbit_fifo accepts
  the enqueue that crosses the limit, then blocks its publishers. It unblocks them
  only when ready messages are at or below 80% (rounded down) of every set limit
  (`is_below_soft_limit`, ?LOW_LIMIT = 0.8). Here the reply is the notification.
  So the overshoot is exactly the one crossing message. While `publishers_blocked`,
  an Enqueue replies "rejected" and is not stored (the node nacks the confirm).
  Deliberate differences: the block is queue-wide, and there are no in-flight
  extras. (rabbit_fifo lets a channel that registers while the queue is between
  80% and the limit publish until the next crossing.)
- An Enqueue replies "duplicate" before "rejected": a re-sent message that was
  stored is confirmed. De-duplication is by "seq at or below the publisher's last
  stored one". So a publisher whose seq s was rejected must not get a later seq
  stored before s. A retry would then take s for a duplicate, confirm it, and lose
  it. So the first rejected seq of a publisher is remembered (`enqueuer_gaps`).
  That publisher's higher seqs are rejected too until s itself is stored. A retry
  re-sends from s: lower seqs are duplicates or fill in, and s closes the gap.

Changing the limits of a running queue (UpdateConfig: a policy's max-length,
max-length-bytes, overflow, delivery-limit; seed 002 "Policy Support"). It works
as rabbit_fifo's `apply(#update_config{})`, which swaps the config and runs
`checkout` (serve consumers, then `evaluate_limit`):
- The four settings replace the config's. The rest (release_cursor_interval)
  stays. Consumers are served, then the limits hold at once, as after any command.
  Drop-head drops from the head down to the new limits (`Dropped(..., "maxlen")`).
  Reject-publish blocks if ready messages are over a new limit. It lifts a block
  only at or below 80% of every new limit. So raising a limit does not unblock
  publishers still above 80% of it.
- A delivery limit applies from the next return on. Nothing is dropped at the
  update (rabbit_fifo checks it in `return`). A checked-out message over a lowered
  limit is dropped when it comes back. A ready one over it is delivered once more.
  Messages stay where they are. A limit switched between -1 and >= 0 changes where
  later returns go (tail / near the head), not where earlier ones went.
- The block exists only under reject-publish with a limit. So an update to
  drop-head or to no limit lifts it. rabbit_fifo lifts it when the limits are
  removed (`unblock_enqueuers`). It does not on a switch to drop_head, which leaves
  its enqueuers blocked. Here drop-head never blocks (deliberate difference).
- Publishers' rejected-seq gaps stay whatever the config. They guard
  de-duplication, not the limit.
- An update to the settings the queue already has changes no message. So
  proposing it twice is harmless. Which settings a queue should have is the node's
  business, not the machine's. (Those are arguments combined with a policy.)
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from typing import Any, assert_never

from . import dlx, leases, nodes, single_active
from .commands import (ActiveConsumerChanged, Cancel, Checkout, Command, Delivery, Dequeue,
                       Discard, DlxCheckout, DlxSettle, Down, Effect,
                       Enqueue, LeaseGrow, LeaseRelease, LeaseSettle, Meta, NodeDown, NodeUp,
                       Purge, QueueExpired, ReleaseCursor, Return, Settle, Tick, UpdateConfig)
from .serving import die, expire_heads, serve_consumers, take_next
from .state import (HIGH_BIT, HIGH_PRIORITY_ABOVE, SIZE_MASK, SOFT_LIMIT_PERCENT, ConsumerState,
                    FifoState, is_high)


def apply(meta: Meta, command: Command, state: FifoState) -> tuple[FifoState, Any, list[Effect]]:
    config = state.config
    if (type(command) is Enqueue and config.quiet_enqueue and command.ttl is None
            and not state.consumers
            and state.applied_since_cursor + 1 < config.release_cursor_interval
            and state.normal.expiries is None and state.high.expiries is None
            and state.returns.expiries is None):
        # The usual publish: an Enqueue nothing watches (no consumers, settings that
        # act on it, messages with expiries) is stored, or found a duplicate by its
        # key, and counted towards a release cursor not yet due. Each step below
        # would do nothing more for it. (Not blocked: no limit. A rejected re-send
        # behind its publisher's gap stores nothing either.)
        state.now_ms = meta.system_time
        reply = _enqueue(meta, command, state)
        state.last_index = meta.index
        if reply == "ok" or state.ready_count:  # twin of the cursor's inline branch
            state.applied_since_cursor += 1
            return state, reply, []
        effects: list[Effect] = []  # nothing stored, nothing ready: the cursor is due
        _maybe_release_cursor(meta, state, effects)
        return state, reply, effects
    effects = []
    reply: Any = None
    state.now_ms = meta.system_time
    active = state.active
    # last_active matters only to a queue with an expiry (an UpdateConfig that sets
    # one restarts the period below): the consumer scan is skipped on every other
    used = state.config.expires is not None and _has_consumers(state)
    if type(command) not in _KEEP_ROSTER:  # may change who can be served
        state.roster = None
    match command:
        case Enqueue():
            reply = _enqueue(meta, command, state)
        case Checkout():
            _checkout(command, state)
        case Cancel(consumer):
            _cancel(consumer, state)
        case Settle(consumer, msg_ids):
            reply = _settle(consumer, msg_ids, state)
        case Return(consumer, msg_ids):
            reply = _return(consumer, msg_ids, state, effects)
        case Discard(consumer, msg_ids):
            reply = _discard(consumer, msg_ids, state, effects)
        case Purge():
            reply = _purge(state)
        case Down(connection):
            _down(connection, state, effects)
        case Dequeue():
            reply = _dequeue(command, state, effects)
        case LeaseGrow():
            reply = leases.grow(meta, command, state, effects)
        case LeaseSettle(lease, up_to):
            reply = leases.settle(meta, lease, up_to, state)
        case LeaseRelease(lease, fence):
            reply = leases.release(meta, lease, "released", state, effects, fence)
        case Tick():
            leases.expire(meta, state, effects)  # expired messages: after the match
            _check_queue_expiry(meta, state, effects)
        case UpdateConfig():
            _update_config(command, state)
        case DlxCheckout(worker, prefetch):
            dlx.checkout(state, worker, prefetch)
        case DlxSettle(worker, msg_ids):
            reply = dlx.settle(state, worker, msg_ids)
        case NodeDown(down):
            nodes.node_down(down, state, effects)
        case NodeUp(node, boot):
            nodes.node_up(node, boot, state, effects)
        case _:
            assert_never(command)
    state.last_index = meta.index
    if state.config.single_active:
        single_active.activate(state)
        if state.active != active:
            effects.append(ActiveConsumerChanged(state.active))
    if meta.system_time and (used or isinstance(command, (Dequeue, UpdateConfig))
                             or (state.config.expires is not None
                                 and _has_consumers(state))):
        state.last_active = meta.system_time
    if (state.returns.expiries is not None or state.high.expiries is not None
            or state.normal.expiries is not None):  # a queue that ever held an expiry
        expire_heads(state, effects)
    if state.consumers:  # twin of serve_consumers' first test (once per command)
        serve_consumers(state, effects)
    if isinstance(command, Enqueue) and reply == "ok" and (
            command.ttl == 0 or state.config.msg_ttl == 0):  # TTL 0 (the lower is 0)
        _expire_unserved(meta.index, state, effects)
    if state.config.has_limit:
        _apply_limits(state, effects)
    if state.config.dead_letter_at_least_once:
        dlx.serve(state, effects)
    # twin of _maybe_release_cursor's usual early return: not yet due, not empty
    if (state.applied_since_cursor + 1 < state.config.release_cursor_interval
            and state.ready_count):
        state.applied_since_cursor += 1
    else:
        _maybe_release_cursor(meta, state, effects)
    return state, reply, effects


# ------------------------------------------------------------------ messages


def _enqueue(meta: Meta, command: Enqueue, state: FifoState) -> str:
    """"ok" (stored), "duplicate" (stored before) or "rejected" (reject-publish)."""
    publisher, seq = command.publisher, command.seq
    if publisher and seq <= state.enqueuers.get(publisher, 0):
        return "duplicate"
    gap = state.enqueuer_gaps.get(publisher) if publisher else None
    if state.publishers_blocked or (gap is not None and seq > gap):
        if publisher and (gap is None or seq < gap):
            state.enqueuer_gaps[publisher] = seq
        return "rejected"
    if publisher:
        state.enqueuers[publisher] = seq
        if gap is not None and seq == gap:
            del state.enqueuer_gaps[publisher]
    # twin of state.pack and state.is_high: keep in step (once per message)
    packed = min(command.size, SIZE_MASK) | (HIGH_BIT if command.priority > HIGH_PRIORITY_ABOVE
                                             else 0)
    ttl, msg_ttl = command.ttl, state.config.msg_ttl  # the lower of the queue's and the message's TTL
    if ttl is None:
        ttl = msg_ttl
    elif msg_ttl is not None:
        ttl = min(ttl, msg_ttl)
    expiry = 0 if ttl is None else max(1, meta.system_time + ttl)
    (state.high if packed & HIGH_BIT else state.normal).append(meta.index, packed, expiry)
    state.enqueue_count += 1
    return "ok"


# the commands after which serving.py's roster (state.py ServingRoster) still holds:
# an Enqueue changes no consumer, a settle, return or discard only makes room
# (`_checked` keeps the roster's `full`)
_KEEP_ROSTER = frozenset({Enqueue, Settle, Return, Discard})


def _has_consumers(state: FifoState) -> bool:
    """A consumer that uses the queue (queue TTL). It is not a basic.get holder,
    not cancelled, not suspected. (rabbit_fifo's is_expired leaves suspected ones
    out.)"""
    return any(not c.pull_only and not c.cancelled and not c.suspected
               for c in state.consumers.values())


def _check_queue_expiry(meta: Meta, state: FifoState, effects: list[Effect]) -> None:
    expires = state.config.expires
    if expires is None or not meta.system_time:
        return
    if not state.last_active:
        state.last_active = meta.system_time  # a new queue: its period starts now
        return
    unused = meta.system_time - state.last_active
    if unused > expires and not _has_consumers(state):
        effects.append(QueueExpired(unused))


def queue_expiry(state: FifoState) -> int | None:
    """The leader time after which the queue counts as expired if still unused.
    None: no expiry, or a consumer. That is when the leader should propose a Tick."""
    if state.config.expires is None or _has_consumers(state):
        return None
    return state.last_active + state.config.expires + 1 if state.last_active else 0


def _expire_unserved(index: int, state: FifoState, effects: list[Effect]) -> None:
    """A TTL-0 message that no consumer took in its own command expires now.
    (The TTL guide: it expires on reaching the queue unless it can be delivered at
    once.) It is the last entry of its ready queue, if still there."""
    for queue in (state.high, state.normal):
        if len(queue) and queue.indexes[-1] == index:
            _index, packed = queue.pop()
            die(state, effects, index, packed, "expired")
            return


def next_expiry(state: FifoState) -> int | None:
    """The earliest expiry among the ready queues' heads (None: none). That is
    when the leader should propose a Tick. So expired messages leave without a
    consumer."""
    heads = [queue.head_expiry() for queue in (state.returns, state.high, state.normal)
             if queue.expiries is not None and len(queue)]
    heads = [expiry for expiry in heads if expiry]
    return min(heads) if heads else None


def forget(index: int, state: FifoState) -> None:
    """A message taken out left the queue for good (settled, dropped)."""
    if state.expiries_out:
        state.expiries_out.pop(index, None)


def requeue(index: int, packed: int, count: int, state: FifoState,
            effects: list[Effect], reason_if_dropped: str = "delivery_limit",
            counted: bool = True) -> None:
    """Put a message back after an unsuccessful delivery (count already
    incremented). Not `counted`: it comes from a suspected consumer. Then the count
    is unchanged, and it is still redelivered (nodes.py)."""
    limit = state.config.delivery_limit
    expiry = state.expiries_out.pop(index, 0) if state.expiries_out else 0
    if limit >= 0 and count > limit:
        die(state, effects, index, packed, reason_if_dropped)
        return
    if count or not counted:
        state.delivery_counts[index] = count
    if limit >= 0:
        state.returns.append(index, packed, expiry)
    else:
        (state.high if is_high(packed) else state.normal).append(index, packed, expiry)


def _purge(state: FifoState) -> int:
    count = state.ready_count
    for queue in (state.high, state.normal, state.returns):
        queue.clear()
    state.delivery_counts.clear()
    return count


# ------------------------------------------------------------------ length limits


def _limited(state: FifoState) -> tuple[int, int]:
    """(messages, bytes) the length limits count: ready messages, plus held dead
    letters. rabbit_fifo's is_over_limit adds rabbit_fifo_dlx:stat. The guide says
    they "contribute to the queue resource limits"."""
    return (state.ready_count + state.dlx.count, state.ready_bytes + state.dlx.bytes)


def _over_limit(state: FifoState) -> bool:
    config = state.config
    count, size = _limited(state)
    return ((config.max_length is not None and count > config.max_length)
            or (config.max_bytes is not None and size > config.max_bytes))


def _below_soft_limit(state: FifoState) -> bool:
    config = state.config
    count, size = _limited(state)
    return ((config.max_length is None
             or count <= config.max_length * SOFT_LIMIT_PERCENT // 100)
            and (config.max_bytes is None
                 or size <= config.max_bytes * SOFT_LIMIT_PERCENT // 100))


def _apply_limits(state: FifoState, effects: list[Effect]) -> None:
    """Enforce x-max-length / x-max-length-bytes after a command (see the header)."""
    if state.config.overflow == "drop-head":
        while _over_limit(state):  # ends: an empty queue is within any limit >= 0
            taken = take_next(state, effects)
            if taken is None:  # only expired messages were over the limit
                break
            forget(taken[0], state)
            die(state, effects, taken[0], taken[1], "maxlen")
    elif _over_limit(state):
        state.publishers_blocked = True
    elif state.publishers_blocked and _below_soft_limit(state):
        state.publishers_blocked = False


def _update_config(command: UpdateConfig, state: FifoState) -> None:
    """New limits (see the header); `apply` then serves consumers and enforces them."""
    state.config = replace(state.config, delivery_limit=command.delivery_limit,
                           max_length=command.max_length, max_bytes=command.max_bytes,
                           overflow=command.overflow, msg_ttl=command.msg_ttl,
                           expires=command.expires,
                           dead_letter_at_least_once=command.dead_letter_at_least_once)
    if not state.config.dead_letter_at_least_once and state.dlx.count:
        dlx.clear(state)  # the guide: switched away, the held dead letters are deleted
    elif not state.config.dead_letter_at_least_once:
        state.dlx.consumer = None
    if state.config.overflow != "reject-publish" or not state.config.has_limit:
        state.publishers_blocked = False


# ------------------------------------------------------------------ consumers


def _checkout(command: Checkout, state: FifoState) -> None:
    consumer = state.consumers.get(command.consumer)
    if consumer is None or consumer.cancelled:
        checked = consumer.checked if consumer is not None else {}
        next_id = consumer.next_msg_id if consumer is not None else 1
        consumer = ConsumerState(command.prefetch, command.priority, command.connection,
                                 state.next_consumer_order, next_msg_id=next_id, checked=checked)
        state.next_consumer_order += 1
        state.consumers[command.consumer] = consumer
    else:
        consumer.prefetch, consumer.priority = command.prefetch, command.priority


def _cancel(key: str, state: FifoState) -> None:
    consumer = state.consumers.get(key)
    if consumer is None:
        return
    if consumer.checked:
        consumer.cancelled = True  # its unacked messages can still be settled
    else:
        del state.consumers[key]


def _checked(key: str, msg_ids, state: FifoState) -> list[tuple[int, int, int]]:
    consumer = state.consumers.get(key)
    if consumer is None:
        return []
    taken = []
    for msg_id in msg_ids:
        item = consumer.checked.pop(msg_id, None)
        if item is not None:
            taken.append(item)
    if consumer.cancelled and not consumer.checked:
        del state.consumers[key]
        state.roster = None
    elif state.roster is not None and len(consumer.checked) < consumer.prefetch:
        state.roster.full.discard(key)  # it has room again
    return taken


def _settle(key: str, msg_ids, state: FifoState) -> int:
    taken = _checked(key, msg_ids, state)
    if state.expiries_out:
        for index, _packed, _count in taken:
            forget(index, state)
    return len(taken)


def _return(key: str, msg_ids, state: FifoState, effects: list[Effect]) -> int:
    taken = _checked(key, msg_ids, state)
    for index, packed, count in taken:
        requeue(index, packed, count + 1, state, effects)
    return len(taken)


def _discard(key: str, msg_ids, state: FifoState, effects: list[Effect]) -> int:
    taken = _checked(key, msg_ids, state)
    for index, packed, _count in taken:
        forget(index, state)
        die(state, effects, index, packed, "rejected")
    return len(taken)


def _down(connection: str, state: FifoState, effects: list[Effect]) -> None:
    for key in [k for k, c in state.consumers.items() if c.connection == connection]:
        consumer = state.consumers.pop(key)
        for msg_id in sorted(consumer.checked):
            index, packed, count = consumer.checked[msg_id]
            requeue(index, packed, count + 1, state, effects)


def stale_downs(state: FifoState, stale: set[str] | frozenset[str]) -> list[Command]:
    """The commands a node restarted after a crash proposes for the consumers of
    its earlier run's connections (`stale`). Those died with it.

    First a Cancel of each such consumer. So none of them is served, or made the
    single active consumer, while the others are removed. A waiting consumer goes
    before the active one. The active one goes last, so no stale consumer takes
    over from it. Then a Down per connection. It returns each consumer's unacked
    messages, delivery count + 1 for the delivery made before the crash.

    Why not Downs alone, one command each: they handed every returned message to
    another dead consumer. Its Down then counted it again. After a few restarts a
    message no client received reached the delivery limit."""
    keys = sorted((key for key, consumer in state.consumers.items()
                   if consumer.connection in stale and not consumer.cancelled),
                  key=lambda key: (key == state.active, key))
    cancels: list[Command] = [Cancel(key) for key in keys]
    downs: list[Command] = [Down(connection) for connection in sorted(
        {consumer.connection for consumer in state.consumers.values()
         if consumer.connection in stale})]
    return cancels + downs


def _dequeue(command: Dequeue, state: FifoState, effects: list[Effect]):
    """basic.get: (Delivery, messages left) or None when empty."""
    taken = take_next(state, effects)
    if taken is None:
        return None
    index, packed, count, returned = taken
    if command.settled:
        forget(index, state)
        # rabbit_fifo settles a no-ack get at once, and its settle checks the heads
        # again: a message that expired behind the one taken is gone from the count
        if (state.returns.expiries is not None or state.high.expiries is not None
                or state.normal.expiries is not None):
            expire_heads(state, effects)
        return Delivery(0, index, count, returned), state.ready_count
    consumer = state.consumers.get(command.consumer)
    if consumer is None:
        consumer = ConsumerState(0, 0, command.connection, state.next_consumer_order,
                                 pull_only=True)
        state.next_consumer_order += 1
        state.consumers[command.consumer] = consumer
    msg_id = consumer.next_msg_id
    consumer.next_msg_id += 1
    consumer.checked[msg_id] = (index, packed, count)
    return Delivery(msg_id, index, count, returned), state.ready_count


# ------------------------------------------------------------------ release cursor


def lowest_live_index(state: FifoState) -> int | None:
    candidates = [q.min_index() for q in (state.high, state.normal, state.returns)]
    for consumer in state.consumers.values():
        if consumer.checked:
            candidates.append(min(item[0] for item in consumer.checked.values()))
    for lease in state.leases.values():
        if len(lease.indexes):
            candidates.append(min(lease.indexes))
    if state.dlx.count:
        candidates.append(min(dlx.indexes(state)))
    live = [c for c in candidates if c is not None]
    return min(live) if live else None


def live_indexes(state: FifoState) -> array:
    """Every raft index whose message is still in the queue, ascending. That is
    ready, returned, checked out or leased. Segment compaction must keep these."""
    live = array("Q")
    for queue in (state.high, state.normal, state.returns):
        live.extend(queue.indexes[queue.head:])
    for consumer in state.consumers.values():
        live.extend(item[0] for item in consumer.checked.values())
    for lease in state.leases.values():
        live.extend(lease.indexes)
    live.extend(dlx.indexes(state))
    return array("Q", sorted(live))


def _maybe_release_cursor(meta: Meta, state: FifoState, effects: list[Effect]) -> None:
    state.applied_since_cursor += 1
    empty = not state.ready_count and not any(c.checked for c in state.consumers.values()) \
        and not any(len(lease.indexes) for lease in state.leases.values()) \
        and not state.dlx.count
    if state.applied_since_cursor < state.config.release_cursor_interval and not empty:
        return
    state.applied_since_cursor = 0
    lowest = lowest_live_index(state)
    cursor = meta.index + 1 if lowest is None else lowest
    if cursor > state.release_cursor:
        state.release_cursor = cursor
        effects.append(ReleaseCursor(cursor, meta.index))
