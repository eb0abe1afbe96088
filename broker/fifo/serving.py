"""Handing ready messages out: which message is next, and which consumers get them.

Responsibilities:
- `take_next`: the one order in which ready messages leave the queue. They go to a
  consumer, a basic.get, a lease or a length limit's drop-head. The returns go
  first. Then high and normal priority 2:1; a high message older than the normal
  head goes first. Expired heads are dropped on the way.
- `serve_consumers`, run after every command (machine.py `apply`). The consumers
  with capacity take ready messages. The highest consumer priority goes first,
  round-robin among equals. With a single active consumer (single_active.py), that
  one alone.
- `die`: a message leaving unconsumed. It is a Dropped effect, or held for
  at-least-once dead lettering (dlx.py).

How it works: the usual case is served in one pass (`_serve_one_from_normal`).
That case is one consumer with capacity, every ready message in the normal queue,
no TTL anywhere. The messages are taken as one slice, a Delivery each. Everything
else goes one message at a time (`_serve_in_turn`). Both give the same deliveries,
message ids, rotation and queue contents. test_machine.py holds them equal on
random command sequences. A member replaying the log must reach the same state
whichever path it takes. With two consumers or more (`_serve_many`), the roster
kept between commands (state.py `ServingRoster`) says at once when nobody has room,
or when everybody has, at one priority: then the round-robin indexes its list
without a pass over the consumers. test_serving.py holds this equal to ranking
the consumers after every command.

Invariants: deterministic (the state and the command alone decide). A message is
handed out at most once per take. Nothing expired is handed out.

Not here: the commands' semantics (machine.py), leases (leases.py). Peeking at
what would be next without taking it (peek.py, which replays take_next's order).
"""

from __future__ import annotations

from . import dlx, single_active
from .commands import Deliver, Delivery, Dropped, Effect
from .state import ConsumerState, FifoState, ServingRoster, size_of


def expire_heads(state: FifoState, effects: list[Effect]) -> None:
    """Remove expired messages from the heads of the ready queues (machine.py's header,
    "Message TTL")."""
    now = state.now_ms
    for queue in (state.returns, state.high, state.normal):
        if queue.expiries is None:
            continue
        while len(queue):
            expiry = queue.head_expiry()
            if not expiry or expiry > now:
                break
            index, packed = queue.popleft()
            state.delivery_counts.pop(index, None)
            die(state, effects, index, packed, "expired")


def take_next(state: FifoState,
              effects: list[Effect]) -> tuple[int, int, int, bool] | None:
    """(raft index, packed size, delivery count, returned uncounted) of the next
    message to hand out. Expired heads are dropped first (Dropped "expired" into
    `effects`). So what is handed out has not expired. Its expiry moves to
    `expiries_out`. "Returned uncounted": handed out before, and back from a
    suspected consumer with delivery count 0 (Delivery.returned)."""
    if (state.returns.expiries is not None or state.high.expiries is not None
            or state.normal.expiries is not None):  # (as in apply)
        expire_heads(state, effects)
    if len(state.returns):
        queue = state.returns
    else:
        high, normal = state.high, state.normal
        if len(high) and len(normal):
            if state.high_run < 2 or high.head_index() < normal.head_index():
                queue = high
                state.high_run += 1
            else:
                queue = normal
                state.high_run = 0
        elif len(high):
            queue = high
        elif len(normal):
            queue = normal
            state.high_run = 0
        else:
            return None
    if queue.expiries is not None:
        expiry = queue.head_expiry()
        index, packed = queue.popleft()
        if expiry:
            state.expiries_out[index] = expiry
    else:
        index, packed = queue.popleft()
    count = state.delivery_counts.pop(index, None)
    if count is None:
        return index, packed, 0, False
    return index, packed, count, not count


def die(state: FifoState, effects: list[Effect], index: int, packed: int,
        reason: str) -> None:
    """A message leaves without being consumed. It is a Dropped effect: the node
    discards it, or dead-letters it at most once. With at-least-once dead lettering
    it is held for the dead-letter worker instead (dlx.py)."""
    if state.config.dead_letter_at_least_once:
        dlx.hold(state, index, size_of(packed), reason)
    else:
        effects.append(Dropped(index, reason))


def serve_consumers(state: FifoState, effects: list[Effect]) -> None:
    """Hand ready messages to consumers with capacity. The highest priority goes
    first, round-robin among equal priorities. With a single active consumer, to it
    alone."""
    if not state.consumers or not state.ready_count:
        return
    consumers = state.consumers
    if state.config.single_active:
        ordered = single_active.servable(state)
    elif len(consumers) == 1:  # the usual case: no sort of one
        only = next(iter(consumers.items()))
        ordered = [only] if only[1].has_capacity() else []
    else:
        _serve_many(state, effects)
        return
    if not ordered:
        return
    if len(ordered) == 1 and _only_normal(state):
        _serve_one_from_normal(state, *ordered[0], effects)
    else:
        _serve_in_turn(state, ordered, effects)


def _serve_many(state: FifoState, effects: list[Effect]) -> None:
    """`serve_consumers` for two consumers or more, without single active consumer.
    The roster (state.py `ServingRoster`) spares the pass over every consumer in
    the two usual cases: every consumer at its prefetch (nothing to do), and every
    one with room at one priority (the round-robin is over the roster's list as it
    is). Otherwise the consumers with capacity are ranked (`_ranked`) as before.
    The deliveries are the same either way (test_serving.py holds them equal)."""
    roster = state.roster
    if roster is None:
        roster = state.roster = _roster(state.consumers)
    ranked, full = roster.ranked, roster.full
    if len(full) == len(ranked):  # nobody with capacity
        return
    if not full and roster.one_priority:
        ordered = group = ranked  # every one has capacity: what _ranked would give
    else:
        ordered, group = _ranked(state.consumers), None
    if len(ordered) == 1 and _only_normal(state):
        key, consumer = ordered[0]
        _serve_one_from_normal(state, key, consumer, effects)
        if not consumer.has_capacity():
            full.add(key)
    else:
        _serve_in_turn(state, ordered, effects, full, group)


def _only_normal(state: FifoState) -> bool:
    """`_serve_one_from_normal`'s case: every ready message in the normal queue, no
    TTL anywhere."""
    return (state.normal.expiries is None and state.high.expiries is None
            and state.returns.expiries is None and len(state.normal) == state.ready_count)


def _roster(consumers: dict[str, ConsumerState]) -> ServingRoster:
    """The ServingRoster of `consumers` (one pass and a sort, after a command that
    may change who can be served)."""
    ranked = [item for item in consumers.items()
              if not (item[1].cancelled or item[1].pull_only or item[1].suspected)]
    ranked.sort(key=_rank)
    full = {key for key, consumer in ranked
            if consumer.prefetch and len(consumer.checked) >= consumer.prefetch}
    one_priority = not ranked or ranked[0][1].priority == ranked[-1][1].priority
    return ServingRoster(ranked, full, one_priority)


def _rank(item: tuple[str, ConsumerState]) -> tuple[int, int]:
    return -item[1].priority, item[1].order


def _ranked(consumers: dict[str, ConsumerState]) -> list[tuple[str, ConsumerState]]:
    """The consumers with capacity (`has_capacity`, inlined), highest priority first,
    then in registration order: `sorted(..., key=_rank)` of them. Run after every
    command, so in one pass over the consumers. The dict is mostly in that order
    already (registration order, equal priorities); only when it is not, a sort."""
    ordered = []
    in_rank = True
    last = None
    for item in consumers.items():
        consumer = item[1]
        if (consumer.cancelled or consumer.pull_only or consumer.suspected
                or (consumer.prefetch and len(consumer.checked) >= consumer.prefetch)):
            continue
        if last is not None and in_rank and (
                consumer.priority > last.priority
                or (consumer.priority == last.priority and consumer.order < last.order)):
            in_rank = False
        last = consumer
        ordered.append(item)
    if not in_rank:
        ordered.sort(key=_rank)
    return ordered


def _serve_in_turn(state: FifoState, ordered: list[tuple[str, ConsumerState]],
                   effects: list[Effect], full: set[str] | None = None,
                   group: list[tuple[str, ConsumerState]] | None = None) -> None:
    """Hand ready messages one at a time to `ordered`, round-robin among the
    highest priority. `ordered` is the consumers with capacity, highest priority
    first. The highest priority's group is the same until a consumer runs out of
    capacity (then it leaves `ordered`, and joins `full`, the roster's, if given).
    `group`, if given, is that group already (`ordered` is not changed in place)."""
    batches: dict[str, list[Delivery]] = {}
    while state.ready_count and ordered:
        if group is None:
            top = ordered[0][1].priority
            group = [item for item in ordered if item[1].priority == top]
        key, consumer = group[state.rotation % len(group)]
        taken = take_next(state, effects)
        if taken is None:  # what was ready had expired
            break
        state.rotation += 1
        index, packed, count, returned = taken
        msg_id = consumer.next_msg_id
        consumer.next_msg_id += 1
        consumer.checked[msg_id] = (index, packed, count)
        batches.setdefault(key, []).append(Delivery(msg_id, index, count, returned))
        if not consumer.has_capacity():
            ordered = [item for item in ordered if item[0] != key]
            group = None
            if full is not None:
                full.add(key)
    for key, deliveries in batches.items():
        effects.append(Deliver(key, tuple(deliveries)))


def _serve_one_from_normal(state: FifoState, key: str, consumer: ConsumerState,
                           effects: list[Effect]) -> None:
    """`serve_consumers` for the usual case, in one pass. That case is one consumer
    with capacity, every ready message in the normal queue, no TTL anywhere. So
    nothing expires while taking. It gives the same deliveries, message ids, rotation
    and queue contents as taking the messages one at a time (take_next). A replay
    must reproduce them."""
    room = len(state.normal)
    if consumer.prefetch:
        room = min(room, consumer.prefetch - len(consumer.checked))
    indexes, sizes = state.normal.popleft_many(room)
    state.high_run = 0  # as take_next leaves it after taking from the normal queue
    state.rotation += room
    first = consumer.next_msg_id
    consumer.next_msg_id = first + room
    checked = consumer.checked
    counts = state.delivery_counts  # returned messages' counts (no delivery limit)
    deliveries = []
    append = deliveries.append
    for msg_id, index, packed in zip(range(first, first + room), indexes, sizes):
        count = counts.pop(index, None) if counts else None
        if count is None:
            checked[msg_id] = (index, packed, 0)
            append(Delivery(msg_id, index, 0, False))
        else:
            checked[msg_id] = (index, packed, count)
            append(Delivery(msg_id, index, count, not count))
    effects.append(Deliver(key, tuple(deliveries)))
