"""Single active consumer (`x-single-active-consumer`) in the quorum-queue machine.

As rabbit_fifo's `single_active` consumer strategy (RabbitMQ's consumers guide,
"Single Active Consumer"; for priorities RabbitMQ 4.x, "Single Active Consumer and
Consumer Priorities"):
- one consumer at a time is *active* (`FifoState.active`): only it is handed
  messages, within its prefetch; when it is full, messages wait and the other
  consumers are not served ("messages are always delivered to the active consumer,
  even if it is too busy");
- the others *wait*. The next to take over is the waiting consumer with the highest
  x-priority, then the earliest registered (`ConsumerState.order`);
- the active consumer cancelling (its unacked messages stay settleable with it, as
  any cancelled consumer's), its channel or connection going down (a Down: its
  messages return, delivery count + 1), or its node suspected down (a NodeDown: its
  messages return uncounted, nodes.py), makes the next one active in the same
  command, which then serves it; a suspected consumer reinstated (NodeUp) waits;
- a waiting consumer with a higher priority than the active one takes over once
  the active one holds no unacked message. Until then the active one is
  *quiescing*: it gets nothing new. Then it goes back to waiting (keeping its
  registration order) and the other becomes active, in the command that settles,
  returns or discards its last message;
- basic.get (pull-only consumers) and leases are not consumers here: they take
  messages whoever is active.

It is all machine state (`FifoState.active`, the consumers' priorities and orders)
changed only by log commands, so every member of the group, a new leader after a
failover and a replay from any snapshot agree on the active consumer at every log
index. `activate` runs after every command of such a queue, before consumers are
served; it is idempotent. A command that changes the active consumer has an
`ActiveConsumerChanged` effect, before its deliveries.

Invariants (a property in tests/broker/fifo/test_single_active.py): every Deliver
goes to the active consumer; there is an active consumer whenever a consumer that
may take over is registered; a consumer becomes active only with the queue's
highest priority among those that may take over, or as the longest waiting one of
that priority.

Differences from rabbit_fifo 4.x: among waiting consumers of one priority it
prefers the one with more credit (a larger prefetch), then the earliest; here the
earliest always. A consumer whose node was cut off is suspected (nodes.py) and
reinstated when its node is back: it keeps its registration order, and waits unless
no other may be active (RabbitMQ 4.2 puts it at the end of the waiting list); one
whose connection was taken for down (a Down of a node that was forgotten) registers
again (queues/quorum/groups.py `check_out_again`) and waits behind the others. 3.10 has no
priorities here: the earliest registered waiting consumer takes over.

Not here: telling clients (AMQP 0-9-1 has no consumer-activity notification;
RabbitMQ shows the active consumer in its management API and `list_consumers`, and
quorumqueue in `queues list`: queues/quorum/queue.py).
"""

from __future__ import annotations

from .state import ConsumerState, FifoState


def _candidates(state: FifoState):
    """(key, consumer) of every consumer that may be active: registered, not
    cancelled, not a basic.get holder, not suspected (its node gone: nodes.py)."""
    return [(key, consumer) for key, consumer in state.consumers.items()
            if not consumer.cancelled and not consumer.pull_only and not consumer.suspected]


def _rank(item: tuple[str, ConsumerState]) -> tuple[int, int]:
    return -item[1].priority, item[1].order


def activate(state: FifoState) -> None:
    """Make `state.active` right after a command (see the module header)."""
    current = state.consumers.get(state.active) if state.active is not None else None
    if current is None or current.cancelled or current.pull_only or current.suspected:
        state.active = current = None
    waiting = [item for item in _candidates(state) if item[0] != state.active]
    if not waiting:
        return
    key, best = min(waiting, key=_rank)
    if current is None or (best.priority > current.priority and not current.checked):
        state.active = key


def quiescing(state: FifoState) -> bool:
    """The active consumer waits for its unacked messages before a higher-priority
    waiting consumer takes over: nothing new is handed to it."""
    current = state.consumers.get(state.active) if state.active is not None else None
    if current is None:
        return False
    return any(consumer.priority > current.priority for key, consumer in _candidates(state)
               if key != state.active)


def servable(state: FifoState) -> list[tuple[str, ConsumerState]]:
    """The consumers `_serve_consumers` may hand messages to: the active one, if it
    has capacity and is not quiescing; else none."""
    key = state.active
    if key is None:
        return []
    consumer = state.consumers[key]
    if not consumer.has_capacity() or quiescing(state):
        return []
    return [(key, consumer)]


def waiting_order(state: FifoState) -> list[str]:
    """The keys of the waiting consumers, the next to take over first."""
    return [key for key, _consumer in sorted(
        (item for item in _candidates(state) if item[0] != state.active), key=_rank)]

